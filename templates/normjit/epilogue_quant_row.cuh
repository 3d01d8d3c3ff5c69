// Dynamic per-row quantization (vLLM's per-token FP8 / int8): each row's largest |y| gives its
// scale, scale = amax / qmax (1 for a row of zeros), stored as fp32 in p.row_scales[row]; the codes
// of y / scale go to p.y_quant (round to nearest even; FP8 saturates to the largest finite value
// and keeps NaN, int8 clamps to [-128, 127] and gives 0 for NaN). qmax: 448 (e4m3), 57344 (e5m2),
// 127 (int8). y in x's dtype is stored too only where p.y is set. Forward only; the row's amax
// comes from the kernel's measuring pass (kRowScaled), reduced over the row's CTAs where a cluster
// shares it (cluster_max).
#pragma once
#include "normjit/quant_common.cuh"

namespace normjit {

enum class RowQuantFormat { kE4M3, kE5M2, kInt8 };

template <RowQuantFormat kFormat>
struct EpilogueRowQuant {
  static constexpr bool kAlwaysStoresY = false;
  static constexpr bool kNeedsPreActivation = false;
  static constexpr bool kRowScaled = true;
  static constexpr bool kLaneLocal = true;  // ignores invalid packs, no shuffles
  static constexpr float kQMax = kFormat == RowQuantFormat::kE4M3   ? 448.f
                                 : kFormat == RowQuantFormat::kE5M2 ? 57344.f
                                                                    : 127.f;

  // The row's scale and its reciprocal: IEEE division and reciprocal (no fast math), so the host
  // reference gets the same scale. The writing pass forms them once ahead of its packs (kAhead),
  // except over held y (there, in the packs, as the compiler places them). Left to the compiler
  // they came after the first pack's normalization, which then waited in registers across their
  // slow-path calls; the empty asm keeps the reciprocal from sinking there (without it RMSNorm
  // register rows at 448 threads that normalize again took 49 registers, not 40).
  struct RowScale {
    float scale, inv;
  };
  template <bool kAhead>
  static __device__ __forceinline__ RowScale row_arg(float row_amax) {
    const float scale = row_amax > 0.f ? row_amax / kQMax : 1.f;
    const float inv = 1.f / scale;
    if constexpr (kAhead) asm volatile("" ::"f"(inv));
    return {scale, inv};
  }

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int, const RowScale& s) {
    const float scale = s.scale, inv = s.inv;
    if (!valid) return;
    if (col == 0) p.row_scales[row] = scale;
    unsigned char* const dst = p.y_quant + row * p.row_stride + col;
    if constexpr (kFormat == RowQuantFormat::kInt8)
      store_codes<kVec>(dst, to_int8<kVec>(v, inv));
    else
      store_codes<kVec>(dst, to_fp8<kFormat == RowQuantFormat::kE5M2, kVec>(v, inv));
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
