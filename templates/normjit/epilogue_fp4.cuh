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
// threads_per_row * vec a multiple of the block): their amax is reduced by shuffles
// (block_amax). y in YT is stored too only where p.y is set. Forward only; NVFP4 needs sm_89+
// (the e4m3 scale conversions).
// The codes come from e2m1.h's branch-free encoder (nine instructions a value, eight codes
// packed into a 32-bit word and stored with one store a pack), fed with half the scaled value:
// h = y * (1 / 2X) for MX (exact); for NVFP4 h = y * (inv / 2) with inv = fp32(S_enc / s), which
// is fp32(y * inv) / 2 wherever inv / 2 is exact (inv >= 2^-125); below that (S_enc < 2^-116)
// a uniform branch takes fp32(y * inv) * 0.5, two products.
#pragma once
#include "normjit/quant_common.cuh"
#include "normjit/reduce_warp.cuh"

namespace normjit {

template <bool kNv>
struct EpilogueFp4 {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;
  static constexpr int kBlock = kNv ? 16 : 32;
  // Two copies of this output pass (with y and without) ran NVFP4 1.0-1.4 % slower (H100, H200).
  static constexpr bool kOneOutputBody = true;

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int) {
    const float amax = block_amax<kBlock, kVec, kThreadsPerRow>(v, valid);
    unsigned char scale_code;
    float inv = 0.f;    // NVFP4: S_enc / s, what y is multiplied by before encoding
    float half_inv;     // y * half_inv is half the value encoded
    bool zero = false;  // NVFP4: a block scale of 0 (or NaN) gives codes +0, the reference's rule
    bool two_step = false;
    if constexpr (kNv) {
      const float s_enc = __ldg(p.quant_scale);
      scale_code = static_cast<unsigned char>(to_fp8x2<false>(amax / 6.f * s_enc, 0.f) & 0xff);
      const float s = e4m3_value(scale_code);
      zero = !(s > 0.f);
      inv = s_enc / s;       // IEEE division: the codes are e2m1(fp32(y * inv))
      half_inv = inv * 0.5f;  // exact unless inv < 2^-125
      // There fp32(y * inv) / 2 is not fp32(y * (inv / 2)): two products (S_enc < 2^-116 only).
      two_step = __builtin_expect(!zero && !(inv >= 0x1p-125f), 0);
    } else {
      const unsigned code = e2m1_mx_scale_code(amax);
      scale_code = static_cast<unsigned char>(code);
      half_inv = e2m1_mx_half_inverse_scale(code);  // 1 / (2X), exact: a power of two
    }
    unsigned char* const codes = p.y_quant + row * (p.row_stride / 2);
    if constexpr (kVec == 1) {
      // A byte holds two lanes' codes: the even column's lane stores it with its odd neighbour's.
      // Rows of a pass are whole warps' lanes or sub-warp groups of >= 16 lanes, and n is even,
      // so the neighbour is the next lane of the same row.
      const float h = two_step ? __fmul_rn(__fmul_rn(v[0], inv), 0.5f) : __fmul_rn(v[0], half_inv);
      const unsigned code = zero ? 0u : e2m1_pack_of<1>([&](int) { return h; });
      const unsigned hi = __shfl_down_sync(0xffffffffu, code, 1);
      if (!valid) return;
      store_block_scale_of<kBlock>(p, row, col, scale_code);
      if (col % 2 == 0) codes[col / 2] = static_cast<unsigned char>(code | (hi << 4));
    } else {
      if (!valid) return;
      store_block_scale_of<kBlock>(p, row, col, scale_code);
      if (two_step)
        store_e2m1<kVec>(codes + col / 2, [&](int j) { return __fmul_rn(__fmul_rn(v[j], inv), 0.5f); }, zero);
      else
        store_e2m1<kVec>(codes + col / 2, [&](int j) { return __fmul_rn(v[j], half_inv); }, zero);
    }
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
