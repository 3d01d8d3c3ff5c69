// Fused backward row source: the row (a cluster's row: this CTA's segment) waits in dynamic
// shared memory between the two passes, x at shared_x and dy at shared_dy, and gamma * d is
// recomputed in the second pass; only the dgamma/dbeta sums stay in registers, so a CTA takes
// about twice the row it could hold in registers. Each thread reads back only its own packs: no
// barrier orders the passes. One row per CTA. The interface: bwd_source_registers.cuh.
#pragma once
#include "normjit/bwd_common.cuh"

namespace normjit {

template <class Cfg>
struct BwdSharedRows {
  using XT = typename Cfg::XT;
  using YT = typename Cfg::YT;
  using S = RowShape<Cfg>;
  static constexpr int kVec = Cfg::kVec;
  static constexpr bool kInRegisters = false;
  static constexpr bool kBulk = false;
  static constexpr int kBuffers = 1;
  static constexpr int kArrays = 2;
  static_assert(Cfg::kRowsPerCta == 1, "a shared-memory row fills its CTA (a cluster's CTA: its segment)");
  // The fill: each pack by cp.async (sm_80+), all in flight at once with no registers held for
  // them; staged through registers, ptxas issued the loads in rounds, each waiting for the last
  // one's stores. Clustered rows and rows of 896 threads or more measured faster staged.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  static constexpr bool kAsyncFill = false;
#else
  static constexpr bool kAsyncFill = S::kCluster == 1 && S::kThreads < 896;
#endif
  // The cp.async fill's wait is an asm barrier to the compiler: the statistics go ahead of it.
  static constexpr bool kStatsFirst = kAsyncFill;

  static __device__ __forceinline__ void init(unsigned long long*) {}
  static __device__ __forceinline__ void start(const NormParams&, const BwdWalk&, XT*, unsigned long long*, float&,
                                               float&) {}

  static __device__ __forceinline__ void load_stats(const NormParams& p, const BwdWalk& w, long long block,
                                                    float& mean, float& rstd, float&, float&) {
    bwd_load_row_stats<Cfg>(p, w.group, w.row_in_cta, block, mean, rstd);
  }

  // This thread's packs of the row at x and dy (its segment in global memory) into shared_x and
  // shared_dy.
  static __device__ __forceinline__ void fill(const NormParams&, const BwdWalk& w, long long, bool active,
                                              const XT* x, const YT* dy, XT* shared_x, YT* shared_dy,
                                              Pack<XT, kVec> (&)[1], Pack<YT, kVec> (&)[1], XT*, unsigned long long*,
                                              int) {
    if constexpr (kAsyncFill) {
#pragma unroll
      for (int i = 0; i < S::kIters; ++i) {
        const int pack = i * S::kThreads + w.lane;
        if (active && pack < NORMJIT_SEGMENT_VECS(S)) {
          copy_async<XT, kVec>(shared_x + pack * kVec, x + pack * kVec);
          copy_async<YT, kVec>(shared_dy + pack * kVec, dy + pack * kVec);
        }
      }
      commit_async();
      wait_async<0>();  // this thread's packs only: each thread reads back its own
    } else {
#pragma unroll
      for (int i = 0; i < S::kIters; ++i) {
        const int pack = i * S::kThreads + w.lane;
        if (active && pack < NORMJIT_SEGMENT_VECS(S)) {
          const Pack<XT, kVec> xv = load_pack<XT, kVec>(x + pack * kVec);
          const Pack<YT, kVec> dyv = load_pack<YT, kVec>(dy + pack * kVec);
          store_pack<XT, kVec>(shared_x + pack * kVec, xv);
          store_pack<YT, kVec>(shared_dy + pack * kVec, dyv);
        }
      }
    }
  }

  static __device__ __forceinline__ unsigned wait(unsigned long long*, int, unsigned) { return 0u; }
  static __device__ __forceinline__ void finish() {}
};

}  // namespace normjit
