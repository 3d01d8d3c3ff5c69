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
  std::vector<uint8_t> codes;   // [rows, n] (e2m1: one code per byte, low 4 bits; pack_e2m1 packs them)
  std::vector<uint8_t> scales;  // [rows, blocks] block scale codes (E8M0 for MX, e4m3 for NVFP4)
  double tensor_scale = 1.0;    // NVFP4 only: the per-tensor fp32 decode multiplier
};
BlockQuantized quantize_mx(const std::vector<double>& values, int64_t rows, int64_t n, MiniFloat element);
// e2m1 codes (one a byte) packed two a byte as y_quant holds them: element 2k in the low nibble,
// 2k + 1 in the high one (OCP; torch.float4_e2m1fn_x2). An odd count leaves the last high nibble 0.
std::vector<uint8_t> pack_e2m1(const std::vector<uint8_t>& codes);

// NVFP4: blocks of 16 values, e2m1 elements, an e4m3 scale per block and one fp32 scale per
// tensor, in the two-level form TransformerEngine and FlashInfer quantize with: given the
// tensor's encode scale S_enc (fp32; 448 * 6 / amax(tensor)), block scale code s =
// encode_satfinite(e4m3, amax(block) / 6 * S_enc), element = e2m1(v * S_enc / decode(s)) (code 0
// where decode(s) is 0 or NaN). A value decodes as decode(element) * decode(s) / S_enc;
// tensor_scale returns 1 / S_enc, the decode multiplier.
BlockQuantized quantize_nvfp4(const std::vector<double>& values, int64_t rows, int64_t n, double encode_scale);
// The same with S_enc from the values: fp32(448 * 6 / amax(values)), 1 where amax is 0 (as
// TransformerEngine's compute_global_encode_scaling_factor_FP4).
BlockQuantized quantize_nvfp4(const std::vector<double>& values, int64_t rows, int64_t n);
// S_enc of a tensor whose largest magnitude is amax (NaN ignored by the caller): fp32(448 * 6 /
// amax), clamped to the largest float, 1 where amax is 0.
float nvfp4_encode_scale(double amax);

// Block scales laid out for the GEMMs (cuBLASLt's 1D block scaling layout): the row-major
// [rows, cols] scales padded with zeros to [roundup(rows, 128), roundup(cols, 4)] and stored as
// 128 x 4 tiles of 512 bytes, tiles row-major, scale (r, c) of a tile at (r % 32) * 16 + (r / 32)
// * 4 + c. Written from the tile shape, apart from templates/normjit/block_scale_layout.h.
std::vector<uint8_t> swizzle_block_scales(const std::vector<uint8_t>& scales, int64_t rows, int64_t cols);

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
