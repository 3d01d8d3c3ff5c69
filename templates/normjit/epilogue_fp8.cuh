// Per-tensor FP8 output (TransformerEngine's delayed scaling):
//   y_quant = satfinite(round_nearest_even(v * scale)) as e4m3 (kE5M2 false) or e5m2 codes, scale
//   read from p.quant_scale; amax (where p.amax is set) folds in max |v| of the unscaled values
//   (NaN ignored); y in YT is stored too only where p.y is set. Forward only.
#pragma once
#include "normjit/quant_common.cuh"
#include "normjit/reduce_warp.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "the fp8 epilogues need sm_89 or newer (cvt.rn.satfinite.e4m3x2/e5m2x2)"
#endif

namespace normjit {

template <bool kE5M2>
struct EpilogueFp8 {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;
  static constexpr bool kLaneLocal = true;  // ignores invalid packs, no shuffles
  // Each thread's max |y| over its packs; finish() folds the CTA's into p.amax once. The scale is
  // read once per thread (start), not per pack.
  struct State {
    float amax;
    float scale;
  };
  // Read-only load: the code stores could alias a plain one.
  static __device__ __forceinline__ State start(const NormParams& p) { return State{0.f, __ldg(p.quant_scale)}; }

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int, State& state) {
    if (!valid) return;
#pragma unroll
    for (int j = 0; j < kVec; ++j) state.amax = fmaxf(state.amax, fabsf(v[j]));  // fmaxf drops NaN
    store_codes<kVec>(p.y_quant + row * p.row_stride + col, to_fp8<kE5M2, kVec>(v, state.scale));
  }

  // Every thread of the CTA calls it (its block is whole warps): a warp's max by shuffles, the
  // CTA's through shared memory, then one thread reads the stored amax and issues an atomicMax
  // on its bits (non-negative floats order as their bits) only where it would raise it: one
  // global access per CTA instead of one per warp and pack, whose single address held a fp8
  // forward without a residual at 64 % of copy.
  template <int kThreadsPerRow>
  static __device__ __forceinline__ void finish(const State& state, const NormParams& p) {
    if (p.amax == nullptr) return;
    __shared__ float warp_amax[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const float amax = group_max<32>(state.amax);
    if (warps == 1) {
      if (lane == 0 && amax > *reinterpret_cast<volatile float*>(p.amax))
        atomicMax(reinterpret_cast<unsigned*>(p.amax), __float_as_uint(amax));
      return;
    }
    if (lane == 0) warp_amax[warp] = amax;
    __syncthreads();
    if (warp != 0) return;
    const float cta_amax = group_max<32>(lane < warps ? warp_amax[lane] : 0.f);
    if (lane == 0 && cta_amax > *reinterpret_cast<volatile float*>(p.amax))
      atomicMax(reinterpret_cast<unsigned*>(p.amax), __float_as_uint(cta_amax));
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
