// Kernel parameters, shared by host and device code. Plain types only: NVRTC compiles this
// without any system header, and the host passes the same struct by value to cuLaunchKernel.
// One struct serves every kernel of a spec; each kernel reads the fields its phase uses.
#pragma once

namespace normjit {

struct NormParams {
  const void* x;        // [rows, row_stride] x dtype; columns [0, N) are read
  const void* gamma;    // [N] weight dtype; AdaLayerNorm: [groups, N], one row per batch
  const void* beta;     // like gamma; null when the spec has no bias (backward: only gelu reads it)
  void* y;              // forward: [rows, row_stride] x dtype
  float* mean;          // [rows] f32; forward LayerNorm training writes it, backward reads it
  float* rstd;          // [rows] f32; forward training writes it, backward reads it
  const void* dy;       // backward: [rows, row_stride] x dtype
  void* dx;             // backward: [rows, row_stride] x dtype
  unsigned char* mask;  // relu_bitmask: [rows, ceil(N/8)] uint8; forward writes, backward reads
  float* workspace;     // backward: fp32 partials of dgamma/dbeta and per-row sums
  void* dgamma;         // backward: [groups, N] weight dtype
  void* dbeta;          // backward: [groups, N] weight dtype; null without bias
  long long rows;            // number of rows
  long long row_stride;      // elements between consecutive rows of x, y, dy and dx
  long long rows_per_group;  // AdaLayerNorm: rows per batch (S); otherwise rows
  long long mask_stride;     // relu_bitmask: bytes per mask row, ceil(N / 8)
  int partial_slots;         // backward: dgamma/dbeta partial rows per group in the workspace
  int row_chunk;             // backward gmem path: rows per column-tile CTA
  float eps;                 // added to the variance (LayerNorm) or mean square (RMSNorm)
  float clip_lower;          // relu_bitmask: lower clip
  float clip_upper;          // relu_bitmask: upper clip
  // Residual add (last, so the other fields keep their offsets in kernels without it).
  // The stream's dtype is x's, or f32 for .residual_f32.
  const void* residual;  // forward: [rows, row_stride] stream dtype, added to x
  void* h;               // forward: [rows, row_stride] stream dtype, x + residual (the normalized input)
  const void* dh_out;    // backward: [rows, row_stride] stream dtype, the gradient arriving on h, added to dx
  // Quantizing epilogues (fp8_*), last for the same reason.
  unsigned char* y_quant;    // forward: [rows, row_stride] FP8 codes of y * quant_scale
  const float* quant_scale;  // the scale y is multiplied by before rounding (one float)
  float* amax;               // optional: max |y| over the launch is folded in (atomicMax); null: none
  // Per-row quantizing epilogues (*_row), last for the same reason.
  float* row_scales;  // forward: [rows] f32, each row's scale amax / qmax (its codes are y / scale)
  // Block-scaled epilogues (mxfp8_*), last for the same reason.
  unsigned char* block_scales;   // forward: [rows, block_scale_stride] E8M0 codes, one per 32 values
  long long block_scale_stride;  // ceil(N / 32)
  // Block scales' layout (block_scale_layout.h: 0 row-major, 1 swizzled 128x4), last for the same
  // reason. mxfp4 / nvfp4 take block_scales too (NVFP4: e4m3 codes, one per 16 values;
  // block_scale_stride ceil(N / 16)) and write y_quant at half a byte an element: row r's codes
  // at y_quant + r * row_stride / 2.
  int block_scale_layout;
  // Residual add's extras, last for the same reason.
  const void* bias_in;  // forward .bias_in: [N] weight dtype, added with the residual
  void* dresidual;      // backward .residual_f32: [rows, row_stride] f32, dx unrounded (dresidual)
  // Generic kernels (norm_generic.cuh), last for the same reason: the row's length and the spec's
  // boolean fields (GenericFlag), which the specialized kernels have compiled in.
  int n;
  int generic_flags;
  int generic_stage_packs;  // backward, kGenericStaged: packs of x and dy staged in shared memory
  int generic_segment_packs;  // backward _cluster kernels: packs of the row each CTA takes (a multiple of 32)
};

}  // namespace normjit
