// Fused backward row source: the row in registers. Each thread loads its packs of x and dy once
// and holds them (and gamma * d) between the row's two passes; no shared memory. Any row shape:
// sub-warp rows (several per CTA), a CTA's, or a cluster's (one segment per CTA).
//
// A row source of the fused backward (norm_bwd.cuh) is a set of static functions over state that
// stays in the kernel: the CTA's walk (BwdWalk), the row's registers (xs, dys), the next row's
// statistics, the row buffers (`rows`, each x then dy; `ready`, their mbarriers) and the
// pipeline's buffer and phases. Kept there, every kernel's SASS stayed as it was before the
// split; held in a source object, the compiler assigned some registers differently.
//   kInRegisters  the row stays in xs / dys (kIters packs each) and pass 1 keeps gamma * d for
//                 pass 2; otherwise it waits in shared memory at shared_x / shared_dy and
//                 gamma * d is recomputed
//   kBulk         rows arrive by bulk copies (the gamma rule keys on it, bwd_gamma.cuh)
//   kBuffers      row buffers in dynamic shared memory
//   kArrays       rows in a buffer: x and dy, then dh_out where the residual add's bulk-copied
//                 rows bring it in too (kBwdBulkDhOut)
//   kStatsFirst   load_stats reads the row's mean and rstd before fill; otherwise the kernel
//                 reads them after fill, predicated on the row being active
//   init          before the kernel waits for its prerequisites;  start  before the first row
//   fill, wait    make this thread's packs of the row available; wait returns the bits of
//                 ready_phases it used up
//   next          (kBuffers > 1) the buffer of the next row;  finish  after the last row
#pragma once
#include "normjit/bwd_common.cuh"

namespace normjit {

template <class Cfg>
struct BwdRegisterRows {
  using XT = typename Cfg::XT;
  using YT = typename Cfg::YT;
  using S = RowShape<Cfg>;
  static constexpr int kVec = Cfg::kVec;
  static constexpr bool kInRegisters = true;
  static constexpr bool kBulk = false;
  static constexpr int kBuffers = 1;
  static constexpr int kArrays = 2;
  static constexpr bool kStatsFirst = false;

  static __device__ __forceinline__ void init(unsigned long long*) {}
  static __device__ __forceinline__ void start(const NormParams&, const BwdWalk&, XT*, unsigned long long*, float&,
                                               float&) {}

  // This thread's packs of the row at x and dy (its segment in global memory) into xs and dys.
  static __device__ __forceinline__ void fill(const NormParams&, const BwdWalk& w, long long, bool active,
                                              const XT* x, const YT* dy, XT*, YT*, Pack<XT, kVec> (&xs)[S::kIters],
                                              Pack<YT, kVec> (&dys)[S::kIters], XT*, unsigned long long*, int) {
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + w.lane;
      if (active && pack < NORMJIT_SEGMENT_VECS(S)) {
        xs[i] = load_pack<XT, kVec>(x + pack * kVec);
        dys[i] = load_pack<YT, kVec>(dy + pack * kVec);
      }
    }
  }

  static __device__ __forceinline__ unsigned wait(unsigned long long*, int, unsigned) { return 0u; }
  static __device__ __forceinline__ void finish() {}
};

}  // namespace normjit
