// Fused backward with a producer warp (spelled ws, ws3 ... ws8): the CTA's last warp only copies
// rows in, the kThreadsPerRow threads before it (the consumers) only compute. The producer's
// lane 0 keeps a ring of kStages row buffers in shared memory filled by bulk copies (x then dy,
// as tma rows); each buffer has a `full` mbarrier (the copy's bytes) and an `empty` one (one
// arrival per consumer warp). A consumer warp moves its packs of the row into registers and
// releases the buffer at once, so kStages rows stay in flight while the consumers work on the one
// in their registers, and no CTA barrier ever waits for the producer. The consumers' row sums
// take named barrier 1 (kThreadsPerRow threads), with scratch alternating per row so no barrier
// closes a row. One row per CTA, no cluster, x and dy of one 16-bit or 32-bit type.
#pragma once
#include "normjit/async_copy.cuh"
#include "normjit/bwd_common.cuh"
#include "normjit/bwd_gamma.cuh"
#include "normjit/bwd_write_dx.cuh"
#include "normjit/reduce_cta.cuh"

namespace normjit {

// Specs with a producer warp bind kProducerWarp (no other spec's source has the line).
template <class Cfg, class = void>
inline constexpr bool kBwdProducerWarp = false;
template <class Cfg>
inline constexpr bool kBwdProducerWarp<Cfg, decltype(void(Cfg::kProducerWarp))> = Cfg::kProducerWarp;

// The consumers' barrier: hardware barrier 1 over their kThreads threads (0 is __syncthreads).
template <int kThreads>
struct ConsumerBarrier {
  static __device__ __forceinline__ void sync() { asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory"); }
};

template <class Cfg>
__device__ __forceinline__ void norm_bwd_producer_rows(const NormParams& p) {
  using XT = typename Cfg::XT;
  using YT = typename Cfg::YT;
  using WT = typename Cfg::WT;
  using S = BwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr int kStages = Cfg::kStages;
  constexpr int kThreads = S::kThreads;  // consumers
  constexpr int kConsumerWarps = kThreads / 32;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  constexpr bool kDbetaShared = Cfg::kDbetaShared;
  // gamma * d from pass 1 held for pass 2 where it is a few registers; else recomputed.
  constexpr bool kHoldGd = S::kIters * kVec <= 16;
  // The row's packs move into registers (the buffer freed at once) only where they are few;
  // otherwise both passes read the buffer and free it after the second.
  constexpr bool kHoldRow = S::kIters == 1;
  static_assert(Cfg::kRowsPerCta == 1 && Cfg::kCluster == 1 && kThreads % 32 == 0,
                "a producer-warp row is one CTA's, of whole warps");
  static_assert(!Cfg::kXhatFromY, "memory_efficient rows take the other sources");
  static_assert(sizeof(XT) == sizeof(YT), "bulk-copied rows take x and dy of one type");
  static_assert(!kDbetaShared || Cfg::kHasBias, "shared dbeta sums need a bias");
  __shared__ float2 pair_scratch[2][kConsumerWarps];
  __shared__ unsigned long long full[kStages], empty[kStages];
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  XT* const rows = reinterpret_cast<XT*>(dynamic_shared);
  float* const shared_b = reinterpret_cast<float*>(rows + 2 * kStages * S::kSegment);

  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < kStages; ++b) {
      init_barrier(&full[b]);
      init_barrier<kConsumerWarps>(&empty[b]);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the warps part here
  allow_dependent_launch();
  const long long group = blockIdx.y;
  const long long slot = blockIdx.x;
  const long long slots = gridDim.x;
  const long long row_blocks = p.rows_per_group;

  if (threadIdx.x >= kThreads) {  // the producer warp
    wait_for_prerequisites();
    if (threadIdx.x == kThreads) {
      constexpr unsigned kBytes = S::kSegment * sizeof(XT);
      int stage = 0;
      unsigned empty_parity = 0;  // the phase of empty[stage] to wait for, from the second round
      bool first_round = true;
      for (long long block = slot; block < row_blocks; block += slots) {
        if (!first_round) wait_row_barrier(&empty[stage], empty_parity);
        const long long offset = (group * p.rows_per_group + block) * p.row_stride;
        XT* const to_x = rows + 2 * stage * S::kSegment;
        expect_bulk_bytes(&full[stage], 2 * kBytes);
        bulk_copy_to_shared(to_x, static_cast<const XT*>(p.x) + offset, kBytes, &full[stage]);
        bulk_copy_to_shared(to_x + S::kSegment, static_cast<const YT*>(p.dy) + offset, kBytes, &full[stage]);
        if (++stage == kStages) {
          stage = 0;
          if (!first_round) empty_parity ^= 1u;
          first_round = false;
        }
      }
    }
    return;
  }

  const int lane = threadIdx.x;
  const long long weight_offset = Cfg::kPerGroupWeights ? group * Cfg::kN : 0;
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
      if (const int pack = i * kThreads + lane; pack < S::kVecs) store_pack<float, kVec>(shared_b + pack * kVec, zero);
  }
  wait_for_prerequisites();
  float next_mean = 0.f, next_rstd = 0.f;  // one row ahead: the row's own would be a DRAM round trip
  bwd_load_row_stats<Cfg>(p, group, 0, slot, next_mean, next_rstd);
  int stage = 0;
  unsigned full_parity = 0;
  int parity = 0;  // alternates per row: the row sums' scratch
  for (long long block = slot; block < row_blocks; block += slots, parity ^= 1) {
    const float mean = next_mean, rstd = next_rstd;
    bwd_load_row_stats<Cfg>(p, group, 0, block + slots, next_mean, next_rstd);
    const long long row = group * p.rows_per_group + block;
    const long long offset = row * p.row_stride;
    wait_row_barrier(&full[stage], full_parity);
    const XT* const shared_x = rows + 2 * stage * S::kSegment;
    const YT* const shared_dy = reinterpret_cast<const YT*>(shared_x + S::kSegment);
    Pack<XT, kVec> xs[kHoldRow ? S::kIters : 1];
    Pack<YT, kVec> dys[kHoldRow ? S::kIters : 1];
    if constexpr (kHoldRow) {
#pragma unroll
      for (int i = 0; i < S::kIters; ++i)
        if (const int pack = i * kThreads + lane; pack < S::kVecs) {
          xs[i] = load_pack<XT, kVec>(shared_x + pack * kVec);
          dys[i] = load_pack<YT, kVec>(shared_dy + pack * kVec);
        }
      // The warp's packs are in registers: the producer may refill the buffer.
      __syncwarp();
      if (lane % 32 == 0) arrive_on_barrier(&empty[stage]);
    }
    const int row_stage = stage;
    if (++stage == kStages) {
      stage = 0;
      full_parity ^= 1u;
    }
    // Pack i of this thread's x and dy: held, or read from the buffer.
    auto held = [&](int i, Pack<XT, kVec>& xv, Pack<YT, kVec>& dyv) {
      if constexpr (kHoldRow) {
        xv = xs[i];
        dyv = dys[i];
      } else {
        const int pack = i * kThreads + lane;
        xv = load_pack<XT, kVec>(shared_x + pack * kVec);
        dyv = load_pack<YT, kVec>(shared_dy + pack * kVec);
      }
    };

    float gd[kHoldGd ? S::kIters : 1][kVec];
    float c1 = 0.f, c2 = 0.f;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * kThreads + lane;
      const int col = pack * kVec;
      if (pack < S::kVecs) {
        const Pack<WT, kVec> g = load_pack<WT, kVec>(gamma + col);
        Pack<XT, kVec> xv;
        Pack<YT, kVec> dyv;
        held(i, xv, dyv);
        float xhat[kVec], d[kVec];
        pack_xhat_grad<Cfg>(xv, dyv, g, beta, p, row, col, 0, mean, rstd, xhat, d);
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
          const float gdj = d[j] * gf[j];
          if constexpr (kHoldGd) gd[i][j] = gdj;
          if constexpr (kLayerNorm) c1 += gdj;
          c2 += gdj * xhat[j];
        }
      }
    }
    row_sum_pair<kThreads, (kThreads / 32 > kSerialFold), ConsumerBarrier<kThreads>>(c1, c2, pair_scratch[parity]);
    c1 = kLayerNorm ? c1 * S::kInvN : 0.f;
    c2 = c2 * S::kInvN;

    const float slope = -rstd * rstd * c2;
    const float intercept = -rstd * c1 - slope * mean;
    YT* dx = static_cast<YT*>(p.dx) + offset;
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * kThreads + lane;
      if (pack < S::kVecs) {
        Pack<XT, kVec> xv;
        Pack<YT, kVec> dyv;
        held(i, xv, dyv);
        float gdv[kVec];
        if constexpr (kHoldGd) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) gdv[j] = gd[i][j];
        } else {
          const int col = pack * kVec;
          const Pack<WT, kVec> g = load_pack<WT, kVec>(gamma + col);
          float xhat[kVec], d[kVec];
          pack_xhat_grad<Cfg>(xv, dyv, g, beta, p, row, col, 0, mean, rstd, xhat, d);
          float gf[kVec];
          unpack_scale<Cfg>(g, gf);
#pragma unroll
          for (int j = 0; j < kVec; ++j) gdv[j] = d[j] * gf[j];
        }
        float xf[kVec];
        unpack(xv, xf);
        Pack<YT, kVec> o;
        if constexpr (Cfg::Prologue::kAddsToDx) {
          float dxf[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) dxf[j] = dx_element<Cfg>(gdv[j], xf[j], mean, rstd, c1, c2, slope, intercept);
          Cfg::Prologue::template add_to_dx<kVec, dx_loads_in_order<Cfg>>(p, dx + pack * kVec, dxf);
#pragma unroll
          for (int j = 0; j < kVec; ++j) o.v[j] = Convert<YT>::from(dxf[j]);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            o.v[j] = Convert<YT>::from(dx_element<Cfg>(gdv[j], xf[j], mean, rstd, c1, c2, slope, intercept));
        }
        store_output_pack<YT, kVec, false>(dx + pack * kVec, o);
      }
    }
    if constexpr (!kHoldRow) {  // done with the buffer
      __syncwarp();
      if (lane % 32 == 0) arrive_on_barrier(&empty[row_stage]);
    }
  }

  // One partial row per CTA.
  float* out_g = bwd_partial<Cfg>(p, 0, group, slot);
  float* out_b = bwd_partial<Cfg>(p, 1, group, slot);
#pragma unroll
  for (int i = 0; i < S::kIters; ++i) {
    const int pack = i * kThreads + lane;
    if (pack < S::kVecs) {
      Pack<float, kVec> g, b;
      if constexpr (kDbetaShared) b = load_pack<float, kVec>(shared_b + pack * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        g.v[j] = acc_g[i][j];
        if constexpr (!kDbetaShared) b.v[j] = acc_b[i][j];
      }
      store_output_pack<float, kVec, false>(out_g + pack * kVec, g);
      if constexpr (Cfg::kHasBias) store_output_pack<float, kVec, false>(out_b + pack * kVec, b);
    }
  }
}

}  // namespace normjit
