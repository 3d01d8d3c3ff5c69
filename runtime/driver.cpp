#include "normjit/driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "normjit/error.hpp"
#include "runtime/log.hpp"

// cuda.h maps some names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2); stringifying after
// expansion asks libcuda for the same symbol the prototype describes.
#define NORMJIT_STR(x) #x
#define NORMJIT_XSTR(x) NORMJIT_STR(x)

namespace normjit {
namespace {

struct Loaded {
  DriverApi api;
  std::string error;  // empty when usable
};

const Loaded& load() {
  static const Loaded loaded = [] {
    Loaded l;
    void* handle = nullptr;
    std::string dl_errors;
    for (const char* name : {"libcuda.so.1", "libcuda.so"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      const char* e = dlerror();
      dl_errors += std::string(dl_errors.empty() ? "" : "; ") + (e ? e : name);
    }
    if (!handle) {
      l.error = "the CUDA driver (libcuda.so.1) could not be loaded: " + dl_errors;
      return l;
    }
#define NORMJIT_LOAD_PFN(name)                                                           \
  l.api.name = reinterpret_cast<decltype(l.api.name)>(dlsym(handle, NORMJIT_XSTR(name))); \
  if (!l.api.name && l.error.empty()) l.error = "libcuda lacks " NORMJIT_XSTR(name) " (driver too old?)";
    NORMJIT_DRIVER_FUNCTIONS(NORMJIT_LOAD_PFN)
#undef NORMJIT_LOAD_PFN
    if (!l.error.empty()) return l;
    const CUresult r = l.api.cuInit(0);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      l.api.cuGetErrorName(r, &name);
      l.error = std::string("cuInit failed with ") + (name ? name : "an unknown error");
      return l;
    }
    int count = 0;
    if (l.api.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) l.error = "the CUDA driver sees no GPU";
    return l;
  }();
  return loaded;
}

}  // namespace

const DriverApi& driver() {
  const Loaded& l = load();
  if (!l.error.empty())
    throw Error(Status::kDriverUnavailable,
                "this operation needs a GPU, but " + l.error +
                    ". Generating, compiling and precompiling kernels work without one.");
  return l.api;
}

bool gpu_available(std::string* why_not) {
  const Loaded& l = load();
  if (why_not) *why_not = l.error;
  return l.error.empty();
}

void check_cu(CUresult result, const char* call, const std::string& context) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  const DriverApi& api = load().api;
  if (api.cuGetErrorName) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(result, &text);
  throw Error(Status::kCudaError, std::string(call) + " returned " + (name ? name : std::to_string(result)) + " (" +
                                      (text ? text : "no description") + ")" +
                                      (context.empty() ? "" : " while " + context));
}

}  // namespace normjit
