// Per-tensor FP8 output (TransformerEngine's delayed scaling):
//   y_quant = satfinite(round_nearest_even(v * scale)) as e4m3 (kE5M2 false) or e5m2 codes, scale
//   read from p.quant_scale; amax (where p.amax is set) folds in max |v| of the unscaled values
//   (NaN ignored); y in YT is stored too only where p.y is set. Forward only.
#pragma once
#include "normjit/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "the fp8 epilogues need sm_89 or newer (cvt.rn.satfinite.e4m3x2/e5m2x2)"
#endif

namespace normjit {

template <bool kE5M2>
struct EpilogueFp8 {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;

  // Two floats to two FP8 codes: lo in the low byte.
  static __device__ __forceinline__ unsigned short to_fp8x2(float lo, float hi) {
    unsigned short d;
    if constexpr (kE5M2)
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    else
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
  }

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int) {
    float amax = 0.f;
    if (valid) {
      const float scale = *p.quant_scale;
      unsigned char q[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));  // fmaxf drops NaN
      if constexpr (kVec == 1) {
        q[0] = static_cast<unsigned char>(to_fp8x2(v[0] * scale, 0.f) & 0xff);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; j += 2) {
          const unsigned short d = to_fp8x2(v[j] * scale, v[j + 1] * scale);
          q[j] = static_cast<unsigned char>(d & 0xff);
          q[j + 1] = static_cast<unsigned char>(d >> 8);
        }
      }
      unsigned char* dst = p.y_quant + row * p.row_stride + col;
      // kVec one-byte codes at a kVec-aligned address (max_vec_for checks y_quant and row_stride).
      if constexpr (kVec == 16) {
        uint4 w;
        memcpy(&w, q, 16);
        *reinterpret_cast<uint4*>(dst) = w;
      } else if constexpr (kVec == 8) {
        uint2 w;
        memcpy(&w, q, 8);
        *reinterpret_cast<uint2*>(dst) = w;
      } else if constexpr (kVec == 4) {
        unsigned w;
        memcpy(&w, q, 4);
        *reinterpret_cast<unsigned*>(dst) = w;
      } else if constexpr (kVec == 2) {
        unsigned short w;
        memcpy(&w, q, 2);
        *reinterpret_cast<unsigned short*>(dst) = w;
      } else {
        dst[0] = q[0];
      }
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
