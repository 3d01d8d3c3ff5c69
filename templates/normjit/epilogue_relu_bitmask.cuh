// Clamped ReLU with a bit-packed mask (cuDNN's LayerNorm + ReLU bitmask):
//   y = clamp(v, lower, upper); bit k of mask byte j is set when lower < y < upper for
//   feature 8j + k. Backward: dy * bit.
#pragma once
#include "normjit/common.cuh"

namespace normjit {

struct EpilogueReluBitmask {
  static constexpr bool kAlwaysStoresY = true;  // y is always an output
  static constexpr bool kNeedsPreActivation = false;

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool valid, const NormParams& p, long long row,
                                                 int col, int lane) {
    unsigned bits = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      v[j] = fminf(fmaxf(v[j], p.clip_lower), p.clip_upper);
      // Decided on the value as stored (YT), so the mask agrees with y bit for bit.
      const float stored = to_float(Convert<YT>::from(v[j]));
      if (valid && p.clip_lower < stored && stored < p.clip_upper) bits |= 1u << j;
    }
    // A byte covers 8 features: kVec < 8 means 8 / kVec neighbouring lanes (fewer when the
    // whole row is narrower) each hold part of it; they OR their bits into the first lane.
    constexpr int kLanesPerByte = kVec >= 8 ? 1 : (8 / kVec < kThreadsPerRow ? 8 / kVec : kThreadsPerRow);
    const int slot = lane % kLanesPerByte;
    bits <<= slot * kVec;
#pragma unroll
    for (int offset = 1; offset < kLanesPerByte; offset <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, offset);
    // Bits past N stay 0: invalid lanes contribute none.
    if (valid && slot == 0) p.mask[row * p.mask_stride + col / 8] = static_cast<unsigned char>(bits);
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&dy)[kVec], const float (&)[kVec], bool valid,
                                                  const NormParams& p, long long row, int col) {
    if (!valid) return;
    static_assert(kVec <= 8, "a pack spans at most one mask byte");
    const unsigned bits = p.mask[row * p.mask_stride + col / 8];
    const int shift = col % 8;  // 0 when kVec == 8
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (!((bits >> (shift + j)) & 1u)) dy[j] = 0.f;
  }
};

}  // namespace normjit
