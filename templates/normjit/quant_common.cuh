// Conversions and stores shared by the quantizing epilogues.
#pragma once
#include "normjit/block_scale_layout.h"
#include "normjit/common.cuh"
#include "normjit/e2m1.h"

namespace normjit {

// kVec one-byte codes at a kVec-aligned address (max_vec_for checks y_quant and row_stride).
template <int kVec>
__device__ __forceinline__ void store_codes(unsigned char* dst, const unsigned char (&q)[kVec]) {
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

// Two floats to two FP8 codes (lo in the low byte): round to nearest even, saturate to the
// largest finite value, NaN kept.
template <bool kE5M2>
__device__ __forceinline__ unsigned short to_fp8x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  static_assert(kE5M2 && !kE5M2, "FP8 conversion (cvt.rn.satfinite.e4m3x2/e5m2x2) needs sm_89 or newer");
#endif
  unsigned short d;
  if constexpr (kE5M2)
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}

// kVec floats to kVec FP8 codes.
template <bool kE5M2, int kVec>
__device__ __forceinline__ void to_fp8(const float (&v)[kVec], float scale, unsigned char (&q)[kVec]) {
  if constexpr (kVec == 1) {
    q[0] = static_cast<unsigned char>(to_fp8x2<kE5M2>(v[0] * scale, 0.f) & 0xff);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      const unsigned short d = to_fp8x2<kE5M2>(v[j] * scale, v[j + 1] * scale);
      q[j] = static_cast<unsigned char>(d & 0xff);
      q[j + 1] = static_cast<unsigned char>(d >> 8);
    }
  }
}

// The value of a non-negative e4m3 (E4M3FN) code; code 0x7F is NaN. Exact: 3 mantissa bits.
__device__ __forceinline__ float e4m3_value(unsigned code) {
  const unsigned e = code >> 3, m = code & 7u;
  if (code == 0x7Fu) return __uint_as_float(0x7fc00000u);
  return e == 0 ? static_cast<float>(m) * 0.001953125f  // subnormal: m * 2^-9
                : __uint_as_float(((e + 120u) << 23) | (m << 20));
}

// kVec floats (kVec even) to kVec / 2 bytes of e2m1 codes, each scaled by `scale` first.
template <int kVec>
__device__ __forceinline__ void to_e2m1(const float (&v)[kVec], float scale, unsigned char (&q)[kVec / 2]) {
#pragma unroll
  for (int j = 0; j < kVec; j += 2) q[j / 2] = e2m1x2(v[j] * scale, v[j + 1] * scale);
}

// A block scale code at (row, block) of the scale matrix, in the launch's layout.
__device__ __forceinline__ void store_block_scale(const NormParams& p, long long row, int block, unsigned char code) {
  p.block_scales[block_scale_offset(row, block, p.block_scale_stride, p.block_scale_layout)] = code;
}

// Round half to even, clamped to [-128, 127]; NaN gives 0 (cvt.rni's rule).
__device__ __forceinline__ unsigned char to_int8(float v) {
  const int q = __float2int_rn(v);
  return static_cast<unsigned char>(static_cast<signed char>(q < -128 ? -128 : q > 127 ? 127 : q));
}

}  // namespace normjit
