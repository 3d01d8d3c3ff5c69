#pragma once
// Generic kernels (templates/normjit/norm_generic.cuh): compiled when normjit is built, they take
// N and the spec's boolean fields at run time, so a launch never waits for NVRTC. The compile
// modes choose when they run (docs/generic.md).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "normjit/compiler.hpp"
#include "normjit/spec.hpp"

namespace normjit {

// When Runtime::launch uses the specialized kernel of a spec.
//   sync:    the launch compiles (or loads) the specialized kernel, then runs it. Deterministic.
//   async:   on a miss of both caches the launch runs the generic kernel at once and the
//            specialized one compiles on a background thread, used from the launch after it is
//            ready on. A disk-cache hit is loaded synchronously.
//   generic: generic kernels only; no NVRTC at all.
enum class CompileMode { kSync, kAsync, kGeneric };
const char* to_string(CompileMode m);
// "sync", "async" or "generic"; anything else throws Error(kInvalidArgument) naming `what` and the value.
CompileMode parse_compile_mode(std::string_view text, std::string_view what = "compile mode");
// NORMJIT_COMPILE_MODE, sync when unset or empty.
CompileMode compile_mode_from_env();

// Empty when a generic kernel covers the spec (any n, block config ignored); else why not, naming
// the field and its value. Every norm, phase, epilogue and fusion has one; the quantizing
// epilogues' need sm_89 or newer (Runtime says so on older GPUs).
std::string generic_unsupported_why(const Spec& spec);
// The generic kernels come in two programs per x dtype: the norm kernels (epilogues none,
// relu_bitmask, gelu; forward and backward, every fusion) and the quantizing forwards (FP8, int8,
// MX and NVFP4 epilogues), which need sm_89's FP8 conversions and load only where used.
enum class GenericProgram { kNorm, kQuant };
const char* to_string(GenericProgram p);
GenericProgram generic_program_of(const Spec& spec);
std::vector<GenericProgram> generic_programs();
int generic_program_min_arch(GenericProgram p);  // 80, or 89 for the quant program
// The vector widths the generic kernels come in for a dtype: 16 bytes down to one element.
std::vector<int> generic_vecs(DType x);
// Kernel names. Forward specs share the forward kernel of their dtypes, epilogue and residual add
// (training or not is a flag); backward specs run the row kernel, then the reduction of the weight
// dtype.
// held_packs: the backward's held-row kernel of that many packs a thread (0: not held).
std::string generic_kernel_name(const Spec& spec, int vec, bool clustered = false, int held_packs = 0);
// Whether the backward's held-row kernels (1 to kGenericMaxHeldPacks packs a thread in registers,
// rows of at most kGenericMaxHeldPacks * kGenericMaxHeldThreads packs) exist for the spec at this vector
// width.
bool generic_has_held(const Spec& spec, int vec);
// Whether the backward of `spec` at vector width `vec` has a clustered kernel (16-byte packs: a
// slot's row split over a cluster of CTAs on sm_90, each a segment of its columns).
bool generic_has_clustered(const Spec& spec, int vec);
std::string generic_reduce_name(DType w);
// The generic backward's CTA width for a row (or cluster segment) of `segment_packs` packs. A row's
// sums and stages take the same shared memory at any width, so a CTA is a row in flight: of the
// multiples of 32 up to the widest CTA that use at least 85 % of their rounds' slots, and
// `as_wide_as_row` (always a candidate), the widest whose CTAs a SM (`ctas_per_sm(threads)`) come
// within 10 % of the most any of them gets.
unsigned generic_backward_threads(int64_t segment_packs, unsigned as_wide_as_row,
                                  const std::function<int(unsigned)>& ctas_per_sm);
// The generic forward's CTA (one a row) for a row of `packs` packs and `row_bytes` bytes (the
// pass after the statistics reads it again, from L2 where it stayed): about kGenericUnroll packs a
// thread, at most 256 threads, or up to 512 where the rows in flight at 256 (`ctas_per_sm(threads)`
// a SM on `sm_count` SMs) take more than the L2's `l2_bytes`; and whether the rows in flight then
// take more than half of it (kGenericRowsPastL2: the statistics pass from the row's end, the last
// pass streaming). ncu at LN 65536 (256 threads): DRAM 88 % busy moving 1.5x the kernel's bytes,
// L2 hit rate 47 %: x was read twice from DRAM. H200, bf16, M = 32768 (4096 past 65536), % of copy
// LN / RMS, 256 threads -> this: 32768 68.5 / 69.0 -> 77.6 / 80.9, 65536 65.1 / 65.9 -> 70.9 / 74.9
// (512 threads), 131072 62.6 / 62.8 -> 67.4 / 68.0, 262144 61.9 / 62.3 -> 65.0 / 65.9.
struct GenericForwardShape {
  unsigned threads = 0;
  bool rows_past_l2 = false;
};
GenericForwardShape generic_forward_shape(int64_t packs, int64_t row_bytes, int sm_count, int64_t l2_bytes,
                                          const std::function<int(unsigned)>& ctas_per_sm);
// The generic forward of a row that crowds the L2 (rows_past_l2) in a cluster (the _cluster kernel,
// sm_90): the fewest CTAs, 2 to `max_cluster`, whose segments of whole warps' packs take at most
// `segment_bytes` of x each, and about kGenericUnroll packs a thread (at most 256 threads). A
// cluster of 1 where the row needs no second CTA.
struct GenericForwardCluster {
  unsigned cluster = 1, threads = 0;
  int64_t segment_packs = 0;
};
GenericForwardCluster generic_forward_cluster_shape(int64_t packs, int64_t pack_bytes, int64_t segment_bytes,
                                                    int max_cluster);
// The generic backward of a row held in registers (generic_bwd_held, the _held kernels): one pack
// a thread under kGenericHeldTwoFrom packs, two from there, in the fewest whole warps (at least
// one). packs_per_thread 0 where the row has more than kGenericMaxHeldPacks * kGenericMaxHeldThreads
// packs (the staged kernels take it).
struct GenericBackwardHeld {
  int packs_per_thread = 0;
  unsigned threads = 0;
};
GenericBackwardHeld generic_backward_held_shape(int64_t packs);
// Rows past one CTA's held packs (kGenericMaxHeldPacks * kGenericMaxHeldThreads), split over a
// cluster: about kGenericHeldSegmentPacks packs a CTA (two CTAs a SM overlap one another's
// cluster barriers), or the widest held CTAs where that takes more than max_cluster CTAs. A
// cluster of 0: the row takes no held cluster (the staged kernels).
struct GenericBackwardHeldCluster {
  unsigned cluster = 0;
  int64_t segment_packs = 0;  // a multiple of two packs a lane of whole warps; the last CTA's may be shorter
  unsigned threads = 0;       // segment_packs / kGenericMaxHeldPacks
};
GenericBackwardHeldCluster generic_backward_held_cluster_shape(int64_t packs, int max_cluster);
// A program of generic kernels of x dtype `x`: all weight dtypes, the program's epilogues,
// vector widths and residual kinds, and for the norm program both phases and the reductions.
GeneratedSource generic_source(DType x, GenericProgram program);
// The dtypes the generic programs are built for.
std::vector<DType> generic_program_dtypes();

// The generic images built into this library: for each x dtype and program, cubins (sm_80 for
// the norm program, sm_90) and PTX (compute_90) that the driver compiles for newer GPUs.
struct GenericImage {
  DType x = DType::kBF16;
  GenericProgram program = GenericProgram::kNorm;
  std::string arch;  // "sm_90", or "compute_90" for PTX
  bool is_ptx = false;
  std::string_view image;
};
const std::vector<GenericImage>& generic_images();
namespace detail {
const std::vector<GenericImage>& generic_image_table();  // defined by the build's generic_images.cpp
}
// The image for a GPU of compute capability sm (e.g. 90), or nullptr: the same arch's cubin, else
// the newest cubin of the same major version at or below it, else PTX of an arch at or below it.
const GenericImage* generic_image_for(DType x, GenericProgram program, int sm);

// Compiles resolved specs on background threads for async mode. Each spec (by `key`) is compiled
// at most once per compiler; a failed compile is logged and stays failed (its generic kernel keeps
// running). The destructor drops queued work and waits for the compiles in flight (NVRTC cannot be
// interrupted).
class BackgroundCompiler {
 public:
  using CompileFn = std::function<Binary(const Spec&)>;
  enum class State { kUnknown, kQueued, kCompiling, kReady, kFailed };
  BackgroundCompiler(CompileFn compile, int threads);
  ~BackgroundCompiler();
  BackgroundCompiler(const BackgroundCompiler&) = delete;
  BackgroundCompiler& operator=(const BackgroundCompiler&) = delete;

  // Queues the spec unless its key is known; returns the key's state after the call.
  State request(uint64_t key, const Spec& resolved);
  State state(uint64_t key) const;
  // The compiled binary of a ready key (moved out: later calls see kReady and get nothing).
  std::optional<Binary> take(uint64_t key);
  // The error of a failed key ("" otherwise).
  std::string error(uint64_t key) const;
  // Blocks until nothing is queued or compiling.
  void wait_idle() const;
  int threads() const { return static_cast<int>(workers_.size()); }
  // NORMJIT_COMPILE_THREADS, else min(2, hardware threads), at least 1.
  static int default_threads();

 private:
  struct Job {
    State state = State::kQueued;
    Spec spec;
    std::optional<Binary> binary;
    std::string error;
  };
  void work();

  CompileFn compile_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::deque<uint64_t> queue_;
  std::map<uint64_t, Job> jobs_;
  int busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};
const char* to_string(BackgroundCompiler::State s);

}  // namespace normjit
