// LayerNorm / RMSNorm forward, training (y, mean, rstd) and inference (y).
// One row is handled by kThreadsPerRow threads; a CTA holds kRowsPerCta rows.
// Statistics use fp32 and never form E[x^2] - E[x]^2 about zero: rows held in registers take
// the corrected two-pass route; rows streamed from global memory merge per-chunk moments
// (Chan et al.) of x - x[0]. The mean stays split in two floats until the output.
#pragma once
#include "normjit/fwd_stats.cuh"
#include "normjit/fwd_write_y.cuh"
#include "normjit/row_pipeline.cuh"

namespace normjit {

// One row (one cluster's row) per CTA, held in registers, shared memory or nowhere.
template <class Cfg>
__device__ __forceinline__ void norm_fwd_row(const NormParams& p) {
  using XT = typename Cfg::XT;  // the rows as normalized (h of an fp32 residual stream)
  using YT = typename Cfg::YT;  // x as given, and y
  using WT = typename Cfg::WT;
  using S = FwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  constexpr int kScratch = S::kThreads > 32 ? S::kThreads / 32 : 1;
  constexpr float kInvN = S::kInvN;
  __shared__ float sum_scratch[kScratch];
  __shared__ float2 pair_scratch[kScratch];
  __shared__ Moments moments_scratch[Cfg::kCache == RowCache::kGlobal ? kScratch : 1];
  // Clustered rows: one slot per cluster-wide sum (LayerNorm takes two).
  __shared__ float2 cluster_slots[2];
  // Shared-memory rows (kShared): the launch gives (N / cluster) * sizeof(XT) bytes of dynamic shared memory.
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  XT* const shared_row = reinterpret_cast<XT*>(dynamic_shared);
  static_assert(S::kCluster == 1 || Cfg::kCache != RowCache::kGlobal, "clustered rows live in registers or smem");
  static_assert(Cfg::kCache != RowCache::kShared || Cfg::kRowsPerCta == 1, "a shared-memory row fills its CTA");

  const int lane = threadIdx.x % S::kThreads;
  const int rank = blockIdx.x % S::kCluster;  // this CTA's segment of a clustered row
  const int segment_col = rank * S::kSegment;
  const long long row = static_cast<long long>(blockIdx.x / S::kCluster) * Cfg::kRowsPerCta + threadIdx.x / S::kThreads;
  // Rows past the end still take part in the shuffles; they neither load nor store.
  const bool active = row < p.rows;
  const long long offset = (active ? row : 0) * p.row_stride + segment_col;
  const YT* x = static_cast<const YT*>(p.x) + offset;
  YT* y = static_cast<YT*>(p.y) + offset;
  // AdaLayerNorm: gamma and beta have one row per group (batch) of rows_per_group rows.
  const long long weight_offset =
      (Cfg::kPerGroupWeights && active ? group_of_row(row, p.rows_per_group) * Cfg::kN : 0) + segment_col;
  const WT* gamma = static_cast<const WT*>(p.gamma) + weight_offset;
  const WT* beta = Cfg::kHasBias ? static_cast<const WT*>(p.beta) + weight_offset : nullptr;

  // mean = center + shift (LayerNorm); both 0 for RMSNorm.
  float center = 0.f, shift = 0.f, rstd;
  Pack<XT, kVec> cache[Cfg::kCache == RowCache::kRegisters ? S::kIters : 1];
  if constexpr (Cfg::kCache == RowCache::kRegisters) {
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + lane;
      if (active && pack < NORMJIT_SEGMENT_VECS(S))
        cache[i] = Cfg::Prologue::template load<XT, WT, kVec>(p, x + pack * kVec, segment_col + pack * kVec);
    }
    if constexpr (kLayerNorm) {
      // Sums of deviations from a center and of their squares; the small deviation sum corrects
      // the mean without rounding it into |mean|. Warp rows center on a first-pass mean (two
      // shuffle trees). CTA-wide rows center on the row's first element instead, saving a barrier
      // round, which held them well below the one-reduction RMSNorm: the cancellation in
      // sq/N - shift^2 is bounded, since (x0 - mean)^2 <= N * variance.
      if constexpr (S::kThreads > 32) {
        center = active ? to_float(static_cast<const YT*>(p.x)[row * p.row_stride]) : 0.f;
      } else {
        const float sum = active ? pack_sum<Cfg, S::kIters>(cache, 0, lane, 0.f) : 0.f;
        center = row_sum<S::kThreads>(sum, sum_scratch) * kInvN;
      }
    }
    const float2 dev_sq = active ? pack_dev_sq<Cfg, S::kIters>(cache, 0, lane, center) : make_float2(0.f, 0.f);
    centered_stats<Cfg>(dev_sq.x, dev_sq.y, p.eps, pair_scratch, sum_scratch, &cluster_slots[kLayerNorm ? 1 : 0],
                        shift, rstd);
    // Done reading the other CTAs' slots; they may exit once everyone has arrived.
    if constexpr (S::kCluster > 1) cluster_arrive();
  } else if constexpr (Cfg::kCache == RowCache::kShared) {
    // One pass over global memory: each thread keeps the packs it loads in shared memory and
    // reads back only its own, so no barrier orders the two passes. Sums are centered on the row's
    // x[0], as for CTA-wide register rows: one pair reduction. A cluster keeps one segment of the
    // row in each CTA's shared memory (rows too large for one SM) and sums through DSMEM.
    if constexpr (kLayerNorm) center = active ? to_float(static_cast<const YT*>(p.x)[row * p.row_stride]) : 0.f;
    float dev = 0.f, sq = 0.f;
    for (int base = 0; base < S::kIters; base += S::kChunk) {
      Pack<XT, kVec> chunk[S::kChunk];
#pragma unroll
      for (int i = 0; i < S::kChunk; ++i) {
        const int pack = (base + i) * S::kThreads + lane;
        if (active && pack < NORMJIT_SEGMENT_VECS(S)) {
          chunk[i] = Cfg::Prologue::template load<XT, WT, kVec>(p, x + pack * kVec, segment_col + pack * kVec);
          store_pack<XT, kVec>(shared_row + pack * kVec, chunk[i]);
        }
      }
      if (!active) continue;
      const float2 chunk_dev_sq = pack_dev_sq<Cfg, S::kChunk>(chunk, base, lane, center);
      dev += chunk_dev_sq.x;
      sq += chunk_dev_sq.y;
    }
    centered_stats<Cfg>(dev, sq, p.eps, pair_scratch, sum_scratch, &cluster_slots[kLayerNorm ? 1 : 0], shift, rstd);
    if constexpr (S::kCluster > 1) cluster_arrive();
  } else {
    // The row streams from global memory twice. LayerNorm merges per-chunk moments (Chan) of
    // x - x[0], so one statistics pass is free of cancellation; RMSNorm only sums squares.
    if constexpr (kLayerNorm) center = active ? to_float(x[0]) : 0.f;
    Moments local{0.f, 0.f, 0.f};
    for (int base = 0; base < S::kIters; base += S::kChunk) {
      Pack<XT, kVec> chunk[S::kChunk];
      load_input_chunk<Cfg, S::kChunk, XT, WT>(p, chunk, x, base, lane, active, segment_col);
      if (!active) continue;
      if constexpr (kLayerNorm) {
        const float count = pack_count<Cfg, S::kChunk>(base, lane);
        const float chunk_mean = count > 0.f ? pack_sum<Cfg, S::kChunk>(chunk, base, lane, center) / count : 0.f;
        local = merge(local, Moments{count, chunk_mean,
                                     pack_sq_dev<Cfg, S::kChunk>(chunk, base, lane, center, chunk_mean)});
      } else {
        local.m2 += pack_sq_dev<Cfg, S::kChunk>(chunk, base, lane, 0.f, 0.f);
      }
    }
    if constexpr (kLayerNorm) {
      const Moments row_m = row_merge<S::kThreads>(local, moments_scratch);
      shift = row_m.mean;
      rstd = rsqrtf(row_m.m2 * kInvN + p.eps);
    } else {
      rstd = rsqrtf(row_sum<S::kThreads>(local.m2, sum_scratch) * kInvN + p.eps);
    }
  }

  if constexpr (Cfg::kTraining) {
    if (active && lane == 0 && rank == 0) {
      if constexpr (kLayerNorm) p.mean[row] = center + shift;
      p.rstd[row] = rstd;
    }
  }
  constexpr const HeldWeights<WT, kVec, 0>* kNoHeldWeights = nullptr;
  float row_amax = 0.f;
  constexpr bool kRowScaled = RowScaled<typename Cfg::Epilogue>::value;
  // Register rows of a row-scaled epilogue keep y between its two passes (normalized once), or,
  // compiled with NORMJIT_RENORMALIZE_ROW_Y, normalize again in the writing pass: kIters * kVec
  // fewer live registers for more instructions. compile() builds both and keeps this one where it
  // fits more CTAs per SM (GeneratedSource::row_y_renormalize_option).
#ifdef NORMJIT_RENORMALIZE_ROW_Y
  constexpr bool kHoldsY = false;
#else
  constexpr bool kHoldsY = kRowScaled && Cfg::kCache == RowCache::kRegisters;
#endif
  float held_y[kHoldsY ? S::kIters : 1][kVec];
  if constexpr (kRowScaled) {
    __shared__ float max_scratch[kScratch];
    __shared__ float amax_slot;  // clustered rows: this CTA's part of the row's amax
    float amax;
    if constexpr (Cfg::kCache == RowCache::kRegisters)
      amax = write_packs<Cfg, S::kIters, XT, WT, kVec, 0, kPassMeasure>(
          p, cache, 0, lane, row, active, y, gamma, beta, center, shift, rstd, segment_col, kNoHeldWeights, 0.f,
          nullptr, kHoldsY ? held_y : nullptr);
    else
      amax = row_source_amax<Cfg, XT, WT>(p, Cfg::kCache == RowCache::kShared ? shared_row : Cfg::Prologue::reread(p, x),
                                          lane, row, active, gamma, beta, center, shift, rstd);
    row_amax = row_max<S::kThreads>(amax, max_scratch);
    if constexpr (S::kCluster > 1) {
      // The statistics' arrive (above) is completed first: a thread's cluster barriers alternate
      // arrive, wait. Then the row's amax over the cluster, and the arrive the exit's wait ends.
      cluster_wait();
      row_amax = cluster_max<S::kCluster>(row_amax, &amax_slot);
      cluster_arrive();
    }
  }
  using Epilogue = typename Cfg::Epilogue;
  typename EpilogueState<Epilogue>::type state = EpilogueStart<Epilogue>::make(p);
  if constexpr (kHoldsY) {
    write_packs<Cfg, S::kIters, XT, WT, kVec, 0, kPassWriteHeld>(p, cache, 0, lane, row, active, y, gamma, beta,
                                                                 center, shift, rstd, segment_col, kNoHeldWeights,
                                                                 row_amax, &state, held_y);
    if constexpr (S::kCluster > 1) cluster_wait();
  } else if constexpr (Cfg::kCache == RowCache::kRegisters) {
    write_packs<Cfg, S::kIters, XT, WT>(p, cache, 0, lane, row, active, y, gamma, beta, center, shift, rstd,
                                        segment_col, kNoHeldWeights, row_amax, &state);
    // A CTA's shared memory must outlive the other CTAs' reads of it.
    if constexpr (S::kCluster > 1) cluster_wait();
  } else {
    // Second pass: from shared memory (kShared) or global memory again (kGlobal).
    write_row<Cfg>(p, Cfg::kCache == RowCache::kShared ? shared_row : Cfg::Prologue::reread(p, x), lane, row, active,
                   y, gamma, beta, center, shift, rstd, segment_col, kNoHeldWeights, row_amax, &state);
    if constexpr (S::kCluster > 1) cluster_wait();
  }
  if constexpr (EpilogueState<Epilogue>::kStateful) Epilogue::template finish<S::kThreads>(state, p);
}

// Starts the copy of `row` (this CTA's segment, from segment_col) into buffer `buffer` of
// `rows`; past the last row, an empty group (see row_pipeline.cuh).
template <class Cfg, bool kBulk, class XT>
__device__ __forceinline__ void fwd_fill_buffer(const NormParams& p, XT* rows, unsigned long long* ready,
                                                int segment_col, int lane, long long row, int buffer) {
  using S = FwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  if constexpr (kBulk) {
    if (threadIdx.x == 0 && row < p.rows) {
      constexpr unsigned kBytes = S::kSegment * sizeof(XT);
      fence_shared_for_bulk_copy();
      expect_bulk_bytes(&ready[buffer], kBytes);
      bulk_copy_to_shared(rows + buffer * S::kSegment, static_cast<const XT*>(p.x) + row * p.row_stride + segment_col,
                          kBytes, &ready[buffer]);
    }
    return;
  }
  if (row < p.rows) {
    const XT* x = static_cast<const XT*>(p.x) + row * p.row_stride + segment_col;
    XT* const to = rows + buffer * S::kSegment;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i)
      if (const int pack = i * S::kThreads + lane; pack < S::kVecs)
        copy_async<XT, kVec>(to + pack * kVec, x + pack * kVec);
  }
  commit_async();
}

// Pipelined shared-memory rows (kSharedPipelined): a persistent grid; each CTA (cluster) walks
// rows gridDim.x / kCluster apart through kStages row buffers, keeping kStages - 1 rows in flight.
// Each thread copies its packs of a later row in asynchronously, then reads back only its own
// packs of the current one: the loads stay in flight across the row's reduction barrier and the
// stores, and no barrier orders the buffers.
template <class Cfg>
__device__ __forceinline__ void norm_fwd_pipelined(const NormParams& p) {
  using XT = typename Cfg::XT;
  using WT = typename Cfg::WT;
  using S = FwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr int kStages = Cfg::kStages;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  constexpr int kScratch = S::kThreads / 32;
  static_assert(Cfg::kRowsPerCta == 1 && S::kThreads > 32, "a pipelined row fills its CTA");
  static_assert(kStages >= 2, "a pipelined row needs a buffer to fill while it works on another");
  static_assert(!S::kRagged, "a pipelined row's buffers take whole, equal segments");
  static_assert(Cfg::Prologue::kNormalizesX, "pipelined rows copy x alone into their buffers");
  static_assert(sizeof(typename Cfg::YT) == sizeof(XT), "pipelined rows normalize x as given");
  __shared__ float sum_scratch[kScratch];
  __shared__ float2 pair_scratch[kScratch];
  __shared__ float2 cluster_slots[2];  // alternate per row (see cluster_sum)
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  XT* const shared_rows = reinterpret_cast<XT*>(dynamic_shared);  // kStages buffers of kSegment
  // Rows filled by bulk copies: thread 0 copies each buffer's segment whole; row_ready[b]
  // completes a phase each time buffer b has landed.
  constexpr bool kBulk = Cfg::kBulkCopy;
  using Pipeline = RowPipeline<Cfg, kBulk>;
  __shared__ unsigned long long row_ready[kBulk ? kStages : 1];
  Pipeline::init(row_ready);

  const int lane = threadIdx.x;
  const int rank = blockIdx.x % S::kCluster;
  const int segment_col = rank * S::kSegment;
  const long long first = blockIdx.x / S::kCluster;
  const long long stride = gridDim.x / S::kCluster;
  // Weights in registers where they take at most 32 of them over at most 4 packs (5 packs, or 8
  // of gamma alone, spilled at 512 threads) and the CTA can give 128 per thread (at most 512
  // threads); AdaLayerNorm's weights change with the row's group.
  constexpr int kWeightRegs = S::kIters * (Cfg::kHasBias ? 2 : 1) * int(sizeof(Pack<WT, kVec>)) / 4;
  constexpr int kHeld =
      !Cfg::kPerGroupWeights && S::kThreads <= 512 && S::kIters <= 4 && kWeightRegs <= 32 ? S::kIters : 0;
  HeldWeights<WT, kVec, kHeld> held;
  if constexpr (kHeld > 0) {
    const WT* gamma = static_cast<const WT*>(p.gamma) + segment_col;
    const WT* beta = Cfg::kHasBias ? static_cast<const WT*>(p.beta) + segment_col : nullptr;
#pragma unroll
    for (int i = 0; i < kHeld; ++i)
      if (const int pack = i * S::kThreads + lane; pack < S::kVecs) {
        held.g[i] = load_pack<WT, kVec>(gamma + pack * kVec);
        if constexpr (Cfg::kHasBias) held.b[i] = load_pack<WT, kVec>(beta + pack * kVec);
      }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    fwd_fill_buffer<Cfg, kBulk>(p, shared_rows, row_ready, segment_col, lane, first + s * stride, s);
  using Epilogue = typename Cfg::Epilogue;
  typename EpilogueState<Epilogue>::type state = EpilogueStart<Epilogue>::make(p);
  int buffer = 0, parity = 0;
  unsigned ready_phases = 0;  // bulk copies: bit b, the parity of buffer b's next phase
  for (long long row = first; row < p.rows; row += stride, parity ^= 1) {
    Pipeline::before_fill_behind();
    fwd_fill_buffer<Cfg, kBulk>(p, shared_rows, row_ready, segment_col, lane, row + (kStages - 1) * stride,
                                Pipeline::behind(buffer));
    const long long offset = row * p.row_stride + segment_col;
    const long long weight_offset =
        (Cfg::kPerGroupWeights ? group_of_row(row, p.rows_per_group) * Cfg::kN : 0) + segment_col;
    const WT* gamma = static_cast<const WT*>(p.gamma) + weight_offset;
    const WT* beta = Cfg::kHasBias ? static_cast<const WT*>(p.beta) + weight_offset : nullptr;
    XT* y = static_cast<XT*>(p.y) + offset;
    // Centered on the row's x[0], read from global memory: another thread copied it in.
    const float center = kLayerNorm ? to_float(static_cast<const XT*>(p.x)[row * p.row_stride]) : 0.f;
    ready_phases ^= Pipeline::wait(row_ready, buffer, ready_phases);
    const XT* const row_x = shared_rows + buffer * S::kSegment;
    float dev = 0.f, sq = 0.f;
    for (int base = 0; base < S::kIters; base += S::kChunk) {
      Pack<XT, kVec> chunk[S::kChunk];
      load_chunk<Cfg>(chunk, row_x, base, lane, true);
      const float2 chunk_dev_sq = pack_dev_sq<Cfg, S::kChunk>(chunk, base, lane, center);
      dev += chunk_dev_sq.x;
      sq += chunk_dev_sq.y;
    }
    float shift = 0.f, rstd;
    centered_stats<Cfg>(dev, sq, p.eps, pair_scratch, sum_scratch, &cluster_slots[parity], shift, rstd);
    if constexpr (Cfg::kTraining) {
      if (lane == 0 && rank == 0) {
        if constexpr (kLayerNorm) p.mean[row] = center + shift;
        p.rstd[row] = rstd;
      }
    }
    float row_amax = 0.f;
    if constexpr (RowScaled<typename Cfg::Epilogue>::value) {
      // Its own scratch: the statistics' reduction may still be reading theirs.
      __shared__ float max_scratch[kScratch];
      __shared__ float amax_slots[2];  // clustered rows: alternate per row, as cluster_slots
      row_amax = row_max<S::kThreads>(
          row_source_amax<Cfg, XT, WT, kHeld>(p, row_x, lane, row, true, gamma, beta, center, shift, rstd, &held),
          max_scratch);
      row_amax = cluster_max<S::kCluster>(row_amax, &amax_slots[parity]);
    }
    write_row<Cfg, XT, WT, kHeld>(p, row_x, lane, row, true, y, gamma, beta, center, shift, rstd, segment_col, &held,
                                  row_amax, &state);
    buffer = Pipeline::next(buffer);
    // The next row's reduction reuses the scratch (a cluster's barrier already orders it).
    if constexpr (S::kCluster == 1) __syncthreads();
  }
  Pipeline::drain();
  if constexpr (EpilogueState<Epilogue>::kStateful) Epilogue::template finish<S::kThreads>(state, p);
  // A CTA's cluster slots must outlive the other CTAs' reads of them.
  if constexpr (S::kCluster > 1) {
    cluster_arrive();
    cluster_wait();
  }
}

template <class Cfg>
__device__ __forceinline__ void norm_fwd(const NormParams& p) {
  // Unclustered kernels are programmatic dependents of the stream's previous kernel (the host
  // launches them so): the next kernel may begin launching once every CTA of this one has started,
  // and nothing here touches global memory before the previous kernel has finished.
  if constexpr (FwdShape<Cfg>::kCluster == 1) {
    allow_dependent_launch();
    wait_for_prerequisites();
  }
  if constexpr (Cfg::kCache == RowCache::kSharedPipelined)
    norm_fwd_pipelined<Cfg>(p);
  else
    norm_fwd_row<Cfg>(p);
}

}  // namespace normjit
