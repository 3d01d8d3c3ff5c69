#pragma once
// Host-side fp64 reference of the forward norms and dtype conversions, for tests, the bench and
// users who want to check a kernel.
#include <cmath>
#include <cstdint>
#include <vector>

#include "normjit/spec.hpp"

namespace normjit::reference {

// Bit patterns <-> float for the storage dtypes (round to nearest even).
uint16_t float_to_bf16(float v);
float bf16_to_float(uint16_t v);
uint16_t float_to_f16(float v);
float f16_to_float(uint16_t v);
// Reads element i of a buffer of dtype d as float / writes float v into it.
float load(const void* data, DType d, int64_t i);
void store(void* data, DType d, int64_t i, float v);

struct ForwardRef {
  std::vector<double> y;     // [rows, n], after the epilogue
  std::vector<double> mean;  // [rows] (LayerNorm, AdaLayerNorm)
  std::vector<double> rstd;  // [rows]
};
// x: [rows, row_stride] of row_dtype(spec) (x's dtype, f32 for .residual_f32); gamma, beta: [n] of
// spec.w_dtype, or [rows / rows_per_batch, n] for AdaLayerNorm (beta may be null). zero_centered
// specs scale by 1 + gamma. For a residual spec, pass h (x (+ bias_in) + residual, rounded to the
// stream's dtype) as x, and add dh_out to dx. dy is of spec.x_dtype.
ForwardRef forward(const Spec& spec, const void* x, const void* gamma, const void* beta, int64_t rows,
                   int64_t row_stride, double eps, int64_t rows_per_batch = 0, double clip_lower = 0,
                   double clip_upper = INFINITY);

struct BackwardRef {
  std::vector<double> dx;      // [rows, n]
  std::vector<double> dgamma;  // [groups, n]
  std::vector<double> dbeta;   // [groups, n] (zeros without bias)
};
// Uses the saved f32 mean and rstd, as the kernels do. mask: the forward's relu_bitmask output,
// [rows, ceil(n/8)]. beta is read only by the gelu epilogue's backward.
BackwardRef backward(const Spec& spec, const void* dy, const void* x, const void* gamma, const void* beta,
                     const float* mean, const float* rstd, const uint8_t* mask, int64_t rows, int64_t row_stride,
                     int64_t rows_per_batch = 0);

// The memory_efficient backward's math: x̂ = (y - beta) / gamma' from the forward's stored y
// (epilogue none), then the same gradients. Against backward() it shows only what y's rounding costs.
BackwardRef backward_from_y(const Spec& spec, const void* dy, const void* y, const void* gamma, const void* beta,
                            const float* rstd, int64_t rows, int64_t row_stride, int64_t rows_per_batch = 0);

double gelu(double u);
double gelu_grad(double u);

// Tolerance |got - ref| <= atol + rtol * |ref| for outputs stored in dtype d: y and dx in the x
// dtype, dgamma/dbeta in the weight dtype (with atol scaled by max |ref| of the tensor, since
// they are sums over rows). Statistics are f32 and use the f32 row.
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(DType d);
// Backward: the f32 row is 10x looser (dx subtracts two row means; dgamma sums over rows).
Tolerance backward_tolerance(DType d);

}  // namespace normjit::reference
