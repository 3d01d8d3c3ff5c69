// Sums over the CTAs of a thread-block cluster (sm_90+) through distributed shared memory: a row
// split into one segment per CTA sums its per-CTA partials here. Every thread of every CTA of the
// cluster must reach each cluster barrier (the .aligned forms).
#pragma once
#include "normjit/async_copy.cuh"

namespace normjit {

// arrive/wait may be split to overlap work with the wait.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// Address of `local` (this CTA's shared memory) in the CTA `rank` of the cluster.
__device__ __forceinline__ unsigned cluster_address(const void* local, unsigned rank) {
  unsigned remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
  return remote;
}

// Sums a pair of per-CTA values over the kCluster CTAs of a cluster, in rank order, so every CTA
// gets the same bits. Each CTA passes its own shared `slot`; nothing may rewrite it until all
// CTAs have passed their next cluster barrier (callers alternate two slots, or wait at exit).
// Only the slot's writer releases it (a cluster-scope fence, then a relaxed arrive): a release
// arrive by every thread would also wait for each thread's earlier global stores (the previous
// row's output) to be performed.
template <int kCluster>
__device__ __forceinline__ float2 cluster_sum(float2 v, float2* slot) {
  if constexpr (kCluster == 1) {
    return v;
  } else {
    if (threadIdx.x == 0) {
      *slot = v;
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    cluster_wait();
    float2 total = make_float2(0.f, 0.f);
#pragma unroll
    for (int r = 0; r < kCluster; ++r) {
      float2 part;
      asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                   : "=f"(part.x), "=f"(part.y) : "r"(cluster_address(slot, r)) : "memory");
      total.x += part.x;
      total.y += part.y;
    }
    return total;
  }
}

// The largest of a per-CTA value over the cluster, as cluster_sum (the same slot rules; max
// does not depend on the order).
template <int kCluster>
__device__ __forceinline__ float cluster_max(float v, float* slot) {
  if constexpr (kCluster == 1) {
    return v;
  } else {
    if (threadIdx.x == 0) {
      *slot = v;
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    cluster_wait();
    float total = 0.f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) {
      float part;
      asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(part) : "r"(cluster_address(slot, r)) : "memory");
      total = fmaxf(total, part);
    }
    return total;
  }
}

}  // namespace normjit
