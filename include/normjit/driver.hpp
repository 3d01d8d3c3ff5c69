#pragma once
// The CUDA Driver API, loaded from libcuda at run time so normjit works on machines without a
// driver until something needs a GPU. cuda.h is used for its types and prototypes only.
#include <cuda.h>

#include <string>

namespace normjit {

// Names go through cuda.h's macros before dlsym, so each entry loads the symbol its prototype
// describes: cuStreamBeginCapture -> cuStreamBeginCapture_v2 (takes a capture mode),
// cuGraphInstantiate -> cuGraphInstantiateWithFlags (CUDA 12+ signature: exec, graph, flags).
#define NORMJIT_DRIVER_FUNCTIONS(X) \
  X(cuInit)                         \
  X(cuDriverGetVersion)             \
  X(cuDeviceGetCount)               \
  X(cuDeviceGet)                    \
  X(cuDeviceGetName)                \
  X(cuDeviceGetAttribute)           \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease)      \
  X(cuCtxSetCurrent)                \
  X(cuCtxGetCurrent)                \
  X(cuCtxSynchronize)               \
  X(cuModuleLoadData)               \
  X(cuModuleUnload)                 \
  X(cuModuleGetFunction)            \
  X(cuFuncSetAttribute)             \
  X(cuFuncGetAttribute)             \
  X(cuLaunchKernel)                 \
  X(cuLaunchKernelEx)               \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuOccupancyMaxActiveClusters)   \
  X(cuGetErrorName)                 \
  X(cuGetErrorString)               \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuMemcpyHtoD)                   \
  X(cuMemcpyDtoH)                   \
  X(cuMemcpyDtoDAsync)              \
  X(cuMemsetD8)                     \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy)                \
  X(cuStreamSynchronize)            \
  X(cuStreamBeginCapture)           \
  X(cuStreamIsCapturing)            \
  X(cuStreamEndCapture)             \
  X(cuGraphInstantiate)             \
  X(cuGraphUpload)                  \
  X(cuGraphLaunch)                  \
  X(cuGraphExecDestroy)             \
  X(cuGraphDestroy)                 \
  X(cuEventCreate)                  \
  X(cuEventDestroy)                 \
  X(cuEventRecord)                  \
  X(cuEventSynchronize)             \
  X(cuEventElapsedTime)

struct DriverApi {
#define NORMJIT_DECLARE_PFN(name) decltype(&::name) name = nullptr;
  NORMJIT_DRIVER_FUNCTIONS(NORMJIT_DECLARE_PFN)
#undef NORMJIT_DECLARE_PFN
};

// Loads libcuda once and calls cuInit. Throws Error(kDriverUnavailable) saying plainly that a GPU
// driver is needed, and why it was not found.
const DriverApi& driver();
// True when libcuda loads, cuInit succeeds and at least one device exists. Never throws.
bool gpu_available(std::string* why_not = nullptr);

// Throws Error(kCudaError) naming the call, the error name and text, and `context`.
void check_cu(CUresult result, const char* call, const std::string& context = {});

}  // namespace normjit

// One check macro for the Driver API: NORMJIT_CU(cuFoo(args...)) through the loaded table.
#define NORMJIT_CU(call_expr) ::normjit::check_cu(::normjit::driver().call_expr, #call_expr)
// The context string is built only on failure: this runs on every launch.
#define NORMJIT_CU_CTX(call_expr, context)                                                \
  do {                                                                                   \
    const CUresult nj_cu_result_ = ::normjit::driver().call_expr;                        \
    if (nj_cu_result_ != CUDA_SUCCESS) ::normjit::check_cu(nj_cu_result_, #call_expr, context); \
  } while (0)
