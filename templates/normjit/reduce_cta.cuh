// Row-wide reductions for a row spread over kThreads threads: a sub-warp group (kThreads <= 32,
// power of two; shuffles only) or whole warps of one CTA (kThreads a multiple of 32, one row per
// CTA). Every thread of the row gets the result. The CTA variants use `scratch` in shared memory
// (kThreads / 32 slots) and have no trailing barrier: give each call its own scratch, or put a
// barrier between two calls that share it.
#pragma once
#include "normjit/reduce_warp.cuh"

namespace normjit {

// Past this many warps, each warp folds the per-warp partials by shuffles (one shared load per
// lane, five steps) instead of every thread reading and adding all of them (at 1024 threads, 16
// shared loads and 64 adds per thread per row pair). Same order in every warp, so same bits.
// Clustered backward rows measured faster with the serial fold and ask for it (kShuffleFold).
constexpr int kSerialFold = 8;

template <int kThreads, bool kShuffleFold = (kThreads / 32 > kSerialFold)>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  if constexpr (kThreads <= 32) {
    return group_sum<kThreads>(v);
  } else {
    constexpr int kWarps = kThreads / 32;
    v = group_sum<32>(v);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    if constexpr (kShuffleFold) {
      const int lane = threadIdx.x % 32;
      return group_sum<32>(lane < kWarps ? scratch[lane] : 0.f);
    }
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += scratch[w];
    return total;
  }
}

// The row's largest value, as row_sum (its own scratch of kThreads / 32 floats).
template <int kThreads>
__device__ __forceinline__ float row_max(float v, float* scratch) {
  if constexpr (kThreads <= 32) {
    return group_max<kThreads>(v);
  } else {
    constexpr int kWarps = kThreads / 32;
    v = group_max<32>(v);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    const int lane = threadIdx.x % 32;
    return group_max<32>(lane < kWarps ? scratch[lane] : 0.f);
  }
}

// The barrier between the warps' partials and their fold: the CTA's, unless a caller's warps are
// only part of it (bwd_producer_warp.cuh).
struct CtaBarrier {
  static __device__ __forceinline__ void sync() { __syncthreads(); }
};

// Two sums at once (one barrier); scratch holds kThreads / 32 pairs.
template <int kThreads, bool kShuffleFold = (kThreads / 32 > kSerialFold), class Barrier = CtaBarrier>
__device__ __forceinline__ void row_sum_pair(float& a, float& b, float2* scratch) {
  if constexpr (kThreads <= 32) {
    a = group_sum<kThreads>(a);
    b = group_sum<kThreads>(b);
  } else {
    constexpr int kWarps = kThreads / 32;
    a = group_sum<32>(a);
    b = group_sum<32>(b);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = make_float2(a, b);
    Barrier::sync();
    if constexpr (kShuffleFold) {
      const int lane = threadIdx.x % 32;
      const float2 part = lane < kWarps ? scratch[lane] : make_float2(0.f, 0.f);
      a = group_sum<32>(part.x);
      b = group_sum<32>(part.y);
      return;
    }
    a = 0.f;
    b = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      a += scratch[w].x;
      b += scratch[w].y;
    }
  }
}

template <int kThreads, bool kShuffleFold = (kThreads / 32 > kSerialFold)>
__device__ __forceinline__ Moments row_merge(Moments m, Moments* scratch) {
  if constexpr (kThreads <= 32) {
    return group_merge<kThreads>(m);
  } else {
    constexpr int kWarps = kThreads / 32;
    m = group_merge<32>(m);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = m;
    __syncthreads();
    if constexpr (kShuffleFold) {
      const int lane = threadIdx.x % 32;
      return group_merge<32>(lane < kWarps ? scratch[lane] : Moments{0.f, 0.f, 0.f});
    }
    Moments total = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total = merge(total, scratch[w]);
    return total;
  }
}

}  // namespace normjit
