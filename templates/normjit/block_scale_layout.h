// Where a block scale goes in the block_scales buffer. Plain host/device code: the kernels, the
// runtime (block_scale_bytes) and the host tests compile the same function.
//   row-major (kBlockScaleRowMajor): scale (row, col) of the [rows, cols] scale matrix at
//     row * cols + col, cols = ceil(n / block).
//   swizzled (kBlockScaleSwizzled): the 1D block-scaling layout of cuBLASLt and CUTLASS
//     (Sm1xxBlockScaledConfig; TensorRT-LLM / FlashInfer get_sf_out_offset_128x4; cuDNN's "128x4
//     tiled" layout): the matrix padded to [roundup(rows, 128), roundup(cols, 4)] and cut into
//     tiles of 128 rows x 4 columns, 512 contiguous bytes each, tiles in row-major order (all of
//     a row band's tiles, then the next band's); inside a tile, (r, c) at byte
//     (r % 32) * 16 + (r / 32) * 4 + c. The padding is never written: the caller zero-fills it.
#pragma once

#if defined(__CUDACC_RTC__)
#include "normjit/host_device.h"
#else
#include "host_device.h"
#endif

namespace normjit {

constexpr int kBlockScaleRowMajor = 0;
constexpr int kBlockScaleSwizzled = 1;

// row, col >= 0; cols: scale columns of the unpadded matrix.
NORMJIT_HOST_DEVICE inline long long block_scale_offset(long long row, long long col, long long cols, int layout) {
  if (layout != kBlockScaleSwizzled) return row * cols + col;
  const long long col_tiles = (cols + 3) >> 2;
  const long long tile = (row >> 7) * col_tiles + (col >> 2);
  return (tile << 9) + ((row & 31) << 4) + (((row >> 5) & 3) << 2) + (col & 3);
}

}  // namespace normjit
