// The split route of the backward, for rows too large for a fused CTA (or cluster):
// norm_bwd_rowsums forms each row's two sums (one CTA per row, streamed in chunks), then
// norm_bwd_tiles, column-tiled, forms dx and each tile's dgamma/dbeta partials over a chunk of
// rows. No shared memory holds a row, so any N fits.
#pragma once
#include "normjit/bwd_common.cuh"

namespace normjit {

// Split route, step 1: per row, sum(gamma*d) and sum(gamma*d*xhat), streamed in chunks.
template <class Cfg>
__device__ __forceinline__ void norm_bwd_rowsums(const NormParams& p) {
  using XT = typename Cfg::XT;
  using YT = typename Cfg::YT;
  using WT = typename Cfg::WT;
  using S = BwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  static_assert(Cfg::kRowsPerCta == 1, "the split route streams one row per CTA");
  __shared__ float2 pair_scratch[S::kThreads > 32 ? S::kThreads / 32 : 1];
  allow_dependent_launch();  // the column tiles wait for the row sums themselves
  wait_for_prerequisites();  // as the fused kernel: the stream's previous kernel
  const int lane = threadIdx.x;
  const long long row = blockIdx.x;
  const long long weight_offset = Cfg::kPerGroupWeights ? group_of_row(row, p.rows_per_group) * Cfg::kN : 0;
  const WT* gamma = static_cast<const WT*>(p.gamma) + weight_offset;
  const WT* beta = Cfg::kHasBias && p.beta ? static_cast<const WT*>(p.beta) + weight_offset : nullptr;
  const XT* x = static_cast<const XT*>(p.x) + row * p.row_stride;
  const YT* dy = static_cast<const YT*>(p.dy) + row * p.row_stride;
  const float mean = kBwdReadsMean<Cfg> ? p.mean[row] : 0.f;
  const float rstd = p.rstd[row];
  // 3-4 packs per chunk spilled at 1024 threads (64 registers): f32 rows, and bf16 rows with a bias
  // (N = 18432, 28672). Two packs of x and dy per thread still keep 1024 x 64 bytes in flight.
  constexpr int kChunk = S::kChunk > 2 ? 2 : S::kChunk;
  float c1 = 0.f, c2 = 0.f;
  for (int base = 0; base < S::kIters; base += kChunk) {
    Pack<XT, kVec> xs[kChunk];
    Pack<YT, kVec> dys[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int pack = (base + i) * S::kThreads + lane;
      if (pack < S::kVecs) {
        xs[i] = load_pack<XT, kVec>(x + pack * kVec);
        dys[i] = load_pack<YT, kVec>(dy + pack * kVec);
      }
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int pack = (base + i) * S::kThreads + lane;
      if (pack < S::kVecs) {
        const int col = pack * kVec;
        const Pack<WT, kVec> g = load_pack<WT, kVec>(gamma + col);
        float xhat[kVec], d[kVec];
        pack_xhat_grad<Cfg>(xs[i], dys[i], g, beta, p, row, col, 0, mean, rstd, xhat, d);
        float gf[kVec];
        unpack_scale<Cfg>(g, gf);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float gd = d[j] * gf[j];
          if constexpr (kLayerNorm) c1 += gd;
          c2 += gd * xhat[j];
        }
      }
    }
  }
  if constexpr (kLayerNorm) row_sum_pair<S::kThreads>(c1, c2, pair_scratch);
  else c2 = row_sum<S::kThreads>(c2, reinterpret_cast<float*>(pair_scratch));
  if (lane == 0) bwd_row_sums<Cfg>(p)[row] = make_float2(c1, c2);
}

// Split route, step 2: a CTA owns kTileThreads packs of columns and row_chunk rows of one group:
// dx for its tile, and its columns' partial dgamma/dbeta over those rows.
template <class Cfg>
__device__ __forceinline__ void norm_bwd_tiles(const NormParams& p) {
  using XT = typename Cfg::XT;
  using YT = typename Cfg::YT;
  using WT = typename Cfg::WT;
  using S = BwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  allow_dependent_launch();
  wait_for_prerequisites();  // the row sums
  const int pack = blockIdx.x * S::kTileThreads + threadIdx.x;
  if (pack >= S::kVecs) return;  // no barriers or shuffles below
  const int col = pack * kVec;
  const long long group = blockIdx.z;
  const long long weight_offset = Cfg::kPerGroupWeights ? group * Cfg::kN : 0;
  const WT* beta = Cfg::kHasBias && p.beta ? static_cast<const WT*>(p.beta) + weight_offset : nullptr;
  const Pack<WT, kVec> g = load_pack<WT, kVec>(static_cast<const WT*>(p.gamma) + weight_offset + col);
  float gf[kVec];
  unpack_scale<Cfg>(g, gf);
  const float2* sums = bwd_row_sums<Cfg>(p);
  const long long begin = static_cast<long long>(blockIdx.y) * p.row_chunk;
  const long long end = begin + p.row_chunk < p.rows_per_group ? begin + p.row_chunk : p.rows_per_group;
  float acc_g[kVec], acc_b[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc_g[j] = acc_b[j] = 0.f;
#pragma unroll 4
  for (long long local = begin; local < end; ++local) {
    const long long row = group * p.rows_per_group + local;
    const long long offset = row * p.row_stride + col;
    const Pack<XT, kVec> x = load_pack<XT, kVec>(static_cast<const XT*>(p.x) + offset);
    const Pack<YT, kVec> dy = load_pack<YT, kVec>(static_cast<const YT*>(p.dy) + offset);
    const float mean = kBwdReadsMean<Cfg> ? p.mean[row] : 0.f;
    const float rstd = p.rstd[row];
    const float2 c = sums[row];
    const float c1 = kLayerNorm ? c.x * S::kInvN : 0.f;
    const float c2 = c.y * S::kInvN;
    float xhat[kVec], d[kVec];
    pack_xhat_grad<Cfg>(x, dy, g, beta, p, row, col, 0, mean, rstd, xhat, d);
    Pack<YT, kVec> o;
    float dxf[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      acc_g[j] += d[j] * xhat[j];
      acc_b[j] += d[j];
      dxf[j] = rstd * (d[j] * gf[j] - c1 - xhat[j] * c2);
    }
    Cfg::Prologue::template add_to_dx<kVec, dx_loads_in_order<Cfg>>(p, static_cast<YT*>(p.dx) + offset, dxf);
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = Convert<YT>::from(dxf[j]);
    store_pack<YT, kVec>(static_cast<YT*>(p.dx) + offset, o);
  }
  Pack<float, kVec> pg, pb;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    pg.v[j] = acc_g[j];
    pb.v[j] = acc_b[j];
  }
  store_pack<float, kVec>(bwd_partial<Cfg>(p, 0, group, blockIdx.y) + col, pg);
  if constexpr (Cfg::kHasBias) store_pack<float, kVec>(bwd_partial<Cfg>(p, 1, group, blockIdx.y) + col, pb);
}

}  // namespace normjit
