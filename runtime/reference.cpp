#include "normjit/reference.hpp"

#include <algorithm>
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

double gelu(double u) { return 0.5 * u * (1.0 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u))); }

double gelu_grad(double u) {
  const double t = std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u));
  const double dt = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * u * u) * (1.0 - t * t);
  return 0.5 * (1.0 + t) + 0.5 * u * dt;
}

namespace {
int64_t weight_row(const Spec& s, int64_t row, int64_t rows_per_batch) {
  return is_adaptive(s.norm) ? row / rows_per_batch : 0;
}
}  // namespace

ForwardRef forward(const Spec& s, const void* x, const void* gamma, const void* beta, int64_t rows,
                   int64_t row_stride, double eps, int64_t rows_per_batch, double clip_lower, double clip_upper) {
  ForwardRef r;
  r.y.resize(rows * s.n);
  r.mean.resize(rows);
  r.rstd.resize(rows);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t base = row * row_stride;
    const int64_t w = weight_row(s, row, rows_per_batch) * s.n;
    double mean = 0, var = 0;
    if (subtracts_mean(s.norm)) {
      for (int64_t i = 0; i < s.n; ++i) mean += load(x, row_dtype(s), base + i);
      mean /= s.n;
    }
    for (int64_t i = 0; i < s.n; ++i) {
      const double d = load(x, row_dtype(s), base + i) - mean;
      var += d * d;
    }
    var /= s.n;
    const double rstd = 1.0 / std::sqrt(var + eps);
    r.mean[row] = mean;
    r.rstd[row] = rstd;
    for (int64_t i = 0; i < s.n; ++i) {
      const double scale = load(gamma, s.w_dtype, w + i) + (s.zero_centered ? 1 : 0);
      double y = (load(x, row_dtype(s), base + i) - mean) * rstd * scale;
      if (beta) y += load(beta, s.w_dtype, w + i);
      if (s.epilogue == Epilogue::kReluBitmask) y = std::min(std::max(y, clip_lower), clip_upper);
      if (s.epilogue == Epilogue::kGelu) y = gelu(y);
      r.y[row * s.n + i] = y;
    }
  }
  return r;
}

namespace {
// The backward of `rows` rows, x̂ of (row, column) from `xhat_of`.
template <class XhatOf>
BackwardRef backward_rows(const Spec& s, const void* dy, const void* gamma, const void* beta, const uint8_t* mask,
                          int64_t rows, int64_t row_stride, int64_t rows_per_batch, const float* rstd,
                          XhatOf xhat_of) {
  const int64_t groups = is_adaptive(s.norm) ? rows / rows_per_batch : 1;
  const int64_t mask_stride = (s.n + 7) / 8;
  BackwardRef r;
  r.dx.resize(rows * s.n);
  r.dgamma.assign(groups * s.n, 0.0);
  r.dbeta.assign(groups * s.n, 0.0);
  std::vector<double> xhat(s.n), gd(s.n);
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t base = row * row_stride;
    const int64_t g_row = weight_row(s, row, rows_per_batch);
    const int64_t w = g_row * s.n;
    const double rs = rstd[row];
    double c1 = 0, c2 = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      xhat[i] = xhat_of(row, base + i, w + i);
      const double g = load(gamma, s.w_dtype, w + i) + (s.zero_centered ? 1 : 0);
      double d = load(dy, s.x_dtype, base + i);
      if (s.epilogue == Epilogue::kReluBitmask && !((mask[row * mask_stride + i / 8] >> (i % 8)) & 1)) d = 0;
      if (s.epilogue == Epilogue::kGelu) d *= gelu_grad(xhat[i] * g + (beta ? load(beta, s.w_dtype, w + i) : 0.0));
      r.dgamma[w + i] += d * xhat[i];
      r.dbeta[w + i] += d;
      gd[i] = g * d;
      c1 += gd[i];
      c2 += gd[i] * xhat[i];
    }
    c1 = subtracts_mean(s.norm) ? c1 / s.n : 0.0;
    c2 /= s.n;
    for (int64_t i = 0; i < s.n; ++i) r.dx[row * s.n + i] = rs * (gd[i] - c1 - xhat[i] * c2);
  }
  if (!s.has_bias) std::fill(r.dbeta.begin(), r.dbeta.end(), 0.0);
  return r;
}
}  // namespace

BackwardRef backward(const Spec& s, const void* dy, const void* x, const void* gamma, const void* beta,
                     const float* mean, const float* rstd, const uint8_t* mask, int64_t rows, int64_t row_stride,
                     int64_t rows_per_batch) {
  return backward_rows(s, dy, gamma, beta, mask, rows, row_stride, rows_per_batch, rstd,
                       [&](int64_t row, int64_t at, int64_t) {
                         const double mu = subtracts_mean(s.norm) ? mean[row] : 0.0;
                         return (load(x, row_dtype(s), at) - mu) * rstd[row];
                       });
}

BackwardRef backward_from_y(const Spec& s, const void* dy, const void* y, const void* gamma, const void* beta,
                            const float* rstd, int64_t rows, int64_t row_stride, int64_t rows_per_batch) {
  return backward_rows(s, dy, gamma, beta, nullptr, rows, row_stride, rows_per_batch, rstd,
                       [&](int64_t, int64_t at, int64_t w) {
                         const double g = load(gamma, s.w_dtype, w) + (s.zero_centered ? 1 : 0);
                         const double b = beta ? load(beta, s.w_dtype, w) : 0.0;
                         return (load(y, s.x_dtype, at) - b) / g;
                       });
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

Tolerance backward_tolerance(DType d) {
  return d == DType::kF32 ? Tolerance{1e-4, 1e-4} : tolerance(d);
}

}  // namespace normjit::reference
