// What every normjit kernel uses: the parts below, how a row maps onto threads, and the launch
// helpers. Each part is its own header:
//   pack.cuh            element types, conversions, vector packs and output stores
//   async_copy.cuh      cp.async, bulk copies (TMA) with mbarriers, L2 prefetch
//   reduce_warp.cuh     sums and moments over lanes of a warp
//   reduce_cta.cuh      sums and moments over a row's threads (sub-warp group or CTA)
//   reduce_cluster.cuh  sums over the CTAs of a cluster (distributed shared memory)
// The kernels: norm_fwd.cuh and norm_bwd.cuh, each a composition of its own parts (fwd_*.cuh,
// bwd_*.cuh) and of row_pipeline.cuh, rows waiting in shared-memory buffers filled ahead of use.
#pragma once
#include "normjit/async_copy.cuh"
#include "normjit/pack.cuh"
#include "normjit/params.h"
#include "normjit/reduce_cluster.cuh"
#include "normjit/reduce_cta.cuh"
#include "normjit/reduce_warp.cuh"

// Launch bounds of a row kernel with no minimum CTA count of its own. The compiler defines
// NORMJIT_NO_OCCUPANCY_SPILL when recompiling a kernel that spilled (runtime/nvrtc_compiler.cpp):
// asking for one CTA per SM lets ptxas use the few registers it had spilled to keep occupancy.
#ifdef NORMJIT_NO_OCCUPANCY_SPILL
#define NORMJIT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)
#else
#define NORMJIT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#endif
// NORMJIT_CAPPED_LAUNCH_BOUNDS asks for `ctas` CTAs per SM, accepting the small spill the
// generator allows for it (GeneratedSource::spill_allowance_bytes); past that the compiler
// defines NORMJIT_UNCAPPED and it is NORMJIT_LAUNCH_BOUNDS.
#ifdef NORMJIT_UNCAPPED
#define NORMJIT_CAPPED_LAUNCH_BOUNDS(threads, ctas) NORMJIT_LAUNCH_BOUNDS(threads)
#else
#define NORMJIT_CAPPED_LAUNCH_BOUNDS(threads, ctas) __launch_bounds__(threads, ctas)
#endif

namespace normjit {

enum class NormKind { kLayerNorm, kRMSNorm };
enum class RowCache { kRegisters, kGlobal, kShared, kSharedPipelined };

// Programmatic dependent launch (sm_90+; no-ops elsewhere, and when the host launched the next
// kernel plainly). allow_dependent_launch: the next kernel in the stream may begin launching now.
// wait_for_prerequisites: blocks until the kernels this one depends on have finished and their
// writes are visible; everything that reads their results comes after it.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A CTA's packs of a clustered row: N / vec / C rounded up, or what the spec binds
// (kSegmentPacks: rounded up further to whole scale blocks of a block-scaled output).
template <class Cfg, class = void>
struct SegmentPacksOf {
  static constexpr int value = (Cfg::kN / Cfg::kVec + Cfg::kCluster - 1) / Cfg::kCluster;
};
template <class Cfg>
struct SegmentPacksOf<Cfg, decltype(void(Cfg::kSegmentPacks))> {
  static constexpr int value = Cfg::kSegmentPacks;
};

// How a row of Cfg::kN elements maps onto Cfg::kThreadsPerRow threads in packs of Cfg::kVec:
// pack p of a row belongs to lane p % kThreads, in its iteration p / kThreads. With a cluster
// of kCluster CTAs per row, CTA r owns the segment of kVecs packs from r * kVecs. Where that
// leaves the last CTA fewer (kRagged: rows in registers or one buffer of shared memory), each
// CTA takes the rounded-up share and the last CTA the rest, kLastVecs.
template <class Cfg>
struct RowShape {
  static constexpr int kVec = Cfg::kVec;
  static constexpr int kThreads = Cfg::kThreadsPerRow;
  static constexpr int kCluster = Cfg::kCluster;
  static constexpr int kRowVecs = Cfg::kN / kVec;
  static constexpr int kVecs = SegmentPacksOf<Cfg>::value;  // packs per row (per CTA segment)
  static constexpr int kLastVecs = kRowVecs - (kCluster - 1) * kVecs;  // the last CTA's segment
  static constexpr bool kRagged = kLastVecs != kVecs;
  static constexpr int kSegment = kVecs * kVec;                     // elements per CTA segment
  static constexpr int kIters = (kVecs + kThreads - 1) / kThreads;  // packs per thread
  // Paths that stream a row take this many packs per thread at a time.
  static constexpr int kChunk = kIters < 4 ? kIters : 4;
  static constexpr float kInvN = 1.0f / static_cast<float>(Cfg::kN);
  static_assert(Cfg::kN % kVec == 0, "vec must divide N");
  static_assert(kLastVecs > 0, "the cluster's last CTA must hold part of the row");
  static_assert(kCluster == 1 || Cfg::kRowsPerCta == 1, "a clustered row spans whole CTAs");

  // This CTA's packs of a kRagged row (the others use kVecs: see NORMJIT_SEGMENT_VECS).
  static __device__ __forceinline__ int ragged_segment_vecs() {
    return blockIdx.x % kCluster == kCluster - 1 ? kLastVecs : kVecs;
  }
};

// The packs of this CTA's segment of a row of shape S: kVecs unless the segments are ragged.
// Written where it is compared, not behind a function: behind one, the even shapes' kernels came
// out of ptxas with other SASS. (A last CTA compiled as its own instantiation, bounds constant,
// took more registers and ran LN 262136 at 70.9 % of copy against 80.6, H200.)
#define NORMJIT_SEGMENT_VECS(S) ((S::kRagged) ? S::ragged_segment_vecs() : S::kVecs)

// AdaLayerNorm: the group (batch) of a row. validate_launch keeps such launches below 2^32 rows,
// so 32 bits suffice: a 64-bit division expands into a called routine that needs a stack frame.
__device__ __forceinline__ long long group_of_row(long long row, long long rows_per_group) {
  return static_cast<unsigned>(row) / static_cast<unsigned>(rows_per_group);
}

}  // namespace normjit
