// OCP MXFP8 output (Microscaling Formats v1.0): every 32 consecutive values of a row share one
// scale X = 2^(floor(log2(amax)) - emax), emax 8 (e4m3) or 15 (e5m2), the exponent clamped to
// [-127, 127] (amax 0: X = 2^-127; NaN values are left out of the amax and stay NaN codes, as
// normjit::reference::quantize_mx defines it). X's E8M0 code (exponent + 127) goes to
// p.block_scales at scale (row, col / 32) in p.block_scale_layout (block_scale_layout.h: row-major
// [rows, block_scale_stride] or the GEMMs' 128x4 tiles), the element codes of y / X (round to
// nearest even, saturating; NaN kept) to p.y_quant. y in YT is stored too only where p.y is set.
// A block is 32 / kVec lanes' packs of one pass (the spec's threads_per_row * vec is a multiple
// of 32): their amax is reduced by shuffles. Forward only; sm_89+.
#pragma once
#include "normjit/quant_common.cuh"
#include "normjit/reduce_warp.cuh"

namespace normjit {

template <bool kE5M2>
struct EpilogueMx {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;
  static constexpr unsigned kElementEmax = kE5M2 ? 15 : 8;

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int) {
    const float amax = block_amax<32, kVec, kThreadsPerRow>(v, valid);
    if (!valid) return;
    // From amax's exponent bits (e2m1.h), as ilogbf and ldexpf give them without their branches.
    const unsigned scale_code = mx_scale_code<kElementEmax>(amax);
    store_block_scale_of<32>(p, row, col, static_cast<unsigned char>(scale_code));
    store_codes<kVec>(p.y_quant + row * p.row_stride + col, to_fp8<kE5M2, kVec>(v, mx_inverse_scale(scale_code)));
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
