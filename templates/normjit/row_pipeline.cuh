// Pipelined rows: a persistent CTA (or cluster) walks its rows through kStages buffers of
// shared memory, and while it works on one row the next kStages - 1 are on their way in.
// Two ways to fill a buffer (the kernel issues the copies, a buffer at a time):
//   per-thread cp.async (sm_80+): each thread copies its own packs, one commit group per row,
//     and later reads back only those, so no barrier orders the buffers;
//   bulk copies (kBulk; sm_90 cp.async.bulk): thread 0 copies whole segments, which complete on
//     the buffer's mbarrier (`ready`: kStages of them in shared memory) that every thread waits
//     on. A bulk copy overwrites every thread's packs, so all must be done with a buffer (a CTA
//     barrier) before it is filled again. Needs 16-byte aligned segments.
// The walk's state stays with the kernel: `buffer`, the buffer of the row it works on, and for
// bulk copies `ready_phases`, bit b the parity of buffer b's next phase. One row per CTA (a
// clustered row: one segment per CTA).
#pragma once
#include "normjit/common.cuh"

namespace normjit {

template <class Cfg, bool kBulk>
struct RowPipeline {
  static constexpr int kStages = Cfg::kStages;
  static_assert(Cfg::kRowsPerCta == 1, "a pipelined row fills its CTA");
  static_assert(kStages >= 2, "a pipelined row needs a buffer to fill while it works on another");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(!kBulk, "bulk copies (tma) need sm_90 or newer");
#endif

  // Thread 0 sets up the barriers; the CTA barrier publishes them before any copy or wait.
  static __device__ __forceinline__ void init(unsigned long long* ready) {
    if constexpr (kBulk) {
      if (threadIdx.x == 0)
#pragma unroll
        for (int b = 0; b < kStages; ++b) init_row_barrier(&ready[b]);
      __syncthreads();
    }
  }

  // The buffer behind `buffer`: it held the previous row, and takes the row kStages - 1 ahead.
  static __device__ __forceinline__ int behind(int buffer) { return buffer == 0 ? kStages - 1 : buffer - 1; }
  static __device__ __forceinline__ int next(int buffer) { return buffer == kStages - 1 ? 0 : buffer + 1; }

  // Before filling the buffer behind: a bulk copy overwrites every thread's packs of the previous
  // row there. The row's closing CTA barrier orders that, but clustered rows skip it: one here.
  static __device__ __forceinline__ void before_fill_behind() {
    if constexpr (kBulk && Cfg::kCluster > 1) __syncthreads();
  }

  // Waits until `buffer` has landed (this thread's packs, or with bulk copies all of it);
  // returns the bits of ready_phases that the wait used up (to be flipped).
  static __device__ __forceinline__ unsigned wait(unsigned long long* ready, int buffer, unsigned ready_phases) {
    if constexpr (kBulk) {
      wait_row_barrier(&ready[buffer], ready_phases >> buffer & 1u);
      return 1u << buffer;
    } else {
      wait_async<kStages - 1>();
      return 0u;
    }
  }

  // After the last row: the trailing empty groups (a fill past the last row still commits one,
  // so that every row's copies are exactly kStages - 1 groups behind the newest).
  static __device__ __forceinline__ void drain() {
    if constexpr (!kBulk) wait_async<0>();
  }
};

}  // namespace normjit
