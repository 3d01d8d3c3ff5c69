// Generic kernels: one kernel serves every N. The row's length and the spec's boolean fields
// (statistics with or without the mean, bias, per-group weights, zero-centred weights, training
// outputs) are launch arguments (NormParams::n, ::generic_flags); the dtypes, the epilogue and the
// vector width stay compile-time. They ship compiled inside the library (tools/build_generic.cpp)
// and run while NVRTC specializes a spec, or alone where no NVRTC may run (docs/generic.md).
//
// One CTA per row (a grid-stride loop over rows), blockDim.x threads of any multiple of 32: pack p
// of a row belongs to thread p % blockDim.x, the layout of the specialized kernels, so the same
// epilogue functors apply. Each pass streams the row from global memory; the second pass finds it
// in L2 (where the rows in flight crowd it, kGenericRowsPastL2 orders the passes and streams the
// last one, or generic_fwd_cluster splits the row over a cluster that reads it once into shared
// memory; the backward holds rows of at most 1024 packs in registers, generic_bwd_held). LayerNorm
// sums deviations from the row's first element (the cancellation in
// sq / N - shift^2 is bounded, as in the specialized CTA-wide rows).
#pragma once
#include "normjit/common.cuh"
#include "normjit/fwd_write_y.cuh"
#include "normjit/generic_flags.h"

namespace normjit {

// Sums of (a, b) over the CTA, the same for every thread, added in warp order. The scratch is
// free again when it returns.
__device__ __forceinline__ float2 generic_cta_sum2(float a, float b, float2* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  const int warps = blockDim.x / 32;
  if (warps == 1) return make_float2(a, b);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = make_float2(a, b);
  __syncthreads();
  float2 total = make_float2(0.f, 0.f);
  for (int w = 0; w < warps; ++w) {
    total.x += scratch[w].x;
    total.y += scratch[w].y;
  }
  __syncthreads();
  return total;
}

template <class T, int kVec>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kVec]) {
  unpack(load_pack<T, kVec>(p), out);
}

// The two 16-bit elements of a 32-bit word as floats (the first in the low half).
__device__ __forceinline__ void unpack_word(const bf16*, unsigned w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_word(const f16*, unsigned w, float& lo, float& hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(w));
}

// y's pack as a streaming store (st.global.cs: evict-first in L2), so that it does not push out
// the rows the forward reads again; store_output_pack's st.global.v4 otherwise.
template <class T, int kVec>
__device__ __forceinline__ void store_output_pack_streaming(T* p, const Pack<T, kVec>& v) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  constexpr int kWords = kVec / kPerWord;
  if constexpr (kWords < 4 || kWords % 4 != 0) {
    store_output_pack<T, kVec, true>(p, v);
  } else {
    unsigned w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      w[i] = kPerWord == 1 ? element_bits(v.v[i]) : element_bits(v.v[2 * i]) | element_bits(v.v[2 * i + 1]) << 16;
#pragma unroll
    for (int i = 0; i < kWords; i += 4)
      asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; st.global.cs.v4.b32 [g], {%1, %2, %3, %4}; }" ::"l"(
                       p + i * kPerWord),
                   "r"(w[i]), "r"(w[i + 1]), "r"(w[i + 2]), "r"(w[i + 3]));
  }
}

// A pack loaded in one pass and used later in it, kept as 32-bit words and written on every path
// (clear() where there is nothing to load). Under the launch bounds' 64 registers, a Pack of
// 16-bit elements left as it was on some path (no bias, past the row's end) was carried element
// by element, a register each, and spilled. Packs under 4 bytes stay Packs.
template <class T, int kVec, bool kInWords = sizeof(Pack<T, kVec>) % 4 == 0>
struct GenericPack {
  Pack<T, kVec> pack;
  __device__ __forceinline__ void load(const T* p) { pack = load_pack<T, kVec>(p); }
  __device__ __forceinline__ void load_streaming(const T* p) { load(p); }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int j = 0; j < kVec; ++j) pack.v[j] = T{};
  }
  __device__ __forceinline__ void unpack_to(float (&out)[kVec]) const { unpack(pack, out); }
};
template <class T, int kVec>
struct GenericPack<T, kVec, true> {
  static constexpr int kWords = static_cast<int>(sizeof(Pack<T, kVec>)) / 4;
  unsigned w[kWords];
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kWords % 4 == 0) {  // 16 bytes a load (a pack of 8 fp32 weights: two)
#pragma unroll
      for (int i = 0; i < kWords; i += 4) {
        const uint4 v = reinterpret_cast<const uint4*>(p)[i / 4];
        w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
      }
    } else if constexpr (kWords == 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x, w[1] = v.y;
    } else {
      static_assert(kWords == 1, "a pack of 4, 8 or a multiple of 16 bytes");
      w[0] = *reinterpret_cast<const unsigned*>(p);
    }
  }
  // A last read (ld.global.cs: evict-first in L2).
  __device__ __forceinline__ void load_streaming(const T* p) {
    if constexpr (kWords % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kWords; i += 4)
        asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(w[i]), "=r"(w[i + 1]), "=r"(w[i + 2]), "=r"(w[i + 3])
            : "l"(reinterpret_cast<const uint4*>(p) + i / 4));
    } else if constexpr (kWords == 2) {
      asm("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
    } else {
      asm("ld.global.cs.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
    }
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  __device__ __forceinline__ void unpack_to(float (&out)[kVec]) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      if constexpr (sizeof(T) == 4) out[i] = __uint_as_float(w[i]);
      else unpack_word(static_cast<const T*>(nullptr), w[i], out[2 * i], out[2 * i + 1]);
    }
  }
};

// The residual add's kinds (a compile-time argument of the kernels): none, the stream in x's
// dtype (.residual), or an fp32 stream beside x in bf16 / f16 (.residual_f32).
enum GenericResidual : int { kGenericNoResidual = 0, kGenericResidualX = 1, kGenericResidualF32 = 2 };

// The stream's element type: x's, or fp32.
template <class XT, int kResidual>
struct GenericStream {
  using type = XT;
};
template <class XT>
struct GenericStream<XT, kGenericResidualF32> {
  using type = float;
};

// The largest |v| over the CTA, the same for every thread (the scratch is free again after it).
__device__ __forceinline__ float generic_cta_max(float v, float2* scratch) {
  v = group_max<32>(v);
  const int warps = blockDim.x / 32;
  if (warps == 1) return v;
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32].x = v;
  __syncthreads();
  float m = 0.f;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, scratch[w].x);
  __syncthreads();
  return m;
}

// The forward's statistics pass over a row: sums of deviations from `center` and of their
// squares, kU packs a round. kResidual: the pack normalized is h = x (+ bias_in) + residual,
// summed in fp32, rounded once to the stream's dtype ST and stored to h.
template <class XT, class ST, class WT, int kVec, int kU, bool kResidual>
__device__ __forceinline__ void generic_stats_pass(const XT* x, const ST* res, const WT* bias_row, ST* h, int tid,
                                                   int threads, int packs, bool bias_in, float center, float& dev,
                                                   float& sq, bool from_end) {
  // From the row's end where the pass after it should find the lines read last in L2 (it starts
  // from the row's start).
  const int step = threads * kU, last = (packs - 1) / step * step;
  for (int k = 0; k < packs; k += step) {
    const int base = (from_end ? last - k : k) + tid;
    GenericPack<XT, kVec> v[kU];
    GenericPack<ST, kVec> r[kResidual ? kU : 1];
    GenericPack<WT, kVec> bi[kResidual ? kU : 1];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int pack = base + u * threads;
      if (pack < packs) v[u].load(x + pack * kVec);
      else v[u].clear();
      if constexpr (kResidual) {
        if (pack < packs) r[u].load(res + pack * kVec);
        else r[u].clear();
        if (bias_in && pack < packs) bi[u].load(bias_row + pack * kVec);
        else bi[u].clear();
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (const int pack = base + u * threads; pack < packs) {
        float f[kVec];
        v[u].unpack_to(f);
        if constexpr (kResidual) {
          float rf[kVec], bf[kVec];
          r[u].unpack_to(rf);
          bi[u].unpack_to(bf);
          Pack<ST, kVec> hv;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            hv.v[j] = Convert<ST>::from((bias_in ? f[j] + bf[j] : f[j]) + rf[j]);
            f[j] = to_float(hv.v[j]);
          }
          store_output_pack<ST, kVec, true>(h + pack * kVec, hv);
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = f[j] - center;
          dev += d;
          sq += d * d;
        }
      }
  }
}

// Packs of the residual add's statistics pass in flight per thread: x, residual and bias_in each.
constexpr int kGenericResidualUnroll = 2;

// Packs of the forward's output pass in flight per thread: x, gamma and beta each (four spilled
// under the launch bounds' 64 registers with fp32 weights).
constexpr int kGenericOutUnroll = 2;

// The cluster the launch gave a backward's _cluster kernels (generic_launch: 2-16 CTAs sharing
// a row, each a segment of its columns); sm_80 images have none.
__device__ __forceinline__ unsigned generic_cluster_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned size;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
  return size;
#else
  return 1;
#endif
}
__device__ __forceinline__ unsigned generic_cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
#else
  return 0;
#endif
}

// cluster_reduce (reduce_cluster.cuh) for a cluster of run-time size (at most 32), its slot rules
// included: each rank's part folded in rank order, so every CTA gets the same bits. Lane r of each
// warp loads rank r's part, all at once, and the warp folds them through shuffles: a loop of
// remote loads, each waited for before the next (the size is not known to unroll it), took a
// distributed-shared-memory latency per rank.
template <class T, class Combine>
__device__ __forceinline__ T generic_cluster_reduce(T v, T* slot, unsigned cluster, T init, Combine combine) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) {
    if (threadIdx.x == 0) {
      *slot = v;
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    cluster_wait();
    const unsigned lane = threadIdx.x % 32;
    T part = init;
    if (lane < cluster) load_cluster_slot(part, cluster_address(slot, lane));
    T total = init;
    for (unsigned r = 0; r < cluster; ++r) combine(total, shfl_lane(part, static_cast<int>(r)));
    return total;
  }
#endif
  return v;
}

// The backward's row sums over a cluster of run-time size (ClusterPushSums, pushed into each
// CTA). kClustered false: no cluster, nothing in shared memory.
template <bool kClustered>
struct GenericClusterSums {
  __device__ __forceinline__ void init(unsigned) {}
  __device__ __forceinline__ float2 sum(float2 v, long long, unsigned) { return v; }
};
template <>
struct GenericClusterSums<true> {
  ClusterPushSums<kGenericMaxCluster> pushed;

  // Every thread of every CTA, before any row's sum: the barriers exist before anyone pushes.
  __device__ __forceinline__ void init(unsigned cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (cluster > 1) {
      pushed.init_and_arrive();
      cluster_wait();
    }
#endif
  }
  // turn: the CTA's row count so far. Every thread calls it after a CTA barrier has made `v` whole.
  __device__ __forceinline__ float2 sum(float2 v, long long turn, unsigned cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (cluster > 1) return pushed.sum(v, static_cast<unsigned>(turn), cluster);
#endif
    return v;
  }
};

// No CTA of a cluster leaves while another may still read its slots.
__device__ __forceinline__ void generic_cluster_exit(unsigned cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) {
    cluster_arrive();
    cluster_wait();
  }
#endif
}

// kResidual (GenericResidual): the residual add, its own kernels (in the plain ones its registers
// spilled the output pass). Quantizing epilogues: a stateful one (per-tensor FP8's amax) keeps its
// state over the CTA's rows and finishes once; a row-scaled one (per-row FP8 / int8) gets the
// row's largest |y| from a pass that only measures it; the block-scaled ones reduce each block
// over the lanes holding it (a round's packs are whole warps', pack p at thread p % threads).
template <class XT, class WT, class Epilogue, int kVec, int kResidual>
__device__ __forceinline__ void generic_fwd(const NormParams& p) {
  using ST = typename GenericStream<XT, kResidual>::type;
  constexpr bool residual = kResidual != kGenericNoResidual;
  constexpr bool kRowScaled = RowScaled<Epilogue>::value;
  constexpr bool kStateful = EpilogueState<Epilogue>::kStateful;
  // The quantizing epilogues (y optional) take one pack a round: their encoders' registers spilled
  // 100-480 bytes beside two packs under the launch bounds' 64 registers.
  constexpr int kOutUnroll = Epilogue::kAlwaysStoresY ? kGenericOutUnroll : 1;
  __shared__ float2 scratch[32];
  const int n = p.n, flags = p.generic_flags;
  const bool subtracts_mean = flags & kGenericSubtractsMean, has_bias = flags & kGenericHasBias;
  const float one = (flags & kGenericZeroCentered) ? 1.f : 0.f;
  const bool bias_in = residual && (flags & kGenericBiasIn);
  const bool stores_y = Epilogue::kAlwaysStoresY || p.y != nullptr;
  const WT* const bias_row = bias_in ? static_cast<const WT*>(p.bias_in) : nullptr;
  const int packs = n / kVec, threads = blockDim.x, tid = threadIdx.x;
  const float inv_n = 1.f / static_cast<float>(n);
  typename EpilogueState<Epilogue>::type state = EpilogueStart<Epilogue>::make(p);
  // Where the rows in flight take more than half the L2 (kGenericRowsPastL2), the statistics pass
  // walks the row from its end, so that the next pass starts on the lines read last, and the last
  // pass reads the row and writes y as streaming accesses (evict-first), so that rows still to be
  // read again stay.
  const bool past_l2 = flags & kGenericRowsPastL2;
  for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const XT* x = static_cast<const XT*>(p.x) + row * p.row_stride;
    XT* y = static_cast<XT*>(p.y) + row * p.row_stride;
    const long long weights = (flags & kGenericPerGroup) ? group_of_row(row, p.rows_per_group) * n : 0;
    const WT* gamma = static_cast<const WT*>(p.gamma) + weights;
    const WT* beta = has_bias ? static_cast<const WT*>(p.beta) + weights : nullptr;
    // The residual add: h = x (+ bias_in) + residual, summed in fp32 and rounded once to the
    // stream's dtype, written out and normalized; the later passes read h back (this thread's
    // own stores).
    ST* const h = residual ? static_cast<ST*>(p.h) + row * p.row_stride : nullptr;
    const ST* const res = residual ? static_cast<const ST*>(p.residual) + row * p.row_stride : nullptr;
    const ST* in;
    if constexpr (residual) in = h;
    else in = x;
    const float center =
        !subtracts_mean ? 0.f
        : residual      ? to_float(Convert<ST>::from(to_float(x[0]) + (bias_in ? to_float(bias_row[0]) : 0.f) +
                                                     to_float(res[0])))
                        : to_float(x[0]);
    float dev = 0.f, sq = 0.f;
    generic_stats_pass<XT, ST, WT, kVec, residual ? kGenericResidualUnroll : kGenericUnroll, residual>(
        x, res, bias_row, h, tid, threads, packs, bias_in, center, dev, sq, past_l2);
    const float2 sums = generic_cta_sum2(dev, sq, scratch);
    const float shift = subtracts_mean ? sums.x * inv_n : 0.f;
    const float rstd = rsqrtf(fmaxf(sums.y * inv_n - shift * shift, 0.f) + p.eps);
    if ((flags & kGenericTraining) && tid == 0) {
      if (subtracts_mean) p.mean[row] = center + shift;
      p.rstd[row] = rstd;
    }
    // A round's packs: all loads before any store (y may alias x for all the compiler knows, so
    // a load after a store would wait for it), then each pack normalized.
    // Every register of a round written on every path (GenericPack).
    struct Round {
      GenericPack<ST, kVec> v[kOutUnroll];
      GenericPack<WT, kVec> g[kOutUnroll], b[kOutUnroll];
    };
    auto load_round = [&](Round& r, int base, bool last_read) {
#pragma unroll
      for (int u = 0; u < kOutUnroll; ++u)
        if (const int pack = base + u * threads + tid; pack < packs) {
          if (last_read) r.v[u].load_streaming(in + pack * kVec);
          else r.v[u].load(in + pack * kVec);
          r.g[u].load(gamma + pack * kVec);
          if (has_bias) r.b[u].load(beta + pack * kVec);
          else r.b[u].clear();
        } else {
          r.v[u].clear();
          r.g[u].clear();
          r.b[u].clear();
        }
    };
    auto normalize = [&](const Round& r, int u, float (&out)[kVec]) {
      float f[kVec], gf[kVec], bf[kVec];
      r.v[u].unpack_to(f);
      r.g[u].unpack_to(gf);
      r.b[u].unpack_to(bf);
#pragma unroll
      for (int j = 0; j < kVec; ++j)
        out[j] = (f[j] - center - shift) * rstd * (gf[j] + one) + (has_bias ? bf[j] : 0.f);
    };
    // Row-scaled epilogues: the row's largest |y| first (fmaxf drops NaN), in its own pass.
    float row_amax = 0.f;
    const int step = threads * kOutUnroll;
    if constexpr (kRowScaled) {
      for (int base = 0; base < packs; base += step) {
        Round r;
        load_round(r, base, false);
#pragma unroll
        for (int u = 0; u < kOutUnroll; ++u)
          if (base + u * threads + tid < packs) {
            float out[kVec];
            normalize(r, u, out);
#pragma unroll
            for (int j = 0; j < kVec; ++j) row_amax = fmaxf(row_amax, fabsf(out[j]));
          }
      }
      row_amax = generic_cta_max(row_amax, scratch);
    }
    // What a row-scaled epilogue's packs share (its scale), formed once ahead of them.
    const auto row_scale = [&] {
      if constexpr (kRowScaled) return Epilogue::template row_arg<true>(row_amax);
      else return 0;
    }();
    // Every thread runs every round (the epilogue may shuffle across lanes); past the row's end
    // a pack is invalid.
    for (int base = 0; base < packs; base += step) {
      Round r;
      load_round(r, base, past_l2);
#pragma unroll
      for (int u = 0; u < kOutUnroll; ++u) {
        const int pack = base + u * threads + tid;
        const bool valid = pack < packs;
        float out[kVec];
        if (valid) {
          normalize(r, u, out);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) out[j] = 0.f;
        }
        if constexpr (kRowScaled)
          Epilogue::template forward<XT, kVec, 1024>(out, valid, p, row, pack * kVec, tid, row_scale);
        else if constexpr (kStateful)
          Epilogue::template forward<XT, kVec, 1024>(out, valid, p, row, pack * kVec, tid, state);
        else
          Epilogue::template forward<XT, kVec, 1024>(out, valid, p, row, pack * kVec, tid);
        if (valid && stores_y) {
          Pack<XT, kVec> o;
#pragma unroll
          for (int j = 0; j < kVec; ++j) o.v[j] = Convert<XT>::from(out[j]);
          if (past_l2) store_output_pack_streaming<XT, kVec>(y + pack * kVec, o);
          else store_output_pack<XT, kVec, true>(y + pack * kVec, o);
        }
      }
    }
  }
  if constexpr (kStateful) Epilogue::template finish<1024>(state, p);  // every thread reaches it
}

// The forward of rows that crowd the L2 (generic_forward_cluster_shape): a cluster of 2-16 CTAs a
// row, each copying its segment of x (NormParams::generic_segment_packs, whole warps' packs) into
// shared memory with cp.async, so that x is read from global memory once. The row's two sums add
// over the cluster through distributed shared memory in rank order; the output pass reads the
// segment back from shared memory. A thread copies and reads only its own packs, so no barrier
// guards the segment. Many small CTAs a SM (a segment of about 32 KB) keep copies in flight while
// others write. Epilogues of the norm program (none, relu_bitmask, gelu), no residual add.
template <class XT, class WT, class Epilogue, int kVec>
__device__ __forceinline__ void generic_fwd_cluster(const NormParams& p) {
  static_assert(!RowScaled<Epilogue>::value && !EpilogueState<Epilogue>::kStateful,
                "the quantizing epilogues' generic forward reads its row from global memory");
  __shared__ float2 scratch[32];
  // Alternate rows' slots (generic_cluster_reduce): the pushed exchange of the backward
  // (GenericClusterSums) ran 0.96-1.00x here, five CTAs a SM hiding the barrier.
  __shared__ float2 cluster_sums[2];
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  XT* const segment_x = reinterpret_cast<XT*>(dynamic_shared);
  const int n = p.n, flags = p.generic_flags;
  const bool subtracts_mean = flags & kGenericSubtractsMean, has_bias = flags & kGenericHasBias;
  const float one = (flags & kGenericZeroCentered) ? 1.f : 0.f;
  const int threads = blockDim.x, tid = threadIdx.x;
  const unsigned cluster = generic_cluster_size();
  const int all_packs = n / kVec, segment = p.generic_segment_packs;
  const int first = min(all_packs, static_cast<int>(generic_cluster_rank()) * segment);
  const int packs = min(all_packs - first, segment);  // this CTA's
  const int col0 = first * kVec;
  const float inv_n = 1.f / static_cast<float>(n);
  const long long rows_step = gridDim.x / cluster;
  constexpr int kU = kGenericOutUnroll;  // packs a round
  const int step = threads * kU;
  for (long long row = blockIdx.x / cluster, turn = 0; row < p.rows; row += rows_step, ++turn) {
    const XT* x = static_cast<const XT*>(p.x) + row * p.row_stride;
    for (int pack = tid; pack < packs; pack += threads)
      copy_async<XT, kVec>(segment_x + pack * kVec, x + col0 + pack * kVec);
    commit_async();
    const long long group_weights = (flags & kGenericPerGroup) ? group_of_row(row, p.rows_per_group) * n : 0;
    const WT* gamma = static_cast<const WT*>(p.gamma) + group_weights + col0;
    const WT* beta = has_bias ? static_cast<const WT*>(p.beta) + group_weights + col0 : nullptr;
    XT* y = static_cast<XT*>(p.y) + row * p.row_stride + col0;
    const float center = subtracts_mean ? to_float(x[0]) : 0.f;
    struct Weights {
      GenericPack<WT, kVec> g[kU], b[kU];
    } weights;
    auto load_weights = [&](int base) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (const int pack = base + u * threads + tid; pack < packs) {
          weights.g[u].load(gamma + pack * kVec);
          if (has_bias) weights.b[u].load(beta + pack * kVec);
          else weights.b[u].clear();
        } else {
          weights.g[u].clear();
          weights.b[u].clear();
        }
    };
    load_weights(0);
    wait_async<0>();
    float dev = 0.f, sq = 0.f;
    for (int pack = tid; pack < packs; pack += threads) {
      float f[kVec];
      unpack(load_pack<XT, kVec>(segment_x + pack * kVec), f);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float d = f[j] - center;
        dev += d;
        sq += d * d;
      }
    }
    const float2 sums = generic_cluster_reduce(generic_cta_sum2(dev, sq, scratch), &cluster_sums[turn & 1], cluster,
                                               make_float2(0.f, 0.f), ClusterSumOp{});
    const float shift = subtracts_mean ? sums.x * inv_n : 0.f;
    const float rstd = rsqrtf(fmaxf(sums.y * inv_n - shift * shift, 0.f) + p.eps);
    if ((flags & kGenericTraining) && tid == 0 && first == 0) {
      if (subtracts_mean) p.mean[row] = center + shift;
      p.rstd[row] = rstd;
    }
    // Every thread runs every round (the epilogue may shuffle across lanes); past the segment's
    // end a pack is invalid. The round's weights were loaded before its stores (y may alias them
    // for all the compiler knows, so a load after a store would wait for it): the first round's
    // while the copies were in flight, each later one's at the end of the round before it.
    for (int base = 0; base < packs; base += step) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int pack = base + u * threads + tid;
        const bool valid = pack < packs;
        float out[kVec];
        if (valid) {
          float f[kVec], gf[kVec], bf[kVec];
          unpack(load_pack<XT, kVec>(segment_x + pack * kVec), f);
          weights.g[u].unpack_to(gf);
          weights.b[u].unpack_to(bf);
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            out[j] = (f[j] - center - shift) * rstd * (gf[j] + one) + (has_bias ? bf[j] : 0.f);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) out[j] = 0.f;
        }
        Epilogue::template forward<XT, kVec, 1024>(out, valid, p, row, col0 + pack * kVec, tid);
        if (valid) {
          Pack<XT, kVec> o;
#pragma unroll
          for (int j = 0; j < kVec; ++j) o.v[j] = Convert<XT>::from(out[j]);
          store_output_pack_streaming<XT, kVec>(y + pack * kVec, o);
        }
      }
      load_weights(base + step);
    }
  }
  generic_cluster_exit(cluster);
}

// One element's dx: rstd·(g·d − mean(g·d) − x̂·mean(g·d·x̂)). g·d is rounded alone, as in the row
// sums, so that dx is exactly 0 where the two agree (N = 1).
__device__ __forceinline__ float generic_dx(float rstd, float g, float d, float xhat, float mean_gd, float mean_gdx) {
  return rstd * (__fmul_rn(g, d) - mean_gd - xhat * mean_gdx);
}
// The epilogue's pre-activation x̂·g + β (β 0 without a bias), which its backward needs.
__device__ __forceinline__ float generic_pre_activation(float xhat, float g, float beta) { return xhat * g + beta; }

// The packs of a backward round, loaded before any of the round's stores (dx, the sums) for the
// reason the forward's output pass gives. One pack: at two the kernels took 123-184 registers, two
// CTAs of 256 threads a SM; at one 72-108, and 80 under launch bounds of three CTAs, unspilled.
constexpr int kGenericBwdUnroll = 1;

// ST: the rows' type (x's, or fp32 for an fp32 residual stream: h and dh_out); kFromY
// (memory_efficient): x holds the forward's y, and x̂ = (y − β) / γ′.
template <class XT, class ST, class WT, class Epilogue, int kVec, bool kFromY>
struct GenericBwdRound {
  static constexpr bool kReadsBeta = Epilogue::kNeedsPreActivation || kFromY;
  Pack<ST, kVec> x[kGenericBwdUnroll];
  Pack<XT, kVec> dy[kGenericBwdUnroll];
  Pack<WT, kVec> g[kGenericBwdUnroll], b[kReadsBeta ? kGenericBwdUnroll : 1];
  Pack<ST, kVec> dh[kGenericBwdUnroll];  // the residual add's dh_out (dx pass)

  // x and dy from `xr` / `dyr`: the stage's rows in shared memory or the rows in global memory,
  // never a choice between them per pack, so that each load is LDS or LDG and not a generic one.
  // dhr: the row of dh_out, where the dx pass adds it (null otherwise).
  __device__ __forceinline__ void load(const ST* xr, const XT* dyr, const WT* gamma, const WT* beta, int base,
                                       int threads, int packs, bool has_bias, const ST* dhr = nullptr) {
#pragma unroll
    for (int u = 0; u < kGenericBwdUnroll; ++u)
      if (const int pack = base + u * threads; pack < packs) {
        if (dhr) dh[u] = load_pack<ST, kVec>(dhr + pack * kVec);
        x[u] = load_pack<ST, kVec>(xr + pack * kVec);
        dy[u] = load_pack<XT, kVec>(dyr + pack * kVec);
        g[u] = load_pack<WT, kVec>(gamma + pack * kVec);
        if constexpr (kReadsBeta)
          if (has_bias) b[u] = load_pack<WT, kVec>(beta + pack * kVec);
      }
  }

  // Pack u's x̂, the epilogue's gradient d of dy, and g = gamma (+ 1).
  __device__ __forceinline__ void grad(const NormParams& p, int u, long long row, int col, float mean, float rstd,
                                       float one, bool has_bias, float (&xhat)[kVec], float (&d)[kVec],
                                       float (&gf)[kVec]) const {
    float f[kVec], bf[kVec];
    unpack(x[u], f);
    unpack(dy[u], d);
    unpack(g[u], gf);
    if constexpr (kReadsBeta)
      if (has_bias) unpack(b[u], bf);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      gf[j] += one;
      // memory_efficient: undo y's affine map, as the specialized rows do (__fdividef).
      if constexpr (kFromY) xhat[j] = __fdividef(has_bias ? f[j] - bf[j] : f[j], gf[j]);
      else xhat[j] = (f[j] - mean) * rstd;
    }
    float pre[kVec];
    if constexpr (Epilogue::kNeedsPreActivation) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) pre[j] = generic_pre_activation(xhat[j], gf[j], has_bias ? bf[j] : 0.f);
    }
    Epilogue::template backward<kVec>(d, pre, true, p, row, col);
  }
};

// A slot's dgamma (or dbeta) sums over the thread's packs, pack = k·threads + tid. In shared
// memory the q-th float4 of a 16-byte-or-wider pack's floats sits at (k·kQuads + q)·threads + tid:
// a warp's float4 accesses are then conflict-free (by column, 32-byte strides conflicted and the
// sums' shared-memory traffic bound the kernel). Narrower packs and the workspace go by column.
template <int kVec>
struct GenericSums {
  static constexpr int kQuads = kVec >= 4 ? kVec / 4 : 0;
  float* shared;  // null: in the workspace
  float* by_column;

  __device__ __forceinline__ float4* quad(int pack, int tid, int threads, int q) const {
    return reinterpret_cast<float4*>(shared) + (pack - tid) * kQuads + q * threads + tid;
  }
  template <class F>  // f(float& sum, int j) for each of the pack's kVec sums
  __device__ __forceinline__ void update(int pack, int tid, int threads, F f) const {
    if (kQuads > 0 && shared) {
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        float4* at = quad(pack, tid, threads, q);
        float4 v = *at;
        f(v.x, 4 * q);
        f(v.y, 4 * q + 1);
        f(v.z, 4 * q + 2);
        f(v.w, 4 * q + 3);
        *at = v;
      }
    } else {
      float* at = (shared ? shared : by_column) + pack * kVec;
#pragma unroll
      for (int j = 0; j < kVec; ++j) f(at[j], j);
    }
  }
};

// The backward of the rows of group blockIdx.y, slot blockIdx.x of gridDim.x: dx, and this slot's
// dgamma / dbeta sums over its rows in the workspace ([2][groups][slots][n] floats, dgamma's then
// dbeta's), which generic_bwd_reduce adds up in slot order. A thread owns the same columns in
// every row, so the sums need no barrier: in dynamic shared memory (kGenericSharedSums; two arrays
// with a bias, see GenericSums), else in the slot's workspace rows. With kGenericStaged the first
// generic_stage_packs packs of x and dy follow them in shared memory, copied by cp.async: with
// kGenericTwoStages the slot's next row is copied into the other stage while this row computes;
// with one stage, each pack's copy for the next row starts once the dx pass has stored the pack
// (the store depends on the pack's shared-memory loads, so the copy cannot overtake them). A
// thread copies and reads only its own packs, so no barrier guards the stages either.
template <class XT, class WT, class Epilogue, int kVec, int kResidual, bool kFromY, bool kClustered = false>
__device__ __forceinline__ void generic_bwd(const NormParams& p) {
  using ST = typename GenericStream<XT, kResidual>::type;
  __shared__ float2 scratch[32];
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int n = p.n, flags = p.generic_flags;
  const bool subtracts_mean = flags & kGenericSubtractsMean, has_bias = flags & kGenericHasBias;
  const float one = (flags & kGenericZeroCentered) ? 1.f : 0.f;
  const int threads = blockDim.x, tid = threadIdx.x;
  // kClustered: a slot is a cluster whose CTAs take a segment of the row's packs each (the
  // launch's generic_segment_packs), so that their columns' sums fit shared memory; the other
  // kernels compile the segment away (cluster 1, one segment).
  const unsigned cluster = kClustered ? generic_cluster_size() : 1;
  const int all_packs = n / kVec;
  const int segment = kClustered ? p.generic_segment_packs : all_packs;
  const int first = kClustered ? min(all_packs, static_cast<int>(generic_cluster_rank()) * segment) : 0;
  const int packs = min(all_packs - first, segment);  // this CTA's
  const int col0 = first * kVec;
  const int staged = (flags & kGenericStaged) ? p.generic_stage_packs : 0;
  const float inv_n = 1.f / static_cast<float>(n);
  const long long group = blockIdx.y, groups = gridDim.y, slot = blockIdx.x / cluster, slots = gridDim.x / cluster;
  float* const slot_g = p.workspace + (group * slots + slot) * n + col0;
  float* const slot_b = p.workspace + ((groups + group) * slots + slot) * n + col0;
  __shared__ GenericClusterSums<kClustered> cluster_sums;
  cluster_sums.init(cluster);
  const bool shared_sums = flags & kGenericSharedSums;
  constexpr bool residual = kResidual != kGenericNoResidual;  // x is h; dx gets dh_out added
  // In shared memory each array covers whole rounds of packs (see GenericSums).
  const int sums_floats = (packs + threads - 1) / threads * threads * kVec;
  float* const shared_g = shared_sums ? reinterpret_cast<float*>(dynamic_shared) : nullptr;
  const GenericSums<kVec> sum_g{shared_g, slot_g};
  const GenericSums<kVec> sum_b{shared_sums ? shared_g + sums_floats : nullptr, slot_b};
  // The stages after the sums (a multiple of 16 bytes), each x's first `staged` packs, then dy's,
  // rounded up to 16 bytes (generic_stage_bytes).
  unsigned char* const stages = dynamic_shared + (shared_sums ? (has_bias ? 8 : 4) * sums_floats : 0);
  const int stage_bytes = generic_stage_bytes(staged, kVec, sizeof(ST), sizeof(XT));
  const bool two_stages = flags & kGenericTwoStages;  // then staged == packs
  for (int pack = tid; pack < packs; pack += threads) {
    sum_g.update(pack, tid, threads, [](float& v, int) { v = 0.f; });
    if (has_bias) sum_b.update(pack, tid, threads, [](float& v, int) { v = 0.f; });
  }
  const long long weights = (flags & kGenericPerGroup) ? group * n : 0;
  const WT* gamma = static_cast<const WT*>(p.gamma) + weights + col0;
  const WT* beta = has_bias ? static_cast<const WT*>(p.beta) + weights + col0 : nullptr;
  auto x_row = [&](long long row) { return static_cast<const ST*>(p.x) + row * p.row_stride + col0; };
  auto dy_row = [&](long long row) { return static_cast<const XT*>(p.dy) + row * p.row_stride + col0; };
  auto stage_x = [&](unsigned char* stage) { return reinterpret_cast<ST*>(stage); };
  auto stage_dy = [&](unsigned char* stage) { return reinterpret_cast<XT*>(stage + staged * kVec * sizeof(ST)); };
  auto stage_pack = [&](unsigned char* stage, long long row, int pack) {
    copy_async<ST, kVec>(stage_x(stage) + pack * kVec, x_row(row) + pack * kVec);
    copy_async<XT, kVec>(stage_dy(stage) + pack * kVec, dy_row(row) + pack * kVec);
  };
  if (slot < p.rows_per_group)
    for (int pack = tid; pack < staged; pack += threads) stage_pack(stages, group * p.rows_per_group + slot, pack);
  commit_async();
  for (long long r = slot, turn = 0; r < p.rows_per_group; r += slots, ++turn) {
    const long long row = group * p.rows_per_group + r;
    const bool has_next = r + slots < p.rows_per_group;
    const ST* x = x_row(row);
    const XT* dy = dy_row(row);
    XT* dx = static_cast<XT*>(p.dx) + row * p.row_stride + col0;
    const float mean = subtracts_mean && !kFromY ? p.mean[row] : 0.f, rstd = p.rstd[row];
    unsigned char* const stage = stages + (two_stages ? (turn & 1) * stage_bytes : 0);
    ST* const sx = stage_x(stage);
    XT* const sdy = stage_dy(stage);
    if (two_stages) {
      // The other stage held this slot's previous row, whose packs this thread has used.
      if (has_next)
        for (int pack = tid; pack < staged; pack += threads)
          stage_pack(stages + ((turn + 1) & 1) * stage_bytes, row + slots, pack);
      commit_async();
      wait_async<1>();
    } else {
      wait_async<0>();
    }
    // Each pass walks the staged packs with the stage's pointers, then the rest with the rows'.
    const int stage_end = min(staged, packs);
    const int past_stage = tid + (stage_end > tid ? (stage_end - tid + threads - 1) / threads * threads : 0);
    // Pass 1: the row's sums of g·d and g·d·x̂, and this thread's columns of dgamma / dbeta.
    float c1 = 0.f, c2 = 0.f;
    auto sums_pass = [&](const ST* xs, const XT* dys, int from, int to) {
      for (int base = from; base < to; base += threads * kGenericBwdUnroll) {
        GenericBwdRound<XT, ST, WT, Epilogue, kVec, kFromY> round;
        round.load(xs, dys, gamma, beta, base, threads, to, has_bias);
#pragma unroll
        for (int u = 0; u < kGenericBwdUnroll; ++u) {
          const int pack = base + u * threads;
          if (pack >= to) break;
          const int col = pack * kVec;
          float xhat[kVec], d[kVec], g[kVec];
          round.grad(p, u, row, col0 + col, mean, rstd, one, has_bias, xhat, d, g);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            // g·d rounded alone in both passes (no fused multiply-add), so that at N = 1, where
            // x̂ = 0, dx = rstd · (g·d − g·d) is exactly 0 and not rstd times a rounding residue.
            const float gd = __fmul_rn(g[j], d[j]);
            c1 += gd;
            c2 += gd * xhat[j];
          }
          sum_g.update(pack, tid, threads, [&](float& v, int j) { v += d[j] * xhat[j]; });
          if (has_bias) sum_b.update(pack, tid, threads, [&](float& v, int j) { v += d[j]; });
        }
      }
    };
    sums_pass(sx, sdy, tid, stage_end);
    sums_pass(x, dy, past_stage, packs);
    const float2 sums = cluster_sums.sum(generic_cta_sum2(c1, c2, scratch), turn, cluster);
    const float mean_gd = subtracts_mean ? sums.x * inv_n : 0.f, mean_gdx = sums.y * inv_n;
    // Pass 2: dx (+ dh_out with the residual add: the gradient of x and of the residual), from
    // the stage or from the row again (in L2).
    const ST* const dh_out = residual ? static_cast<const ST*>(p.dh_out) + row * p.row_stride + col0 : nullptr;
    // An fp32 stream's dh goes out unrounded too (dresidual); dx is it rounded.
    float* const dresidual =
        kResidual == kGenericResidualF32 ? static_cast<float*>(p.dresidual) + row * p.row_stride + col0 : nullptr;
    auto dx_pass = [&](const ST* xs, const XT* dys, int from, int to, bool from_stage) {
      for (int base = from; base < to; base += threads * kGenericBwdUnroll) {
        GenericBwdRound<XT, ST, WT, Epilogue, kVec, kFromY> round;
        round.load(xs, dys, gamma, beta, base, threads, to, has_bias, dh_out);
#pragma unroll
        for (int u = 0; u < kGenericBwdUnroll; ++u) {
          const int pack = base + u * threads;
          if (pack >= to) break;
          const int col = pack * kVec;
          float xhat[kVec], d[kVec], g[kVec], dh[kVec];
          round.grad(p, u, row, col0 + col, mean, rstd, one, has_bias, xhat, d, g);
          if (residual) unpack(round.dh[u], dh);
          Pack<XT, kVec> o;
          Pack<float, kVec> o32;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            o32.v[j] = generic_dx(rstd, g[j], d[j], xhat[j], mean_gd, mean_gdx) + (residual ? dh[j] : 0.f);
            o.v[j] = Convert<XT>::from(o32.v[j]);
          }
          store_pack<XT, kVec>(dx + col, o);
          if constexpr (kResidual == kGenericResidualF32) store_pack<float, kVec>(dresidual + col, o32);
          // The store depends on the pack's shared-memory loads: the copy cannot overtake them.
          if (from_stage && !two_stages && has_next) stage_pack(stage, row + slots, pack);
        }
      }
    };
    dx_pass(sx, sdy, tid, stage_end, true);
    dx_pass(x, dy, past_stage, packs, false);
    if (!two_stages) commit_async();
  }
  if (shared_sums)
    for (int pack = tid; pack < packs; pack += threads) {
      sum_g.update(pack, tid, threads, [&](float& v, int j) { slot_g[pack * kVec + j] = v; });
      if (has_bias) sum_b.update(pack, tid, threads, [&](float& v, int j) { slot_b[pack * kVec + j] = v; });
    }
  generic_cluster_exit(cluster);
}

// The backward of rows of at most kPacks packs a thread (blockDim.x * kPacks >= N / kVec, pack
// k * blockDim.x + tid): the thread's packs of x and dy, its weights and its dgamma / dbeta sums
// stay in registers across the slot's rows, and the slot's next row is loaded while this one
// reduces. Slots and workspace as generic_bwd's (its reduction adds them); no staging, no
// shared-memory sums. kClustered: a slot is a cluster whose CTAs hold a segment of the row each
// (NormParams::generic_segment_packs), the row's two sums added over distributed shared memory
// as generic_bwd's clusters do. Not with the residual add or the memory-efficient backward.
template <class XT, class WT, class Epilogue, int kVec, int kPacks, bool kClustered = false>
__device__ __forceinline__ void generic_bwd_held(const NormParams& p) {
  __shared__ float2 scratch[32];
  const int n = p.n, flags = p.generic_flags;
  const bool subtracts_mean = flags & kGenericSubtractsMean, has_bias = flags & kGenericHasBias;
  const float one = (flags & kGenericZeroCentered) ? 1.f : 0.f;
  const int threads = blockDim.x, tid = threadIdx.x;
  const unsigned cluster = kClustered ? generic_cluster_size() : 1;
  const int all_packs = n / kVec;
  const int first = kClustered ? min(all_packs, static_cast<int>(generic_cluster_rank()) * p.generic_segment_packs) : 0;
  const int packs = kClustered ? min(all_packs - first, p.generic_segment_packs) : all_packs;  // this CTA's
  const float inv_n = 1.f / static_cast<float>(n);
  const long long group = blockIdx.y, groups = gridDim.y, slot = blockIdx.x / cluster, slots = gridDim.x / cluster;
  __shared__ GenericClusterSums<kClustered> cluster_sums;
  cluster_sums.init(cluster);
  const long long rows_per_group = p.rows_per_group;
  const long long weights = (flags & kGenericPerGroup) ? group * n : 0;
  auto col_of = [&](int k) { return (first + k * threads + tid) * kVec; };
  auto active = [&](int k) { return k * threads + tid < packs; };
  float g[kPacks][kVec], b[kPacks][kVec];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    GenericPack<WT, kVec> gp, bp;
    if (active(k)) gp.load(static_cast<const WT*>(p.gamma) + weights + col_of(k));
    else gp.clear();
    if (active(k) && has_bias) bp.load(static_cast<const WT*>(p.beta) + weights + col_of(k));
    else bp.clear();
    gp.unpack_to(g[k]);
    bp.unpack_to(b[k]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) g[k][j] += one;
  }
  float sum_g[kPacks][kVec], sum_b[kPacks][kVec];
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_g[k][j] = sum_b[k][j] = 0.f;
  GenericPack<XT, kVec> x_next[kPacks], dy_next[kPacks];
  // The row's statistics come with its packs, a row ahead: loaded where they are used, they cost
  // every row a memory latency before its sums.
  float mean_next = 0.f, rstd_next = 0.f;
  auto load_row = [&](long long row) {
    if (subtracts_mean) mean_next = p.mean[row];
    rstd_next = p.rstd[row];
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (active(k)) {
        x_next[k].load(static_cast<const XT*>(p.x) + row * p.row_stride + col_of(k));
        dy_next[k].load(static_cast<const XT*>(p.dy) + row * p.row_stride + col_of(k));
      } else {
        x_next[k].clear();
        dy_next[k].clear();
      }
  };
  if (slot < rows_per_group) load_row(group * rows_per_group + slot);
  for (long long r = slot, turn = 0; r < rows_per_group; r += slots, ++turn) {
    const long long row = group * rows_per_group + r;
    float xhat[kPacks][kVec], d[kPacks][kVec];  // xhat holds x until the row's statistics normalize it
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      x_next[k].unpack_to(xhat[k]);
      dy_next[k].unpack_to(d[k]);
    }
    const float mean = mean_next, rstd = rstd_next;
    if (r + slots < rows_per_group) load_row(row + slots);
    float c1 = 0.f, c2 = 0.f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      float pre[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        xhat[k][j] = (xhat[k][j] - mean) * rstd;
        if constexpr (Epilogue::kNeedsPreActivation)
          pre[j] = generic_pre_activation(xhat[k][j], g[k][j], has_bias ? b[k][j] : 0.f);
      }
      Epilogue::template backward<kVec>(d[k], pre, active(k), p, row, col_of(k));
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        // g·d rounded alone, as generic_bwd does (dx exactly 0 at N = 1).
        const float gd = __fmul_rn(g[k][j], d[k][j]);
        c1 += gd;
        c2 += gd * xhat[k][j];
        sum_g[k][j] += d[k][j] * xhat[k][j];
        sum_b[k][j] += d[k][j];
      }
    }
    const float2 sums = cluster_sums.sum(generic_cta_sum2(c1, c2, scratch), turn, cluster);
    const float mean_gd = subtracts_mean ? sums.x * inv_n : 0.f, mean_gdx = sums.y * inv_n;
#pragma unroll
    for (int k = 0; k < kPacks; ++k)
      if (active(k)) {
        Pack<XT, kVec> o;
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          o.v[j] = Convert<XT>::from(generic_dx(rstd, g[k][j], d[k][j], xhat[k][j], mean_gd, mean_gdx));
        store_output_pack<XT, kVec, true>(static_cast<XT*>(p.dx) + row * p.row_stride + col_of(k), o);
      }
  }
  float* const slot_g = p.workspace + (group * slots + slot) * n;
  float* const slot_b = p.workspace + ((groups + group) * slots + slot) * n;
#pragma unroll
  for (int k = 0; k < kPacks; ++k)
    if (active(k))
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        slot_g[col_of(k) + j] = sum_g[k][j];
        if (has_bias) slot_b[col_of(k) + j] = sum_b[k][j];
      }
  generic_cluster_exit(cluster);
}

// dgamma / dbeta of group blockIdx.y: each column's slot sums added in slot order (8 lanes of
// slots per column, then the lanes in order), so results are bitwise reproducible. 256 threads.
template <class WT>
__device__ __forceinline__ void generic_bwd_reduce(const NormParams& p) {
  constexpr int kSlotLanes = 8;
  __shared__ float fold[2][kSlotLanes][33];
  const int n = p.n, slots = p.partial_slots;
  const bool has_bias = p.generic_flags & kGenericHasBias;
  const int c = threadIdx.x % 32, slot_lane = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + c;
  const long long group = blockIdx.y, groups = gridDim.y;
  float sum_g = 0.f, sum_b = 0.f;
  if (col < n) {
    const float* in_g = p.workspace + group * slots * static_cast<long long>(n) + col;
    const float* in_b = p.workspace + (groups + group) * slots * static_cast<long long>(n) + col;
    for (long long s = slot_lane; s < slots; s += kSlotLanes) {
      sum_g += in_g[s * n];
      if (has_bias) sum_b += in_b[s * n];
    }
  }
  fold[0][slot_lane][c] = sum_g;
  fold[1][slot_lane][c] = sum_b;
  __syncthreads();
  if (slot_lane == 0 && col < n) {
    float g = 0.f, b = 0.f;
#pragma unroll
    for (int l = 0; l < kSlotLanes; ++l) {
      g += fold[0][l][c];
      b += fold[1][l][c];
    }
    static_cast<WT*>(p.dgamma)[group * n + col] = Convert<WT>::from(g);
    if (has_bias) static_cast<WT*>(p.dbeta)[group * n + col] = Convert<WT>::from(b);
  }
}

}  // namespace normjit
