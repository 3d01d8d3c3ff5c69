// gamma of the fused backward: a CTA's columns never change, so where registers allow, each
// thread loads its packs of gamma once and holds them; otherwise each pass reads them again.
// Rows in shared memory read gamma in both passes of every row, and with the row buffers taking
// most of L1 it came from L2 each time, a stall at its first use. Only bulk-copied rows (kBulk)
// hold it, and only where it measured faster and did not spill: LayerNorm rows of 384-512
// threads with at most 64 bytes of it, and weights of at most 16 values per thread (not LayerNorm
// rows of more than 896 threads, which need the registers for the dbeta sums). 16-bit weights are
// held without an epilogue only (H200 LN 10240-18432 bf16 weights 81-84 -> 93-95 %, level with
// fp32 weights); with a mask or gelu their 736-896-thread rows spilled 8-56 B holding it. cp.async
// rows measured slower holding it. AdaLayerNorm's gamma changes with
// the group: never held. memory_efficient rows with 1/gamma' in their xhat table hold it only from
// 512 threads: below, it took the registers of a CTA per SM (LN 4096 t256 fp32: 80 -> 99, t384
// 76 -> 95, t448 72 -> 87).
#pragma once
#include "normjit/bwd_common.cuh"

namespace normjit {

struct EpilogueNone;
template <class Epilogue>
constexpr bool kNoEpilogue = false;
template <>
constexpr bool kNoEpilogue<EpilogueNone> = true;

template <class Cfg, bool kBulk, class S = RowShape<Cfg>, int kWeightBytes = sizeof(typename Cfg::WT)>
constexpr bool kBwdHoldsGamma =
    ((kBulk && Cfg::kHasBias && !Cfg::kPerGroupWeights && S::kThreads >= 384 && S::kThreads <= 512 &&
      S::kIters * Cfg::kVec * kWeightBytes <= 64) ||
     (kBulk && (kWeightBytes == 4 || kNoEpilogue<typename Cfg::Epilogue>) && !Cfg::kPerGroupWeights &&
      !(Cfg::kHasBias && S::kThreads > 896) &&
      S::kIters * Cfg::kVec <= 16)) &&
    (!XhatTableOf<Cfg>::kReciprocal || S::kThreads >= 512);

// This thread's packs of gamma into `held` (kIters of them), from the CTA's segment at `gamma`.
template <class Cfg, class WT, int kVec, int kPacks>
__device__ __forceinline__ void load_held_gamma(Pack<WT, kVec> (&held)[kPacks], const WT* gamma, int lane) {
  using S = RowShape<Cfg>;
#pragma unroll
  for (int i = 0; i < S::kIters; ++i)
    if (const int pack = i * S::kThreads + lane; pack < NORMJIT_SEGMENT_VECS(S))
      held[i] = load_pack<WT, kVec>(gamma + pack * kVec);
}

// This thread's pack i of gamma, at column col of the segment: held, or read.
template <bool kHeld, class WT, int kVec, int kPacks>
__device__ __forceinline__ Pack<WT, kVec> gamma_pack(const Pack<WT, kVec> (&held)[kPacks], const WT* gamma, int i,
                                                     int col) {
  if constexpr (kHeld) return held[i];
  else return load_pack<WT, kVec>(gamma + col);
}

}  // namespace normjit
