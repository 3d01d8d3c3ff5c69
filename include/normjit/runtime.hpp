#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "normjit/compiler.hpp"
#include "normjit/driver.hpp"
#include "normjit/error.hpp"
#include "normjit/spec.hpp"

namespace normjit {

// Raw device pointers and sizes for one launch. Layouts are row-major.
struct LaunchArgs {
  const void* x = nullptr;  // [rows, row_stride] x dtype, first n columns read
  const void* gamma = nullptr;  // [n] weight dtype
  const void* beta = nullptr;   // [n] weight dtype; required iff spec.has_bias
  void* y = nullptr;            // [rows, row_stride] x dtype, first n columns written
  float* mean = nullptr;        // [rows] f32; LayerNorm training only
  float* rstd = nullptr;        // [rows] f32; training only
  int64_t rows = 0;
  int64_t row_stride = 0;       // elements between rows of x and y; >= n
  float eps = 1e-5f;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  int l2_bytes = 0;
  int driver_version = 0;
};

class Kernel {
 public:
  const Spec& spec() const { return spec_; }
  const std::string& name() const { return spec_string_; }
  // Validates every argument against the spec (naming the field and value), then launches.
  // A thread with no current context gets the runtime's; another context is an error.
  void launch(const LaunchArgs& args, CUstream stream = nullptr) const;
  // Checks only; throws Error(kInvalidArgument) naming the field. Exposed for tests.
  void validate(const LaunchArgs& args) const;
  int threads_per_cta() const { return threads_per_cta_; }

 private:
  friend class Runtime;
  Spec spec_;
  std::string spec_string_;
  CUfunction function_ = nullptr;
  CUcontext context_ = nullptr;  // the device's primary context, where the module lives
  int threads_per_cta_ = 0;
  int rows_per_cta_ = 0;
};

struct RuntimeCounters {
  uint64_t memory_hits = 0;  // found in the in-process cache
  uint64_t disk_hits = 0;    // loaded from the disk cache
  uint64_t compiles = 0;     // compiled with NVRTC
};

class Runtime {
 public:
  // Creates a runtime bound to a device's primary context. Throws Error(kDriverUnavailable) when
  // there is no driver or GPU. cache_dir defaults to DiskCache::default_dir().
  explicit Runtime(int device = 0, std::filesystem::path cache_dir = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The kernel for a spec (block config from the heuristic when absent). Thread-safe; the
  // reference stays valid for the runtime's lifetime.
  const Kernel& get(const Spec& spec);
  // Picks the vector width the pointers' alignment allows, then gets and launches.
  void launch(const Spec& spec, const LaunchArgs& args, CUstream stream = nullptr);

  const DeviceInfo& device() const { return device_; }
  Target target() const { return target_; }
  RuntimeCounters counters() const;
  DiskCache& disk_cache() { return disk_cache_; }

 private:
  DeviceInfo device_;
  Target target_;
  CUdevice cu_device_ = 0;
  CUcontext context_ = nullptr;
  DiskCache disk_cache_;
  mutable std::mutex mutex_;
  // Keyed by the packed fields of the resolved spec: building the string form costs more than
  // the whole lookup.
  std::unordered_map<uint64_t, std::unique_ptr<Kernel>> kernels_;
  std::vector<CUmodule> modules_;
  RuntimeCounters counters_;
};

// Checks launch arguments against a resolved spec; throws Error(kInvalidArgument) naming the
// field and its value. Needs no GPU.
void validate_launch(const Spec& resolved_spec, const LaunchArgs& args);

// Largest vector width (elements) that the pointers, stride and n allow for this spec's dtypes.
int max_vec_for(const Spec& spec, const LaunchArgs& args);

}  // namespace normjit
