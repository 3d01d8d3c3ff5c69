// LayerNorm / RMSNorm / AdaLayerNorm backward: dx, and dgamma/dbeta through fp32 partials that a
// fixed-order second stage reduces, so results are bitwise reproducible (no float atomics).
//
//   xhat = (x - mean) * rstd            (RMSNorm: mean = 0)
//   d    = epilogue'(dy)                (the gradient of the pre-activation)
//   dx   = rstd * (gamma*d - mean_N(gamma*d) - xhat * mean_N(gamma*d*xhat))
//          (RMSNorm: without the mean_N(gamma*d) term)
//   dgamma = sum_rows d * xhat,  dbeta = sum_rows d   (per group for AdaLayerNorm)
//
// Two routes, chosen per hidden size at generation time:
//   fused (below): a persistent grid; each CTA (or cluster of CTAs sharing a row) walks its rows,
//     keeps its columns' dgamma/dbeta sums, and writes one partial row at the end. Where the
//     row waits is the row source: registers, shared memory, or a pipeline of shared-memory
//     buffers filled by cp.async or bulk copies (bwd_source_*.cuh); or, with a producer warp,
//     a ring of buffers that one warp fills for the others (bwd_producer_warp.cuh).
//   split (bwd_split.cuh): row sums, then column tiles that form dx and the partials.
// norm_bwd_reduce (bwd_reduce_partials.cuh) then sums the partials of each group in slot order.
#pragma once
#include "normjit/bwd_common.cuh"
#include "normjit/bwd_gamma.cuh"
#include "normjit/bwd_producer_warp.cuh"
#include "normjit/bwd_reduce_partials.cuh"
#include "normjit/bwd_source_pipeline.cuh"
#include "normjit/bwd_source_registers.cuh"
#include "normjit/bwd_source_shared.cuh"
#include "normjit/bwd_split.cuh"
#include "normjit/bwd_write_dx.cuh"

namespace normjit {

// Whether the fused backward warms the residual add's dh_out into L2 a row ahead: with a 16-bit
// stream its loads in the dx pass waited on DRAM (H200: LN / RMS 2880 1.07 / 1.09x, 18432 1.08 /
// 1.04x, LN 28672's 896-thread row 0.98x); an fp32 stream's rows ran 0.91-0.96x with it.
template <class Cfg>
inline constexpr bool kBwdPrefetchesDxInputs = Cfg::Prologue::kAddsToDx && sizeof(typename Cfg::XT) == 2;

// Warms into L2 what the prologue's add_to_dx reads for row block `block` (this thread's packs of
// its segment); nothing past the last row.
template <class Cfg>
__device__ __forceinline__ void bwd_prefetch_dx_inputs(const NormParams& p, const BwdWalk& w, long long block) {
  using S = BwdShape<Cfg>;
  using YT = typename Cfg::YT;
  constexpr int kVec = Cfg::kVec;
  const long long local = block * Cfg::kRowsPerCta + w.row_in_cta;
  if (block >= w.row_blocks || local >= p.rows_per_group) return;
  const YT* dx = static_cast<const YT*>(p.dx) + (w.group * p.rows_per_group + local) * p.row_stride + w.segment_col;
#pragma unroll
  for (int i = 0; i < S::kIters; ++i)
    if (const int pack = i * S::kThreads + w.lane; pack < NORMJIT_SEGMENT_VECS(S))
      Cfg::Prologue::template prefetch_dx_inputs<kVec>(p, dx + pack * kVec);
}

// The fused route over a row source (bwd_source_*.cuh). Per row: the source delivers x and dy,
// with the row's mean and rstd; pass 1 forms d, adds to the dgamma/dbeta sums and sums gamma*d
// and gamma*d*xhat over the row (and cluster); pass 2 writes dx. At the end each CTA writes its
// partial row of the sums.
template <class Cfg, class Source>
__device__ __forceinline__ void norm_bwd_fused_rows(const NormParams& p) {
  using XT = typename Cfg::XT;  // x as the rows hold it (h of an fp32 residual stream)
  using YT = typename Cfg::YT;  // dy and dx
  using WT = typename Cfg::WT;
  using S = BwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr int kRows = Cfg::kRowsPerCta;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  constexpr int kHeld = Source::kInRegisters ? S::kIters : 1;  // packs per thread held in registers
  constexpr bool kDbetaShared = Cfg::kDbetaShared;
  static_assert(!kDbetaShared || (!Source::kInRegisters && Cfg::kHasBias),
                "shared dbeta sums belong to shared-memory rows");
  __shared__ float2 pair_scratch[S::kThreads > 32 ? S::kThreads / 32 : 1];
  // Clustered rows: the row sums' exchange (ClusterPushSums), set up before anything else.
  __shared__ ClusterPushSums<S::kCluster> cluster_sums;
  if constexpr (S::kCluster > 1) cluster_sums.init_and_arrive();
  __shared__ unsigned long long row_ready[Source::kBulk ? Source::kBuffers : 1];  // bulk copies' barriers
  // The source's row buffers, each x then dy; the shared dbeta sums after the last one.
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  XT* const shared_rows = reinterpret_cast<XT*>(dynamic_shared);
  float* const shared_b = reinterpret_cast<float*>(shared_rows + Source::kArrays * Source::kBuffers * S::kSegment);
  // memory_efficient: the xhat table (XhatTableOf<Cfg>) after those, or alone for rows in registers.
  using Table = XhatTableOf<Cfg>;
  float* const table_reciprocal = Source::kInRegisters ? reinterpret_cast<float*>(dynamic_shared)
                                                       : shared_b + (kDbetaShared ? S::kSegment : 0);
  WT* const table_beta = reinterpret_cast<WT*>(table_reciprocal + S::kSegment);
  const XhatColumns<WT> table{table_reciprocal, table_beta};

  allow_dependent_launch();  // the reduction waits for this kernel's partials itself
  BwdWalk w;
  w.lane = threadIdx.x % S::kThreads;
  w.row_in_cta = threadIdx.x / S::kThreads;
  w.group = blockIdx.y;
  const int rank = blockIdx.x % S::kCluster;
  w.segment_col = rank * S::kSegment;
  w.slot = blockIdx.x / S::kCluster;
  w.slots = gridDim.x / S::kCluster;
  const long long weight_offset = (Cfg::kPerGroupWeights ? w.group * Cfg::kN : 0) + w.segment_col;
  const WT* gamma = static_cast<const WT*>(p.gamma) + weight_offset;
  const WT* beta = Cfg::kHasBias && p.beta ? static_cast<const WT*>(p.beta) + weight_offset : nullptr;

  // This thread's dgamma and dbeta sums. Past the registers' room for both (dbeta_sums_in_shared
  // on the host, kDbetaShared here) the dbeta sums follow the row buffers in shared memory, at
  // shared_b in the row's layout; each thread updates only its own columns, so no barrier orders
  // them. The sums' code stays in this function: moved into helpers, it came out of ptxas with a
  // different register assignment (other SASS).
  float acc_g[S::kIters][kVec], acc_b[kDbetaShared ? 1 : S::kIters][kVec];
#pragma unroll
  for (int i = 0; i < S::kIters; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      acc_g[i][j] = 0.f;
      if constexpr (!kDbetaShared) acc_b[i][j] = 0.f;
    }
  if constexpr (kDbetaShared) {
    Pack<float, kVec> zero;
#pragma unroll
    for (int j = 0; j < kVec; ++j) zero.v[j] = 0.f;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i)
      if (const int pack = i * S::kThreads + w.lane; pack < NORMJIT_SEGMENT_VECS(S))
        store_pack<float, kVec>(shared_b + pack * kVec, zero);
  }

  Source::init(row_ready);
  // The host may launch this kernel as a programmatic dependent of the stream's previous kernel
  // (its launch then overlaps that kernel's tail): no global memory access before this.
  wait_for_prerequisites();
  w.row_blocks = (p.rows_per_group + kRows - 1) / kRows;
  constexpr bool kHoldGamma = kBwdHoldsGamma<Cfg, Source::kBulk>;
  Pack<WT, kVec> held_gamma[kHoldGamma ? S::kIters : 1];
  if constexpr (kHoldGamma) load_held_gamma<Cfg>(held_gamma, gamma, w.lane);
  float next_mean = 0.f, next_rstd = 0.f;  // pipelined rows: the next row's statistics
  Source::start(p, w, shared_rows, row_ready, next_mean, next_rstd);
  // The table, while the first rows are copied in. Rows of one CTA share its columns; a CTA row's
  // threads read back only their own.
  if constexpr (Table::kReciprocal) {
    if (kRows == 1 || w.row_in_cta == 0) fill_xhat_table<Cfg>(table_reciprocal, table_beta, gamma, beta, w.lane);
    if constexpr (kRows > 1) __syncthreads();
  }
  if constexpr (S::kCluster > 1) cluster_wait();  // every CTA's exchange is set up
  unsigned turn = 0;          // this CTA's rows so far: the exchange's buffer and phase
  int buffer = 0;             // pipelined rows: this row's buffer
  unsigned ready_phases = 0;  // bulk copies: see row_pipeline.cuh
  for (long long block = w.slot; block < w.row_blocks; block += w.slots, ++turn) {
    const long long local = block * kRows + w.row_in_cta;
    const bool active = local < p.rows_per_group;
    const long long row = w.group * p.rows_per_group + (active ? local : 0);
    const long long offset = row * p.row_stride + w.segment_col;
    const XT* x = static_cast<const XT*>(p.x) + offset;
    const YT* dy = static_cast<const YT*>(p.dy) + offset;
    XT* const shared_x = shared_rows + Source::kArrays * buffer * S::kSegment;  // shared-memory rows: where the row waits
    YT* const shared_dy = reinterpret_cast<YT*>(shared_x + S::kSegment);  // in a slot of x's size
    Pack<XT, kVec> xs[kHeld];
    Pack<YT, kVec> dys[kHeld];
    float mean = 0.f, rstd = 0.f;
    if constexpr (Source::kStatsFirst) Source::load_stats(p, w, block, mean, rstd, next_mean, next_rstd);
    Source::fill(p, w, block, active, x, dy, shared_x, shared_dy, xs, dys, shared_rows, row_ready, buffer);
    if constexpr (kBwdPrefetchesDxInputs<Cfg> && Source::kArrays == 2) {
      // The next row's other inputs of dx (the residual add's dh_out), into L2 a row ahead.
      if (block == w.slot) bwd_prefetch_dx_inputs<Cfg>(p, w, block);
      bwd_prefetch_dx_inputs<Cfg>(p, w, block + w.slots);
    }
    ready_phases ^= Source::wait(row_ready, buffer, ready_phases);
    // Pack i of this thread's x and dy, wherever the row waits. (A lambda here, not a function
    // of the source: as for the sums, that kept the SASS of every kernel as it was.)
    auto held = [&](int i, Pack<XT, kVec>& xv, Pack<YT, kVec>& dyv) {
      if constexpr (Source::kInRegisters) {
        xv = xs[i];
        dyv = dys[i];
      } else {
        const int pack = i * S::kThreads + w.lane;
        xv = load_pack<XT, kVec>(shared_x + pack * kVec);
        dyv = load_pack<YT, kVec>(shared_dy + pack * kVec);
      }
    };
    // After a fill that goes through registers, in this predicated form: ahead of it, ptxas split
    // the fill's loads into more rounds.
    if constexpr (!Source::kStatsFirst) {
      mean = kBwdReadsMean<Cfg> && active ? p.mean[row] : 0.f;
      rstd = active ? p.rstd[row] : 0.f;
    }

    float gd[kHeld][kVec];  // gamma * d (registers only; shared-memory rows recompute it)
    float c1 = 0.f, c2 = 0.f;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + w.lane;
      const int col = pack * kVec;
      const int h = Source::kInRegisters ? i : 0;
      if (active && pack < NORMJIT_SEGMENT_VECS(S)) {
        const Pack<WT, kVec> g = gamma_pack<kHoldGamma>(held_gamma, gamma, i, col);
        Pack<XT, kVec> xv;
        Pack<YT, kVec> dyv;
        held(i, xv, dyv);
        float xhat[kVec], d[kVec];
        if constexpr (Table::kReciprocal)
          pack_xhat_grad_from_table<Cfg>(xv, dyv, table, beta, p, row, col, w.segment_col, xhat, d);
        else
          pack_xhat_grad<Cfg>(xv, dyv, g, beta, p, row, col, w.segment_col, mean, rstd, xhat, d);
        if constexpr (kDbetaShared) {
          Pack<float, kVec> b = load_pack<float, kVec>(shared_b + col);
#pragma unroll
          for (int j = 0; j < kVec; ++j) b.v[j] += d[j];
          store_pack<float, kVec>(shared_b + col, b);
        }
        float gf[kVec];
        unpack_scale<Cfg>(g, gf);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          acc_g[i][j] += d[j] * xhat[j];
          if constexpr (!kDbetaShared) acc_b[i][j] += d[j];
          gd[h][j] = d[j] * gf[j];
          if constexpr (kLayerNorm) c1 += gd[h][j];  // RMSNorm has no mean term
          c2 += gd[h][j] * xhat[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) gd[h][j] = 0.f;
      }
    }
    // c1, c2: the row's means of gamma*d and gamma*d*xhat. Clustered rows measured faster with
    // the serial fold of the warps' partials.
    constexpr bool kShuffleFold = S::kCluster == 1 && S::kThreads / 32 > kSerialFold;
    if constexpr (kLayerNorm) row_sum_pair<S::kThreads, kShuffleFold>(c1, c2, pair_scratch);
    else c2 = row_sum<S::kThreads, kShuffleFold>(c2, reinterpret_cast<float*>(pair_scratch));
    float2 sums = make_float2(c1, c2);
    if constexpr (S::kCluster > 1) sums = cluster_sums.sum(sums, turn);
    c1 = kLayerNorm ? sums.x * S::kInvN : 0.f;
    c2 = sums.y * S::kInvN;

    // Pass 2: dx (bwd_write_dx.cuh), from gamma * d held or recomputed.
    const float slope = -rstd * rstd * c2;
    const float intercept = -rstd * c1 - slope * mean;
    YT* dx = static_cast<YT*>(p.dx) + offset;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + w.lane;
      if (active && pack < NORMJIT_SEGMENT_VECS(S)) {
        Pack<XT, kVec> xv;
        Pack<YT, kVec> dyv;
        held(i, xv, dyv);
        float gdv[kVec];
        float xf[kVec];  // x, or (memory_efficient) x̂ recomputed from y
        if constexpr (!Source::kInRegisters || Cfg::kXhatFromY) {
          const int col = pack * kVec;
          const Pack<WT, kVec> g = gamma_pack<kHoldGamma>(held_gamma, gamma, i, col);
          float xhat[kVec], d[kVec];
          if constexpr (Table::kReciprocal)
            pack_xhat_grad_from_table<Cfg>(xv, dyv, table, beta, p, row, col, w.segment_col, xhat, d);
          else
            pack_xhat_grad<Cfg>(xv, dyv, g, beta, p, row, col, w.segment_col, mean, rstd, xhat, d);
          float gf[kVec];
          unpack_scale<Cfg>(g, gf);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            gdv[j] = d[j] * gf[j];
            if constexpr (Cfg::kXhatFromY) xf[j] = xhat[j];
          }
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) gdv[j] = gd[i][j];
        }
        Pack<YT, kVec> o;
        if constexpr (!Cfg::kXhatFromY) unpack(xv, xf);
        if constexpr (Cfg::Prologue::kAddsToDx) {
          float dxf[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) dxf[j] = dx_element<Cfg>(gdv[j], xf[j], mean, rstd, c1, c2, slope, intercept);
          if constexpr (Source::kArrays == 3)  // dh_out came in with the row (kBwdBulkDhOut)
            Cfg::Prologue::add_held_to_dx(p, dx + pack * kVec, dxf, load_pack<XT, kVec>(shared_x + 2 * S::kSegment + pack * kVec));
          else
            Cfg::Prologue::template add_to_dx<kVec, dx_loads_in_order<Cfg>>(p, dx + pack * kVec, dxf);
#pragma unroll
          for (int j = 0; j < kVec; ++j) o.v[j] = Convert<YT>::from(dxf[j]);
        } else {  // converted as each is formed: the schedule of the kernels before prologues existed
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            o.v[j] = Convert<YT>::from(dx_element<Cfg>(gdv[j], xf[j], mean, rstd, c1, c2, slope, intercept));
        }
        // Clustered rows: plain stores came out split (see store_output_pack).
        store_output_pack<YT, kVec, (S::kCluster > 1)>(dx + pack * kVec, o);
      }
    }
    if constexpr (Source::kBuffers > 1) buffer = Source::next(buffer);
    // The next row's reduction reuses pair_scratch (and a cluster's pushes need this row's parts
    // read: ClusterPushSums).
    if constexpr (S::kThreads > 32) __syncthreads();
  }
  Source::finish();
  // A CTA's rows end with every push into it landed; the barrier before exit is kept so that no
  // CTA leaves while another may still address its shared memory.
  if constexpr (S::kCluster > 1) cluster_arrive();
  // One partial row per CTA: rows of a CTA that share columns are summed in a fixed order.
  float* out_g = bwd_partial<Cfg>(p, 0, w.group, w.slot) + w.segment_col;
  float* out_b = bwd_partial<Cfg>(p, 1, w.group, w.slot) + w.segment_col;
  if constexpr (kRows == 1) {
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + w.lane;
      if (pack < NORMJIT_SEGMENT_VECS(S)) {
        Pack<float, kVec> g, b;
        if constexpr (kDbetaShared) b = load_pack<float, kVec>(shared_b + pack * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          g.v[j] = acc_g[i][j];
          if constexpr (!kDbetaShared) b.v[j] = acc_b[i][j];
        }
        store_output_pack<float, kVec, (S::kCluster > 1)>(out_g + pack * kVec, g);
        if constexpr (Cfg::kHasBias) store_output_pack<float, kVec, (S::kCluster > 1)>(out_b + pack * kVec, b);
      }
    }
  } else {
    // Sub-warp rows: fold the row groups of each warp together (lanes kThreads apart own the
    // same columns), then the warps through shared memory.
#pragma unroll
    for (int offset = S::kThreads; offset < 32; offset <<= 1)
#pragma unroll
      for (int i = 0; i < S::kIters; ++i)
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          acc_g[i][j] += __shfl_xor_sync(0xffffffffu, acc_g[i][j], offset);
          acc_b[i][j] += __shfl_xor_sync(0xffffffffu, acc_b[i][j], offset);
        }
    constexpr int kWarps = S::kCtaThreads / 32;
    constexpr int kCols = S::kIters * S::kThreads * kVec;
    __shared__ float fold[kWarps][kCols];
    const int warp = threadIdx.x / 32;
    for (int which = 0; which < (Cfg::kHasBias ? 2 : 1); ++which) {
      if (threadIdx.x % 32 < S::kThreads) {
#pragma unroll
        for (int i = 0; i < S::kIters; ++i)
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            fold[warp][(i * S::kThreads + w.lane) * kVec + j] = which == 0 ? acc_g[i][j] : acc_b[i][j];
      }
      __syncthreads();
      float* out = which == 0 ? out_g : out_b;
      for (int c = threadIdx.x; c < Cfg::kN; c += S::kCtaThreads) {
        float sum = 0.f;
#pragma unroll
        for (int from = 0; from < kWarps; ++from) sum += fold[from][c];
        out[c] = sum;
      }
      __syncthreads();
    }
  }
  if constexpr (S::kCluster > 1) cluster_wait();
}

template <class Cfg>
__device__ __forceinline__ void norm_bwd_fused(const NormParams& p) {
  if constexpr (kBwdProducerWarp<Cfg>) {
    norm_bwd_producer_rows<Cfg>(p);
  } else if constexpr (Cfg::kCache == RowCache::kRegisters) {
    norm_bwd_fused_rows<Cfg, BwdRegisterRows<Cfg>>(p);
  } else if constexpr (Cfg::kCache == RowCache::kShared) {
    norm_bwd_fused_rows<Cfg, BwdSharedRows<Cfg>>(p);
  } else {
    // LayerNorm rows of more than 768 threads that hold gamma have no two registers to spare
    // for the next row's statistics (ptxas spilled): they read the row's own at its start.
    constexpr bool kStatsAhead =
        !(kBwdHoldsGamma<Cfg, Cfg::kBulkCopy> && Cfg::kHasBias && Cfg::kThreadsPerRow > 768);
    norm_bwd_fused_rows<Cfg, BwdPipelinedRows<Cfg, Cfg::kBulkCopy, kStatsAhead>>(p);
  }
}

}  // namespace normjit
