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

// memory_efficient fused rows: the per-column values of x̂ = (y - beta) / gamma' the CTA keeps in
// shared memory, as the host's xhat_table() bound them (kReciprocalTable, kBetaTable); specs that
// bind neither keep none.
template <class Cfg, class = void>
struct XhatTableOf {
  static constexpr bool kReciprocal = false;
  static constexpr bool kBeta = false;
};
template <class Cfg>
struct XhatTableOf<Cfg, decltype(void(Cfg::kReciprocalTable))> {
  static constexpr bool kReciprocal = Cfg::kReciprocalTable;
  static constexpr bool kBeta = Cfg::kBetaTable;
};

// Where a CTA's table is: 1/gamma' (fp32) and beta at its segment's columns.
template <class WT>
struct XhatColumns {
  const float* reciprocal = nullptr;
  const WT* beta = nullptr;
};

// This thread's columns of the table, once per CTA. __fdividef(a, b) is a * rcp(b), with a and b
// scaled by 2^24 where |b| < 2^-126; a times __fdividef(1, b) is the same exact product rounded
// once, so x̂ keeps its bits (short of |y - beta| > 2^104 over a subnormal gamma'), and the row
// loop loses the division's six instructions per element for one multiply.
template <class Cfg, class WT>
__device__ __forceinline__ void fill_xhat_table(float* reciprocal, WT* beta_table, const WT* gamma, const WT* beta,
                                                int lane) {
  using S = RowShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
#pragma unroll
  for (int i = 0; i < S::kIters; ++i) {
    const int pack = i * S::kThreads + lane;
    if (pack < NORMJIT_SEGMENT_VECS(S)) {
      float gf[kVec];
      unpack_scale<Cfg>(load_pack<WT, kVec>(gamma + pack * kVec), gf);
      Pack<float, kVec> r;
#pragma unroll
      for (int j = 0; j < kVec; ++j) r.v[j] = __fdividef(1.f, gf[j]);
      store_pack<float, kVec>(reciprocal + pack * kVec, r);
      if constexpr (XhatTableOf<Cfg>::kBeta)
        store_pack<WT, kVec>(beta_table + pack * kVec, load_pack<WT, kVec>(beta + pack * kVec));
    }
  }
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

// pack_xhat_grad of a memory_efficient row with a table (XhatTableOf<Cfg>::kReciprocal): x̂ =
// (y - beta) * (1/gamma'), the bits of pack_xhat_grad's division (fill_xhat_table), beta from the
// table or from global memory. A function of its own: a table argument to pack_xhat_grad changed
// the split route's SASS.
template <class Cfg, class XT, class YT, class WT, int kVec>
__device__ __forceinline__ void pack_xhat_grad_from_table(const Pack<XT, kVec>& x, const Pack<YT, kVec>& dy,
                                                          const XhatColumns<WT>& table, const WT* beta,
                                                          const NormParams& p, long long row, int col,
                                                          int segment_col, float (&xhat)[kVec], float (&d)[kVec]) {
  static_assert(Cfg::kXhatFromY && XhatTableOf<Cfg>::kReciprocal && !Cfg::Epilogue::kNeedsPreActivation,
                "memory_efficient rows with a table, whose epilogue (none) needs no pre-activation");
  float xf[kVec], r[kVec];
  unpack(x, xf);
  unpack(dy, d);
  unpack(load_pack<float, kVec>(table.reciprocal + col), r);
  constexpr int kPart = 16 / static_cast<int>(sizeof(WT)) < kVec ? 16 / static_cast<int>(sizeof(WT)) : kVec;
#pragma unroll
  for (int k = 0; k < kVec; k += kPart) {
    float bf[kPart];
    if constexpr (Cfg::kHasBias)
      unpack(load_pack<WT, kPart>((XhatTableOf<Cfg>::kBeta ? table.beta : beta) + col + k), bf);
#pragma unroll
    for (int j = 0; j < kPart; ++j) xhat[k + j] = (Cfg::kHasBias ? xf[k + j] - bf[j] : xf[k + j]) * r[k + j];
  }
  float pre[kVec];
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
