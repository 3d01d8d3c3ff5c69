#include "normjit/quant_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "normjit/error.hpp"

namespace normjit::reference {

namespace {

struct Layout {
  int exponent_bits, mantissa_bits, bias;
  bool ieee_specials;  // the all-ones exponent means infinity / NaN (e5m2)
  uint8_t max_code;    // largest finite magnitude's code
  int nan_code;        // magnitude code of NaN, -1: none
};

Layout layout(MiniFloat f) {
  switch (f) {
    case MiniFloat::kE4M3: return {4, 3, 7, false, 0x7E, 0x7F};
    case MiniFloat::kE5M2: return {5, 2, 15, true, 0x7B, 0x7F};
    case MiniFloat::kE2M1: return {2, 1, 1, false, 0x7, -1};
  }
  throw Error(Status::kInvalidArgument, "unknown MiniFloat format " + std::to_string(static_cast<int>(f)));
}

int sign_shift(const Layout& l) { return l.exponent_bits + l.mantissa_bits; }

double decode_magnitude(const Layout& l, unsigned m) {
  const unsigned e = m >> l.mantissa_bits, frac = m & ((1u << l.mantissa_bits) - 1);
  if (l.nan_code >= 0 && !l.ieee_specials && m == static_cast<unsigned>(l.nan_code))
    return std::numeric_limits<double>::quiet_NaN();
  if (l.ieee_specials && e == (1u << l.exponent_bits) - 1)
    return frac ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  if (e == 0) return std::ldexp(frac, 1 - l.bias - l.mantissa_bits);  // subnormal
  return std::ldexp((1u << l.mantissa_bits) + frac, static_cast<int>(e) - l.bias - l.mantissa_bits);
}

}  // namespace

double decode(MiniFloat format, uint8_t code) {
  const Layout l = layout(format);
  const unsigned sign = (code >> sign_shift(l)) & 1u;
  const double m = decode_magnitude(l, code & ((1u << sign_shift(l)) - 1));
  return sign ? -m : m;
}

double max_finite(MiniFloat format) {
  const Layout l = layout(format);
  return decode_magnitude(l, l.max_code);
}

int max_exponent(MiniFloat format) { return std::ilogb(max_finite(format)); }

uint8_t encode_satfinite(MiniFloat format, double v) {
  const Layout l = layout(format);
  const uint8_t sign = std::signbit(v) ? static_cast<uint8_t>(1u << sign_shift(l)) : 0;
  if (std::isnan(v)) return l.nan_code >= 0 ? static_cast<uint8_t>(sign | l.nan_code) : 0;
  const double a = std::fabs(v);
  if (a >= max_finite(format)) return sign | l.max_code;  // saturate, infinities too
  // Quantum of a's binade: subnormals share the smallest normal binade's.
  const int min_exponent = 1 - l.bias;
  const int e = std::max(a > 0 ? std::ilogb(a) : min_exponent, min_exponent);
  const double steps = std::nearbyint(std::ldexp(a, l.mantissa_bits - e));  // ties to even
  // steps in [2^M, 2^(M+1)] for normals (2^(M+1) carries into the next binade), [0, 2^M] below.
  unsigned m;
  if (steps < std::ldexp(1.0, l.mantissa_bits) && e == min_exponent) {
    m = static_cast<unsigned>(steps);  // subnormal (or zero); 2^M itself is the first normal
  } else {
    int biased = e + l.bias;
    unsigned frac = static_cast<unsigned>(steps) - (1u << l.mantissa_bits);
    if (frac == (1u << l.mantissa_bits)) {
      frac = 0;
      ++biased;
    }
    m = (static_cast<unsigned>(biased) << l.mantissa_bits) | frac;
  }
  return sign | static_cast<uint8_t>(std::min<unsigned>(m, l.max_code));
}

MiniFloat fp8_element(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kFp8E4M3:
    case Epilogue::kFp8E4M3Row:
    case Epilogue::kMxfp8E4M3: return MiniFloat::kE4M3;
    case Epilogue::kFp8E5M2:
    case Epilogue::kFp8E5M2Row:
    case Epilogue::kMxfp8E5M2: return MiniFloat::kE5M2;
    default: break;
  }
  throw Error(Status::kInvalidArgument,
              std::string("fp8_element: epilogue ") + to_string(epilogue) + " has no FP8 element format");
}

double decode_e8m0(uint8_t code) {
  return code == 255 ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, static_cast<int>(code) - 127);
}

uint8_t mx_scale_code(double amax, MiniFloat element) {
  if (std::isnan(amax)) return 255;
  if (amax == 0) return 0;
  const int x = std::clamp(std::ilogb(amax) - max_exponent(element), -127, 127);
  return static_cast<uint8_t>(x + 127);
}

namespace {
void check_shape(const std::vector<double>& values, int64_t rows, int64_t n, const char* what) {
  if (rows < 0 || n < 1 || static_cast<int64_t>(values.size()) != rows * n)
    throw Error(Status::kInvalidArgument, std::string(what) + ": values.size()=" + std::to_string(values.size()) +
                                              " is not rows=" + std::to_string(rows) + " x n=" + std::to_string(n));
}

double block_amax(const std::vector<double>& values, int64_t begin, int64_t end) {
  double amax = 0;
  for (int64_t i = begin; i < end; ++i)
    if (!std::isnan(values[i])) amax = std::max(amax, std::fabs(values[i]));
  return amax;
}

// Quantizes each block of `block` consecutive values of a row (a short last block keeps the values
// it has): block_scale(amax) gives the stored scale code, decode_scale(code) the divisor of its
// values, element_format their format.
template <class BlockScale, class DecodeScale>
BlockQuantized quantize_blocks(const std::vector<double>& values, int64_t rows, int64_t n, int64_t block,
                               MiniFloat element, BlockScale block_scale, DecodeScale decode_scale) {
  const int64_t blocks = (n + block - 1) / block;
  BlockQuantized q;
  q.codes.resize(values.size());
  q.scales.resize(rows * blocks);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = r * n + b * block, end = r * n + std::min(n, (b + 1) * block);
      const uint8_t s = block_scale(block_amax(values, begin, end));
      q.scales[r * blocks + b] = s;
      const double x = decode_scale(s);
      for (int64_t i = begin; i < end; ++i) q.codes[i] = x > 0 ? encode_satfinite(element, values[i] / x) : 0;
    }
  return q;
}
}  // namespace

BlockQuantized quantize_mx(const std::vector<double>& values, int64_t rows, int64_t n, MiniFloat element) {
  check_shape(values, rows, n, "quantize_mx");
  return quantize_blocks(
      values, rows, n, 32, element, [element](double amax) { return mx_scale_code(amax, element); }, decode_e8m0);
}

std::vector<uint8_t> pack_e2m1(const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> out((codes.size() + 1) / 2, 0);
  for (size_t i = 0; i < codes.size(); ++i) out[i / 2] |= static_cast<uint8_t>((codes[i] & 0xF) << (i % 2 ? 4 : 0));
  return out;
}

float nvfp4_encode_scale(double amax) {
  if (!(amax > 0)) return 1.0f;
  const double s = max_finite(MiniFloat::kE4M3) * max_finite(MiniFloat::kE2M1) / amax;
  return static_cast<float>(std::min<double>(s, std::numeric_limits<float>::max()));
}

BlockQuantized quantize_nvfp4(const std::vector<double>& values, int64_t rows, int64_t n, double encode_scale) {
  check_shape(values, rows, n, "quantize_nvfp4");
  const double e2m1_max = max_finite(MiniFloat::kE2M1);
  // The elements divide by decode(s) / S_enc: quantize_blocks codes 0 where that is not > 0.
  BlockQuantized q = quantize_blocks(
      values, rows, n, kNvfp4Block, MiniFloat::kE2M1,
      [&](double block_amax) { return encode_satfinite(MiniFloat::kE4M3, block_amax / e2m1_max * encode_scale); },
      [&](uint8_t code) { return decode(MiniFloat::kE4M3, code) / encode_scale; });
  q.tensor_scale = 1.0 / encode_scale;
  return q;
}

BlockQuantized quantize_nvfp4(const std::vector<double>& values, int64_t rows, int64_t n) {
  check_shape(values, rows, n, "quantize_nvfp4");
  return quantize_nvfp4(values, rows, n, nvfp4_encode_scale(block_amax(values, 0, static_cast<int64_t>(values.size()))));
}

std::vector<uint8_t> swizzle_block_scales(const std::vector<uint8_t>& scales, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(scales.size()) != rows * cols)
    throw Error(Status::kInvalidArgument, "swizzle_block_scales: scales.size()=" + std::to_string(scales.size()) +
                                              " is not rows=" + std::to_string(rows) + " x cols=" + std::to_string(cols));
  const int64_t row_tiles = (rows + 127) / 128, col_tiles = (cols + 3) / 4;
  std::vector<uint8_t> out(row_tiles * col_tiles * 512, 0);
  // Tile (tr, tc) is 512 bytes at (tr * col_tiles + tc) * 512: 32 lines of 16 bytes, line l holding
  // rows l, l + 32, l + 64, l + 96 of the tile, 4 scales each.
  for (int64_t tr = 0; tr < row_tiles; ++tr)
    for (int64_t tc = 0; tc < col_tiles; ++tc) {
      uint8_t* tile = out.data() + (tr * col_tiles + tc) * 512;
      for (int64_t line = 0; line < 32; ++line)
        for (int64_t quarter = 0; quarter < 4; ++quarter)
          for (int64_t c = 0; c < 4; ++c) {
            const int64_t r = tr * 128 + quarter * 32 + line, col = tc * 4 + c;
            if (r < rows && col < cols) tile[line * 16 + quarter * 4 + c] = scales[r * cols + col];
          }
    }
  return out;
}

TensorQuantized quantize_fp8_per_tensor(const std::vector<double>& values, double scale, MiniFloat format) {
  if (format == MiniFloat::kE2M1)
    throw Error(Status::kInvalidArgument, "quantize_fp8_per_tensor: format e2m1 is not an FP8 format");
  TensorQuantized q;
  q.codes.reserve(values.size());
  for (double v : values) q.codes.push_back(encode_satfinite(format, v * scale));
  q.amax = block_amax(values, 0, static_cast<int64_t>(values.size()));
  return q;
}

namespace {
template <class Quantize>
RowQuantized per_row(const std::vector<double>& values, int64_t rows, int64_t n, double qmax, Quantize quantize) {
  RowQuantized q;
  q.codes.resize(values.size());
  q.scales.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const double amax = block_amax(values, r * n, (r + 1) * n);
    const float scale = amax > 0 ? static_cast<float>(amax / qmax) : 1.0f;
    q.scales[r] = scale;
    for (int64_t i = r * n; i < (r + 1) * n; ++i) q.codes[i] = quantize(values[i] / static_cast<double>(scale));
  }
  return q;
}
}  // namespace

RowQuantized quantize_fp8_per_row(const std::vector<double>& values, int64_t rows, int64_t n, MiniFloat format) {
  check_shape(values, rows, n, "quantize_fp8_per_row");
  if (format == MiniFloat::kE2M1)
    throw Error(Status::kInvalidArgument, "quantize_fp8_per_row: format e2m1 is not an FP8 format");
  return per_row(values, rows, n, max_finite(format), [format](double v) { return encode_satfinite(format, v); });
}

RowQuantized quantize_int8_per_row(const std::vector<double>& values, int64_t rows, int64_t n) {
  check_shape(values, rows, n, "quantize_int8_per_row");
  return per_row(values, rows, n, 127.0, [](double v) {
    const double r = std::isnan(v) ? 0.0 : std::clamp(std::nearbyint(v), -128.0, 127.0);
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  });
}

}  // namespace normjit::reference
