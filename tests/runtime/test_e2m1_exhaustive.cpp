// The kernels' software e2m1 encoder and MXFP4 scale helpers (templates/normjit/e2m1.h, the code
// that EpilogueFp4 runs, compiled here for the host) against the references of
// runtime/quant_reference.cpp, bit for bit:
// - e2m1_code: every fp32 bit pattern whose magnitude lies in [2^-3, 16) (both signs, all 2^23
//   mantissas of each binade: every code boundary and tie), every subnormal and NaN payload class,
//   and 4096 mantissas of every other binade; NORMJIT_E2M1_EXHAUSTIVE=1 takes all 2^32 patterns
//   (about two and a half minutes on two cores).
// - the MXFP4 scale (e2m1_mx_scale_code) for every subnormal and 1024 mantissas of every binade
//   (all 2^31 non-negative floats with the variable set), and its inverse for every code;
// - the packed words (e2m1_pack: eight codes a word, the first value in the low nibble) against the
//   per-value codes, with MX powers of two and NVFP4's fp32 multipliers;
// - a host copy of EpilogueFp4's MXFP4 steps against reference::quantize_mx and pack_e2m1.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "normjit/quant_reference.hpp"
#include "templates/normjit/e2m1.h"

using namespace normjit;
using namespace normjit::reference;

namespace {

float float_of(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

bool exhaustive() {
  const char* e = std::getenv("NORMJIT_E2M1_EXHAUSTIVE");
  return e && *e && std::strcmp(e, "0") != 0;
}

// Runs check(u) for u in [begin, end) (64-bit bounds) on every core; returns the mismatch count
// and the first mismatching pattern.
template <class Check>
uint64_t sweep(uint64_t begin, uint64_t end, Check check, uint32_t* first_bad) {
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::atomic<uint64_t> bad{0};
  std::atomic<uint64_t> first{UINT64_MAX};
  std::vector<std::thread> pool;
  const uint64_t chunk = (end - begin + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const uint64_t lo = begin + t * chunk, hi = std::min(end, lo + chunk);
      uint64_t local = 0;
      for (uint64_t u = lo; u < hi; ++u)
        if (!check(static_cast<uint32_t>(u))) {
          if (local++ == 0) {
            uint64_t f = first.load();
            while (u < f && !first.compare_exchange_weak(f, u)) {
            }
          }
        }
      bad += local;
    });
  for (auto& th : pool) th.join();
  if (first_bad) *first_bad = static_cast<uint32_t>(first.load());
  return bad;
}

bool code_matches(uint32_t u) {
  const float x = float_of(u);
  return e2m1_code(x) == encode_satfinite(MiniFloat::kE2M1, static_cast<double>(x));
}

// The e2m1 code of fp32(v * m), the value EpilogueFp4 encodes (NVFP4: m = S_enc / s).
unsigned want_code(float v, float m) { return encode_satfinite(MiniFloat::kE2M1, static_cast<double>(v * m)); }

}  // namespace

TEST_CASE("e2m1_code (e2m1.h) equals encode_satfinite at every code boundary, tie and special value") {
  uint32_t first = 0;
  if (exhaustive()) {
    const uint64_t bad = sweep(0, uint64_t{1} << 32, code_matches, &first);
    CAPTURE(first);
    CHECK(bad == 0);
    return;
  }
  // Binades 2^-3 .. 2^3 (biased exponents 124-130): every code boundary (0.25 ... 5, and 6 where
  // saturation starts) with all its neighbours, both signs.
  for (uint32_t sign : {0u, 0x80000000u}) {
    const uint64_t bad = sweep(sign | (124u << 23), sign | (131u << 23), code_matches, &first);
    CAPTURE(sign);
    CAPTURE(first);
    CHECK(bad == 0);
  }
  // Every subnormal and zero, every NaN payload's top bits and both infinities, both signs.
  for (uint32_t sign : {0u, 0x80000000u}) {
    CHECK(sweep(sign, sign | 0x00800000u, code_matches, &first) == 0);
    CHECK(sweep(0, 1u << 12, [&](uint32_t k) { return code_matches(sign | 0x7F800000u | (k << 11) | (k & 0x7FF)); },
                &first) == 0);
    CHECK(code_matches(sign | 0x7F800000u));
    CHECK(code_matches(sign | 0x7F800001u));
    CHECK(code_matches(sign | 0x7FFFFFFFu));
  }
  // 4096 mantissas of every other binade (the codes are 0 or 7 there, signed).
  int64_t other = 0;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 1; e < 255; ++e) {
      if (e >= 124 && e <= 130) continue;
      for (uint32_t k = 0; k < 4096; ++k) {
        const uint32_t mantissa = (k * 2047u + (k >> 3)) & 0x7FFFFFu;
        other += !code_matches(sign | (e << 23) | mantissa);
      }
      other += !code_matches(sign | (e << 23) | 0x7FFFFFu);
    }
  CHECK(other == 0);
  // Known codes, packed two a byte.
  CHECK(e2m1_code(-0.f) == 0x8);
  CHECK(e2m1_code(std::numeric_limits<float>::quiet_NaN()) == 0x0);
  CHECK(e2m1_code(-std::numeric_limits<float>::quiet_NaN()) == 0x0);
  CHECK(e2m1x2(0.5f, -6.f) == 0xF1);
}

TEST_CASE("the MXFP4 scale from the amax bits equals reference::mx_scale_code, its inverse is exact") {
  auto matches = [](uint32_t u) {
    const float amax = float_of(u);
    return e2m1_mx_scale_code(amax) == mx_scale_code(static_cast<double>(amax), MiniFloat::kE2M1);
  };
  uint32_t first = 0;
  if (exhaustive()) {
    CHECK(sweep(0, 0x7F800001u, matches, &first) == 0);  // every non-negative float, infinity
  } else {
    CHECK(sweep(0, 0x00800000u, matches, &first) == 0);  // zero and every subnormal
    int64_t bad = 0;
    for (uint32_t e = 1; e < 255; ++e)
      for (uint32_t k = 0; k < 1024; ++k) bad += !matches((e << 23) | ((k * 8191u) & 0x7FFFFFu));
    bad += !matches(0x7F800000u);  // infinity: code 254
    CHECK(bad == 0);
  }
  CAPTURE(first);
  CHECK(e2m1_mx_scale_code(std::numeric_limits<float>::infinity()) == 254);
  CHECK(e2m1_mx_scale_code(0.f) == 0);
  CHECK(e2m1_mx_scale_code(6.f) == 127);  // 2^(2 - 2)
  // The half inverse of every code the scale can take (0-252, 254; 253 needs a finite amax of
  // 2^128): 2^(126 - code), exactly.
  for (unsigned code = 0; code <= 254; ++code) {
    if (code == 253) continue;
    CAPTURE(code);
    CHECK(static_cast<double>(e2m1_mx_half_inverse_scale(code)) == 0.5 / decode_e8m0(static_cast<uint8_t>(code)));
  }
}

TEST_CASE("the MXFP8 scales from the amax bits equal reference::mx_scale_code, their inverses are exact") {
  auto check_format = [](MiniFloat element, auto scale_code) {
    auto matches = [&](uint32_t u) {
      const float amax = float_of(u);
      return scale_code(amax) == mx_scale_code(static_cast<double>(amax), element);
    };
    uint32_t first = 0;
    CHECK(sweep(0, 0x00800000u, matches, &first) == 0);  // zero and every subnormal
    CAPTURE(first);
    int64_t bad = 0;
    for (uint32_t e = 1; e < 255; ++e)
      for (uint32_t k = 0; k < 1024; ++k) bad += !matches((e << 23) | ((k * 8191u) & 0x7FFFFFu));
    bad += !matches(0x7F800000u);  // infinity: code 254
    CHECK(bad == 0);
  };
  check_format(MiniFloat::kE4M3, [](float a) { return mx_scale_code<8>(a); });
  check_format(MiniFloat::kE5M2, [](float a) { return mx_scale_code<15>(a); });
  CHECK(mx_scale_code<8>(448.f) == 127);  // 2^(8 - 8)
  CHECK(mx_scale_code<15>(57344.f) == 127);
  // Every code the MXFP8 scales take: 0-246 (finite amax), 254 (infinity).
  for (unsigned code = 0; code <= 254; ++code) {
    if (code > 246 && code != 254) continue;
    CAPTURE(code);
    CHECK(static_cast<double>(mx_inverse_scale(code)) == 1.0 / decode_e8m0(static_cast<uint8_t>(code)));
  }
}

TEST_CASE("e2m1_pack: eight codes a word, the first value in the low nibble, as the per-value codes") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<uint32_t> bits;
  const float specials[] = {0.f,
                            -0.f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::max(),
                            0.25f,
                            -2.5f,
                            5.f,
                            1.75f};
  auto value = [&](int i) -> float {
    switch (i % 4) {
      case 0: return specials[bits(rng) % (sizeof(specials) / sizeof(specials[0]))];
      case 1: return float_of(bits(rng));  // any bit pattern
      default: return normal(rng) * 4.f;
    }
  };
  int64_t bad = 0, checked = 0;
  for (int round = 0; round < 20000; ++round) {
    float v[8];
    for (int j = 0; j < 8; ++j) v[j] = value(round * 8 + j);
    // MX: a power of two (1 / X for a random E8M0 code); NVFP4: a random fp32 multiplier >= 2^-125.
    const bool mx = round % 2 == 0;
    const unsigned e8m0 = bits(rng) % 253;
    const float m = mx ? static_cast<float>(1.0 / decode_e8m0(static_cast<uint8_t>(e8m0)))
                       : std::ldexp(1.f + static_cast<float>(bits(rng) % 8388608) / 8388608.f,
                                    static_cast<int>(bits(rng) % 240) - 120);
    const float half = mx ? e2m1_mx_half_inverse_scale(e8m0) : m * 0.5f;
    REQUIRE(static_cast<double>(half) * 2 == static_cast<double>(m));
    const unsigned words[4] = {e2m1_pack<8>(v, half), e2m1_pack<4>(v, half), e2m1_pack<2>(v, half),
                               e2m1_pack<1>(v, half)};
    const int counts[4] = {8, 4, 2, 1};
    for (int w = 0; w < 4; ++w)
      for (int j = 0; j < 8; ++j) {
        const unsigned got = j < counts[w] ? (words[w] >> (4 * j)) & 0xF : words[w] >> (4 * j);
        // NaN products (0 * infinity) are NaN codes +0 in the kernel; the reference of NaN is +0 too.
        const unsigned want = j < counts[w] ? want_code(v[j], m) : 0u;
        ++checked;
        if (got != want && bad++ < 5) MESSAGE("v " << v[j] << " x " << m << ": code " << got << ", want " << want);
      }
  }
  CHECK(checked > 0);
  CHECK(bad == 0);
  // NVFP4's multiplier below 2^-125, where halving it rounds: fp32(v * m) / 2, two products.
  const float tiny = std::ldexp(1.f + 3.f / 8388608.f, -127);  // odd last bit: its half rounds
  for (float v : {std::ldexp(1.5f, 125), std::ldexp(-1.25f, 126), std::ldexp(1.75f, 127)}) {
    const float h = v * tiny * 0.5f;
    CHECK(e2m1_pack_of<1>([&](int) { return h; }) == want_code(v, tiny));
  }
}

TEST_CASE("EpilogueFp4's MXFP4 steps, run on the host, give reference::quantize_mx's scales and codes") {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  const int64_t rows = 64, n = 512;
  std::vector<float> y(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    // Rows at scales from 2^-140 (subnormal) to 2^120, some blocks with an infinity, NaN or zeros.
    const float scale = std::ldexp(1.f, static_cast<int>(r * 4) - 140);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = normal(rng) * scale;
    if (r % 5 == 1) y[r * n + 37] = std::numeric_limits<float>::infinity();
    if (r % 7 == 2) y[r * n + 70] = std::numeric_limits<float>::quiet_NaN();
    if (r % 3 == 0)
      for (int64_t i = 128; i < 160; ++i) y[r * n + i] = uniform(rng) < 0.5f ? 0.f : -0.f;
  }
  std::vector<double> values(y.begin(), y.end());
  const BlockQuantized want = quantize_mx(values, rows, n, MiniFloat::kE2M1);
  const std::vector<uint8_t> want_bytes = pack_e2m1(want.codes);
  std::vector<uint8_t> scales, bytes;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < n / 32; ++b) {
      const float* v = &y[r * n + b * 32];
      float amax = 0.f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));  // fmaxf leaves NaN out
      const unsigned code = e2m1_mx_scale_code(amax);
      scales.push_back(static_cast<uint8_t>(code));
      const float half = e2m1_mx_half_inverse_scale(code);
      for (int w = 0; w < 4; ++w) {
        const unsigned word = e2m1_pack<8>(v + 8 * w, half);
        for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<uint8_t>(word >> (8 * k)));
      }
    }
  CHECK(scales == want.scales);
  CHECK(bytes == want_bytes);
}
