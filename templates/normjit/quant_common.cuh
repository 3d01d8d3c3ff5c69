// Conversions and stores shared by the quantizing epilogues.
#pragma once
#include "normjit/block_scale_layout.h"
#include "normjit/common.cuh"
#include "normjit/e2m1.h"

namespace normjit {

// kVec one-byte codes as they lie in memory: four to a 32-bit word, the first code in the low
// byte. Built a word at a time, so the conversions' 16-bit results need no byte shuffling.
template <int kVec>
struct Codes {
  unsigned w[(kVec + 3) / 4];
};

// kVec one-byte codes at a kVec-aligned address (max_vec_for checks y_quant and row_stride).
template <int kVec>
__device__ __forceinline__ void store_codes(unsigned char* dst, const Codes<kVec>& q) {
  if constexpr (kVec == 16) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(q.w[0], q.w[1], q.w[2], q.w[3]);
  } else if constexpr (kVec == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(q.w[0], q.w[1]);
  } else if constexpr (kVec == 4) {
    *reinterpret_cast<unsigned*>(dst) = q.w[0];
  } else if constexpr (kVec == 2) {
    *reinterpret_cast<unsigned short*>(dst) = static_cast<unsigned short>(q.w[0]);
  } else {
    dst[0] = static_cast<unsigned char>(q.w[0]);
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

// kVec floats times scale to kVec FP8 codes.
template <bool kE5M2, int kVec>
__device__ __forceinline__ Codes<kVec> to_fp8(const float (&v)[kVec], float scale) {
  Codes<kVec> q;
  if constexpr (kVec == 1) {
    q.w[0] = to_fp8x2<kE5M2>(v[0] * scale, 0.f);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      const unsigned d = to_fp8x2<kE5M2>(v[j] * scale, v[j + 1] * scale);
      if (j % 4 == 0)
        q.w[j / 4] = d;
      else
        q.w[j / 4] |= d << 16;
    }
  }
  return q;
}

// kVec floats times scale to kVec int8 codes: round half to even, clamped to [-128, 127], NaN
// gives 0 (cvt.rni's rule; cvt.pack.sat clamps to the byte and packs two a step).
template <int kVec>
__device__ __forceinline__ Codes<kVec> to_int8(const float (&v)[kVec], float scale) {
  int r[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) r[j] = __float2int_rn(v[j] * scale);
  Codes<kVec> q;
  if constexpr (kVec == 1) {
    q.w[0] = static_cast<unsigned char>(static_cast<signed char>(r[0] < -128 ? -128 : r[0] > 127 ? 127 : r[0]));
  } else {
#pragma unroll
    for (int j = 0; j < kVec; j += 4) {
      // d[7:0] = b, d[15:8] = a, d[31:16] = c[15:0].
      unsigned high = 0;
      if (j + 2 < kVec) asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, 0;" : "=r"(high) : "r"(r[j + 3]), "r"(r[j + 2]));
      asm("cvt.pack.sat.s8.s32.b32 %0, %1, %2, %3;" : "=r"(q.w[j / 4]) : "r"(r[j + 1]), "r"(r[j]), "r"(high));
    }
  }
  return q;
}

// The value of a non-negative e4m3 (E4M3FN) code; code 0x7F is NaN. Exact: cvt to f16 (sm_89+),
// then to fp32.
__device__ __forceinline__ float e4m3_value(unsigned code) {
  unsigned pair;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(static_cast<unsigned short>(code & 0xffu)));
  float v;
  asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(static_cast<unsigned short>(pair & 0xffffu)));
  return v;
}

// The e2m1 codes of 2 half_of(j), j < kVec (kVec even; e2m1_pack_of), two a byte as y_quant holds
// them (the first value in the low nibble), with one kVec / 2-byte store at a kVec / 2-aligned
// address; all +0 where zero is set.
template <int kVec, class HalfOf>
__device__ __forceinline__ void store_e2m1(unsigned char* dst, HalfOf half_of, bool zero) {
  static_assert(kVec % 2 == 0 && kVec <= 16, "two to sixteen values");
  if constexpr (kVec == 16) {
    uint2 w;
    w.x = zero ? 0u : e2m1_pack_of<8>(half_of);
    w.y = zero ? 0u : e2m1_pack_of<8>([&](int j) { return half_of(j + 8); });
    *reinterpret_cast<uint2*>(dst) = w;
  } else if constexpr (kVec == 8) {
    *reinterpret_cast<unsigned*>(dst) = zero ? 0u : e2m1_pack_of<8>(half_of);
  } else if constexpr (kVec == 4) {
    *reinterpret_cast<unsigned short*>(dst) = static_cast<unsigned short>(zero ? 0u : e2m1_pack_of<4>(half_of));
  } else {
    dst[0] = static_cast<unsigned char>(zero ? 0u : e2m1_pack_of<2>(half_of));
  }
}

// A block scale code at (row, block) of the scale matrix, in the launch's layout.
__device__ __forceinline__ void store_block_scale(const NormParams& p, long long row, int block, unsigned char code) {
  p.block_scales[block_scale_offset(row, block, p.block_scale_stride, p.block_scale_layout)] = code;
}

// What the block-scaled epilogues (EpilogueMx, EpilogueFp4) share. A scale block is kBlock
// consecutive values of a row held as kBlock / kVec consecutive, aligned lanes' packs of one pass
// (the spec's threads_per_row * vec is a multiple of kBlock).
// The block's largest |v|, in every lane of the block: each lane's max over its pack (0 for a lane
// past the row; fmaxf leaves NaN out), reduced by shuffles. Every lane of the warp calls it.
template <int kBlock, int kVec, int kThreadsPerRow>
__device__ __forceinline__ float block_amax(const float (&v)[kVec], bool valid) {
  constexpr int kLanesPerBlock = kBlock / kVec;
  static_assert(kThreadsPerRow % kLanesPerBlock == 0, "a scale block must lie within one row's lanes");
  float amax = 0.f;
  if (valid) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));
  }
  return group_max<kLanesPerBlock>(amax);
}

// The block's scale code, stored by the lane that holds the block's first value (column col).
template <int kBlock>
__device__ __forceinline__ void store_block_scale_of(const NormParams& p, long long row, int col, unsigned char code) {
  if (col % kBlock == 0) store_block_scale(p, row, col / kBlock, code);
}

}  // namespace normjit
