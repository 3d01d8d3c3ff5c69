// LayerNorm / RMSNorm forward, training (y, mean, rstd) and inference (y).
// One row is handled by kThreadsPerRow threads; a CTA holds kRowsPerCta rows.
// Statistics use fp32; LayerNorm's variance comes from merged per-thread moments (two-pass
// within each thread's values, Chan merge across threads), so no cancellation.
#pragma once
#include "normjit/common.cuh"

namespace normjit {

template <class Cfg>
struct FwdShape {
  static constexpr int kVec = Cfg::kVec;
  static constexpr int kThreads = Cfg::kThreadsPerRow;
  static constexpr int kVecs = Cfg::kN / kVec;                       // packs per row
  static constexpr int kIters = (kVecs + kThreads - 1) / kThreads;   // packs per thread
  // In the global path a thread streams its packs in chunks of this many.
  static constexpr int kChunk = kIters < 4 ? kIters : 4;
  static_assert(Cfg::kN % kVec == 0, "vec must divide N");
};

// Moments of kCount packs; for RMSNorm only the sum of squares (in .m2, mean 0) is formed.
template <class Cfg, int kCount, class XT, int kVec>
__device__ __forceinline__ Moments pack_moments(const Pack<XT, kVec> (&packs)[kCount], int first_pack,
                                                int lane) {
  using S = FwdShape<Cfg>;
  float sum = 0.f, count = 0.f;
  if constexpr (Cfg::kNorm == NormKind::kLayerNorm) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      if ((first_pack + i) * S::kThreads + lane < S::kVecs) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += to_float(packs[i].v[j]);
        count += kVec;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCount; ++i)
      if ((first_pack + i) * S::kThreads + lane < S::kVecs) count += kVec;
  }
  const float local_mean = count > 0.f ? sum / count : 0.f;
  float m2 = 0.f;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    if ((first_pack + i) * S::kThreads + lane < S::kVecs) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = to_float(packs[i].v[j]) - local_mean;
        m2 += d * d;
      }
    }
  }
  return {count, local_mean, m2};
}

template <class Cfg, int kCount, class XT, class WT, int kVec>
__device__ __forceinline__ void write_packs(const FwdParams& p, const Pack<XT, kVec> (&packs)[kCount],
                                            int first_pack, int lane, long long row, XT* y, float mean,
                                            float rstd) {
  using S = FwdShape<Cfg>;
  const WT* gamma = static_cast<const WT*>(p.gamma);
  const WT* beta = static_cast<const WT*>(p.beta);
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const int pack = (first_pack + i) * S::kThreads + lane;
    if (pack < S::kVecs) {
      const int col = pack * kVec;
      const Pack<WT, kVec> g = load_pack<WT, kVec>(gamma + col);
      Pack<WT, kVec> b;
      if constexpr (Cfg::kHasBias) b = load_pack<WT, kVec>(beta + col);
      float out[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xhat = (to_float(packs[i].v[j]) - mean) * rstd;
        out[j] = xhat * to_float(g.v[j]);
        if constexpr (Cfg::kHasBias) out[j] += to_float(b.v[j]);
      }
      Cfg::Epilogue::template apply<kVec>(out, row, col);
      Pack<XT, kVec> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o.v[j] = Convert<XT>::from(out[j]);
      store_pack<XT, kVec>(y + col, o);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void norm_fwd(const FwdParams& p) {
  using XT = typename Cfg::XT;
  using WT = typename Cfg::WT;
  using S = FwdShape<Cfg>;
  constexpr int kVec = Cfg::kVec;
  constexpr bool kLayerNorm = Cfg::kNorm == NormKind::kLayerNorm;
  __shared__ Moments scratch[S::kThreads > 32 ? S::kThreads / 32 : 1];

  const int lane = threadIdx.x % S::kThreads;
  const long long row = static_cast<long long>(blockIdx.x) * Cfg::kRowsPerCta + threadIdx.x / S::kThreads;
  // Rows past the end still take part in the shuffles; they neither load nor store.
  const bool active = row < p.rows;
  const long long offset = (active ? row : 0) * p.row_stride;
  const XT* x = static_cast<const XT*>(p.x) + offset;
  XT* y = static_cast<XT*>(p.y) + offset;

  Moments local{0.f, 0.f, 0.f};
  Pack<XT, kVec> cache[Cfg::kCache == RowCache::kRegisters ? S::kIters : 1];
  if constexpr (Cfg::kCache == RowCache::kRegisters) {
#pragma unroll
    for (int i = 0; i < S::kIters; ++i) {
      const int pack = i * S::kThreads + lane;
      if (active && pack < S::kVecs) cache[i] = load_pack<XT, kVec>(x + pack * kVec);
    }
    if (active) local = pack_moments<Cfg, S::kIters>(cache, 0, lane);
  } else {
    for (int base = 0; base < S::kIters; base += S::kChunk) {
      Pack<XT, kVec> chunk[S::kChunk];
#pragma unroll
      for (int i = 0; i < S::kChunk; ++i) {
        const int pack = (base + i) * S::kThreads + lane;
        if (active && pack < S::kVecs) chunk[i] = load_pack<XT, kVec>(x + pack * kVec);
      }
      if (active) {
        const Moments m = pack_moments<Cfg, S::kChunk>(chunk, base, lane);
        if constexpr (kLayerNorm) {
          local = merge(local, m);
        } else {
          local.m2 += m.m2;  // RMSNorm: m2 is the plain sum of squares (mean stays 0)
        }
      }
    }
  }

  float mean = 0.f, rstd;
  if constexpr (kLayerNorm) {
    const Moments row_m = row_merge<S::kThreads>(local, scratch);
    mean = row_m.mean;
    rstd = rsqrtf(row_m.m2 / static_cast<float>(Cfg::kN) + p.eps);
  } else {
    const float total = row_sum<S::kThreads>(local.m2, reinterpret_cast<float*>(scratch));
    rstd = rsqrtf(total / static_cast<float>(Cfg::kN) + p.eps);
  }

  if constexpr (Cfg::kTraining) {
    if (active && lane == 0) {
      if constexpr (kLayerNorm) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
  if (!active) return;

  if constexpr (Cfg::kCache == RowCache::kRegisters) {
    write_packs<Cfg, S::kIters, XT, WT>(p, cache, 0, lane, row, y, mean, rstd);
  } else {
    for (int base = 0; base < S::kIters; base += S::kChunk) {
      Pack<XT, kVec> chunk[S::kChunk];
#pragma unroll
      for (int i = 0; i < S::kChunk; ++i) {
        const int pack = (base + i) * S::kThreads + lane;
        if (pack < S::kVecs) chunk[i] = load_pack<XT, kVec>(x + pack * kVec);
      }
      write_packs<Cfg, S::kChunk, XT, WT>(p, chunk, base, lane, row, y, mean, rstd);
    }
  }
}

}  // namespace normjit
