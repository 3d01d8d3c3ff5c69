#pragma once
// Output files the user names on a tool's command line: a tool that cannot write one says so and
// fails, rather than reporting success over a file that is not there.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

namespace normjit::tools {

// Writes `text` to `path` ('-': stdout); returns an empty string, or why it could not.
inline std::string write_output(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text << std::flush;
    return std::cout ? std::string() : "cannot write to stdout";
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return "cannot create " + path + ": " + std::strerror(errno);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) return "cannot write " + path + ": " + std::strerror(written ? errno : write_errno);
  return {};
}

}  // namespace normjit::tools
