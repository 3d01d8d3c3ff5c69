#pragma once
// Scratch device buffers, random fills, event timing and a backward's inputs: what normjit-bench
// and the runtime's tune-on-a-miss share to time kernels on random data. Internal (not installed).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "normjit/compiler.hpp"
#include "normjit/driver.hpp"
#include "normjit/error.hpp"
#include "normjit/runtime.hpp"
#include "runtime/fill_source.hpp"

namespace normjit::detail {

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) NORMJIT_CU_CTX(cuMemAlloc(&ptr, n), "allocating " + std::to_string(n) + " bytes");
  }
  ~DeviceBuffer() {
    if (ptr) driver().cuMemFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr); }
};

// Uniform random values from a counter hash (fresh per seed), one kernel per dtype.
class FillKernels {
 public:
  FillKernels(const Target& target, int sm_count) : grid_(static_cast<unsigned>(sm_count) * 8) {
    GeneratedSource src;
    src.spec = "normjit.fill";
    src.kernel_name = "normjit_fill";
    src.source = kFillSource;
    const CompileResult r = compile(src, target);
    NORMJIT_CU(cuModuleLoadData(&module_, r.binary.image.data()));
    NORMJIT_CU(cuModuleGetFunction(&fill_[0], module_, "fill_f32"));
    NORMJIT_CU(cuModuleGetFunction(&fill_[1], module_, "fill_f16"));
    NORMJIT_CU(cuModuleGetFunction(&fill_[2], module_, "fill_bf16"));
  }
  ~FillKernels() { driver().cuModuleUnload(module_); }
  FillKernels(const FillKernels&) = delete;
  FillKernels& operator=(const FillKernels&) = delete;
  // offset - scale <= values < offset + scale, on the legacy stream.
  void run(void* out, DType d, long long n, unsigned seed, float scale, float offset) const {
    CUfunction f = fill_[d == DType::kF32 ? 0 : d == DType::kF16 ? 1 : 2];
    void* args[] = {&out, &n, &seed, &scale, &offset};
    NORMJIT_CU(cuLaunchKernel(f, grid_, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  }

 private:
  CUmodule module_ = nullptr;
  CUfunction fill_[3] = {};
  unsigned grid_;
};

struct Events {
  CUevent start = nullptr, stop = nullptr;
  Events() {
    NORMJIT_CU(cuEventCreate(&start, CU_EVENT_DEFAULT));
    NORMJIT_CU(cuEventCreate(&stop, CU_EVENT_DEFAULT));
  }
  ~Events() {
    driver().cuEventDestroy(start);
    driver().cuEventDestroy(stop);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// The median of samples (the upper one of an even count).
inline double median_of(std::vector<double> samples) {
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

// Median over `reps` batches of `batch` calls of fn(i), in microseconds per call, after `warmup`
// calls. The events go on `stream`, which must be the stream fn works on.
template <class Fn>
double time_median_us(int warmup, int reps, int batch, Fn&& fn, CUstream stream = nullptr) {
  Events ev;
  int counter = 0;
  for (int i = 0; i < warmup; ++i) fn(counter++);
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    NORMJIT_CU(cuEventRecord(ev.start, stream));
    for (int b = 0; b < batch; ++b) fn(counter++);
    NORMJIT_CU(cuEventRecord(ev.stop, stream));
    NORMJIT_CU(cuEventSynchronize(ev.stop));
    float ms = 0;
    NORMJIT_CU(cuEventElapsedTime(&ms, ev.start, ev.stop));
    per_call.push_back(1000.0 * ms / batch);
  }
  return median_of(std::move(per_call));
}

// Turns the LaunchArgs of the forward that fed a backward (x, mean, beta, y) into the backward's
// inputs: no y, and beta only where the backward reads it (a bias, with a gelu epilogue or
// memory_efficient). A memory_efficient backward reads `forward_y`, the forward's y kept where dx
// will not overwrite it, in place of x, and no mean; other backwards ignore forward_y.
inline void set_backward_inputs(const Spec& spec, LaunchArgs& a, const void* beta, void* forward_y) {
  a.y = nullptr;
  a.beta = spec.has_bias && (spec.epilogue == Epilogue::kGelu || spec.memory_efficient) ? beta : nullptr;
  if (spec.memory_efficient) {
    a.x = nullptr;
    a.mean = nullptr;
    a.y = forward_y;
  }
}

}  // namespace normjit::detail
