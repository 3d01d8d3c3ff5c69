// Sums and moments over an aligned group of lanes of one warp, by shuffles: no shared memory, no
// barrier. Every lane of the group takes part and gets the result.
#pragma once

namespace normjit {

// Lane `lane`'s value, in every lane of the warp.
__device__ __forceinline__ float shfl_lane(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane); }
__device__ __forceinline__ float2 shfl_lane(float2 v, int lane) {
  return make_float2(__shfl_sync(0xffffffffu, v.x, lane), __shfl_sync(0xffffffffu, v.y, lane));
}

// Sum over an aligned group of kWidth (power of two, <= 32) lanes.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Largest value over an aligned group of kWidth lanes (fmaxf: NaN only where every lane has one).
template <int kWidth>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Count, mean and sum of squared deviations of a set of values. merge() is Chan et al.'s
// pairwise update: no E[x^2] - E[x]^2 cancellation, so x = 1e4 + noise keeps its variance.
struct Moments {
  float count;
  float mean;
  float m2;
};

__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  const float count = a.count + b.count;
  if (count == 0.f) return a;
  const float delta = b.mean - a.mean;
  // Counts are exact small integers; the fast division keeps each merge a few instructions
  // instead of an inlined IEEE division.
  const float b_share = __fdividef(b.count, count);
  return {count, a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * a.count * b_share};
}

template <int kWidth>
__device__ __forceinline__ Moments group_merge(Moments m) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) {
    Moments other;
    other.count = __shfl_xor_sync(0xffffffffu, m.count, offset);
    other.mean = __shfl_xor_sync(0xffffffffu, m.mean, offset);
    other.m2 = __shfl_xor_sync(0xffffffffu, m.m2, offset);
    m = merge(m, other);
  }
  return m;
}

}  // namespace normjit
