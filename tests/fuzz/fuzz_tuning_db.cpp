// libFuzzer target: the tuning-database reader on arbitrary bytes. It must either throw
// Error(kInvalidArgument) naming the file, or return a database that writes and reads back equal.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "normjit/error.hpp"
#include "normjit/tuning.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const normjit::TuningDb db = normjit::TuningDb::parse(text, "fuzz.json");
    const std::string dumped = db.dump();
    if (normjit::TuningDb::parse(dumped, "again").dump() != dumped) std::abort();
  } catch (const normjit::Error& e) {
    if (e.status() != normjit::Status::kInvalidArgument) std::abort();
    if (std::string(e.what()).find("fuzz.json") == std::string::npos) std::abort();
  }
  return 0;
}
