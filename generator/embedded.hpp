#pragma once
#include <string_view>
#include <vector>

namespace normjit::detail {

struct EmbeddedFile {
  std::string_view path;      // relative to templates/, e.g. "normjit/common.cuh"
  std::string_view contents;
};
// Every file under templates/, embedded at build time (cmake/embed_templates.cmake).
const std::vector<EmbeddedFile>& embedded_templates();
// SHA-256 of every embedded file's path, length and contents, computed at build time.
std::string_view embedded_templates_digest();
// Every generator/picks/*.txt table, keyed by file name (e.g. "sm90.txt").
const std::vector<EmbeddedFile>& embedded_pick_tables();

}  // namespace normjit::detail
