#pragma once
// Device source of fill kernels that draw uniform values from a counter hash (fresh per seed):
// normjit-bench's inputs and the tuner's scratch buffers. Compiled with compile() like a norm kernel.
namespace normjit::detail {

inline constexpr const char* kFillSource = R"(
#include "normjit/common.cuh"
// Uniform values in [offset - scale, offset + scale) from a counter hash: fresh per seed.
__device__ __forceinline__ float uniform(unsigned long long i, unsigned seed) {
  unsigned long long z = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
template <class T>
__device__ void fill(T* out, long long n, unsigned seed, float scale, float offset) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = normjit::Convert<T>::from(offset + scale * uniform(i, seed));
}
extern "C" __global__ void fill_f32(float* o, long long n, unsigned s, float sc, float off) { fill(o, n, s, sc, off); }
extern "C" __global__ void fill_f16(normjit::f16* o, long long n, unsigned s, float sc, float off) { fill(o, n, s, sc, off); }
extern "C" __global__ void fill_bf16(normjit::bf16* o, long long n, unsigned s, float sc, float off) { fill(o, n, s, sc, off); }
)";

}  // namespace normjit::detail
