// Per-tensor FP8 output (TransformerEngine's delayed scaling):
//   y_quant = satfinite(round_nearest_even(v * scale)) as e4m3 (kE5M2 false) or e5m2 codes, scale
//   read from p.quant_scale; amax (where p.amax is set) folds in max |v| of the unscaled values
//   (NaN ignored); y in YT is stored too only where p.y is set. Forward only.
#pragma once
#include "normjit/quant_common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "the fp8 epilogues need sm_89 or newer (cvt.rn.satfinite.e4m3x2/e5m2x2)"
#endif

namespace normjit {

template <bool kE5M2>
struct EpilogueFp8 {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int) {
    float amax = 0.f;
    if (valid) {
      const float scale = *p.quant_scale;
      unsigned char q[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));  // fmaxf drops NaN
      to_fp8<kE5M2, kVec>(v, scale, q);
      store_codes<kVec>(p.y_quant + row * p.row_stride + col, q);
    }
    if (p.amax == nullptr) return;
    // Every lane calls the hook: full warps reduce by shuffles first, so one lane a warp may touch
    // the amax; it reads it first and skips the atomic when its value is not larger, so the
    // atomics fade once the largest values have been seen. Non-negative floats order as their bits.
    if (blockDim.x % 32 == 0) {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
      if ((threadIdx.x & 31) != 0) return;
    }
    if (amax > *reinterpret_cast<volatile float*>(p.amax))
      atomicMax(reinterpret_cast<unsigned*>(p.amax), __float_as_uint(amax));
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
