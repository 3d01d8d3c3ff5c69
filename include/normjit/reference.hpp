#pragma once
// Host-side fp64 reference of the forward norms and dtype conversions, for tests, the bench and
// users who want to check a kernel.
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
  std::vector<double> y;     // [rows, n]
  std::vector<double> mean;  // [rows] (LayerNorm)
  std::vector<double> rstd;  // [rows]
};
// x: [rows, row_stride] of spec.x_dtype; gamma, beta: [n] of spec.w_dtype (beta may be null).
ForwardRef forward(const Spec& spec, const void* x, const void* gamma, const void* beta, int64_t rows,
                   int64_t row_stride, double eps);

// Tolerance |got - ref| <= atol + rtol * |ref| for outputs stored in dtype d (y); statistics are
// f32 and use the f32 row.
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance(DType d);

}  // namespace normjit::reference
