// Block-scaled e2m1 (FP4) output, two codes a byte (the first element in the low nibble):
//   kNv false, OCP MXFP4: every 32 consecutive values of a row share X = 2^(floor(log2 amax) - 2)
//     (emax of e2m1: 2), the exponent clamped to [-127, 127] (amax 0: X = 2^-127); X's E8M0 code
//     (exponent + 127) is the block's scale, the codes are e2m1(y / X).
//   kNv true, NVIDIA NVFP4: every 16 values share an e4m3 scale s = e4m3_satfinite(amax / 6 *
//     S_enc), S_enc the tensor scale at p.quant_scale (448 * 6 / amax(tensor)); the codes are
//     e2m1(y * (S_enc / s)), 0 where s is 0 or NaN (normjit::reference::quantize_nvfp4).
// NaN values are left out of the amax and give code +0 (e2m1 has none). Scale (row, col / block)
// goes to p.block_scales in p.block_scale_layout; row r's codes to p.y_quant + r * row_stride / 2
// (n and row_stride even). A block is block / kVec lanes' packs of one pass (the spec's
// threads_per_row * vec a multiple of the block): their amax is reduced by shuffles. y in YT is
// stored too only where p.y is set. Forward only; NVFP4 needs sm_89+ (the e4m3 scale conversion).
#pragma once
#include "normjit/quant_common.cuh"
#include "normjit/reduce_warp.cuh"

namespace normjit {

template <bool kNv>
struct EpilogueFp4 {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;
  static constexpr int kBlock = kNv ? 16 : 32;

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int) {
    constexpr int kLanesPerBlock = kBlock / kVec;
    static_assert(kThreadsPerRow % kLanesPerBlock == 0, "a scale block must lie within one row's lanes");
    float amax = 0.f;
    if (valid) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) amax = fmaxf(amax, fabsf(v[j]));  // fmaxf drops NaN
    }
    // The block's lanes are consecutive and aligned; every lane of the warp takes part.
    amax = group_max<kLanesPerBlock>(amax);
    unsigned char scale_code;
    float inv;  // what y is multiplied by before encoding
    if constexpr (kNv) {
      const float s_enc = *p.quant_scale;
      scale_code = static_cast<unsigned char>(to_fp8x2<false>(amax / 6.f * s_enc, 0.f) & 0xff);
      const float s = e4m3_value(scale_code);
      inv = s > 0.f ? s_enc / s : 0.f;  // IEEE division; NaN s gives 0 as well
    } else {
      const int exponent = amax > 0.f ? ilogbf(amax) - 2 : -127;
      const int clamped = exponent < -127 ? -127 : exponent > 127 ? 127 : exponent;
      scale_code = static_cast<unsigned char>(clamped + 127);
      inv = ldexpf(1.f, -clamped);  // 1 / X, exact: a power of two
    }
    if constexpr (kVec == 1) {
      // A byte holds two lanes' codes: the even column's lane stores it with its odd neighbour's.
      // Rows of a pass are whole warps' lanes or sub-warp groups of >= 16 lanes, and n is even,
      // so the neighbour is the next lane of the same row.
      const unsigned code = e2m1_code(v[0] * inv);
      const unsigned hi = __shfl_down_sync(0xffffffffu, code, 1);
      if (!valid) return;
      if (col % kBlock == 0) store_block_scale(p, row, col / kBlock, scale_code);
      if (col % 2 == 0) p.y_quant[row * (p.row_stride / 2) + col / 2] = static_cast<unsigned char>(code | (hi << 4));
    } else {
      if (!valid) return;
      if (col % kBlock == 0) store_block_scale(p, row, col / kBlock, scale_code);
      unsigned char q[kVec / 2];
      to_e2m1<kVec>(v, inv, q);
      store_codes<kVec / 2>(p.y_quant + row * (p.row_stride / 2) + col / 2, q);
    }
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
