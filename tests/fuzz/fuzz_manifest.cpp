// libFuzzer target: the manifest reader on arbitrary bytes. It must either throw
// Error(kInvalidSpec) naming a line, or return specs that each round-trip.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "tools/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    for (const normjit::Spec& s : normjit::tools::parse_manifest(in, "fuzz"))
      if (normjit::Spec::parse(s.str()) != s) std::abort();
  } catch (const normjit::Error& e) {
    if (e.status() != normjit::Status::kInvalidSpec) std::abort();
    if (std::string(e.what()).find("fuzz:") == std::string::npos) std::abort();
  }
  return 0;
}
