// Software e2m1 (OCP FP4 E2M1: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6) encoding, round to
// nearest even and saturating (PTX's .satfinite); NaN gives +0 (e2m1 has no NaN), the sign of
// anything else is kept (-0.1 gives -0, code 0x8), as normjit::reference::encode_satfinite
// defines it. sm_90 has no e2m1 conversion (cvt.rn.satfinite.e2m1x2.f32 is sm_100a+). Plain
// host/device code: the host tests compile this same function against the reference.
#pragma once

#ifndef NORMJIT_HOST_DEVICE
#if defined(__CUDACC__)
#define NORMJIT_HOST_DEVICE __host__ __device__
#else
#define NORMJIT_HOST_DEVICE
#endif
#endif

namespace normjit {

// The 4-bit code of v (low nibble). A magnitude's code is the number of midpoints it passes: at
// a midpoint it rounds to the even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2,
// 3.5 -> 4, 5 -> 4), so the comparisons alternate > and >=. Infinities pass all seven (6.0); NaN
// passes none.
NORMJIT_HOST_DEVICE inline unsigned e2m1_code(float v) {
#ifdef __CUDA_ARCH__
  const unsigned bits = __float_as_uint(v);
#else
  unsigned bits;
  __builtin_memcpy(&bits, &v, sizeof(bits));
#endif
  const float a = v < 0.f ? -v : v;
  const unsigned magnitude = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                             (a > 5.f);
  const unsigned sign = v == v ? (bits >> 31) << 3 : 0u;  // NaN: +0
  return sign | magnitude;
}

// Two codes in a byte, lo (the first element) in the low nibble (OCP, torch.float4_e2m1fn_x2).
NORMJIT_HOST_DEVICE inline unsigned char e2m1x2(float lo, float hi) {
  return static_cast<unsigned char>(e2m1_code(lo) | (e2m1_code(hi) << 4));
}

}  // namespace normjit
