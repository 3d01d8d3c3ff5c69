// Prologue slot: what the forward normalizes, and what the backward adds to dx. A prologue is a
// functor with two constants (kNormalizesX: the forward normalizes x itself; kAddsToDx: add_to_dx
// is not empty) and three hooks the norm kernels call. XT is the type rows are held and normalized
// in (Cfg::XT), YT the activations' (x, y, dy, dx: Cfg::YT); they differ only for an fp32 residual
// stream (XT f32: residual, h and dh_out).
//   load<XT, WT, kVec>(p, x, col): the pack the forward normalizes, for the pack of x at `x`,
//     column `col` of the row (first pass);
//   reread(p, x): where a row streamed twice (gmem) reads that input again in its second pass;
//   add_to_dx<kVec, kInOrder>(p, dx, v): v, a pack of dx (fp32) about to be stored at `dx`, gets
//     any gradient the prologue's inputs add, and goes wherever else the prologue sends it;
//     kInOrder: its loads stay in program order (dx_loads_in_order);
//   prefetch_dx_inputs<kVec>(p, dx) (kAddsToDx only): warms into L2 the pack add_to_dx will read
//     for the pack of dx at `dx`.
// Pointers of x, h, residual, dx, dh_out and dresidual share one row stride, so a pack's offset
// (in elements) from p.x (or p.dx) finds it in the others.
#pragma once
#include "normjit/async_copy.cuh"
#include "normjit/pack.cuh"

namespace normjit {

struct PrologueNone {
  static constexpr bool kNormalizesX = true;  // the forward normalizes x as it is in memory
  static constexpr bool kAddsToDx = false;    // add_to_dx does nothing
  template <class XT, class WT, int kVec>
  static __device__ __forceinline__ Pack<XT, kVec> load(const NormParams&, const XT* x, int) {
    return load_pack<XT, kVec>(x);
  }
  template <class XT>
  static __device__ __forceinline__ const XT* reread(const NormParams&, const XT* x) {
    return x;
  }
  template <int kVec, bool kInOrder, class YT>
  static __device__ __forceinline__ void add_to_dx(const NormParams&, const YT*, float (&)[kVec]) {}
};

// h = x (+ bias_in) + residual, summed in fp32 and rounded once to the stream's type HT (as the
// unfused add stores it: x's dtype, or fp32 for an fp32 residual stream), written to p.h and
// normalized. The backward's x is h; dx = dnorm(dy) + dh_out serves as both dx and dresidual; an
// fp32 stream also stores it unrounded to p.dresidual (dx gets it in x's dtype).
template <class HT, bool kBiasIn>
struct PrologueResidualAdd {
  static constexpr bool kNormalizesX = false;
  static constexpr bool kAddsToDx = true;
  template <class XT, class WT, int kVec, class YT>
  static __device__ __forceinline__ Pack<XT, kVec> load(const NormParams& p, const YT* x, int col) {
    static_assert(sizeof(XT) == sizeof(HT), "rows are held in the residual stream's type");
    const long long offset = x - static_cast<const YT*>(p.x);
    const Pack<YT, kVec> xv = load_pack<YT, kVec>(x);
    const Pack<HT, kVec> rv = load_pack<HT, kVec>(static_cast<const HT*>(p.residual) + offset);
    float bf[kVec];
    if constexpr (kBiasIn) unpack(load_pack<WT, kVec>(static_cast<const WT*>(p.bias_in) + col), bf);
    Pack<HT, kVec> h;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float sum = to_float(xv.v[j]);
      if constexpr (kBiasIn) sum += bf[j];
      h.v[j] = Convert<HT>::from(sum + to_float(rv.v[j]));
    }
    store_pack<HT, kVec>(static_cast<HT*>(p.h) + offset, h);
    return h;
  }
  // The same thread stored these packs of h in the first pass: plain loads see them.
  template <class YT>
  static __device__ __forceinline__ const HT* reread(const NormParams& p, const YT* x) {
    return static_cast<const HT*>(p.h) + (x - static_cast<const YT*>(p.x));
  }
  // The fused backward asks a row ahead: its in-order loads of dh_out waited on DRAM every row.
  template <int kVec, class YT>
  static __device__ __forceinline__ void prefetch_dx_inputs(const NormParams& p, const YT* dx) {
    prefetch_l2(static_cast<const HT*>(p.dh_out) + (dx - static_cast<const YT*>(p.dx)));
  }
  // The same with dh_out's pack already read (a bulk copy brought it into shared memory).
  template <int kVec, class YT>
  static __device__ __forceinline__ void add_held_to_dx(const NormParams& p, const YT* dx, float (&v)[kVec],
                                                        const Pack<HT, kVec>& dh) {
    float g[kVec];
    unpack(dh, g);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] += g[j];
    if constexpr (sizeof(HT) != sizeof(YT)) {
      Pack<HT, kVec> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o.v[j] = v[j];
      store_pack<HT, kVec>(static_cast<HT*>(p.dresidual) + (dx - static_cast<const YT*>(p.dx)), o);
    }
  }
  // kInOrder: dh_out is loaded where it is used, not hoisted with the loop's other loads (which
  // spills wide rows: pack.cuh); narrow rows keep the plain load, which ptxas batches.
  template <int kVec, bool kInOrder, class YT>
  static __device__ __forceinline__ void add_to_dx(const NormParams& p, const YT* dx, float (&v)[kVec]) {
    const long long offset = dx - static_cast<const YT*>(p.dx);
    const HT* src = static_cast<const HT*>(p.dh_out) + offset;
    float g[kVec];
    if constexpr (kInOrder)
      unpack(load_pack_in_order<HT, kVec>(src), g);
    else
      unpack(load_pack<HT, kVec>(src), g);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] += g[j];
    if constexpr (sizeof(HT) != sizeof(YT)) {
      Pack<HT, kVec> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o.v[j] = v[j];
      store_pack<HT, kVec>(static_cast<HT*>(p.dresidual) + offset, o);
    }
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
