// Prologue slot: what the forward normalizes, and what the backward adds to dx. A prologue is a
// functor with two constants (kNormalizesX: the forward normalizes x itself; kAddsToDx: add_to_dx
// is not empty) and three hooks the norm kernels call:
//   load<XT, kVec>(p, x): the pack the forward normalizes, for the pack of x at `x` (first pass);
//   reread<XT>(p, x): where a row streamed twice (gmem) reads that input again in its second pass;
//   add_to_dx<XT, kVec, kInOrder>(p, dx, v): v, a pack of dx (fp32) about to be stored at `dx`, gets
//     any gradient the prologue's inputs add; kInOrder: its loads stay in program order
//     (dx_loads_in_order).
// Pointers of x, h, residual, dx and dh_out share one row stride, so a pack's offset from p.x (or
// p.dx) finds it in the others.
#pragma once
#include "normjit/pack.cuh"

namespace normjit {

struct PrologueNone {
  static constexpr bool kNormalizesX = true;  // the forward normalizes x as it is in memory
  static constexpr bool kAddsToDx = false;    // add_to_dx does nothing
  template <class XT, int kVec>
  static __device__ __forceinline__ Pack<XT, kVec> load(const NormParams&, const XT* x) {
    return load_pack<XT, kVec>(x);
  }
  template <class XT>
  static __device__ __forceinline__ const XT* reread(const NormParams&, const XT* x) {
    return x;
  }
  template <class XT, int kVec, bool kInOrder>
  static __device__ __forceinline__ void add_to_dx(const NormParams&, const XT*, float (&)[kVec]) {}
};

// h = x + residual, rounded to x's dtype (as the unfused add would store it), written to p.h and
// normalized. The backward's x is h; dx = dnorm(dy) + dh_out serves as both dx and dresidual.
struct PrologueResidualAdd {
  static constexpr bool kNormalizesX = false;
  static constexpr bool kAddsToDx = true;
  template <class XT, int kVec>
  static __device__ __forceinline__ Pack<XT, kVec> load(const NormParams& p, const XT* x) {
    const long long offset = x - static_cast<const XT*>(p.x);
    const Pack<XT, kVec> xv = load_pack<XT, kVec>(x);
    const Pack<XT, kVec> rv = load_pack<XT, kVec>(static_cast<const XT*>(p.residual) + offset);
    Pack<XT, kVec> h;
#pragma unroll
    for (int j = 0; j < kVec; ++j) h.v[j] = Convert<XT>::from(to_float(xv.v[j]) + to_float(rv.v[j]));
    store_pack<XT, kVec>(static_cast<XT*>(p.h) + offset, h);
    return h;
  }
  // The same thread stored these packs of h in the first pass: plain loads see them.
  template <class XT>
  static __device__ __forceinline__ const XT* reread(const NormParams& p, const XT* x) {
    return static_cast<const XT*>(p.h) + (x - static_cast<const XT*>(p.x));
  }
  // kInOrder: dh_out is loaded where it is used, not hoisted with the loop's other loads (which
  // spills wide rows: pack.cuh); narrow rows keep the plain load, which ptxas batches.
  template <class XT, int kVec, bool kInOrder>
  static __device__ __forceinline__ void add_to_dx(const NormParams& p, const XT* dx, float (&v)[kVec]) {
    const long long offset = dx - static_cast<const XT*>(p.dx);
    const XT* src = static_cast<const XT*>(p.dh_out) + offset;
    float g[kVec];
    if constexpr (kInOrder)
      unpack(load_pack_in_order<XT, kVec>(src), g);
    else
      unpack(load_pack<XT, kVec>(src), g);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] += g[j];
  }
};

// Whether a backward's dx loop keeps the prologue's loads in program order: pipelined rows, and
// CTAs of 640 threads or more (at most 96 registers a thread), spill when ptxas hoists them.
template <class Cfg>
inline constexpr bool dx_loads_in_order =
    Cfg::kCache == RowCache::kSharedPipelined || Cfg::kThreadsPerRow * Cfg::kRowsPerCta >= 640;

// The scale a weight value gives: gamma, or 1 + gamma for zero-centred weights.
template <class Cfg, class WT>
__device__ __forceinline__ float scale_of(WT g) {
  return Cfg::kZeroCenteredGamma ? to_float(g) + 1.f : to_float(g);
}
template <class Cfg, class WT, int kVec>
__device__ __forceinline__ void unpack_scale(const Pack<WT, kVec>& g, float (&out)[kVec]) {
  unpack(g, out);
  if constexpr (Cfg::kZeroCenteredGamma) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] += 1.f;
  }
}

}  // namespace normjit
