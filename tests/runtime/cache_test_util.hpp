#pragma once
// Helpers shared by the disk-cache tests: scratch directories and file contents.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace cache_test {

namespace fs = std::filesystem;

// A directory name under the temp dir that does not exist yet.
inline fs::path fresh_dir(const char* tag) {
  const fs::path d = fs::temp_directory_path() /
                     ("normjit-test-" + std::string(tag) + "-" + std::to_string(std::random_device{}()));
  fs::remove_all(d);
  return d;
}

// The files in `dir` with extension `ext` (none when the directory does not exist).
inline std::vector<fs::path> entries(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ext) out.push_back(it->path());
  return out;
}

inline size_t count_ext(const fs::path& dir, const std::string& ext) { return entries(dir, ext).size(); }

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace cache_test
