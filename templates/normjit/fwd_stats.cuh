// The forward's row statistics: this thread's sums over its packs of a row (deviations from a
// center, squared deviations, counts), and the row's shift and rstd from them, summed over the
// row's threads (reduce_cta.cuh) and, for clustered rows, its CTAs (reduce_cluster.cuh).
// Packs follow RowShape: pack p of a row (segment) belongs to lane p % kThreads.
#pragma once
#include "normjit/common.cuh"
#include "normjit/prologue.cuh"

namespace normjit {

template <class Cfg>
using FwdShape = RowShape<Cfg>;

// This lane's packs of iterations first_pack..first_pack + kCount - 1 of a row (segment) at
// `source`; packs past the segment, and all of an inactive row's, are left unread.
template <class Cfg, int kCount, class XT, int kVec>
__device__ __forceinline__ void load_chunk(Pack<XT, kVec> (&packs)[kCount], const XT* source, int first_pack, int lane,
                                           bool active) {
  using S = FwdShape<Cfg>;
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    if (const int pack = (first_pack + i) * S::kThreads + lane; active && pack < NORMJIT_SEGMENT_VECS(S))
      packs[i] = load_pack<XT, kVec>(source + pack * kVec);
}

// The same for the forward's first read of its input (x at `x`, of the activations' type YT):
// through the prologue (x + residual, ...).
template <class Cfg, int kCount, class XT, class WT, int kVec, class YT>
__device__ __forceinline__ void load_input_chunk(const NormParams& p, Pack<XT, kVec> (&packs)[kCount], const YT* x,
                                                 int first_pack, int lane, bool active, int segment_col) {
  using S = FwdShape<Cfg>;
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    if (const int pack = (first_pack + i) * S::kThreads + lane; active && pack < NORMJIT_SEGMENT_VECS(S))
      packs[i] = Cfg::Prologue::template load<XT, WT, kVec>(p, x + pack * kVec, segment_col + pack * kVec);
}

// Over the valid elements of kCount packs, in one loop: Σ (x - center) where kSum, and
// Σ ((x - center) - shift)^2 where kSquares. Subtracting `center` first keeps large offsets
// (x = 1e4 + noise) out of the sums. Both at once (shift 0) unpack and centre each element once.
template <class Cfg, bool kSum, bool kSquares, int kCount, class XT, int kVec>
__device__ __forceinline__ float2 pack_sums(const Pack<XT, kVec> (&packs)[kCount], int first_pack, int lane,
                                            float center, float shift) {
  using S = FwdShape<Cfg>;
  float sum = 0.f, m2 = 0.f;
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    if ((first_pack + i) * S::kThreads + lane < NORMJIT_SEGMENT_VECS(S)) {
      float xf[kVec];
      unpack(packs[i], xf);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float c = xf[j] - center;
        if constexpr (kSum) sum += c;
        if constexpr (kSquares) {
          const float d = c - shift;
          m2 += d * d;
        }
      }
    }
  return make_float2(sum, m2);
}

template <class Cfg, int kCount, class XT, int kVec>
__device__ __forceinline__ float pack_sum(const Pack<XT, kVec> (&packs)[kCount], int first_pack, int lane,
                                          float center) {
  return pack_sums<Cfg, true, false>(packs, first_pack, lane, center, 0.f).x;
}

template <class Cfg, int kCount, class XT, int kVec>
__device__ __forceinline__ float pack_sq_dev(const Pack<XT, kVec> (&packs)[kCount], int first_pack, int lane,
                                             float center, float shift) {
  return pack_sums<Cfg, false, true>(packs, first_pack, lane, center, shift).y;
}

// {Σ (x - center), Σ (x - center)^2} (RMSNorm, center 0: the squares only, the first sum 0).
template <class Cfg, int kCount, class XT, int kVec>
__device__ __forceinline__ float2 pack_dev_sq(const Pack<XT, kVec> (&packs)[kCount], int first_pack, int lane,
                                              float center) {
  return pack_sums<Cfg, Cfg::kNorm == NormKind::kLayerNorm, true>(packs, first_pack, lane, center, 0.f);
}

// Valid elements among kCount packs.
template <class Cfg, int kCount>
__device__ __forceinline__ float pack_count(int first_pack, int lane) {
  using S = FwdShape<Cfg>;
  float count = 0.f;
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    if ((first_pack + i) * S::kThreads + lane < NORMJIT_SEGMENT_VECS(S)) count += Cfg::kVec;
  return count;
}

// The row's shift (mean - center; LayerNorm) and rstd from this thread's sums of deviations from
// the center and of their squares (RMSNorm: squares only), summed over the row and, for clusters,
// over the cluster through `slot` (see cluster_sum).
template <class Cfg>
__device__ __forceinline__ void centered_stats(float dev, float sq, float eps, float2* pair_scratch,
                                               float* sum_scratch, float2* slot, float& shift, float& rstd) {
  using S = FwdShape<Cfg>;
  if constexpr (Cfg::kNorm == NormKind::kLayerNorm) {
    row_sum_pair<S::kThreads>(dev, sq, pair_scratch);
    const float2 dev_sq = cluster_sum<S::kCluster>(make_float2(dev, sq), slot);
    shift = dev_sq.x * S::kInvN;
    rstd = rsqrtf(fmaxf(dev_sq.y * S::kInvN - shift * shift, 0.f) + eps);
  } else {
    const float total = cluster_sum<S::kCluster>(make_float2(row_sum<S::kThreads>(sq, sum_scratch), 0.f), slot).x;
    rstd = rsqrtf(total * S::kInvN + eps);
  }
}

}  // namespace normjit
