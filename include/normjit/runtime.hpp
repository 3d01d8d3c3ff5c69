#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "normjit/compiler.hpp"
#include "normjit/driver.hpp"
#include "normjit/error.hpp"
#include "normjit/generic.hpp"
#include "normjit/spec.hpp"
#include "normjit/tuning.hpp"

namespace normjit {

struct NormParams;  // templates/normjit/params.h

// The layout of a block-scaled epilogue's scales: the [rows, cols] scale matrix (cols =
// ceil(n / block), block 32 or NVFP4's 16) row-major, or swizzled as cuBLASLt and CUTLASS read
// block scales (their "1D block scaling factors layout"): padded to [roundup(rows, 128),
// roundup(cols, 4)], in tiles of 128 rows x 4 columns stored as 512 contiguous bytes, tiles in
// row-major order, scale (r, c) of a tile at byte (r % 32) * 16 + (r / 32) * 4 + c
// (templates/normjit/block_scale_layout.h). The kernels write only real scales: a caller of the
// swizzled layout zero-fills the padding (or leaves it to a GEMM that ignores it).
enum class BlockScaleLayout { kRowMajor = 0, kSwizzled = 1 };
const char* to_string(BlockScaleLayout v);

// Raw device pointers and sizes for one launch. Row-major; x, y, dy and dx share row_stride.
// Pointers a spec does not use must stay null (a non-null one is reported as a mismatch).
struct LaunchArgs {
  // Forward and backward inputs.
  const void* x = nullptr;      // [rows, row_stride] x dtype, first n columns used
  const void* gamma = nullptr;  // [n] weight dtype; AdaLayerNorm: [rows / rows_per_batch, n]
  const void* beta = nullptr;   // like gamma. Forward: iff has_bias. Backward: iff has_bias and the
                                // epilogue recomputes its input (gelu) or the spec is memory_efficient
  float* mean = nullptr;        // [rows] f32. LayerNorm/AdaLN: forward training writes, backward reads
  float* rstd = nullptr;        // [rows] f32. Forward training writes, backward reads
  // Forward output; the input of a memory_efficient backward (in place of x; no mean either).
  void* y = nullptr;  // [rows, row_stride] x dtype
  // Backward.
  const void* dy = nullptr;      // [rows, row_stride] x dtype
  void* dx = nullptr;            // [rows, row_stride] x dtype
  void* dgamma = nullptr;        // like gamma, weight dtype
  void* dbeta = nullptr;         // like gamma, weight dtype; iff has_bias
  void* workspace = nullptr;     // Kernel::workspace_bytes(rows, rows_per_batch) bytes, 16-byte aligned
  size_t workspace_bytes = 0;
  // relu_bitmask epilogue.
  uint8_t* mask = nullptr;  // [rows, ceil(n / 8)] uint8; forward writes, backward reads
  // residual specs. Forward: h = x (+ bias_in) + residual is written and normalized; backward (x
  // is h): dx = dnorm(dy) + dh_out, the gradient of both x and residual. All [rows, row_stride],
  // in the stream's dtype: x's, or f32 for .residual_f32 (row_dtype()).
  const void* residual = nullptr;  // forward input
  void* h = nullptr;               // forward output
  const void* dh_out = nullptr;    // backward input: the gradient arriving on h
  // .residual_f32 backward: dx unrounded (the gradient of the fp32 residual), [rows, row_stride]
  // f32, beside dx in x's dtype (the gradient of x).
  void* dresidual = nullptr;
  // .bias_in forward: [n] weight dtype, added with the residual (h = x + bias_in + residual).
  const void* bias_in = nullptr;
  // fp8_e4m3 / fp8_e5m2 forward: y_quant gets the FP8 codes of y * *quant_scale ([rows,
  // row_stride] bytes); amax (optional) folds in max |y| (atomicMax; initialize it); y itself is
  // optional for these specs (written where given).
  // fp8_e4m3_row / fp8_e5m2_row / int8_row forward: y_quant gets the codes of y / row_scales[row]
  // and row_scales ([rows] f32) each row's amax / qmax; no quant_scale or amax.
  void* y_quant = nullptr;
  const float* quant_scale = nullptr;
  float* amax = nullptr;
  float* row_scales = nullptr;
  // mxfp8_e4m3 / mxfp8_e5m2 forward: y_quant gets the codes of y / X, block_scales ([rows,
  // ceil(n / 32)] bytes, row-major) the E8M0 code of each 32-value block's X.
  // mxfp4: the same with e2m1 codes, two a byte (first element in the low nibble): row r's n / 2
  // bytes at y_quant + r * row_stride / 2 (n and row_stride even). nvfp4: e2m1 codes likewise,
  // an e4m3 scale per 16 values in block_scales ([rows, ceil(n / 16)]), and quant_scale the
  // fp32 tensor scale S_enc (448 * 6 / amax(tensor)).
  uint8_t* block_scales = nullptr;
  float clip_lower = 0.f;
  float clip_upper = INFINITY;
  // Block-scaled epilogues (mxfp8_*, mxfp4, nvfp4): where block_scales' entries go (see
  // BlockScaleLayout); block_scale_bytes() gives the buffer's size. Others keep the default.
  BlockScaleLayout block_scale_layout = BlockScaleLayout::kRowMajor;
  int64_t rows = 0;
  int64_t row_stride = 0;      // elements between rows; >= n
  int64_t rows_per_batch = 0;  // AdaLayerNorm: S of x [B, S, n] (rows = B * S); otherwise 0
  float eps = 1e-5f;           // forward only
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  int l2_bytes = 0;
  int driver_version = 0;
  double dram_gb_per_s = 0;  // peak, from the memory clock and bus width (0: not reported)
};

class Kernel {
 public:
  const Spec& spec() const { return spec_; }
  const std::string& name() const { return spec_string_; }
  // Validates every argument against the spec (naming the field and value), then launches:
  // one kernel forward, two or three backward (the last reduces dgamma/dbeta in fixed order). On
  // sm_90+ every kernel, a clustered first one aside, is a programmatic dependent of the kernel
  // before it in the stream: it may launch during that kernel's tail and waits for it on the device.
  // A thread with no current context gets the runtime's; another context is an error.
  void launch(const LaunchArgs& args, CUstream stream = nullptr) const;
  // Checks only; throws Error(kInvalidArgument) naming the field.
  void validate(const LaunchArgs& args) const;
  // Backward scratch for these sizes (0 for forward).
  size_t workspace_bytes(int64_t rows, int64_t rows_per_batch = 0) const;
  int threads_per_cta() const { return threads_per_cta_; }
  // Local memory per thread (stack frame and register spills) of the spec's kernels, the largest of
  // them: 0 for every configuration the heuristic picks (CI gates it); tuners skip candidates above 0.
  // Read from the cubin's records (the driver's attribute for a PTX image, which it JIT-compiled).
  int local_memory_bytes() const { return local_memory_bytes_; }
  // What launch() hands cuLaunchKernel for a forward spec (the function, grid, block, dynamic
  // shared memory and packed parameters), so a caller can time a raw cuLaunchKernel of it.
  struct RawLaunch {
    CUfunction function = nullptr;
    unsigned grid_x = 0, threads = 0, dynamic_smem_bytes = 0;
    std::vector<unsigned char> params;  // one NormParams, passed by value
  };
  RawLaunch raw_forward_launch(const LaunchArgs& args) const;

 private:
  friend class Runtime;
  struct BackwardPlan {
    int64_t groups = 1, rows_per_group = 0, slots = 0, row_chunk = 0, col_tiles = 0;
    size_t workspace_bytes = 0;
  };
  BackwardPlan plan(int64_t rows, int64_t rows_per_batch) const;
  void check_workspace(const LaunchArgs& args, const BackwardPlan& plan) const;
  // The kernel parameters for these arguments (the backward's slots and chunks come from its plan).
  NormParams params_for(const LaunchArgs& args) const;
  unsigned forward_grid(int64_t rows) const;

  Spec spec_;
  std::string spec_string_;
  CUfunction function_ = nullptr;  // forward; backward: fused, or row sums on the split route
  CUfunction tiles_ = nullptr;     // backward split route
  CUfunction reduce_ = nullptr;    // backward
  CUcontext context_ = nullptr;    // the device's primary context, where the module lives
  int threads_per_cta_ = 0;
  int rows_per_cta_ = 0;
  // smem and pipe rows: shared_row_bytes(); memory_efficient rows in registers: xhat_table_bytes()
  unsigned dynamic_smem_bytes_ = 0;
  int resident_ctas_ = 0;          // function_'s CTAs (clusters, when clustered) resident on the GPU at once
  int sm_count_ = 0;
  // sm_90+: the backward's later kernels are launched as programmatic dependents of the one
  // before, so their launch overlaps its tail; they wait for its results on the device.
  bool dependent_launch_ = false;
  // The first kernel (forward or backward, unclustered) too, as a dependent of the stream's
  // previous kernel.
  bool first_dependent_ = false;
  int local_memory_bytes_ = 0;
};

struct RuntimeCounters {
  uint64_t memory_hits = 0;  // found in the in-process cache
  uint64_t disk_hits = 0;    // loaded from the disk cache
  uint64_t compiles = 0;     // compiled with NVRTC
  // Time spent on misses of the in-process cache: getting the image (disk read and checksum, or a
  // compile), and the driver's module load (cuModuleLoadData and cuModuleGetFunction).
  double image_seconds = 0;
  double module_seconds = 0;
  uint64_t generic_launches = 0;     // launches that ran a generic kernel (generic or async mode)
  uint64_t background_compiles = 0;  // specialized kernels compiled in the background and loaded (async mode)
};

class Runtime {
 public:
  // Creates a runtime bound to a device's primary context. Throws Error(kDriverUnavailable) when
  // there is no driver or GPU. cache_dir defaults to DiskCache::default_dir().
  explicit Runtime(int device = 0, std::filesystem::path cache_dir = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The kernel for a spec. A spec without a block config takes the tuning database's winner for
  // this device when the tuning mode is db (see tuning.hpp), else the heuristic's. Thread-safe;
  // the reference stays valid for the runtime's lifetime.
  const Kernel& get(const Spec& spec);
  // The block config get() would use, for pointers that allow vectors of max_vec elements.
  Spec choose(const Spec& spec, int max_vec = 16) const;
  // The tuning database key of a spec on this device.
  TuningKey tuning_key(const Spec& spec) const;
  TuningMode tuning_mode() const { return tuning_mode_; }
  // NORMJIT_TUNING_DB, else tuning.json in the cache directory; empty when that directory is not
  // usable (not trusted, or cannot be created): no database is read or written then.
  const std::filesystem::path& tuning_db_path() const { return tuning_db_path_; }
  // Picks the vector width the pointers' alignment allows, then launches the spec's kernel as the
  // compile mode says (generic.hpp): sync gets (compiling or loading) the specialized kernel;
  // generic runs the generic kernel; async runs the specialized kernel where it is loaded or on disk
  // and otherwise the generic one, queuing the specialized compile in the background. Specs no
  // generic kernel covers (generic_unsupported_why, or the GPU's arch) take the sync path in async mode, and throw in
  // generic mode. A backward whose workspace is too small for the specialized kernel runs the
  // generic one in async mode (size it with workspace_bytes() before each launch).
  void launch(const Spec& spec, const LaunchArgs& args, CUstream stream = nullptr);
  // The generic kernel of a spec, whatever the mode. Its backward takes any workspace of at least
  // generic_workspace_bytes(spec, rows, rows_per_batch, 1) bytes (fewer partial slots when smaller).
  void launch_generic(const Spec& spec, const LaunchArgs& args, CUstream stream = nullptr);
  // Bytes of backward workspace launch() wants now for these sizes: the specialized kernel's where
  // the mode runs it (sync: compiling it if need be), else the generic kernel's. 0 forward.
  // max_vec: max_vec_for(spec, args) of the launch's pointers (its kernel depends on them).
  size_t workspace_bytes(const Spec& spec, int64_t rows, int64_t rows_per_batch = 0, int max_vec = 16);
  // The generic backward's workspace with its full grid of partial slots (0 forward); max_slots
  // caps the slots (the least it runs with is one a group).
  size_t generic_workspace_bytes(const Spec& spec, int64_t rows, int64_t rows_per_batch = 0,
                                 int64_t max_slots = 0);

  // NORMJIT_COMPILE_MODE when the runtime was created (sync when unset).
  CompileMode compile_mode() const { return compile_mode_.load(); }
  // async and generic load the generic kernels' modules here, not at the first launch.
  void set_compile_mode(CompileMode mode);
  // Async mode: blocks until the background compiles queued so far are done (tests, benches).
  void wait_for_background_compiles();
  // Async mode: the background compile's state of a spec (resolved as launch() would for
  // pointers allowing max_vec): kUnknown where none was queued.
  BackgroundCompiler::State background_state(const Spec& spec, int max_vec = 16);

  const DeviceInfo& device() const { return device_; }
  // The largest cluster the heuristic picks on this device (kMaxCluster or kMaxPortableCluster).
  int max_cluster() const { return max_cluster_; }
  Target target() const { return target_; }
  RuntimeCounters counters() const;
  DiskCache& disk_cache() { return disk_cache_; }

 private:
  DeviceInfo device_;
  Target target_;
  CUdevice cu_device_ = 0;
  CUcontext context_ = nullptr;
  DiskCache disk_cache_;
  // Tune on a miss (NORMJIT_TUNING=tune): times the spec's candidates on scratch buffers, records
  // the fastest in the database (merged into the file under a lock) and returns it.
  Spec tune_on_miss(const Spec& spec);
  // get()'s choice for a spec without a block config outside heuristic mode (tuning on a miss).
  Spec tuned_choice(const Spec& spec);
  // Loads a resolved spec's kernel (memoized).
  // found: the spec's lookup made by the caller (a batch), loaded instead of looking it up again.
  const Kernel& get_resolved(const Spec& resolved, const DiskCache::Lookup* found = nullptr);
  // get_resolved(resolved), where `resolved` is choose(spec, max_vec) or spec itself; falls back to
  // portable clusters where the heuristic's 16-CTA cluster cannot be co-scheduled.
  const Kernel& get_or_fall_back(const Spec& spec, const Spec& resolved, int max_vec);
  // The heuristic's largest cluster on this device.
  std::atomic<int> max_cluster_{kMaxCluster};

  TuningMode tuning_mode_ = TuningMode::kHeuristic;
  std::filesystem::path tuning_db_path_;
  mutable std::mutex tuning_mutex_;  // guards tuning_db_ and chosen_
  TuningDb tuning_db_;
  std::unordered_map<uint64_t, Spec> chosen_;  // tuned_choice() by the spec's packed fields
  mutable std::mutex mutex_;
  // Keyed by the packed fields of the resolved spec: building the string form costs more than
  // the whole lookup.
  std::unordered_map<uint64_t, std::unique_ptr<Kernel>> kernels_;
  std::vector<CUmodule> modules_;
  RuntimeCounters counters_;

  // Async mode: the specialized kernel where it is loaded, compiled in the background or on disk
  // (loading it); else nullptr, queuing its compile.
  const Kernel* async_kernel(const Spec& spec, int max_vec);
  // get_resolved() with a binary compiled in the background.
  const Kernel& load_resolved(const Spec& resolved, const Binary& binary, const std::string& name);
  // Generic kernels: one module per x dtype, loaded on first use.
  struct GenericLaunch;
  GenericLaunch generic_launch(const Spec& spec, int vec, int64_t rows, int64_t rows_per_batch,
                               size_t workspace_limit);
  // What of a generic launch depends only on the spec and vector width (mutex_ held).
  GenericLaunch generic_plan(const Spec& spec, int vec, int max_cluster);
  bool plan_generic_forward_cluster(GenericLaunch& g, const Spec& spec, int vec);
  CUlaunchConfig generic_config(const GenericLaunch& g, unsigned grid_x, CUstream stream,
                                CUlaunchAttribute (&attrs)[2]) const;
  // How many of g's clusters (g.cluster CTAs each) the GPU holds at once; `what` names the launch in an error.
  int generic_resident_clusters(const GenericLaunch& g, const std::string& what) const;
  bool carveout_launch_attribute() const { return device_.driver_version >= 12040; }
  // Whether a resolved spec's kernel is loaded in this runtime.
  bool is_loaded(const Spec& resolved) const;
  // Why no generic kernel runs the spec here (generic_unsupported_why, or this GPU's arch), or "".
  std::string generic_refusal(const Spec& spec) const;
  CUmodule generic_module(DType x, GenericProgram program);
  CUfunction generic_function(DType x, GenericProgram program, const std::string& name);
  void preload_generic_kernels();
  std::map<std::pair<DType, GenericProgram>, CUmodule> generic_modules_;
  std::map<std::string, CUfunction> generic_functions_;
  std::map<std::pair<uint64_t, int>, std::unique_ptr<GenericLaunch>> generic_plans_;  // by spec and vec
  int generic_shared_optin_ = -1;  // bytes of shared memory a generic CTA may take
  std::atomic<CompileMode> compile_mode_{CompileMode::kSync};
  // Created on the first async launch; destroyed first (its compiles use disk_cache_).
  std::mutex background_mutex_;
  std::unique_ptr<BackgroundCompiler> background_;
  BackgroundCompiler& background();
};

// The process's runtime of a device (default cache directory), created on first use and kept for
// the process's life: components of one process that share it load each kernel once. The Python
// package's paths (normjit.Runtime users aside) all use it. Thread-safe.
Runtime& shared_runtime(int device);

// Checks launch arguments against a resolved spec; throws Error(kInvalidArgument) naming the
// field and its value. Needs no GPU. (The workspace size is checked at launch.)
void validate_launch(const Spec& resolved_spec, const LaunchArgs& args);

// Largest vector width (elements) that the pointers, stride and n allow for this spec's dtypes.
int max_vec_for(const Spec& spec, const LaunchArgs& args);

// Bytes per row of the relu_bitmask mask: ceil(n / 8).
inline int64_t mask_row_bytes(int64_t n) { return (n + 7) / 8; }
// Bytes (scale codes) per row of a block-scaled epilogue's row-major scales: ceil(n / 32), NVFP4
// ceil(n / 16); 0 for the other epilogues.
inline int64_t block_scale_row_bytes(int64_t n, Epilogue e) {
  const int block = scale_block_size(e);
  return block > 0 ? (n + block - 1) / block : 0;
}
// Bytes the block_scales buffer of a launch of `rows` rows needs: rows * block_scale_row_bytes
// row-major; swizzled, the padded [roundup(rows, 128), roundup(cols, 4)] matrix.
inline int64_t block_scale_bytes(int64_t rows, int64_t n, Epilogue e, BlockScaleLayout layout) {
  const int64_t cols = block_scale_row_bytes(n, e);
  if (layout == BlockScaleLayout::kRowMajor) return rows * cols;
  return (rows + 127) / 128 * 128 * ((cols + 3) / 4 * 4);
}

}  // namespace normjit
