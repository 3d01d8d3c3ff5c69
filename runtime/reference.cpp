#include "normjit/reference.hpp"

#include <cmath>
#include <cstring>

namespace normjit::reference {

uint16_t float_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_float(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_f16(float v) {
  const _Float16 h = static_cast<_Float16>(v);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float f16_to_float(uint16_t v) {
  _Float16 h;
  std::memcpy(&h, &v, 2);
  return static_cast<float>(h);
}

float load(const void* data, DType d, int64_t i) {
  switch (d) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return f16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.f;
}

void store(void* data, DType d, int64_t i, float v) {
  switch (d) {
    case DType::kF32: static_cast<float*>(data)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = float_to_f16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = float_to_bf16(v); break;
  }
}

ForwardRef forward(const Spec& s, const void* x, const void* gamma, const void* beta, int64_t rows,
                   int64_t row_stride, double eps) {
  ForwardRef r;
  r.y.resize(rows * s.n);
  r.mean.resize(rows);
  r.rstd.resize(rows);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t base = row * row_stride;
    double mean = 0, var = 0;
    if (s.norm == Norm::kLayerNorm) {
      for (int64_t i = 0; i < s.n; ++i) mean += load(x, s.x_dtype, base + i);
      mean /= s.n;
      for (int64_t i = 0; i < s.n; ++i) {
        const double d = load(x, s.x_dtype, base + i) - mean;
        var += d * d;
      }
    } else {
      for (int64_t i = 0; i < s.n; ++i) {
        const double v = load(x, s.x_dtype, base + i);
        var += v * v;
      }
    }
    var /= s.n;
    const double rstd = 1.0 / std::sqrt(var + eps);
    r.mean[row] = mean;
    r.rstd[row] = rstd;
    for (int64_t i = 0; i < s.n; ++i) {
      double y = (load(x, s.x_dtype, base + i) - mean) * rstd * load(gamma, s.w_dtype, i);
      if (beta) y += load(beta, s.w_dtype, i);
      r.y[row * s.n + i] = y;
    }
  }
  return r;
}

Tolerance tolerance(DType d) {
  // About four times the output's rounding (half an ulp relative: f32 6e-8, f16 4.9e-4,
  // bf16 3.9e-3) plus fp32-accumulation slack; measured errors sit well inside.
  switch (d) {
    case DType::kF32: return {1e-5, 1e-5};
    case DType::kF16: return {2e-3, 2e-3};
    case DType::kBF16: return {1.6e-2, 1.6e-2};
  }
  return {0, 0};
}

}  // namespace normjit::reference
