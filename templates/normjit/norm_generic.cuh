// Generic kernels: one kernel serves every N. The row's length and the spec's boolean fields
// (statistics with or without the mean, bias, per-group weights, zero-centred weights, training
// outputs) are launch arguments (NormParams::n, ::generic_flags); the dtypes, the epilogue and the
// vector width stay compile-time. They ship compiled inside the library (tools/build_generic.cpp)
// and run while NVRTC specializes a spec, or alone where no NVRTC may run (docs/generic.md).
//
// One CTA per row (a grid-stride loop over rows), blockDim.x threads of any multiple of 32: pack p
// of a row belongs to thread p % blockDim.x, the layout of the specialized kernels, so the same
// epilogue functors apply. Each pass streams the row from global memory; the second pass finds it
// in L2. LayerNorm sums deviations from the row's first element (the cancellation in
// sq / N - shift^2 is bounded, as in the specialized CTA-wide rows).
#pragma once
#include "normjit/common.cuh"
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

// The forward's statistics pass over a row: sums of deviations from `center` and of their
// squares, kU packs a round. kResidual: the pack normalized is h = x (+ bias_in) + residual,
// rounded once to x's dtype and stored to h.
template <class XT, class WT, int kVec, int kU, bool kResidual>
__device__ __forceinline__ void generic_stats_pass(const XT* x, const XT* res, const WT* bias_row, XT* h, int tid,
                                                   int threads, int packs, bool bias_in, float center, float& dev,
                                                   float& sq) {
  for (int base = tid; base < packs; base += threads * kU) {
    Pack<XT, kVec> v[kU], r[kResidual ? kU : 1];
    Pack<WT, kVec> bi[kResidual ? kU : 1];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (const int pack = base + u * threads; pack < packs) {
        v[u] = load_pack<XT, kVec>(x + pack * kVec);
        if constexpr (kResidual) {
          r[u] = load_pack<XT, kVec>(res + pack * kVec);
          if (bias_in) bi[u] = load_pack<WT, kVec>(bias_row + pack * kVec);
        }
      }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (const int pack = base + u * threads; pack < packs) {
        float f[kVec];
        unpack(v[u], f);
        if constexpr (kResidual) {
          float rf[kVec], bf[kVec];
          unpack(r[u], rf);
          if (bias_in) unpack(bi[u], bf);
          Pack<XT, kVec> hv;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            hv.v[j] = Convert<XT>::from((bias_in ? f[j] + bf[j] : f[j]) + rf[j]);
            f[j] = to_float(hv.v[j]);
          }
          store_pack<XT, kVec>(h + pack * kVec, hv);
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

// kResidual: the residual add in x's dtype (its own kernels: in the plain ones its registers
// spilled the output pass).
template <class XT, class WT, class Epilogue, int kVec, bool kResidual>
__device__ __forceinline__ void generic_fwd(const NormParams& p) {
  __shared__ float2 scratch[32];
  const int n = p.n, flags = p.generic_flags;
  const bool subtracts_mean = flags & kGenericSubtractsMean, has_bias = flags & kGenericHasBias;
  const float one = (flags & kGenericZeroCentered) ? 1.f : 0.f;
  constexpr bool residual = kResidual;
  const bool bias_in = kResidual && (flags & kGenericBiasIn);
  const WT* const bias_row = bias_in ? static_cast<const WT*>(p.bias_in) : nullptr;
  const int packs = n / kVec, threads = blockDim.x, tid = threadIdx.x;
  const float inv_n = 1.f / static_cast<float>(n);
  for (long long row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const XT* x = static_cast<const XT*>(p.x) + row * p.row_stride;
    XT* y = static_cast<XT*>(p.y) + row * p.row_stride;
    const long long weights = (flags & kGenericPerGroup) ? group_of_row(row, p.rows_per_group) * n : 0;
    const WT* gamma = static_cast<const WT*>(p.gamma) + weights;
    const WT* beta = has_bias ? static_cast<const WT*>(p.beta) + weights : nullptr;
    // The residual add: h = x (+ bias_in) + residual, summed in fp32 and rounded once to x's
    // dtype, written out and normalized; the output pass reads h back (this thread's own stores).
    XT* const h = residual ? static_cast<XT*>(p.h) + row * p.row_stride : nullptr;
    const XT* const res = residual ? static_cast<const XT*>(p.residual) + row * p.row_stride : nullptr;
    const float center =
        !subtracts_mean ? 0.f
        : residual      ? to_float(Convert<XT>::from(to_float(x[0]) + (bias_in ? to_float(bias_row[0]) : 0.f) +
                                                     to_float(res[0])))
                        : to_float(x[0]);
    float dev = 0.f, sq = 0.f;
    generic_stats_pass<XT, WT, kVec, kResidual ? kGenericResidualUnroll : kGenericUnroll, kResidual>(
        x, res, bias_row, h, tid, threads, packs, bias_in, center, dev, sq);
    const float2 sums = generic_cta_sum2(dev, sq, scratch);
    const float shift = subtracts_mean ? sums.x * inv_n : 0.f;
    const float rstd = rsqrtf(fmaxf(sums.y * inv_n - shift * shift, 0.f) + p.eps);
    if ((flags & kGenericTraining) && tid == 0) {
      if (subtracts_mean) p.mean[row] = center + shift;
      p.rstd[row] = rstd;
    }
    // Every thread runs every round (the epilogue may shuffle across lanes); past the row's end
    // a pack is invalid. A round's loads all come before its stores: y may alias x for all the
    // compiler knows, so a load after a store would wait for it.
    for (int base = 0; base < packs; base += threads * kGenericOutUnroll) {
      Pack<XT, kVec> v[kGenericOutUnroll];
      Pack<WT, kVec> g[kGenericOutUnroll], b[kGenericOutUnroll];
#pragma unroll
      for (int u = 0; u < kGenericOutUnroll; ++u)
        if (const int pack = base + u * threads + tid; pack < packs) {
          v[u] = load_pack<XT, kVec>((residual ? h : x) + pack * kVec);
          g[u] = load_pack<WT, kVec>(gamma + pack * kVec);
          if (has_bias) b[u] = load_pack<WT, kVec>(beta + pack * kVec);
        }
#pragma unroll
      for (int u = 0; u < kGenericOutUnroll; ++u) {
        const int pack = base + u * threads + tid;
        const bool valid = pack < packs;
        float out[kVec];
        if (valid) {
          float f[kVec], gf[kVec], bf[kVec];
          unpack(v[u], f);
          unpack(g[u], gf);
          if (has_bias) unpack(b[u], bf);
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            out[j] = (f[j] - center - shift) * rstd * (gf[j] + one) + (has_bias ? bf[j] : 0.f);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) out[j] = 0.f;
        }
        Epilogue::template forward<XT, kVec, 1024>(out, valid, p, row, pack * kVec, tid);
        if (valid) {
          Pack<XT, kVec> o;
#pragma unroll
          for (int j = 0; j < kVec; ++j) o.v[j] = Convert<XT>::from(out[j]);
          store_pack<XT, kVec>(y + pack * kVec, o);
        }
      }
    }
  }
}

// The packs of a backward round, loaded before any of the round's stores (dx, the sums) for the
// reason the forward's output pass gives. One pack: at two the kernels took 123-184 registers, two
// CTAs of 256 threads a SM; at one 72-108, and 80 under launch bounds of three CTAs, unspilled.
constexpr int kGenericBwdUnroll = 1;

template <class XT, class WT, class Epilogue, int kVec>
struct GenericBwdRound {
  Pack<XT, kVec> x[kGenericBwdUnroll], dy[kGenericBwdUnroll];
  Pack<WT, kVec> g[kGenericBwdUnroll], b[Epilogue::kNeedsPreActivation ? kGenericBwdUnroll : 1];
  Pack<XT, kVec> dh[kGenericBwdUnroll];  // the residual add's dh_out (dx pass)

  // Packs below `staged` come from the shared-memory rows sx / sdy, the others from global
  // memory. dhr: the row of dh_out, where the dx pass adds it (null otherwise).
  __device__ __forceinline__ void load(const XT* xr, const XT* dyr, const XT* sx, const XT* sdy, int staged,
                                       const WT* gamma, const WT* beta, int base, int threads, int packs,
                                       bool has_bias, const XT* dhr = nullptr) {
#pragma unroll
    for (int u = 0; u < kGenericBwdUnroll; ++u)
      if (const int pack = base + u * threads; pack < packs) {
        if (dhr) dh[u] = load_pack<XT, kVec>(dhr + pack * kVec);
        const bool in_stage = pack < staged;
        x[u] = load_pack<XT, kVec>((in_stage ? sx : xr) + pack * kVec);
        dy[u] = load_pack<XT, kVec>((in_stage ? sdy : dyr) + pack * kVec);
        g[u] = load_pack<WT, kVec>(gamma + pack * kVec);
        if constexpr (Epilogue::kNeedsPreActivation)
          if (has_bias) b[u] = load_pack<WT, kVec>(beta + pack * kVec);
      }
  }

  // Pack u's x̂, the epilogue's gradient d of dy, and g = gamma (+ 1).
  __device__ __forceinline__ void grad(const NormParams& p, int u, long long row, int col, float mean, float rstd,
                                       float one, bool has_bias, float (&xhat)[kVec], float (&d)[kVec],
                                       float (&gf)[kVec]) const {
    float f[kVec];
    unpack(x[u], f);
    unpack(dy[u], d);
    unpack(g[u], gf);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      xhat[j] = (f[j] - mean) * rstd;
      gf[j] += one;
    }
    float pre[kVec];
    if constexpr (Epilogue::kNeedsPreActivation) {
      float bf[kVec];
      if (has_bias) unpack(b[u], bf);
#pragma unroll
      for (int j = 0; j < kVec; ++j) pre[j] = xhat[j] * gf[j] + (has_bias ? bf[j] : 0.f);
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
template <class XT, class WT, class Epilogue, int kVec, bool kResidual>
__device__ __forceinline__ void generic_bwd(const NormParams& p) {
  __shared__ float2 scratch[32];
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  const int n = p.n, flags = p.generic_flags;
  const bool subtracts_mean = flags & kGenericSubtractsMean, has_bias = flags & kGenericHasBias;
  const float one = (flags & kGenericZeroCentered) ? 1.f : 0.f;
  const int packs = n / kVec, threads = blockDim.x, tid = threadIdx.x;
  const int staged = (flags & kGenericStaged) ? p.generic_stage_packs : 0;
  const float inv_n = 1.f / static_cast<float>(n);
  const long long group = blockIdx.y, groups = gridDim.y, slot = blockIdx.x, slots = gridDim.x;
  float* const slot_g = p.workspace + (group * slots + slot) * n;
  float* const slot_b = p.workspace + ((groups + group) * slots + slot) * n;
  const bool shared_sums = flags & kGenericSharedSums;
  constexpr bool residual = kResidual;  // x is h; dx gets dh_out added
  // In shared memory each array covers whole rounds of packs (see GenericSums).
  const int sums_floats = (packs + threads - 1) / threads * threads * kVec;
  float* const shared_g = shared_sums ? reinterpret_cast<float*>(dynamic_shared) : nullptr;
  const GenericSums<kVec> sum_g{shared_g, slot_g};
  const GenericSums<kVec> sum_b{shared_sums ? shared_g + sums_floats : nullptr, slot_b};
  // The stage after the sums (a multiple of 16 bytes).
  XT* const stages = reinterpret_cast<XT*>(dynamic_shared + (shared_sums ? (has_bias ? 8 : 4) * sums_floats : 0));
  const bool two_stages = flags & kGenericTwoStages;  // then staged == packs
  for (int pack = tid; pack < packs; pack += threads) {
    sum_g.update(pack, tid, threads, [](float& v, int) { v = 0.f; });
    if (has_bias) sum_b.update(pack, tid, threads, [](float& v, int) { v = 0.f; });
  }
  const long long weights = (flags & kGenericPerGroup) ? group * n : 0;
  const WT* gamma = static_cast<const WT*>(p.gamma) + weights;
  const WT* beta = has_bias ? static_cast<const WT*>(p.beta) + weights : nullptr;
  auto x_row = [&](long long row) { return static_cast<const XT*>(p.x) + row * p.row_stride; };
  auto dy_row = [&](long long row) { return static_cast<const XT*>(p.dy) + row * p.row_stride; };
  // A stage: x's first `staged` packs, then dy's.
  auto stage_pack = [&](XT* stage, long long row, int pack) {
    copy_async<XT, kVec>(stage + pack * kVec, x_row(row) + pack * kVec);
    copy_async<XT, kVec>(stage + (staged + pack) * kVec, dy_row(row) + pack * kVec);
  };
  if (slot < p.rows_per_group)
    for (int pack = tid; pack < staged; pack += threads) stage_pack(stages, group * p.rows_per_group + slot, pack);
  commit_async();
  for (long long r = slot, turn = 0; r < p.rows_per_group; r += slots, ++turn) {
    const long long row = group * p.rows_per_group + r;
    const bool has_next = r + slots < p.rows_per_group;
    const XT* x = x_row(row);
    const XT* dy = dy_row(row);
    XT* dx = static_cast<XT*>(p.dx) + row * p.row_stride;
    const float mean = subtracts_mean ? p.mean[row] : 0.f, rstd = p.rstd[row];
    XT* const sx = stages + (two_stages ? (turn & 1) * 2 * staged * kVec : 0);
    XT* const sdy = sx + staged * kVec;
    if (two_stages) {
      // The other stage held this slot's previous row, whose packs this thread has used.
      if (has_next)
        for (int pack = tid; pack < staged; pack += threads)
          stage_pack(stages + ((turn + 1) & 1) * 2 * staged * kVec, row + slots, pack);
      commit_async();
      wait_async<1>();
    } else {
      wait_async<0>();
    }
    // Pass 1: the row's sums of g·d and g·d·x̂, and this thread's columns of dgamma / dbeta.
    float c1 = 0.f, c2 = 0.f;
    for (int base = tid; base < packs; base += threads * kGenericBwdUnroll) {
      GenericBwdRound<XT, WT, Epilogue, kVec> round;
      round.load(x, dy, sx, sdy, staged, gamma, beta, base, threads, packs, has_bias);
#pragma unroll
      for (int u = 0; u < kGenericBwdUnroll; ++u) {
        const int pack = base + u * threads;
        if (pack >= packs) break;
        const int col = pack * kVec;
        float xhat[kVec], d[kVec], g[kVec];
        round.grad(p, u, row, col, mean, rstd, one, has_bias, xhat, d, g);
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
    const float2 sums = generic_cta_sum2(c1, c2, scratch);
    const float mean_gd = subtracts_mean ? sums.x * inv_n : 0.f, mean_gdx = sums.y * inv_n;
    // Pass 2: dx (+ dh_out with the residual add: the gradient of x and of the residual), from
    // the stage or from the row again (in L2).
    const XT* const dh_out = residual ? static_cast<const XT*>(p.dh_out) + row * p.row_stride : nullptr;
    for (int base = tid; base < packs; base += threads * kGenericBwdUnroll) {
      GenericBwdRound<XT, WT, Epilogue, kVec> round;
      round.load(x, dy, sx, sdy, staged, gamma, beta, base, threads, packs, has_bias, dh_out);
#pragma unroll
      for (int u = 0; u < kGenericBwdUnroll; ++u) {
        const int pack = base + u * threads;
        if (pack >= packs) break;
        const int col = pack * kVec;
        float xhat[kVec], d[kVec], g[kVec], dh[kVec];
        round.grad(p, u, row, col, mean, rstd, one, has_bias, xhat, d, g);
        if (residual) unpack(round.dh[u], dh);
        Pack<XT, kVec> o;
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          o.v[j] = Convert<XT>::from(rstd * (__fmul_rn(g[j], d[j]) - mean_gd - xhat[j] * mean_gdx) +
                                     (residual ? dh[j] : 0.f));
        store_pack<XT, kVec>(dx + col, o);
        // The store depends on the pack's shared-memory loads: the copy cannot overtake them.
        if (!two_stages && has_next && pack < staged) stage_pack(sx, row + slots, pack);
      }
    }
    if (!two_stages) commit_async();
  }
  if (shared_sums)
    for (int pack = tid; pack < packs; pack += threads) {
      sum_g.update(pack, tid, threads, [&](float& v, int j) { slot_g[pack * kVec + j] = v; });
      if (has_bias) sum_b.update(pack, tid, threads, [&](float& v, int j) { slot_b[pack * kVec + j] = v; });
    }
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
