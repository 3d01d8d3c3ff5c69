#pragma once
// Manifest files: one spec per line; '#' starts a comment; blank lines are ignored.
#include <fstream>
#include <istream>
#include <string>
#include <vector>

#include "normjit/error.hpp"
#include "normjit/spec.hpp"

namespace normjit::tools {

// `name` prefixes errors (file:line: ...).
inline std::vector<Spec> parse_manifest(std::istream& in, const std::string& name) {
  std::vector<Spec> specs;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    try {
      specs.push_back(Spec::parse(line.substr(first, last - first + 1)));
    } catch (const Error& e) {
      throw Error(Status::kInvalidSpec, name + ":" + std::to_string(number) + ": " + e.what());
    }
  }
  return specs;
}

inline std::vector<Spec> read_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Status::kInvalidArgument, "manifest '" + path + "' cannot be opened");
  return parse_manifest(in, path);
}

}  // namespace normjit::tools
