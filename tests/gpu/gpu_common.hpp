// Shared pieces of the GPU tests: one runtime, fresh random inputs, device buffers, and
// forward/backward runners that check against the fp64 reference.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "normjit/normjit.hpp"
#include "normjit/reference.hpp"

namespace gpu_test {
using namespace normjit;

// Listing mode (NORMJIT_GPU_TEST_LIST_SPECS=FILE; gpu_main.cpp): no GPU work. warm() and the runners
// append to FILE each resolved spec they would compile, for NORMJIT_GPU_TEST_ARCH (default 90),
// and return at once, so that the whole suite's kernels are compiled before the cases run: into a
// bundle here (scripts/gpu_test_bundle.sh), or on every core of the device (scripts/device.sh test).
inline const char* listing_file() {
  static const char* path = [] {
    const char* p = std::getenv("NORMJIT_GPU_TEST_LIST_SPECS");
    return p && *p ? p : nullptr;
  }();
  return path;
}
int listing_arch();
// Appends resolved specs to the listing file (one a line; duplicates are left to the reader).
void list_specs(const std::vector<Spec>& resolved);

inline Runtime& runtime() {
  // In listing mode a case stops at its first GPU work (its specs listed so far stay listed).
  if (listing_file()) throw std::runtime_error("listing mode (NORMJIT_GPU_TEST_LIST_SPECS): no GPU work");
  static Runtime rt(0);
  return rt;
}

inline std::mt19937_64& rng() {
  // A fresh seed each run, printed; NORMJIT_GPU_TEST_SEED replays one (with the same test case,
  // since the cases draw from one generator in order).
  static std::mt19937_64 r([] {
    const char* fixed = std::getenv("NORMJIT_GPU_TEST_SEED");
    uint64_t seed = std::random_device{}();
    if (fixed && *fixed) {
      char* end = nullptr;
      errno = 0;
      seed = std::strtoull(fixed, &end, 10);
      if (*end != '\0' || errno != 0 || *fixed == '-') {
        std::fprintf(stderr, "gpu tests: NORMJIT_GPU_TEST_SEED='%s' is not a seed (a whole number, as printed)\n",
                     fixed);
        std::exit(2);
      }
    }
    std::printf("gpu tests: seed %llu%s\n", static_cast<unsigned long long>(seed),
                fixed && *fixed ? " (NORMJIT_GPU_TEST_SEED)" : "");
    return seed;
  }());
  return r;
}

struct DeviceMem {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  explicit DeviceMem(size_t n) : bytes(std::max<size_t>(n, 16)) {
    runtime();  // its context must be current before this test's own allocations
    NORMJIT_CU(cuMemAlloc(&ptr, bytes));
  }
  ~DeviceMem() { driver().cuMemFree(ptr); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  char* get() const { return reinterpret_cast<char*>(ptr); }
  void upload(const void* src, size_t n) { NORMJIT_CU(cuMemcpyHtoD(ptr, src, n)); }
  void download(void* dst, size_t n) const { NORMJIT_CU(cuMemcpyDtoH(dst, ptr, n)); }
  void poison() { NORMJIT_CU(cuMemsetD8(ptr, 0xff, bytes)); }  // NaN in every float dtype
};

// The hidden sizes of a reference grid: `all`, or those of NORMJIT_GPU_TEST_NS (comma-separated)
// that are in it, for a targeted run after a change at a few sizes. The message says how many ran;
// a list that names none of the grid's sizes fails rather than pass with nothing checked.
inline std::vector<int64_t> grid_ns(std::vector<int64_t> all) {
  const char* env = std::getenv("NORMJIT_GPU_TEST_NS");
  if (!env || !*env) return all;
  std::vector<int64_t> chosen;
  std::stringstream list(env);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const long long n = std::strtoll(item.c_str(), &end, 10);
    REQUIRE_MESSAGE((!item.empty() && *end == '\0' && n > 0),
                    "NORMJIT_GPU_TEST_NS: '" << item << "' is not a hidden size (in '" << std::string(env) << "')");
    if (std::find(all.begin(), all.end(), n) != all.end()) chosen.push_back(n);
  }
  REQUIRE_MESSAGE(!chosen.empty(), "NORMJIT_GPU_TEST_NS=" << std::string(env) << " names none of this grid's sizes");
  MESSAGE("NORMJIT_GPU_TEST_NS=" << std::string(env) << ": " << chosen.size() << " of this grid's " << all.size()
                                 << " hidden sizes");
  return chosen;
}

// One shard of a reference grid's sizes (ascending): every `shards`-th size from the `shard`-th
// (0-based), so each shard gets its share of the long rows. A grid split over several doctest
// cases runs side by side under scripts/device.sh test, where one case a process set the suite's
// time. Empty where NORMJIT_GPU_TEST_NS leaves this shard nothing (grid_ns checked the whole grid).
inline std::vector<int64_t> grid_shard(const std::vector<int64_t>& ns, int shard, int shards) {
  std::vector<int64_t> chosen;
  for (size_t i = static_cast<size_t>(shard); i < ns.size(); i += static_cast<size_t>(shards)) chosen.push_back(ns[i]);
  if (chosen.empty())
    MESSAGE("NORMJIT_GPU_TEST_NS leaves shard " << shard + 1 << " of " << shards << " no size; its cases run in another shard");
  return chosen;
}

// Weight dtypes tested with an x dtype: the same, and the other common pairing.
inline std::vector<DType> weight_dtypes_for(DType x) {
  return x == DType::kF32 ? std::vector<DType>{DType::kF32, DType::kBF16} : std::vector<DType>{x, DType::kF32};
}

inline std::vector<char> random_tensor(DType d, int64_t count, double center, double scale) {
  std::vector<char> v(count * dtype_size(d));
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < count; ++i) reference::store(v.data(), d, i, float(center + scale * normal(rng())));
  return v;
}

// Tracks the worst |got - ref| / (atol + rtol |ref|); NaN counts as a failure.
struct Worst {
  double value = 0;
  void add(double got, double want, double atol, double rtol) {
    const double e = std::abs(got - want) / (atol + rtol * std::abs(want));
    value = std::isnan(e) ? INFINITY : std::max(value, e);
  }
};

struct Case {
  Spec spec;              // forward or backward spec (block config from the heuristic)
  int64_t rows = 1;
  int64_t row_stride = 0;      // 0: n
  int64_t x_offset = 0;        // elements: shifts x/y/dy/dx off 16-byte alignment
  int64_t rows_per_batch = 0;  // AdaLayerNorm
  double center = 0.0;         // x = center + noise
  // Weights whose scale (gamma, or 1 + gamma zero-centred) lies closer to 0 than this are set to a
  // scale of 1: memory_efficient's precondition (gamma' away from 0).
  double min_abs_scale = 0.0;
  float clip_lower = 0.f, clip_upper = 6.f;
  // Block-scaled epilogues: where the scales go (the swizzled layout's padding keeps its poison).
  BlockScaleLayout scale_layout = BlockScaleLayout::kRowMajor;
  // Optional tolerances overriding the per-dtype defaults (the seeds' own, for their cases).
  double atol = -1, rtol = -1;
};

// The backward grid's cases at these sizes: every op, x dtype with its weight dtypes, bias or not;
// 1 row, 67 (5 past 65536) and 1031 for short rows, one batch each, and 3 batches of 41 rows for
// the Ada norms up to 32768.
inline std::vector<Case> ops_grid_cases(Phase phase, const std::vector<int64_t>& ns) {
  std::vector<Case> cases;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
      for (DType w : weight_dtypes_for(x))
        for (int64_t n : ns)
          for (bool bias : {false, true}) {
            Case c;
            c.spec = Spec::make(norm, phase, x, n, bias);
            c.spec.w_dtype = w;
            for (int64_t rows : {int64_t(1), n >= 65536 ? int64_t(5) : int64_t(67), n <= 1000 ? int64_t(1031) : int64_t(0)}) {
              if (rows == 0) continue;
              c.rows = rows;
              c.rows_per_batch = is_adaptive(norm) ? rows : 0;
              cases.push_back(c);
            }
            if (is_adaptive(norm) && n <= 32768) {
              c.rows = 3 * 41;
              c.rows_per_batch = 41;
              cases.push_back(c);
            }
          }
  return cases;
}

// A pinned block config (a strategy the heuristic may not pick): 37 rows, one AdaLayerNorm
// batch, a clip the data crosses, x = center + noise.
inline Case pinned_case(const char* text, double center = 0.0) {
  Case c;
  c.spec = Spec::parse(text);
  c.rows = 37;
  c.rows_per_batch = is_adaptive(c.spec.norm) ? 37 : 0;
  c.clip_upper = 1.5f;
  c.center = center;
  return c;
}

inline int64_t groups_of(const Case& c) {
  return is_adaptive(c.spec.norm) ? c.rows / c.rows_per_batch : 1;
}

// Everything a forward run produced, on the host.
struct ForwardRun {
  std::vector<char> x, gamma, beta, y;
  std::vector<float> mean, rstd;
  std::vector<uint8_t> mask;
  double worst = 0;          // y, mean, rstd against the reference
  int64_t mask_mismatches = 0;  // mask vs (lower < y < upper) of the y the GPU stored
  int64_t mask_ref_mismatches = 0;  // mask vs the reference, away from the clip boundaries
  // fp8_* specs: codes checked against the reference's y * scale encoded on the host (exact,
  // unless that value lies within 1e-5 of a rounding boundary), and amax against max |y|.
  double row_scale_rel_err = 0;  // *_row: worst |scale - amax(row) / qmax| / (amax(row) / qmax)
  int64_t quant_checked = 0, quant_mismatches = 0, quant_ambiguous = 0;
  std::string quant_first_mismatch;  // ambiguous: on a rounding boundary
  // Where the boundary codes sit: the rows with the most of them (count, the row's largest |y|, the
  // multiplier) and their first values (y, y * multiplier, the window's half-width).
  std::string quant_ambiguous_where;
  double amax_rel_err = 0;
  float quant_scale = 0;
  // residual specs: h as the GPU wrote it (in the stream's dtype, row_dtype), and its elements that
  // differ from x (+ bias_in) + residual summed in fp32 and rounded once (bit for bit; the reference
  // normalizes that sum).
  std::vector<char> h;
  int64_t h_mismatches = 0;
};

// While set, run_forward / run_backward launch the generic kernels (Runtime::launch_generic).
inline bool& use_generic_kernels() {
  static bool on = false;
  return on;
}
// While set, they launch through this runtime's Runtime::launch (its compile mode) instead.
inline Runtime*& launch_through() {
  static Runtime* rt = nullptr;
  return rt;
}
struct GenericKernelsOn {
  GenericKernelsOn() { use_generic_kernels() = true; }
  ~GenericKernelsOn() { use_generic_kernels() = false; }
};
// While alive, run_forward / run_backward launch through `rt` (launch_through).
struct LaunchingThrough {
  explicit LaunchingThrough(Runtime& rt) { launch_through() = &rt; }
  ~LaunchingThrough() { launch_through() = nullptr; }
  LaunchingThrough(const LaunchingThrough&) = delete;
  LaunchingThrough& operator=(const LaunchingThrough&) = delete;
};

ForwardRun run_forward(const Case& c);

// The quantized-output grids (test_forward_gpu.cpp) and the fusion grids (test_fusions_gpu.cpp):
// generic, through the generic kernels (no NVRTC), else through the specialized ones.
void check_fp8_grid(bool generic);
void check_row_quant_grid(bool generic);
void check_mxfp8_grid(bool generic);
void check_fp4_grid(bool generic);
void check_fp32_stream_forward(bool generic);
void check_fp32_stream_backward(bool generic);
void check_memory_efficient_backward(bool generic);

struct BackwardRun {
  double forward = 0;                     // the forward that fed it (y, mean, rstd), worst err / tol
  double dx = 0, dgamma = 0, dbeta = 0;  // worst err / tol per output (residual: dx includes dh_out)
  double dx_from_x = 0;  // memory_efficient: dx's worst err / tol against the backward of x (atol x rstd |gamma' dy|)
  // residual_f32: dresidual (fp32 dh) against the reference, and its elements whose rounding to x's
  // dtype is not dx's bits.
  double dresidual = 0;
  int64_t dresidual_dx_mismatches = 0;
  std::vector<char> dx_bytes, dgamma_bytes, dbeta_bytes;
};

// Runs the forward (training) to get mean/rstd/mask, then the backward `reps` times on the same
// inputs (for determinism checks the bytes of the last run are returned).
BackwardRun run_backward(const Case& c, int reps = 1, std::vector<std::vector<char>>* all_dgamma = nullptr,
                         std::vector<std::vector<char>>* all_dx = nullptr);

// A case's spec and layout, for a failure's context.
std::string describe(const Case& c);
// One forward case against the reference (y, mean and rstd within tolerance, h bit for bit, the
// mask exact), described in any failure's context.
void check_forward_case(const Case& c);
// One backward case against the reference (its forward, dx, dgamma, dbeta), described in any
// failure's context; a memory_efficient case also against the backward of x itself.
BackwardRun check_backward_case(const Case& c);

// Compiles (or loads) many specs on all cores before the checks run.
inline void warm(const std::vector<Spec>& specs) {
  if (listing_file()) {
    std::vector<Spec> resolved;
    for (const Spec& s : specs) resolved.push_back(resolve(s, 16, listing_arch()));
    list_specs(resolved);
    return;
  }
  runtime();
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  std::mutex failed_mutex;
  std::vector<std::string> failed;  // a spec that cannot compile fails the test, not the process
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t)
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < specs.size();) {
        try {
          runtime().disk_cache().get_or_compile(resolve(specs[i], 16, runtime().target().arch), runtime().target());
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(failed_mutex);
          failed.push_back(e.what());
        }
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& f : failed) FAIL_CHECK("warm: " << f);
  REQUIRE(failed.empty());
}

}  // namespace gpu_test
