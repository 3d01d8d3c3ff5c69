#include "normjit/runtime.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "../templates/normjit/params.h"
#include "runtime/log.hpp"

namespace normjit {
namespace {

std::string hex_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int access_bytes(int vec, DType d) { return std::min(16, vec * dtype_size(d)); }

}  // namespace

// Every field of a resolved spec in one word (n < 2^19, block fields < 2^11 each).
uint64_t packed_key(const Spec& s) {
  const BlockConfig& b = *s.block;
  uint64_t k = static_cast<uint64_t>(s.n);                                   // 19 bits
  k = k << 2 | static_cast<uint64_t>(s.norm);
  k = k << 2 | static_cast<uint64_t>(s.phase);
  k = k << 2 | static_cast<uint64_t>(s.x_dtype);
  k = k << 2 | static_cast<uint64_t>(s.w_dtype);
  k = k << 1 | static_cast<uint64_t>(s.has_bias);
  k = k << 3 | static_cast<uint64_t>(s.epilogue);
  k = k << 11 | static_cast<uint64_t>(b.threads_per_row);
  k = k << 11 | static_cast<uint64_t>(b.rows_per_cta);
  k = k << 5 | static_cast<uint64_t>(b.vec);
  k = k << 2 | static_cast<uint64_t>(b.cache);
  return k;  // 19 + 2+2+2+2+1+3 + 11+11+5+2 = 60 bits
}

int max_vec_for(const Spec& spec, const LaunchArgs& a) {
  int vec = 16 / dtype_size(spec.x_dtype);
  auto ok = [&](int v) {
    const int xb = access_bytes(v, spec.x_dtype), wb = access_bytes(v, spec.w_dtype);
    return spec.n % v == 0 && a.row_stride % v == 0 && aligned(a.x, xb) && aligned(a.y, xb) && aligned(a.gamma, wb) &&
           aligned(a.beta, wb);
  };
  while (vec > 1 && !ok(vec)) vec /= 2;
  return vec;
}

void Kernel::validate(const LaunchArgs& a) const { validate_launch(spec_, a); }

void validate_launch(const Spec& s, const LaunchArgs& a) {
  if (!s.block) throw Error(Status::kInvalidArgument, "validate_launch(" + s.str() + "): spec has no block config; resolve() it");
  // Strings are built only on failure: this runs on every launch.
  auto fail = [&](const std::string& what) {
    throw Error(Status::kInvalidArgument, "launch of " + s.str() + ": " + what);
  };
  const bool training = s.phase == Phase::kForwardTraining;
  const bool wants_mean = training && s.norm == Norm::kLayerNorm;
  if (!a.x) fail("x is null");
  if (!a.y) fail("y is null");
  if (!a.gamma) fail("gamma is null");
  if (s.has_bias && !a.beta) fail("beta is null but the spec has a bias");
  if (!s.has_bias && a.beta) fail("beta=" + hex_ptr(a.beta) + " is given but the spec has no bias (add .bias)");
  if (wants_mean && !a.mean) fail("mean is null; LayerNorm training writes mean");
  if (!wants_mean && a.mean) fail("mean=" + hex_ptr(a.mean) + " is given but " + to_string(s.phase) + " " + to_string(s.norm) + " writes no mean");
  if (training && !a.rstd) fail("rstd is null; training writes rstd");
  if (!training && a.rstd) fail("rstd=" + hex_ptr(a.rstd) + " is given but inference writes no rstd");
  if (a.rows < 0) fail("rows=" + std::to_string(a.rows) + " is negative");
  const int64_t max_rows = int64_t(0x7fffffff) * s.block->rows_per_cta;
  if (a.rows > max_rows) fail("rows=" + std::to_string(a.rows) + " exceeds " + std::to_string(max_rows));
  if (a.row_stride < s.n) fail("row_stride=" + std::to_string(a.row_stride) + " is less than n=" + std::to_string(s.n));
  if (!std::isfinite(a.eps) || a.eps <= 0.f) fail("eps=" + std::to_string(a.eps) + " must be finite and > 0");
  const int vec = s.block->vec;
  if (a.row_stride % vec != 0)
    fail("row_stride=" + std::to_string(a.row_stride) + " is not a multiple of vec=" + std::to_string(vec) +
         " (use Runtime::launch to pick a narrower vector, or a spec with a smaller vec)");
  const int xb = access_bytes(vec, s.x_dtype), wb = access_bytes(vec, s.w_dtype);
  auto check_align = [&](const char* field, const void* p, int bytes) {
    if (p && !aligned(p, bytes))
      fail(std::string(field) + "=" + hex_ptr(p) + " is not aligned to " + std::to_string(bytes) + " bytes (vec=" +
           std::to_string(vec) + ")");
  };
  check_align("x", a.x, xb);
  check_align("y", a.y, xb);
  check_align("gamma", a.gamma, wb);
  check_align("beta", a.beta, wb);
  check_align("mean", a.mean, 4);
  check_align("rstd", a.rstd, 4);
}

void Kernel::launch(const LaunchArgs& a, CUstream stream) const {
  validate(a);
  if (a.rows == 0) return;
  CUcontext current = nullptr;
  NORMJIT_CU(cuCtxGetCurrent(&current));
  if (current == nullptr) {
    NORMJIT_CU(cuCtxSetCurrent(context_));
  } else if (current != context_) {
    throw Error(Status::kInvalidArgument, "launch of " + spec_string_ +
                                              ": the calling thread's current CUDA context is not the primary "
                                              "context of the device this kernel was loaded on");
  }
  FwdParams p{a.x, a.gamma, a.beta, a.y, a.mean, a.rstd, a.rows, a.row_stride, a.eps};
  void* params[] = {&p};
  const unsigned grid = static_cast<unsigned>((a.rows + rows_per_cta_ - 1) / rows_per_cta_);
  NORMJIT_CU_CTX(cuLaunchKernel(function_, grid, 1, 1, threads_per_cta_, 1, 1, 0, stream, params, nullptr),
                 "launching " + spec_string_);
}

Runtime::Runtime(int device, std::filesystem::path cache_dir) : disk_cache_(std::move(cache_dir)) {
  const DriverApi& cu = driver();
  int count = 0;
  NORMJIT_CU(cuDeviceGetCount(&count));
  if (device < 0 || device >= count)
    throw Error(Status::kInvalidArgument,
                "device=" + std::to_string(device) + " is out of range: " + std::to_string(count) + " GPU(s) visible");
  NORMJIT_CU(cuDeviceGet(&cu_device_, device));
  char name[256] = {};
  NORMJIT_CU(cuDeviceGetName(name, sizeof(name), cu_device_));
  device_.ordinal = device;
  device_.name = name;
  NORMJIT_CU(cuDeviceGetAttribute(&device_.sm_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&device_.sm_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&device_.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&device_.l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, cu_device_));
  NORMJIT_CU(cuDriverGetVersion(&device_.driver_version));
  if (device_.sm_major < 8)
    throw Error(Status::kNotSupported, "device " + std::to_string(device) + " (" + device_.name + ") is sm_" +
                                           std::to_string(device_.sm_major * 10 + device_.sm_minor) +
                                           "; normjit needs sm_80 or newer");
  target_ = Target{device_.sm_major * 10 + device_.sm_minor};
  NORMJIT_CU(cuDevicePrimaryCtxRetain(&context_, cu_device_));
  NORMJIT_CU(cuCtxSetCurrent(context_));
  (void)cu;
  detail::log().info("runtime on device {} ({}, {}, {} SMs), cache {}", device, device_.name, target_.str(),
                     device_.sm_count, disk_cache_.dir().string());
}

Runtime::~Runtime() {
  // Never throw from a destructor; the driver may already be shutting down at exit.
  const DriverApi& cu = driver();
  for (CUmodule module : modules_) cu.cuModuleUnload(module);
  if (context_) cu.cuDevicePrimaryCtxRelease(cu_device_);
}

const Kernel& Runtime::get(const Spec& spec) {
  const Spec resolved = resolve(spec);
  const uint64_t key = packed_key(resolved);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = kernels_.find(key); it != kernels_.end()) {
    ++counters_.memory_hits;
    return *it->second;
  }
  const std::string name = resolved.str();
  const CacheCounters before = disk_cache_.counters();
  const Binary binary = disk_cache_.get_or_compile(resolved, target_);
  const CacheCounters after = disk_cache_.counters();
  if (after.compiles > before.compiles)
    ++counters_.compiles;
  else
    ++counters_.disk_hits;
  NORMJIT_CU(cuCtxSetCurrent(context_));
  CUmodule module = nullptr;
  NORMJIT_CU_CTX(cuModuleLoadData(&module, binary.image.data()), "loading " + name + " (" + binary.arch + ")");
  auto kernel = std::make_unique<Kernel>();
  NORMJIT_CU_CTX(cuModuleGetFunction(&kernel->function_, module, binary.kernel_name.c_str()), "loading " + name);
  modules_.push_back(module);
  kernel->context_ = context_;
  kernel->spec_ = resolved;
  kernel->spec_string_ = name;
  kernel->threads_per_cta_ = binary.threads_per_cta;
  kernel->rows_per_cta_ = binary.rows_per_cta;
  return *(kernels_[key] = std::move(kernel));
}

void Runtime::launch(const Spec& spec, const LaunchArgs& args, CUstream stream) {
  const Spec resolved = spec.block ? spec : resolve(spec, max_vec_for(spec, args));
  get(resolved).launch(args, stream);
}

RuntimeCounters Runtime::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace normjit
