// The quantized formats' references against their definitions: every code decoded from the bit
// layout, encode checked against a brute-force nearest-code search (ties to the even code) over
// every midpoint and random values, saturation and NaN, and the block, tensor and row scalings.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "normjit/error.hpp"
#include "normjit/quant_reference.hpp"
#include "normjit/runtime.hpp"
#include "templates/normjit/block_scale_layout.h"
#include "templates/normjit/e2m1.h"

using namespace normjit;
using namespace normjit::reference;

namespace {

constexpr MiniFloat kFormats[] = {MiniFloat::kE4M3, MiniFloat::kE5M2, MiniFloat::kE2M1};

const char* name(MiniFloat f) { return f == MiniFloat::kE4M3 ? "e4m3" : f == MiniFloat::kE5M2 ? "e5m2" : "e2m1"; }
unsigned codes(MiniFloat f) { return f == MiniFloat::kE2M1 ? 16 : 256; }
unsigned sign_bit(MiniFloat f) { return f == MiniFloat::kE2M1 ? 0x8 : 0x80; }

// The nearest finite code to v by search; ties go to the code whose lowest bit is 0 (the even
// mantissa); beyond the largest finite value, that value (saturation).
uint8_t brute_force(MiniFloat f, double v) {
  int best = -1;
  double best_d = INFINITY;
  for (unsigned c = 0; c < codes(f); ++c) {
    const double x = decode(f, static_cast<uint8_t>(c));
    if (!std::isfinite(x) || std::signbit(x) != std::signbit(v)) continue;
    const double d = std::fabs(x - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = static_cast<int>(c);
      best_d = d;
    }
  }
  if (std::fabs(v) >= max_finite(f)) return encode_satfinite(f, std::copysign(max_finite(f), v));
  return static_cast<uint8_t>(best);
}

}  // namespace

TEST_CASE("minifloat decode follows the formats' bit layouts") {
  CHECK(decode(MiniFloat::kE4M3, 0x38) == 1.0);
  CHECK(decode(MiniFloat::kE4M3, 0x7E) == 448.0);
  CHECK(decode(MiniFloat::kE4M3, 0x08) == std::ldexp(1.0, -6));  // smallest normal
  CHECK(decode(MiniFloat::kE4M3, 0x01) == std::ldexp(1.0, -9));  // smallest subnormal
  CHECK(std::isnan(decode(MiniFloat::kE4M3, 0x7F)));
  CHECK(std::isnan(decode(MiniFloat::kE4M3, 0xFF)));
  CHECK(decode(MiniFloat::kE4M3, 0xF0) == -128.0);
  CHECK(decode(MiniFloat::kE4M3, 0xF8) == -256.0);  // the all-ones exponent is finite in E4M3FN
  CHECK(decode(MiniFloat::kE5M2, 0x3C) == 1.0);
  CHECK(decode(MiniFloat::kE5M2, 0x7B) == 57344.0);
  CHECK(decode(MiniFloat::kE5M2, 0x01) == std::ldexp(1.0, -16));
  CHECK(decode(MiniFloat::kE5M2, 0x7C) == INFINITY);
  CHECK(decode(MiniFloat::kE5M2, 0xFC) == -INFINITY);
  CHECK(std::isnan(decode(MiniFloat::kE5M2, 0x7D)));
  const double e2m1[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (unsigned c = 0; c < 8; ++c) {
    CHECK(decode(MiniFloat::kE2M1, static_cast<uint8_t>(c)) == e2m1[c]);
    CHECK(decode(MiniFloat::kE2M1, static_cast<uint8_t>(c | 8)) == -e2m1[c]);
  }
  CHECK(max_finite(MiniFloat::kE4M3) == 448.0);
  CHECK(max_finite(MiniFloat::kE5M2) == 57344.0);
  CHECK(max_finite(MiniFloat::kE2M1) == 6.0);
  CHECK(max_exponent(MiniFloat::kE4M3) == 8);
  CHECK(max_exponent(MiniFloat::kE5M2) == 15);
  CHECK(max_exponent(MiniFloat::kE2M1) == 2);
}

TEST_CASE("minifloat encode: every code round-trips; midpoints and random values round to nearest even") {
  std::mt19937_64 rng(7);
  for (MiniFloat f : kFormats) {
    CAPTURE(name(f));
    int checked = 0;
    for (unsigned c = 0; c < codes(f); ++c) {
      const double x = decode(f, static_cast<uint8_t>(c));
      if (!std::isfinite(x)) continue;
      CHECK(encode_satfinite(f, x) == c);
      // The midpoint to the next code of larger magnitude (same sign).
      const unsigned next = c + 1;
      if ((next & (sign_bit(f) - 1)) == 0) continue;  // c was the largest magnitude of its sign
      const double y = decode(f, static_cast<uint8_t>(next));
      if (!std::isfinite(y)) continue;
      const double mid = (x + y) / 2;
      CAPTURE(mid);
      CHECK(encode_satfinite(f, mid) == ((c & 1) == 0 ? c : next));
      CHECK(encode_satfinite(f, mid) == brute_force(f, mid));
      // Just off the midpoint: the nearer code.
      CHECK(encode_satfinite(f, std::nextafter(mid, 0.0)) == (std::fabs(x) < std::fabs(y) ? c : next));
      CHECK(encode_satfinite(f, std::nextafter(mid, std::copysign(INFINITY, mid))) == (std::fabs(x) < std::fabs(y) ? next : c));
      checked += 4;
    }
    std::uniform_real_distribution<double> exponent(-20, 18);
    for (int i = 0; i < 20000; ++i) {
      const double v = ((rng() & 1) ? -1 : 1) * std::exp2(exponent(rng));
      CAPTURE(v);
      CHECK(encode_satfinite(f, v) == brute_force(f, v));
      ++checked;
    }
    CHECK(checked > 20000);
  }
}

TEST_CASE("minifloat encode saturates to the largest finite value and keeps NaN where the format has one") {
  CHECK(encode_satfinite(MiniFloat::kE4M3, 1e9) == 0x7E);
  CHECK(encode_satfinite(MiniFloat::kE4M3, 464.0) == 0x7E);  // past 448, though 480 would be nearer
  CHECK(encode_satfinite(MiniFloat::kE4M3, -INFINITY) == 0xFE);
  CHECK(encode_satfinite(MiniFloat::kE4M3, std::numeric_limits<double>::quiet_NaN()) == 0x7F);
  CHECK(encode_satfinite(MiniFloat::kE5M2, INFINITY) == 0x7B);
  CHECK(encode_satfinite(MiniFloat::kE5M2, -61440.0) == 0xFB);  // the midpoint to infinity saturates
  CHECK(encode_satfinite(MiniFloat::kE5M2, -std::numeric_limits<double>::quiet_NaN()) == 0xFF);
  CHECK(encode_satfinite(MiniFloat::kE2M1, 7.0) == 0x7);
  CHECK(encode_satfinite(MiniFloat::kE2M1, -100.0) == 0xF);
  CHECK(encode_satfinite(MiniFloat::kE2M1, std::numeric_limits<double>::quiet_NaN()) == 0x0);
  CHECK(encode_satfinite(MiniFloat::kE4M3, -0.0) == 0x80);
  CHECK(encode_satfinite(MiniFloat::kE4M3, std::ldexp(1.0, -11)) == 0x00);  // below half the smallest subnormal
  CHECK(encode_satfinite(MiniFloat::kE4M3, std::ldexp(3.0, -11)) == 0x01);  // above it
}

TEST_CASE("MX block scales: E8M0 of floor(log2(amax)) minus the element's emax, per 32 values") {
  CHECK(mx_scale_code(448.0, MiniFloat::kE4M3) == 127);
  CHECK(mx_scale_code(1.0, MiniFloat::kE4M3) == 119);
  CHECK(mx_scale_code(6.0, MiniFloat::kE2M1) == 127);
  CHECK(mx_scale_code(7.9, MiniFloat::kE2M1) == 127);
  CHECK(mx_scale_code(8.0, MiniFloat::kE2M1) == 128);
  CHECK(mx_scale_code(0.0, MiniFloat::kE5M2) == 0);
  CHECK(mx_scale_code(std::ldexp(1.0, 200), MiniFloat::kE5M2) == 254);  // clamped to 2^127
  CHECK(mx_scale_code(std::numeric_limits<double>::quiet_NaN(), MiniFloat::kE4M3) == 255);
  CHECK(decode_e8m0(127) == 1.0);
  CHECK(std::isnan(decode_e8m0(255)));

  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0, 3);
  const int64_t rows = 3, n = 70;  // a short last block of 6
  std::vector<double> v(rows * n);
  for (double& x : v) x = normal(rng);
  for (MiniFloat f : kFormats) {
    CAPTURE(name(f));
    const BlockQuantized q = quantize_mx(v, rows, n, f);
    REQUIRE(q.scales.size() == static_cast<size_t>(rows * 3));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t s = q.scales[r * 3 + i / 32];
        const double x = decode_e8m0(s), want = v[r * n + i];
        CHECK(q.codes[r * n + i] == brute_force(f, want / x));
        // The block's largest value lands in the element format's top binade, never saturated far.
        CHECK(std::fabs(decode(f, q.codes[r * n + i]) * x - want) <= std::fabs(want) * 0.25 + x * max_finite(f) / 8);
      }
  }
}

TEST_CASE("NVFP4: e2m1 elements, an e4m3 scale per 16 values, one fp32 scale per tensor") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0, 2);
  const int64_t rows = 2, n = 40;
  std::vector<double> v(rows * n);
  for (double& x : v) x = normal(rng);
  v[17] = -9.5;  // the tensor's amax
  const BlockQuantized q = quantize_nvfp4(v, rows, n);
  // S_enc = fp32(448 * 6 / amax) (TransformerEngine's and FlashInfer's encode scale); the decode
  // multiplier is its reciprocal.
  const float s_enc = static_cast<float>(448.0 * 6.0 / 9.5);
  CHECK(nvfp4_encode_scale(9.5) == s_enc);
  CHECK(nvfp4_encode_scale(0.0) == 1.0f);
  CHECK(q.tensor_scale == 1.0 / s_enc);
  REQUIRE(q.scales.size() == static_cast<size_t>(rows * 3));
  CHECK(q.scales[1] == 0x7E);               // the amax block's scale: 448
  CHECK(q.codes[17] == 0xF);                // -6 in e2m1
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = r * 3 + i / 16;
      double block_amax = 0;
      for (int64_t k = (i / 16) * 16; k < std::min<int64_t>(n, (i / 16 + 1) * 16); ++k)
        block_amax = std::max(block_amax, std::fabs(v[r * n + k]));
      CHECK(q.scales[b] == brute_force(MiniFloat::kE4M3, block_amax / 6 * s_enc));
      const double x = decode(MiniFloat::kE4M3, q.scales[b]);
      CHECK(q.codes[r * n + i] == brute_force(MiniFloat::kE2M1, v[r * n + i] * s_enc / x));
    }
  // A given S_enc: the kernels take it from the caller. A zero block scale gives zero codes.
  std::vector<double> small = {1e-6, -2e-6, 0.5, 3.0};
  const BlockQuantized g = quantize_nvfp4(small, 2, 2, 100.0);
  CHECK(g.tensor_scale == 1.0 / 100.0);
  CHECK(g.scales[0] == 0);  // 2e-6 / 6 * 100 is below e4m3's smallest subnormal half
  CHECK(g.codes[0] == 0);
  CHECK(g.codes[1] == 0);
  CHECK(g.scales[1] == encode_satfinite(MiniFloat::kE4M3, 3.0 / 6 * 100));
  CHECK(g.codes[3] == brute_force(MiniFloat::kE2M1, 3.0 * 100 / decode(MiniFloat::kE4M3, g.scales[1])));
}

TEST_CASE("pack_e2m1: element 2k in the low nibble, 2k + 1 in the high one") {
  CHECK(pack_e2m1({0x1, 0x2, 0xF, 0x8}) == std::vector<uint8_t>{0x21, 0x8F});
  CHECK(pack_e2m1({0x7, 0x3, 0x5}) == std::vector<uint8_t>{0x37, 0x05});
  CHECK(pack_e2m1({}).empty());
}

TEST_CASE("the kernels' software e2m1 encoder (e2m1.h, compiled for the host) agrees with the reference") {
  // Every code's value, every midpoint and its float neighbours, both signs.
  for (unsigned c = 0; c < 16; ++c) {
    const float x = static_cast<float>(decode(MiniFloat::kE2M1, static_cast<uint8_t>(c)));
    CHECK(e2m1_code(x) == c);
  }
  const float points[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f, 7.f, 1e30f};
  for (float m : points)
    for (float p : {std::nextafter(m, 0.f), m, std::nextafter(m, INFINITY)})
      for (float x : {p, -p}) {
        CAPTURE(x);
        CHECK(e2m1_code(x) == encode_satfinite(MiniFloat::kE2M1, x));
        CHECK(e2m1_code(x) == brute_force(MiniFloat::kE2M1, x));
      }
  // Zeros, infinities, NaN (+0: e2m1 has none), subnormal floats.
  CHECK(e2m1_code(0.f) == 0x0);
  CHECK(e2m1_code(-0.f) == 0x8);
  CHECK(e2m1_code(-0.1f) == 0x8);
  CHECK(e2m1_code(INFINITY) == 0x7);
  CHECK(e2m1_code(-INFINITY) == 0xF);
  CHECK(e2m1_code(std::numeric_limits<float>::quiet_NaN()) == 0x0);
  CHECK(e2m1_code(-std::numeric_limits<float>::quiet_NaN()) == 0x0);
  CHECK(e2m1_code(std::numeric_limits<float>::denorm_min()) == 0x0);
  CHECK(e2m1_code(-std::numeric_limits<float>::denorm_min()) == 0x8);
  // Random values over the format's range and past it.
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<float> uniform(-8.f, 8.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  int64_t mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 ? uniform(rng) : normal(rng);
    if (e2m1_code(x) != encode_satfinite(MiniFloat::kE2M1, x)) ++mismatches;
  }
  CHECK(mismatches == 0);
  // Packed two a byte, the first in the low nibble.
  CHECK(e2m1x2(0.5f, -6.f) == 0xF1);
  CHECK(e2m1x2(-1.f, 3.f) == 0x5A);
}

TEST_CASE("swizzled block scales: cuBLASLt's 128x4 tiles, at known positions and against the reference") {
  // Inside the first tile: row r, column c at (r % 32) * 16 + (r / 32) * 4 + c.
  CHECK(block_scale_offset(0, 0, 4, kBlockScaleSwizzled) == 0);
  CHECK(block_scale_offset(0, 3, 4, kBlockScaleSwizzled) == 3);
  CHECK(block_scale_offset(1, 0, 4, kBlockScaleSwizzled) == 16);
  CHECK(block_scale_offset(31, 2, 4, kBlockScaleSwizzled) == 31 * 16 + 2);
  CHECK(block_scale_offset(32, 0, 4, kBlockScaleSwizzled) == 4);
  CHECK(block_scale_offset(127, 3, 4, kBlockScaleSwizzled) == 511);
  // Tiles row-major: the next 4 columns are the next tile; the next 128 rows follow all of a
  // band's tiles (cols 10: three tiles a band, the last padded).
  CHECK(block_scale_offset(0, 4, 10, kBlockScaleSwizzled) == 512);
  CHECK(block_scale_offset(5, 9, 10, kBlockScaleSwizzled) == 2 * 512 + 5 * 16 + 1);
  CHECK(block_scale_offset(128, 0, 10, kBlockScaleSwizzled) == 3 * 512);
  CHECK(block_scale_offset(200, 6, 10, kBlockScaleSwizzled) == (3 + 1) * 512 + (72 % 32) * 16 + 2 * 4 + 2);
  // Row-major.
  CHECK(block_scale_offset(3, 5, 10, kBlockScaleRowMajor) == 35);
  // Against the host reference's tile-by-tile layout, over shapes with and without padding; every
  // offset lies in block_scale_bytes and no two scales share one.
  for (auto [rows, n, ep] : {std::tuple<int64_t, int64_t, Epilogue>{1, 32, Epilogue::kMxfp8E4M3},
                             {37, 100, Epilogue::kNvfp4},
                             {128, 512, Epilogue::kMxfp4},
                             {300, 4096, Epilogue::kNvfp4},
                             {257, 7168, Epilogue::kMxfp8E5M2}}) {
    CAPTURE(rows);
    CAPTURE(n);
    const int64_t cols = block_scale_row_bytes(n, ep);
    std::vector<uint8_t> scales(rows * cols);
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(1 + i % 251);  // never 0
    const std::vector<uint8_t> want = swizzle_block_scales(scales, rows, cols);
    REQUIRE(static_cast<int64_t>(want.size()) == block_scale_bytes(rows, n, ep, BlockScaleLayout::kSwizzled));
    std::vector<uint8_t> got(want.size(), 0);
    int64_t collisions = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const long long at = block_scale_offset(r, c, cols, kBlockScaleSwizzled);
        REQUIRE(at < static_cast<long long>(got.size()));
        if (got[at] != 0) ++collisions;
        got[at] = scales[r * cols + c];
      }
    CHECK(collisions == 0);
    CHECK(got == want);  // the padding stays 0 in both
  }
  CHECK_THROWS_WITH_AS(swizzle_block_scales({1, 2, 3}, 2, 2), doctest::Contains("scales.size()=3 is not rows=2 x cols=2"),
                       Error);
}

TEST_CASE("per-tensor FP8 with a scale, and dynamic per-row FP8 and int8") {
  const std::vector<double> v = {1.0, -2.0, 0.5, std::numeric_limits<double>::quiet_NaN(), 0.0, 0.0, 0.0, 0.0};
  const TensorQuantized t = quantize_fp8_per_tensor(v, 100.0, MiniFloat::kE4M3);
  CHECK(t.amax == 2.0);  // NaN ignored
  CHECK(t.codes[0] == encode_satfinite(MiniFloat::kE4M3, 100.0));
  CHECK(t.codes[1] == encode_satfinite(MiniFloat::kE4M3, -200.0));
  CHECK(t.codes[3] == 0x7F);

  const RowQuantized i8 = quantize_int8_per_row(v, 2, 4);
  CHECK(i8.scales[0] == static_cast<float>(2.0 / 127));
  CHECK(i8.scales[1] == 1.0f);  // an all-zero row
  CHECK(static_cast<int8_t>(i8.codes[0]) == static_cast<int8_t>(std::nearbyint(1.0 / double(i8.scales[0]))));
  CHECK(static_cast<int8_t>(i8.codes[1]) == -127);
  CHECK(static_cast<int8_t>(i8.codes[3]) == 0);  // NaN
  const RowQuantized f8 = quantize_fp8_per_row(v, 2, 4, MiniFloat::kE4M3);
  CHECK(f8.scales[0] == static_cast<float>(2.0 / 448));
  CHECK(f8.codes[1] == 0xFE);  // -2 / scale = -448 (within the fp32 scale's rounding)

  CHECK_THROWS_WITH_AS(quantize_int8_per_row(v, 3, 4), doctest::Contains("values.size()=8 is not rows=3 x n=4"), Error);
  CHECK_THROWS_WITH_AS(quantize_fp8_per_tensor(v, 1.0, MiniFloat::kE2M1), doctest::Contains("e2m1 is not an FP8 format"),
                       Error);
}

TEST_CASE("fp8_element names each FP8 epilogue's element format and refuses the others") {
  using normjit::Epilogue;
  CHECK(normjit::reference::fp8_element(Epilogue::kFp8E4M3) == normjit::reference::MiniFloat::kE4M3);
  CHECK(normjit::reference::fp8_element(Epilogue::kFp8E4M3Row) == normjit::reference::MiniFloat::kE4M3);
  CHECK(normjit::reference::fp8_element(Epilogue::kMxfp8E4M3) == normjit::reference::MiniFloat::kE4M3);
  CHECK(normjit::reference::fp8_element(Epilogue::kFp8E5M2) == normjit::reference::MiniFloat::kE5M2);
  CHECK(normjit::reference::fp8_element(Epilogue::kFp8E5M2Row) == normjit::reference::MiniFloat::kE5M2);
  CHECK(normjit::reference::fp8_element(Epilogue::kMxfp8E5M2) == normjit::reference::MiniFloat::kE5M2);
  CHECK_THROWS_WITH_AS(normjit::reference::fp8_element(Epilogue::kInt8Row),
                       doctest::Contains("epilogue int8_row has no FP8 element format"), normjit::Error);
}
