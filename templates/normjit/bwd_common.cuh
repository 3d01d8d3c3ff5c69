// What every backward kernel shares: its shape, the fp32 workspace layout, and the per-pack
// gradient of the pre-activation.
//
// Workspace (fp32): [2][groups][partial_slots][N] partials (dgamma, then dbeta), followed on the
// split route by [rows][2] row sums.
#pragma once
#include "normjit/common.cuh"
#include "normjit/prologue.cuh"

namespace normjit {

template <class Cfg>
struct BwdShape : RowShape<Cfg> {
  static constexpr int kCtaThreads = Cfg::kThreadsPerRow * Cfg::kRowsPerCta;
  static constexpr int kTileThreads = 256;     // norm_bwd_tiles
  static constexpr int kReduceThreads = 1024;  // norm_bwd_reduce: 32 columns x 32 lanes of slots
};

template <class Cfg>
__device__ __forceinline__ long long bwd_groups(const NormParams& p) {
  return Cfg::kPerGroupWeights ? group_of_row(p.rows, p.rows_per_group) : 1;
}

template <class Cfg>
__device__ __forceinline__ float* bwd_partial(const NormParams& p, int which, long long group, long long slot) {
  return p.workspace + ((which * bwd_groups<Cfg>(p) + group) * p.partial_slots + slot) * Cfg::kN;
}

template <class Cfg>
__device__ __forceinline__ float2* bwd_row_sums(const NormParams& p) {
  return reinterpret_cast<float2*>(p.workspace + 2 * bwd_groups<Cfg>(p) * p.partial_slots * Cfg::kN);
}

// xhat and d (dy through the epilogue's backward) for one pack.
template <class Cfg, class XT, class YT, class WT, int kVec>
__device__ __forceinline__ void pack_xhat_grad(const Pack<XT, kVec>& x, const Pack<YT, kVec>& dy,
                                               const Pack<WT, kVec>& g, const WT* beta, const NormParams& p,
                                               long long row, int col, int segment_col, float mean, float rstd,
                                               float (&xhat)[kVec], float (&d)[kVec]) {
  float xf[kVec];
  unpack(x, xf);
  unpack(dy, d);
  if constexpr (Cfg::kXhatFromY) {
    // memory_efficient: x holds the forward's y = x̂ * gamma' (+ beta); undo the affine map, beta
    // in 16-byte parts (a whole f32 pack beside gamma's spilled wide CTAs).
    float gf[kVec];
    unpack_scale<Cfg>(g, gf);
    constexpr int kPart = 16 / static_cast<int>(sizeof(WT)) < kVec ? 16 / static_cast<int>(sizeof(WT)) : kVec;
#pragma unroll
    for (int k = 0; k < kVec; k += kPart) {
      float bf[kPart];
      if constexpr (Cfg::kHasBias) unpack(load_pack<WT, kPart>(beta + col + k), bf);
#pragma unroll
      for (int j = 0; j < kPart; ++j)
        xhat[k + j] = __fdividef(Cfg::kHasBias ? xf[k + j] - bf[j] : xf[k + j], gf[k + j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) xhat[j] = (xf[j] - mean) * rstd;
  }
  float pre[kVec];
  if constexpr (Cfg::Epilogue::kNeedsPreActivation) {
    Pack<WT, kVec> b;
    if constexpr (Cfg::kHasBias) b = load_pack<WT, kVec>(beta + col);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      pre[j] = xhat[j] * scale_of<Cfg>(g.v[j]);
      if constexpr (Cfg::kHasBias) pre[j] += to_float(b.v[j]);
    }
  }
  // col is relative to the CTA's segment (as beta is); the mask is indexed by the row's column.
  Cfg::Epilogue::template backward<kVec>(d, pre, true, p, row, segment_col + col);
}

// Where a fused backward CTA is: its thread's lane and row of the row block, and its walk over
// row blocks slot, slot + slots, ... of its group. A cluster of kCluster CTAs shares each row
// (CTA `rank` owns one segment of columns) and counts as one CTA of the persistent grid: one
// partial slot per cluster. Set once; the parts read it.
struct BwdWalk {
  int lane;                   // this thread's lane in its row
  int row_in_cta;             // its row in the row block
  long long group;            // AdaLayerNorm: the batch of every row; else 0
  int segment_col;            // the CTA's first column
  long long slot;             // the CTA's partial slot, and its first row block
  long long slots;            // CTAs (clusters) per group: the step between its row blocks
  long long row_blocks;       // row blocks per group
};

// The backward reads each row's mean: LayerNorm math, unless x̂ comes from y (memory_efficient).
template <class Cfg>
inline constexpr bool kBwdReadsMean = Cfg::kNorm == NormKind::kLayerNorm && !Cfg::kXhatFromY;

// mean and rstd of this thread's row (row_in_cta) of row block `block` of `group`; left as they
// are past the last row.
template <class Cfg>
__device__ __forceinline__ void bwd_load_row_stats(const NormParams& p, long long group, int row_in_cta,
                                                   long long block, float& mean, float& rstd) {
  const long long local = block * Cfg::kRowsPerCta + row_in_cta;
  if (local < p.rows_per_group) {
    if constexpr (kBwdReadsMean<Cfg>) mean = p.mean[group * p.rows_per_group + local];
    rstd = p.rstd[group * p.rows_per_group + local];
  }
}

}  // namespace normjit
