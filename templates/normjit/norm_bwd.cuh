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
//   fused (kRegisters): a persistent grid; each CTA walks its rows with the row in registers and
//     keeps its columns' dgamma/dbeta sums in registers, then writes one partial row.
//   split (kGlobal): norm_bwd_rowsums forms the two row sums; norm_bwd_tiles, column-tiled,
//     forms dx and each tile's partial sums over a chunk of rows.
// norm_bwd_reduce then sums the partials of each group in slot order.
//
// Workspace (fp32): [2][groups][partial_slots][N] partials (dgamma, then dbeta), followed on the
// split route by [rows][2] row sums.
#pragma once
#include "normjit/common.cuh"

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
template <class Cfg, class XT, class WT, int kVec>
__device__ __forceinline__ void pack_xhat_grad(const Pack<XT, kVec>& x, const Pack<XT, kVec>& dy,
                                               const Pack<WT, kVec>& g, const WT* beta, const NormParams& p,
                                               long long row, int col, int segment_col, float mean, float rstd,
                                               float (&xhat)[kVec], float (&d)[kVec]) {
  float xf[kVec];
  unpack(x, xf);
  unpack(dy, d);
#pragma unroll
  for (int j = 0; j < kVec; ++j) xhat[j] = (xf[j] - mean) * rstd;
  float pre[kVec];
  if constexpr (Cfg::Epilogue::kNeedsPreActivation) {
    Pack<WT, kVec> b;
    if constexpr (Cfg::kHasBias) b = load_pack<WT, kVec>(beta + col);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      pre[j] = xhat[j] * to_float(g.v[j]);
      if constexpr (Cfg::kHasBias) pre[j] += to_float(b.v[j]);
    }
  }
  // col is relative to the CTA's segment (as beta is); the mask is indexed by the row's column.
  Cfg::Epilogue::template backward<kVec>(d, pre, true, p, row, segment_col + col);
}

template <class Cfg>
__device__ __forceinline__ void norm_bwd_fused(const NormParams& p) {
  using XT = typename Cfg::XT;
  using WT = typename Cfg::WT;
  using S = BwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr int kRows = Cfg::kRowsPerCta;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  __shared__ float2 pair_scratch[S::kThreads > 32 ? S::kThreads / 32 : 1];
  // Clustered rows: the row sums' cluster slots, alternating per row so one barrier per row
  // suffices (a slot is rewritten only after every CTA passed the next row's barrier).
  __shared__ float2 cluster_slots[2];
  // Shared-memory rows (kShared): x and dy wait in dynamic shared memory between the passes and
  // gamma*d is recomputed, so only the dgamma/dbeta sums stay in registers: about twice the row a
  // CTA can take. Each thread reads back only its own packs: no barrier orders the passes.
  // Pipelined rows (kSharedPipelined) keep kStages rows' x and dy: each thread copies its packs
  // of the CTA's next kStages - 1 rows in asynchronously while the CTA works on this one, so the
  // loads never wait behind the row's barrier and the dx stores.
  constexpr bool kPipe = Cfg::kCache == RowCache::kSharedPipelined;
  constexpr int kBuffers = kPipe ? Cfg::kStages : 1;
  // Pipelined rows filled by bulk copies: thread 0 copies each buffer's x and dy segments whole;
  // row_ready[b] completes a phase each time buffer b has landed.
  constexpr bool kBulk = kPipe && Cfg::kBulkCopy;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static_assert(!kBulk, "bulk copies (tma) need sm_90 or newer");
#endif
  __shared__ unsigned long long row_ready[kBulk ? kBuffers : 1];
  constexpr bool kSmem = Cfg::kCache == RowCache::kShared || kPipe;
  // One-buffer shared rows of one CTA fill by cp.async (sm_80+): every pack's load in flight at
  // once, no registers held for it. Staged through registers, ptxas issued them in two or three
  // rounds, each waiting for the last one's stores, and where the rounds fell moved with unrelated
  // changes. H200, session 12 (call 3), against the staged fill: RMS bwd 16384 t512 / 18432 t768 /
  // 24576 t768 68.2 / 69.6 / 70.7 -> 92.8 / 77.5 / 81.4 %; slower at 896 threads (RMS 28672 80.2
  // -> 77.0) and in every clustered row (2-10 points), so those keep the staged fill, as does
  // NORMJIT_BWD_STAGED_FILL (for A/B timing).
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800) || defined(NORMJIT_BWD_STAGED_FILL)
  constexpr bool kAsyncFill = false;
#else
  constexpr bool kAsyncFill = Cfg::kCache == RowCache::kShared && S::kCluster == 1 && S::kThreads < 896;
#endif
  constexpr int kHeld = kSmem ? 1 : S::kIters;  // packs per thread held in registers between passes
  static_assert(!kSmem || kRows == 1, "a shared-memory row fills its CTA (a cluster's CTA: its segment)");
  // Past the registers' room for both sums (dbeta_sums_in_shared), the dbeta sums follow dy in
  // shared memory; each thread updates only its own columns, so no barrier orders them either.
  constexpr bool kDbetaShared = Cfg::kDbetaShared;
  static_assert(!kDbetaShared || (kSmem && Cfg::kHasBias), "shared dbeta sums belong to shared-memory rows");
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  // Buffer s: x at 2 * s * kSegment, dy after it; the dbeta sums after the last buffer.
  XT* const shared_rows = reinterpret_cast<XT*>(dynamic_shared);
  float* const shared_b = reinterpret_cast<float*>(shared_rows + 2 * kBuffers * S::kSegment);

  allow_dependent_launch();  // the reduction waits for this kernel's partials itself
  const int lane = threadIdx.x % S::kThreads;
  const int row_in_cta = threadIdx.x / S::kThreads;
  const long long group = blockIdx.y;
  // A cluster of kCluster CTAs shares each row (CTA `rank` owns one segment of columns) and
  // counts as one CTA of the persistent grid: one partial slot per cluster.
  const int rank = blockIdx.x % S::kCluster;
  const int segment_col = rank * S::kSegment;
  const long long slot = blockIdx.x / S::kCluster;
  const long long slots = gridDim.x / S::kCluster;
  const long long weight_offset = (Cfg::kPerGroupWeights ? group * Cfg::kN : 0) + segment_col;
  const WT* gamma = static_cast<const WT*>(p.gamma) + weight_offset;
  const WT* beta = Cfg::kHasBias && p.beta ? static_cast<const WT*>(p.beta) + weight_offset : nullptr;

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
      if (const int pack = i * S::kThreads + lane; pack < S::kVecs) store_pack<float, kVec>(shared_b + pack * kVec, zero);
  }

  if constexpr (kBulk) {
    if (threadIdx.x == 0)
#pragma unroll
      for (int b = 0; b < kBuffers; ++b) init_row_barrier(&row_ready[b]);
    __syncthreads();
  }
  // The host may launch this kernel as a programmatic dependent of the stream's previous kernel
  // (its launch then overlaps that kernel's tail): no global memory access before this.
  wait_for_prerequisites();
  const long long row_blocks = (p.rows_per_group + kRows - 1) / kRows;
  // Shared-memory rows read gamma in both passes of every row; a CTA's columns never change, so
  // bulk-copied rows keep it in registers (at most 16 of them) instead. Reloaded, it came from L2
  // whenever the row buffers left L1 too small for it, and each pass waited on it (H200, session
  // 12, Nsight Compute: 31 % of LN bwd 18432's stall samples on its first use). H200, session 12 (call 4), against
  // the session-9 rule (LayerNorm rows of 384-512 threads): LN 12288 t768 tma3 77.7 -> 93.4 %, LN
  // 24576 / 28672 c2 tma 70.1 / 77.3 -> 81.1 / 83.6, RMS 32768 c2 tma 80.6 -> 88.3, RMS 4096 / 8192 +1-2
  // points; but LayerNorm rows of 1024 threads (64 registers, with the dbeta sums) fell 84.6 -> 68.0
  // (LN 16384) and keep reloading it. Not in cp.async rows (session 9, H100: LN 7168 / 8192 pipe
  // 85.4 / 93.0 -> 73.9 / 83.5). NORMJIT_BWD_NO_HELD_GAMMA reloads it everywhere, and
  // NORMJIT_BWD_HOLD_GAMMA_NARROW takes the session-9 rule, for A/B timing.
  constexpr bool kNarrowHold = kBulk && Cfg::kHasBias && !Cfg::kPerGroupWeights && S::kThreads >= 384 &&
                               S::kThreads <= 512 && S::kIters * kVec * static_cast<int>(sizeof(WT)) <= 64;
#ifdef NORMJIT_BWD_NO_HELD_GAMMA
  constexpr bool kHoldGamma = false;
#elif defined(NORMJIT_BWD_HOLD_GAMMA_NARROW)
  constexpr bool kHoldGamma = kNarrowHold;
#else
  // The wider rule for fp32 weights only, where it was measured; with 16-bit weights it spilled
  // (LN 18432 t768, LN 28672 c2 t896), and so did LayerNorm rows of 960 threads (64 registers:
  // 48-byte stack; LN 61440 c4 t960 tma 60.1 / 74.7 % against t1024 unheld 66.8 / 84.6, H200 / H100).
  constexpr bool kHoldGamma = kNarrowHold || (kBulk && sizeof(WT) == 4 && !Cfg::kPerGroupWeights &&
                                              !(Cfg::kHasBias && S::kThreads > 896) && S::kIters * kVec <= 16);
#endif
  Pack<WT, kVec> held_gamma[kHoldGamma ? S::kIters : 1];
  if constexpr (kHoldGamma) {
#pragma unroll
    for (int i = 0; i < S::kIters; ++i)
      if (const int pack = i * S::kThreads + lane; pack < S::kVecs) held_gamma[i] = load_pack<WT, kVec>(gamma + pack * kVec);
  }
  auto gamma_pack = [&](int i, int col) {
    if constexpr (kHoldGamma) return held_gamma[i];
    else return load_pack<WT, kVec>(gamma + col);
  };
  // Pipelined rows: starts the copy of row block `block` (kRows == 1) into buffer `buffer`. Past
  // the last row, an empty group, so that every row's copies are exactly kStages - 1 groups
  // behind the newest (wait_async below).
  auto prefetch = [&](long long block, int buffer) {
    if constexpr (kBulk) {
      if (threadIdx.x == 0 && block < row_blocks) {
        constexpr unsigned kBytes = S::kSegment * sizeof(XT);
        const long long offset = (group * p.rows_per_group + block) * p.row_stride + segment_col;
        XT* const to_x = shared_rows + 2 * buffer * S::kSegment;
        fence_shared_for_bulk_copy();
        expect_bulk_bytes(&row_ready[buffer], 2 * kBytes);
        bulk_copy_to_shared(to_x, static_cast<const XT*>(p.x) + offset, kBytes, &row_ready[buffer]);
        bulk_copy_to_shared(to_x + S::kSegment, static_cast<const XT*>(p.dy) + offset, kBytes, &row_ready[buffer]);
      }
      return;
    }
    if (block < row_blocks) {
      const long long offset = (group * p.rows_per_group + block) * p.row_stride + segment_col;
      XT* const to_x = shared_rows + 2 * buffer * S::kSegment;
#pragma unroll
      for (int i = 0; i < S::kIters; ++i) {
        const int pack = i * S::kThreads + lane;
        if (pack < S::kVecs) {
          copy_async<XT, kVec>(to_x + pack * kVec, static_cast<const XT*>(p.x) + offset + pack * kVec);
          copy_async<XT, kVec>(to_x + S::kSegment + pack * kVec, static_cast<const XT*>(p.dy) + offset + pack * kVec);
        }
      }
    }
    commit_async();
  };
  // mean and rstd of row block `block` (zero past the last row).
  auto load_row_stats = [&](long long block, float& mean, float& rstd) {
    const long long local = block * kRows + row_in_cta;
    if (local < p.rows_per_group) {
      if constexpr (kLayerNorm) mean = p.mean[group * p.rows_per_group + local];
      rstd = p.rstd[group * p.rows_per_group + local];
    }
  };
  // Pipelined rows load them one row ahead: taken at the row's start, after its data had
  // landed, they were a DRAM round trip every row waited for (session 12). LayerNorm rows of more
  // than 768 threads that hold gamma have no two registers to spare for that (ptxas spilled 4-8
  // bytes at 72 registers, 832-896 threads): they load the row's own at its start, the next row's
  // warmed into L2 (measured level or faster than the spilling form, session 13).
#ifdef NORMJIT_BWD_STATS_AHEAD_ALWAYS
  constexpr bool kStatsAhead = kPipe;
#else
  constexpr bool kStatsAhead = kPipe && !(kHoldGamma && Cfg::kHasBias && S::kThreads > 768);
#endif
  float next_mean = 0.f, next_rstd = 0.f;
  if constexpr (kStatsAhead) load_row_stats(slot, next_mean, next_rstd);
  if constexpr (kPipe) {
#pragma unroll
    for (int s = 0; s < kBuffers - 1; ++s) prefetch(slot + s * slots, s);
  }
  int parity = 0;  // alternates per row: the cluster slot
  int buffer = 0;  // pipelined rows: this row's buffer
  unsigned ready_phases = 0;  // bulk copies: bit b, the parity of buffer b's next phase
  for (long long block = slot; block < row_blocks; block += slots, parity ^= 1) {
    const long long local = block * kRows + row_in_cta;
    const bool active = local < p.rows_per_group;
    const long long row = group * p.rows_per_group + (active ? local : 0);
    const long long offset = row * p.row_stride + segment_col;
    const XT* x = static_cast<const XT*>(p.x) + offset;
    const XT* dy = static_cast<const XT*>(p.dy) + offset;
    XT* const shared_x = shared_rows + 2 * buffer * S::kSegment;
    XT* const shared_dy = shared_x + S::kSegment;
    Pack<XT, kVec> xs[kHeld], dys[kHeld];
    float mean = 0.f, rstd = 0.f;
    if constexpr (kStatsAhead) {
      mean = next_mean;
      rstd = next_rstd;
      load_row_stats(block + slots, next_mean, next_rstd);
    } else if constexpr (kPipe) {
      load_row_stats(block, mean, rstd);
      if (const long long next = (block + slots) * kRows + row_in_cta; lane == 0 && next < p.rows_per_group) {
        if constexpr (kLayerNorm) prefetch_l2(p.mean + group * p.rows_per_group + next);
        prefetch_l2(p.rstd + group * p.rows_per_group + next);
      }
    } else if constexpr (kAsyncFill) {
      // Ahead of the row's fill, whose wait is an asm barrier to the compiler.
      load_row_stats(block, mean, rstd);
    }
    if constexpr (kPipe) {
      // The buffer behind this one held the previous row. With per-thread copies this thread alone
      // read its packs there; a bulk copy overwrites everyone's, so every thread must be done:
      // the end-of-row barrier below, or for clusters (which skip it) one here.
      if constexpr (kBulk && S::kCluster > 1) __syncthreads();
      prefetch(block + (kBuffers - 1) * slots, buffer == 0 ? kBuffers - 1 : buffer - 1);
      if constexpr (kBulk) {
        wait_row_barrier(&row_ready[buffer], ready_phases >> buffer & 1u);
        ready_phases ^= 1u << buffer;
      } else {
        wait_async<kBuffers - 1>();
      }
    } else if constexpr (kAsyncFill) {
#pragma unroll
      for (int i = 0; i < S::kIters; ++i) {
        const int pack = i * S::kThreads + lane;
        if (active && pack < S::kVecs) {
          copy_async<XT, kVec>(shared_x + pack * kVec, x + pack * kVec);
          copy_async<XT, kVec>(shared_dy + pack * kVec, dy + pack * kVec);
        }
      }
      commit_async();
      wait_async<0>();  // this thread's packs only: each thread reads back its own
    } else {
#pragma unroll
      for (int i = 0; i < S::kIters; ++i) {
        const int pack = i * S::kThreads + lane;
        if (active && pack < S::kVecs) {
          const int h = kSmem ? 0 : i;
          xs[h] = load_pack<XT, kVec>(x + pack * kVec);
          dys[h] = load_pack<XT, kVec>(dy + pack * kVec);
          if constexpr (kSmem) {
            store_pack<XT, kVec>(shared_x + pack * kVec, xs[0]);
            store_pack<XT, kVec>(shared_dy + pack * kVec, dys[0]);
          }
        }
      }
    }
    // Pack i of this thread's x and dy, wherever it waits.
    auto held = [&](int i, Pack<XT, kVec>& xv, Pack<XT, kVec>& dyv) {
      if constexpr (kSmem) {
        const int pack = i * S::kThreads + lane;
        xv = load_pack<XT, kVec>(shared_x + pack * kVec);
        dyv = load_pack<XT, kVec>(shared_dy + pack * kVec);
      } else {
        xv = xs[i];
        dyv = dys[i];
      }
    };
    // After a register-staged fill and in this predicated form, as before session 12: ahead of it,
    // ptxas split the fill's loads into four or five rounds (RMS bwd 65536 c2 smem, H100: 89.0 ->
    // 77.5 %), and load_row_stats's branch here still left three (SASS, this machine).
    if constexpr (!kPipe && !kAsyncFill) {
      mean = kLayerNorm && active ? p.mean[row] : 0.f;
      rstd = active ? p.rstd[row] : 0.f;
    }

    float gd[kHeld][kVec];  // gamma * d (registers only; shared-memory rows recompute it)
    float c1 = 0.f, c2 = 0.f;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + lane;
      const int col = pack * kVec;
      const int h = kSmem ? 0 : i;
      if (active && pack < S::kVecs) {
        const Pack<WT, kVec> g = gamma_pack(i, col);
        Pack<XT, kVec> xv, dyv;
        held(i, xv, dyv);
        float xhat[kVec], d[kVec];
        pack_xhat_grad<Cfg>(xv, dyv, g, beta, p, row, col, segment_col, mean, rstd, xhat, d);
        if constexpr (kDbetaShared) {
          Pack<float, kVec> b = load_pack<float, kVec>(shared_b + col);
#pragma unroll
          for (int j = 0; j < kVec; ++j) b.v[j] += d[j];
          store_pack<float, kVec>(shared_b + col, b);
        }
        float gf[kVec];
        unpack(g, gf);
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
    constexpr bool kShuffleFold = S::kCluster == 1 && S::kThreads / 32 > kSerialFold;
    if constexpr (kLayerNorm) row_sum_pair<S::kThreads, kShuffleFold>(c1, c2, pair_scratch);
    else c2 = row_sum<S::kThreads, kShuffleFold>(c2, reinterpret_cast<float*>(pair_scratch));
    const float2 sums = cluster_sum<S::kCluster>(make_float2(c1, c2), &cluster_slots[parity]);
    c1 = kLayerNorm ? sums.x * S::kInvN : 0.f;
    c2 = sums.y * S::kInvN;
    // 16-bit x: dx = rstd*gd + (x*slope + intercept), the row's constants folded: two FFMA per
    // element instead of five. The fold costs about |mean|/sigma fp32 ulps; a 16-bit row cannot
    // spread less than its own spacing at the mean (|mean|/sigma < 2^8 bf16, 2^11 f16), which keeps
    // that under the output's rounding. fp32 x keeps the exact form; so does
    // NORMJIT_BWD_EXACT_DX, for A/B timing.
#ifdef NORMJIT_BWD_EXACT_DX
    constexpr bool kFoldedDx = false;
#else
    constexpr bool kFoldedDx = sizeof(XT) == 2;
#endif
    const float slope = -rstd * rstd * c2;
    const float intercept = -rstd * c1 - slope * mean;
    XT* dx = static_cast<XT*>(p.dx) + offset;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + lane;
      if (active && pack < S::kVecs) {
        Pack<XT, kVec> xv, dyv;
        held(i, xv, dyv);
        float gdv[kVec];
        if constexpr (kSmem) {
          const int col = pack * kVec;
          const Pack<WT, kVec> g = gamma_pack(i, col);
          float xhat[kVec], d[kVec];
          pack_xhat_grad<Cfg>(xv, dyv, g, beta, p, row, col, segment_col, mean, rstd, xhat, d);
          float gf[kVec];
          unpack(g, gf);
#pragma unroll
          for (int j = 0; j < kVec; ++j) gdv[j] = d[j] * gf[j];
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) gdv[j] = gd[i][j];
        }
        Pack<XT, kVec> o;
        float xf[kVec];
        unpack(xv, xf);
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          o.v[j] = Convert<XT>::from(kFoldedDx ? fmaf(rstd, gdv[j], fmaf(slope, xf[j], intercept))
                                               : rstd * (gdv[j] - c1 - (xf[j] - mean) * rstd * c2));
        store_output_pack<XT, kVec, (S::kCluster > 1)>(dx + pack * kVec, o);
      }
    }
    if constexpr (kPipe) buffer = buffer == kBuffers - 1 ? 0 : buffer + 1;
    // The next row's reduction reuses pair_scratch (the cluster barrier already orders it).
    if constexpr (S::kThreads > 32 && S::kCluster == 1) __syncthreads();
  }
  if constexpr (kPipe && !kBulk) wait_async<0>();  // the trailing empty groups
  // Done reading the other CTAs' slots; the wait before exit keeps ours alive for theirs.
  if constexpr (S::kCluster > 1) cluster_arrive();

  // One partial row per CTA: rows of a CTA that share columns are summed in a fixed order.
  float* out_g = bwd_partial<Cfg>(p, 0, group, slot) + segment_col;
  float* out_b = bwd_partial<Cfg>(p, 1, group, slot) + segment_col;
  if constexpr (kRows == 1) {
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + lane;
      if (pack < S::kVecs) {
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
            fold[warp][(i * S::kThreads + lane) * kVec + j] = which == 0 ? acc_g[i][j] : acc_b[i][j];
      }
      __syncthreads();
      float* out = which == 0 ? out_g : out_b;
      for (int c = threadIdx.x; c < Cfg::kN; c += S::kCtaThreads) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += fold[w][c];
        out[c] = sum;
      }
      __syncthreads();
    }
  }
  if constexpr (S::kCluster > 1) cluster_wait();
}

// Split route, step 1: per row, sum(gamma*d) and sum(gamma*d*xhat), streamed in chunks.
template <class Cfg>
__device__ __forceinline__ void norm_bwd_rowsums(const NormParams& p) {
  using XT = typename Cfg::XT;
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
  const XT* dy = static_cast<const XT*>(p.dy) + row * p.row_stride;
  const float mean = kLayerNorm ? p.mean[row] : 0.f;
  const float rstd = p.rstd[row];
  // 3-4 packs per chunk spilled at 1024 threads (64 registers): f32 rows, and bf16 rows with a bias
  // (N = 18432, 28672). Two packs of x and dy per thread still keep 1024 x 64 bytes in flight.
  constexpr int kChunk = S::kChunk > 2 ? 2 : S::kChunk;
  float c1 = 0.f, c2 = 0.f;
  for (int base = 0; base < S::kIters; base += kChunk) {
    Pack<XT, kVec> xs[kChunk], dys[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int pack = (base + i) * S::kThreads + lane;
      if (pack < S::kVecs) {
        xs[i] = load_pack<XT, kVec>(x + pack * kVec);
        dys[i] = load_pack<XT, kVec>(dy + pack * kVec);
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
        unpack(g, gf);
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
  unpack(g, gf);
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
    const Pack<XT, kVec> dy = load_pack<XT, kVec>(static_cast<const XT*>(p.dy) + offset);
    const float mean = kLayerNorm ? p.mean[row] : 0.f;
    const float rstd = p.rstd[row];
    const float2 c = sums[row];
    const float c1 = kLayerNorm ? c.x * S::kInvN : 0.f;
    const float c2 = c.y * S::kInvN;
    float xhat[kVec], d[kVec];
    pack_xhat_grad<Cfg>(x, dy, g, beta, p, row, col, 0, mean, rstd, xhat, d);
    Pack<XT, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      acc_g[j] += d[j] * xhat[j];
      acc_b[j] += d[j];
      o.v[j] = Convert<XT>::from(rstd * (d[j] * gf[j] - c1 - xhat[j] * c2));
    }
    store_pack<XT, kVec>(static_cast<XT*>(p.dx) + offset, o);
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

// Stage 2: per group, sums the partial rows in slot order. A CTA covers 32 columns with 32 lanes
// of slots each (short serial chains: small N launches few CTAs); the 32 lane sums are then added
// in lane order. Same order every run.
template <class Cfg>
__device__ __forceinline__ void norm_bwd_reduce(const NormParams& p) {
  using WT = typename Cfg::WT;
  constexpr int kSlotLanes = BwdShape<Cfg>::kReduceThreads / 32;
  __shared__ float fold[2][kSlotLanes][33];
  wait_for_prerequisites();  // the partials
  const int c = threadIdx.x % 32;
  const int slot_lane = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + c;
  const long long group = blockIdx.y;
  float sum_g = 0.f, sum_b = 0.f;
  if (col < Cfg::kN) {
    const float* in_g = bwd_partial<Cfg>(p, 0, group, 0) + col;
    const float* in_b = bwd_partial<Cfg>(p, 1, group, 0) + col;
#ifdef NORMJIT_BWD_REDUCE_UNROLL4  // the former loop, for A/B timing
#pragma unroll 4
    for (int s = slot_lane; s < p.partial_slots; s += kSlotLanes) {
      sum_g += in_g[static_cast<long long>(s) * Cfg::kN];
      if constexpr (Cfg::kHasBias) sum_b += in_b[static_cast<long long>(s) * Cfg::kN];
    }
#else
    // Up to eight slots' loads in flight per lane, predicated rather than a remainder loop: the
    // launch-bound grids (192-256 slots, 6-8 per lane) take one round trip to L2. Added in slot order.
    constexpr int kInFlight = 8;
    for (int base = slot_lane; base < p.partial_slots; base += kInFlight * kSlotLanes) {
      float g[kInFlight], b[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const long long s = base + u * kSlotLanes;
        const bool have = s < p.partial_slots;
        g[u] = have ? in_g[s * Cfg::kN] : 0.f;
        if constexpr (Cfg::kHasBias) b[u] = have ? in_b[s * Cfg::kN] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        if (base + u * kSlotLanes < p.partial_slots) {
          sum_g += g[u];
          if constexpr (Cfg::kHasBias) sum_b += b[u];
        }
    }
#endif
  }
  fold[0][slot_lane][c] = sum_g;
  fold[1][slot_lane][c] = sum_b;
  __syncthreads();
  if (slot_lane == 0 && col < Cfg::kN) {
    float g = 0.f, b = 0.f;
#pragma unroll
    for (int l = 0; l < kSlotLanes; ++l) {
      g += fold[0][l][c];
      b += fold[1][l][c];
    }
    static_cast<WT*>(p.dgamma)[group * Cfg::kN + col] = Convert<WT>::from(g);
    if constexpr (Cfg::kHasBias) static_cast<WT*>(p.dbeta)[group * Cfg::kN + col] = Convert<WT>::from(b);
  }
}

}  // namespace normjit
