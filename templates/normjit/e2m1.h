// Software e2m1 (OCP FP4 E2M1: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6) encoding, round to
// nearest even and saturating (PTX's .satfinite); NaN gives +0 (e2m1 has no NaN), the sign of
// anything else is kept (-0.1 gives -0, code 0x8), as normjit::reference::encode_satfinite
// defines it. sm_90 has no e2m1 conversion (cvt.rn.satfinite.e2m1x2.f32 is sm_100a+). Plain
// host/device code: the host tests compile these same functions against the reference
// (tests/runtime/test_e2m1_exhaustive.cpp: every fp32 bit pattern).
//
// No compare and no branch: a value costs nine instructions, packing included. The encoder takes
// h = x / 2 (one FMUL by half the block's scale: exact for the MX powers of two). With
// sat(y) = min(max(y, 0), 1), NaN giving 0 (PTX's .sat, free on FADD / FFMA), the magnitude is
//   code(|x|) = rint(4 sat(|h|)) + rint(2 sat(|h| - 1)) + rint(sat(|h| - 2))
// the three pieces being the code's three slopes: 2 per unit of |x| below 2 (codes 0-4, step
// 0.5), 1 from 2 to 4 (codes 4-6), 1/2 from 4 to 6 (codes 6-7). At most one piece is fractional;
// the clamps saturate at 7 (|x| >= 6, infinity), NaN gives 0, and |h| - k is exact wherever it is
// not clamped (Sterbenz). rint is an fp32 addition onto 2^23 (ulp 1, ties to even), the code
// landing in the sum's low bits; the pieces go onto 2^23 + rint(4 sat(|h|)) in that order, and
// that sum is 2^23 + 4 whenever the second piece is not 0 and 2^23 + 6 whenever the third is
// not, both even, so each tie goes to the even code as rounding |x| once would.
// The sign is h's sign bit: a NaN h is the canonical 0x7fffffff on the GPU (the CUDA programming
// guide: "the result of a single-precision floating-point operation involving one or more input
// NaNs is the quiet NaN of bit pattern 0x7fffffff"), so NaN gives +0 with no test of its own; the
// host build of half_of() canonicalizes NaN the same way.
#pragma once

#if defined(__CUDACC_RTC__)
#include "normjit/host_device.h"
#else
#include "host_device.h"
#endif

namespace normjit {

namespace e2m1_detail {

constexpr float kMagic = 8388608.f;  // 2^23: the floats of [2^23, 2^24) are the integers
constexpr unsigned kMagicBits = 0x4B000000u;
constexpr unsigned kCanonicalNaN = 0x7fffffffu;

NORMJIT_HOST_DEVICE inline unsigned bits_of(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  unsigned u;
  __builtin_memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

NORMJIT_HOST_DEVICE inline float float_of(unsigned u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float v;
  __builtin_memcpy(&v, &u, sizeof(v));
  return v;
#endif
}

NORMJIT_HOST_DEVICE inline float abs_of(float v) {
#ifdef __CUDA_ARCH__
  return fabsf(v);
#else
  return __builtin_fabsf(v);
#endif
}

// y clamped to [0, 1], NaN to +0 (PTX's .sat; ptxas folds it into the FADD / FFMA before it).
NORMJIT_HOST_DEVICE inline float sat(float y) {
#ifdef __CUDA_ARCH__
  return __saturatef(y);
#else
  return y > 0.f ? (y < 1.f ? y : 1.f) : 0.f;
#endif
}

// x * y rounded once (an FMUL, never fused into a later addition), NaN as the GPU gives it.
NORMJIT_HOST_DEVICE inline float mul_rn(float x, float y) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(x, y);
#else
  const float r = x * y;
  return r == r ? r : float_of(kCanonicalNaN);
#endif
}

// x * y + z where x * y is exact (y a power of two here): one rounding either way.
NORMJIT_HOST_DEVICE inline float fma_exact(float x, float y, float z) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(x, y, z);
#else
  return x * y + z;
#endif
}

// (hi << 1) | (lo >> 31): SHF.L.W.U32.HI on the device.
NORMJIT_HOST_DEVICE inline unsigned shift_in_sign(unsigned lo, unsigned hi) {
#ifdef __CUDA_ARCH__
  return __funnelshift_l(lo, hi, 1);
#else
  return (hi << 1) | (lo >> 31);
#endif
}

}  // namespace e2m1_detail

// 2^23 + the 3-bit magnitude code of 2 |h| (NaN: 2^23 + 0), as float bits: three FADD.SAT, two
// FFMA and an FADD.
NORMJIT_HOST_DEVICE inline unsigned e2m1_magnitude_bits(float h) {
  using namespace e2m1_detail;
  const float a = abs_of(h);
  const float s0 = sat(a), s1 = sat(a - 1.f), s2 = sat(a - 2.f);
  float x = fma_exact(s0, 4.f, kMagic);  // 2^23 + rint(2 min(|x|, 2))
  x = fma_exact(s1, 2.f, x);             // + rint(min(|x|, 4) - 2) where |x| > 2
  x = x + s2;                            // + rint(min(|x|, 6) / 2 - 2) where |x| > 4
  return bits_of(x);
}

// The codes of x[j] = 2 half_of(j) (kN from 1 to 8; each half_of(j) an fp32 result, NaN canonical
// as above), packed four bits each, x[0] in the low nibble. Per value: the six instructions of the
// magnitude and two to pack: a funnel shift moves the word up a bit and takes in h's sign, LEA
// moves it three more and adds 2^23 + magnitude. The 2^23s add up to a constant that one
// subtraction removes. half_of(j) is called once, last value first, just before its use.
template <int kN, class HalfOf>
NORMJIT_HOST_DEVICE inline unsigned e2m1_pack_of(HalfOf half_of) {
  static_assert(kN >= 1 && kN <= 8, "at most 8 codes a word");
  using namespace e2m1_detail;
  unsigned word = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int j = kN - 1; j >= 0; --j) {
    const float h = half_of(j);
    word = shift_in_sign(bits_of(h), word);
    word = (word << 3) + e2m1_magnitude_bits(h);
  }
  // Each nibble's 2^23, shifted with it: only those of the two lowest nibbles stay in 32 bits.
  constexpr unsigned kJunk = kMagicBits + (kN > 1 ? kMagicBits << 4 : 0u);
  return word - kJunk;
}

// The codes of v[j] * (2 half_scale), packed as above from h[j] = fp32(v[j] * half_scale): they
// are e2m1_code(fp32(v[j] * 2 half_scale)) wherever halving commutes with the rounding, so for
// every v[j] when 2 half_scale is a power of two (MX) or a normal float whose half is exact
// (2 half_scale >= 2^-125: a product halved below 2^-126 encodes as a signed 0 either way).
// A product 0 * infinity is NaN: code +0.
template <int kN>
NORMJIT_HOST_DEVICE inline unsigned e2m1_pack(const float* v, float half_scale) {
  return e2m1_pack_of<kN>([&](int j) { return e2m1_detail::mul_rn(v[j], half_scale); });
}

// The 4-bit code of v (low nibble).
NORMJIT_HOST_DEVICE inline unsigned e2m1_code(float v) { return e2m1_pack<1>(&v, 0.5f); }

// Two codes in a byte, lo (the first element) in the low nibble (OCP, torch.float4_e2m1fn_x2).
NORMJIT_HOST_DEVICE inline unsigned char e2m1x2(float lo, float hi) {
  const float v[2] = {lo, hi};
  return static_cast<unsigned char>(e2m1_pack<2>(v, 0.5f));
}

// OCP MX scale of a block whose largest magnitude is amax (>= 0, not NaN), for elements whose
// largest finite value has exponent kEmax (e2m1 2, e4m3 8, e5m2 15): the E8M0 code of
// X = 2^(floor(log2 amax) - kEmax), the exponent clamped to [-127, 127] (reference::mx_scale_code):
// amax's biased exponent - kEmax, 0 for zeros and subnormals (and exponents up to kEmax), 254 for
// infinity.
template <unsigned kEmax>
NORMJIT_HOST_DEVICE inline unsigned mx_scale_code(float amax) {
  const unsigned e = e2m1_detail::bits_of(amax) >> 23;
  return e == 255u ? 254u : e > kEmax ? e - kEmax : 0u;
}

// 1 / X for a code of mx_scale_code, exact: 2^(127 - code); code 254 (infinity) gives the
// subnormal 2^-127. Codes above 246 other than 254 do not occur for kEmax >= 8.
NORMJIT_HOST_DEVICE inline float mx_inverse_scale(unsigned code) {
  return e2m1_detail::float_of(code < 254u ? (254u - code) << 23 : 0x00400000u);
}

NORMJIT_HOST_DEVICE inline unsigned e2m1_mx_scale_code(float amax) { return mx_scale_code<2>(amax); }

// Half of 1 / X for a code of e2m1_mx_scale_code (0-252 or 254), exact: 2^(126 - code), whose
// biased exponent 253 - code is positive up to code 252; code 254 gives the subnormal 2^-128
// (253 - 254 wraps to a negative int below it).
NORMJIT_HOST_DEVICE inline float e2m1_mx_half_inverse_scale(unsigned code) {
  const int b = static_cast<int>((253u - code) << 23);
  return e2m1_detail::float_of(static_cast<unsigned>(b > 0x00200000 ? b : 0x00200000));
}

}  // namespace normjit
