// Kernel parameters, shared by host and device code. Plain types only: NVRTC compiles this
// without any system header, and the host passes the same struct by value to cuLaunchKernel.
#pragma once

namespace normjit {

struct FwdParams {
  const void* x;         // [rows, row_stride] x dtype; columns [0, N) are read
  const void* gamma;     // [N] weight dtype
  const void* beta;      // [N] weight dtype; null when the spec has no bias
  void* y;               // [rows, row_stride] x dtype; columns [0, N) are written
  float* mean;           // [rows] f32; LayerNorm training only, else null
  float* rstd;           // [rows] f32; training only, else null
  long long rows;        // number of rows
  long long row_stride;  // elements between consecutive rows of x and of y
  float eps;             // added to the variance (LayerNorm) or mean square (RMSNorm)
};

}  // namespace normjit
