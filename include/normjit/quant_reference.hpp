#pragma once
// Host-side references of the quantized output formats, written from the formats' definitions
// (OCP 8-bit floating point and microscaling (MX) v1.0; NVIDIA's NVFP4): what a quantizing
// epilogue must produce, bit for bit. Rounding is to nearest, ties to even; out-of-range values
// saturate to the largest finite value (PTX's .satfinite); NaN stays NaN where the format has one.
#include <cstdint>
#include <vector>

#include "normjit/spec.hpp"

namespace normjit::reference {

// Element formats: e4m3 (OCP E4M3FN: bias 7, no infinity, NaN S.1111.111, max 448), e5m2 (OCP
// E5M2: bias 15, IEEE-like infinities and NaNs, max 57344), e2m1 (OCP FP4: bias 1, no infinity or
// NaN, max 6; codes in the low 4 bits).
enum class MiniFloat { kE4M3, kE5M2, kE2M1 };

// The element format of an FP8 quantizing epilogue (fp8_*, mxfp8_*); throws for any other.
MiniFloat fp8_element(Epilogue epilogue);

// The value of a code (NaN or ±infinity where the code means one).
double decode(MiniFloat format, uint8_t code);
// The code of v: round to nearest even, saturate to ±max finite (infinities too). NaN gives the
// format's NaN (sign kept); e2m1 has none, and NaN gives +0 there.
uint8_t encode_satfinite(MiniFloat format, double v);
// The largest finite value, and the exponent of its leading bit (emax: 8, 15, 2).
double max_finite(MiniFloat format);
int max_exponent(MiniFloat format);

// E8M0, the MX shared scale: 2^(code - 127); code 255 is NaN.
double decode_e8m0(uint8_t code);
// The MX shared scale of a block whose largest magnitude is amax (OCP MX v1.0, 6.3):
// 2^(floor(log2(amax)) - emax of the element format), the exponent clamped to [-127, 127];
// amax = 0 gives 2^-127 (code 0); a NaN amax gives code 255.
uint8_t mx_scale_code(double amax, MiniFloat element);

// MX block quantization (MXFP8 e4m3 / e5m2, MXFP4 e2m1): 32 consecutive values of a row share
// one E8M0 scale X; each element is encode_satfinite(v / X). A row of n values gives
// ceil(n / 32) scales (a short last block uses the values it has).
struct BlockQuantized {
  std::vector<uint8_t> codes;   // [rows, n] (e2m1: one code per byte, low 4 bits)
  std::vector<uint8_t> scales;  // [rows, blocks] block scale codes (E8M0 for MX, e4m3 for NVFP4)
  double tensor_scale = 1.0;    // NVFP4 only: the per-tensor fp32 decode multiplier
};
BlockQuantized quantize_mx(const std::vector<double>& values, int64_t rows, int64_t n, MiniFloat element);

// NVFP4: blocks of 16 values, e2m1 elements, an e4m3 scale per block and one fp32 scale per
// tensor. tensor_scale = amax(tensor) / (448 * 6); block scale code = e4m3(amax(block) / 6 /
// tensor_scale); element = e2m1(v / (decode(block scale) * tensor_scale)). A value decodes as
// decode(element) * decode(block scale) * tensor_scale.
BlockQuantized quantize_nvfp4(const std::vector<double>& values, int64_t rows, int64_t n);

// Per-tensor FP8 with a given scale (TransformerEngine's delayed scaling): codes =
// encode_satfinite(v * scale); amax = max |v| of the unscaled values (NaN ignored).
struct TensorQuantized {
  std::vector<uint8_t> codes;
  double amax = 0;
};
TensorQuantized quantize_fp8_per_tensor(const std::vector<double>& values, double scale, MiniFloat format);

// Dynamic per-row quantization (vLLM's per-token): scale[row] = amax(row) / qmax (1 where the row
// is all zeros), code = q(v / scale[row]); FP8: q = encode_satfinite, qmax = max_finite; int8: q
// = round half to even, clamped to [-128, 127], qmax = 127 (codes hold the int8 bit pattern).
struct RowQuantized {
  std::vector<uint8_t> codes;   // [rows, n]
  std::vector<float> scales;    // [rows], fp32 as stored
};
RowQuantized quantize_fp8_per_row(const std::vector<double>& values, int64_t rows, int64_t n, MiniFloat format);
RowQuantized quantize_int8_per_row(const std::vector<double>& values, int64_t rows, int64_t n);

}  // namespace normjit::reference
