// Fused backward, pipelined rows (row_pipeline.cuh): each buffer holds a row's x and dy
// segments, and the CTA (cluster) works on one row while the next kStages - 1 are copied in, by
// each thread's cp.async or by bulk copies (kBulk), so the loads never wait behind the row's
// barrier and the dx stores. As for shared-memory rows, gamma * d is recomputed in the second
// pass. One row per CTA.
#pragma once
#include "normjit/bwd_common.cuh"
#include "normjit/row_pipeline.cuh"

namespace normjit {

// The residual add's bulk-copied rows copy dh_out into the row's buffer after x and dy where the
// host's bulk_copies_dh_out binds kBulkDhOut (the three rows fit), so the dx pass reads it from
// shared memory (its per-thread loads waited on DRAM, or on L2 when prefetched: H200 LN 18432
// t640 c2 76 % against the plain backward's 93).
template <class Cfg, class = void>
inline constexpr bool kCfgBulkDhOut = false;
template <class Cfg>
inline constexpr bool kCfgBulkDhOut<Cfg, decltype(void(Cfg::kBulkDhOut))> = Cfg::kBulkDhOut;
template <class Cfg, bool kBulk>
inline constexpr bool kBwdBulkDhOut = kBulk && kCfgBulkDhOut<Cfg>;

// Starts the copy of row block `block` of the CTA's group (its segment) into buffer `buffer` of
// `rows`; past the last row, an empty group.
template <class Cfg, bool kBulk, class XT>
__device__ __forceinline__ void bwd_fill_buffer(const NormParams& p, const BwdWalk& w, XT* rows,
                                                unsigned long long* ready, long long block, int buffer) {
  using YT = typename Cfg::YT;  // dy, in a slot of x's size
  using S = RowShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  if constexpr (kBulk) {
    if (threadIdx.x == 0 && block < w.row_blocks) {
      // A ragged cluster's last CTA copies its shorter segment (whole 16-byte packs either way).
      const unsigned bytes = NORMJIT_SEGMENT_VECS(S) * kVec * sizeof(XT);
      static_assert(sizeof(YT) == sizeof(XT), "bulk-copied rows take x and dy of one type");
      const long long offset = (w.group * p.rows_per_group + block) * p.row_stride + w.segment_col;
      constexpr int kArrays = kBwdBulkDhOut<Cfg, kBulk> ? 3 : 2;
      XT* const to_x = rows + kArrays * buffer * S::kSegment;
      fence_shared_for_bulk_copy();
      expect_bulk_bytes(&ready[buffer], kArrays * bytes);
      bulk_copy_to_shared(to_x, static_cast<const XT*>(p.x) + offset, bytes, &ready[buffer]);
      bulk_copy_to_shared(to_x + S::kSegment, static_cast<const YT*>(p.dy) + offset, bytes, &ready[buffer]);
      if constexpr (kBwdBulkDhOut<Cfg, kBulk>)
        bulk_copy_to_shared(to_x + 2 * S::kSegment, static_cast<const XT*>(p.dh_out) + offset, bytes, &ready[buffer]);
    }
    return;
  }
  if (block < w.row_blocks) {
    const long long offset = (w.group * p.rows_per_group + block) * p.row_stride + w.segment_col;
    XT* const to_x = rows + 2 * buffer * S::kSegment;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + w.lane;
      if (pack < NORMJIT_SEGMENT_VECS(S)) {
        copy_async<XT, kVec>(to_x + pack * kVec, static_cast<const XT*>(p.x) + offset + pack * kVec);
        copy_async<YT, kVec>(reinterpret_cast<YT*>(to_x + S::kSegment) + pack * kVec,
                             static_cast<const YT*>(p.dy) + offset + pack * kVec);
      }
    }
  }
  commit_async();
}

template <class Cfg, bool kBulkCopy, bool kStatsAhead>
struct BwdPipelinedRows {
  using XT = typename Cfg::XT;
  using YT = typename Cfg::YT;
  using S = RowShape<Cfg>;
  using Pipeline = RowPipeline<Cfg, kBulkCopy>;
  static constexpr int kVec = Cfg::kVec;
  static constexpr bool kInRegisters = false;
  static constexpr bool kBulk = kBulkCopy;
  static constexpr int kBuffers = Pipeline::kStages;
  static constexpr int kArrays = kBwdBulkDhOut<Cfg, kBulkCopy> ? 3 : 2;
  static_assert(!kCfgBulkDhOut<Cfg> || (kBulkCopy && Cfg::Prologue::kAddsToDx), "kBulkDhOut: bulk-copied residual rows only");
  static constexpr bool kStatsFirst = true;
  static __device__ __forceinline__ void init(unsigned long long* ready) { Pipeline::init(ready); }

  // The first row's statistics (kStatsAhead) and the first kStages - 1 rows' copies.
  static __device__ __forceinline__ void start(const NormParams& p, const BwdWalk& w, XT* rows,
                                               unsigned long long* ready, float& next_mean, float& next_rstd) {
    if constexpr (kStatsAhead) bwd_load_row_stats<Cfg>(p, w.group, w.row_in_cta, w.slot, next_mean, next_rstd);
#pragma unroll
    for (int s = 0; s < kBuffers - 1; ++s) bwd_fill_buffer<Cfg, kBulk>(p, w, rows, ready, w.slot + s * w.slots, s);
  }

  // The row's mean and rstd: taken at the row's start, after its data had landed, they were a
  // DRAM round trip every row waited for, so with kStatsAhead they come one row ahead (two more
  // registers: next_mean, next_rstd); otherwise the row's own are read at its start and the next
  // row's warmed into L2.
  static __device__ __forceinline__ void load_stats(const NormParams& p, const BwdWalk& w, long long block,
                                                    float& mean, float& rstd, float& next_mean, float& next_rstd) {
    if constexpr (kStatsAhead) {
      mean = next_mean;
      rstd = next_rstd;
      bwd_load_row_stats<Cfg>(p, w.group, w.row_in_cta, block + w.slots, next_mean, next_rstd);
    } else {
      bwd_load_row_stats<Cfg>(p, w.group, w.row_in_cta, block, mean, rstd);
      if (const long long next = (block + w.slots) * Cfg::kRowsPerCta + w.row_in_cta;
          w.lane == 0 && next < p.rows_per_group) {
        if constexpr (kBwdReadsMean<Cfg>) prefetch_l2(p.mean + w.group * p.rows_per_group + next);
        prefetch_l2(p.rstd + w.group * p.rows_per_group + next);
      }
    }
  }

  // Starts the copy of the row kStages - 1 ahead into the buffer behind this row's.
  static __device__ __forceinline__ void fill(const NormParams& p, const BwdWalk& w, long long block, bool,
                                              const XT*, const YT*, XT*, YT*, Pack<XT, kVec> (&)[1],
                                              Pack<YT, kVec> (&)[1], XT* rows, unsigned long long* ready, int buffer) {
    Pipeline::before_fill_behind();
    bwd_fill_buffer<Cfg, kBulk>(p, w, rows, ready, block + (kBuffers - 1) * w.slots, Pipeline::behind(buffer));
  }

  static __device__ __forceinline__ unsigned wait(unsigned long long* ready, int buffer, unsigned ready_phases) {
    return Pipeline::wait(ready, buffer, ready_phases);
  }

  static __device__ __forceinline__ int next(int buffer) { return Pipeline::next(buffer); }
  static __device__ __forceinline__ void finish() { Pipeline::drain(); }
};

}  // namespace normjit
