#pragma once
#include <spdlog/spdlog.h>

namespace normjit::detail {
// normjit's logger; level from NORMJIT_LOG_LEVEL (trace|debug|info|warn|error|critical|off), default warn.
spdlog::logger& log();
}  // namespace normjit::detail
