// libFuzzer target: Spec::parse on arbitrary bytes. It must either throw Error(kInvalidSpec) or
// return a spec that round-trips through str() and that resolve() completes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "normjit/error.hpp"
#include "normjit/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  normjit::Spec spec;
  try {
    spec = normjit::Spec::parse(text);
  } catch (const normjit::Error& e) {
    if (e.status() != normjit::Status::kInvalidSpec) std::abort();
    return 0;
  }
  if (normjit::Spec::parse(spec.str()) != spec) std::abort();
  for (int sm : {80, 90}) {
    const normjit::Spec resolved = normjit::resolve(spec, 16, sm);
    if (!resolved.block || normjit::Spec::parse(resolved.str()) != resolved) std::abort();
  }
  return 0;
}
