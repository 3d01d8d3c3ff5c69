// GELU (tanh approximation) after the norm. Backward needs the pre-activation, which the norm
// backward recomputes from x, mean, rstd, gamma and beta; nothing extra is saved.
#pragma once
#include "normjit/common.cuh"

namespace normjit {

struct EpilogueGelu {
  static constexpr bool kAlwaysStoresY = true;  // y is always an output
  static constexpr bool kNeedsPreActivation = true;
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubic = 0.044715f;

  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&v)[kVec], bool, const NormParams&, long long, int, int) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float u = v[j];
      v[j] = 0.5f * u * (1.f + tanhf(kSqrt2OverPi * (u + kCubic * u * u * u)));
    }
  }

  template <int kVec>
  static __device__ __forceinline__ void backward(float (&dy)[kVec], const float (&pre)[kVec], bool,
                                                  const NormParams&, long long, int) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float u = pre[j];
      const float t = tanhf(kSqrt2OverPi * (u + kCubic * u * u * u));
      const float dt = kSqrt2OverPi * (1.f + 3.f * kCubic * u * u) * (1.f - t * t);
      dy[j] *= 0.5f * (1.f + t) + 0.5f * u * dt;
    }
  }
};

}  // namespace normjit
