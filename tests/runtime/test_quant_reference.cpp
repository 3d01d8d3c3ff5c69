// The quantized formats' references against their definitions: every code decoded from the bit
// layout, encode checked against a brute-force nearest-code search (ties to the even code) over
// every midpoint and random values, saturation and NaN, and the block, tensor and row scalings.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "normjit/error.hpp"
#include "normjit/quant_reference.hpp"

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
  CHECK(q.tensor_scale == static_cast<float>(9.5 / (448.0 * 6.0)));
  REQUIRE(q.scales.size() == static_cast<size_t>(rows * 3));
  CHECK(q.scales[1] == 0x7E);               // the amax block's scale: 448
  CHECK(q.codes[17] == 0xF);                // -6 in e2m1
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double x = decode(MiniFloat::kE4M3, q.scales[r * 3 + i / 16]) * q.tensor_scale;
      CHECK(q.codes[r * n + i] == brute_force(MiniFloat::kE2M1, v[r * n + i] / x));
    }
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
