#include "runtime/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace normjit::detail {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("normjit");
    l->set_pattern("[%H:%M:%S.%e] [normjit] [%l] %v");
    spdlog::level::level_enum level = spdlog::level::warn;
    if (const char* env = std::getenv("NORMJIT_LOG_LEVEL"); env && *env) {
      level = spdlog::level::from_str(env);
      // from_str maps unknown names to off; say so rather than going silent.
      if (level == spdlog::level::off && std::string(env) != "off") {
        level = spdlog::level::warn;
        l->warn("NORMJIT_LOG_LEVEL='{}' is not a level (trace|debug|info|warn|error|critical|off); using warn", env);
      }
    }
    l->set_level(level);
    return l;
  }();
  return *logger;
}

}  // namespace normjit::detail
