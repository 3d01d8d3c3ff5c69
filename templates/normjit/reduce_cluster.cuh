// Sums over the CTAs of a thread-block cluster (sm_90+) through distributed shared memory: a row
// split into one segment per CTA sums its per-CTA partials here. Every thread of every CTA of the
// cluster must reach each cluster barrier (the .aligned forms).
#pragma once
#include "normjit/async_copy.cuh"
#include "normjit/reduce_warp.cuh"

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

// Loads a slot of another CTA of the cluster (an address from cluster_address).
__device__ __forceinline__ void load_cluster_slot(float2& out, unsigned address) {
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(out.x), "=f"(out.y) : "r"(address) : "memory");
}
__device__ __forceinline__ void load_cluster_slot(float& out, unsigned address) {
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(out) : "r"(address) : "memory");
}

// Combines a per-CTA value over the kCluster CTAs of a cluster: combine(total, part) folds the
// part of each rank into `init`, in rank order, so every CTA gets the same bits. Each CTA passes
// its own shared `slot`; nothing may rewrite it until all CTAs have passed their next cluster
// barrier (callers alternate two slots, or wait at exit). Only the slot's writer releases it (a
// cluster-scope fence, then a relaxed arrive): a release arrive by every thread would also wait
// for each thread's earlier global stores (the previous row's output) to be performed.
template <int kCluster, class T, class Combine>
__device__ __forceinline__ T cluster_reduce(T v, T* slot, T init, Combine combine) {
  if constexpr (kCluster == 1) {
    return v;
  } else {
    if (threadIdx.x == 0) {
      *slot = v;
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    cluster_wait();
    T total = init;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) {
      T part;
      load_cluster_slot(part, cluster_address(slot, r));
      combine(total, part);
    }
    return total;
  }
}

// Fold one CTA's part into the running total, in place (a new float2 built from the sums moved
// ptxas's schedule of some clustered LayerNorm backward kernels).
struct ClusterSumOp {
  __device__ __forceinline__ void operator()(float2& total, float2 part) const {
    total.x += part.x;
    total.y += part.y;
  }
};
struct ClusterMaxOp {
  __device__ __forceinline__ void operator()(float& total, float part) const { total = fmaxf(total, part); }
};

// A float2 stored into another CTA's shared memory (`slot`, from cluster_address), its bytes
// counted on that CTA's mbarrier (`bar`, likewise mapped).
__device__ __forceinline__ void push_cluster_slot(unsigned slot, unsigned bar, float2 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(slot),
               "f"(v.x), "f"(v.y), "r"(bar)
               : "memory");
#endif
}

// A persistent row loop's sums over a cluster of `cluster` CTAs (at most kMaxCluster), pushed:
// thread r of each CTA stores the CTA's part into CTA r's `parts` (st.async, counted on CTA r's own
// mbarrier; its own part by a plain store), and each CTA waits on its own barrier only, one remote
// store's latency a row where cluster_sum takes a cluster barrier's round trip and remote loads
// (H200: the specialized backward's clustered rows 1.06-1.39x, the generic held ones 1.17-1.26x).
// The parts fold in rank order, as cluster_sum folds: the same bits. Two buffers by row parity: a
// CTA pushes row t + 2 only after every CTA pushed row t + 1, which each does after its CTA barrier
// of row t + 1, so after all its threads read row t. That CTA barrier is the caller's: unlike
// cluster_sum, the wait here does not order the CTA's threads. Whole warps call it (a CTA of whole
// warps). The specialized kernels give the cluster at compile time (kMaxCluster), the generic ones
// at run time.
template <int kMaxCluster>
struct ClusterPushSums {
  float2 parts[2][kMaxCluster];
  unsigned long long arrived[2];

  // Every thread of every CTA, before the first sum: thread 0 sets up the barriers, then the
  // cluster barrier (arrive here, cluster_wait before the first push) publishes them.
  __device__ __forceinline__ void init_and_arrive() {
    if (threadIdx.x == 0) {
      init_barrier(&arrived[0]);
      init_barrier(&arrived[1]);
      fence_barrier_init();
    }
    cluster_arrive();
  }
  // row: the CTA's row count so far; all threads call it with the CTA's whole part.
  __device__ __forceinline__ float2 sum(float2 v, unsigned row, unsigned cluster = kMaxCluster) {
    float2* const buffer = parts[row & 1];
    unsigned long long* const bar = &arrived[row & 1];
    const unsigned tid = threadIdx.x;
    if (tid < cluster) {
      unsigned rank;
      asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
      if (tid == rank) {
        buffer[rank] = v;
        expect_bulk_bytes(bar, (cluster - 1) * static_cast<unsigned>(sizeof(float2)));  // releases the store
      } else {
        push_cluster_slot(cluster_address(buffer + rank, tid), cluster_address(bar, tid), v);
      }
    }
    wait_row_barrier(bar, (row >> 1) & 1u);
    // Lane r reads rank r's part and the warp folds them by shuffles: with a load a rank in every
    // thread, more of the 1024-thread epilogue kernels spilled (82 blocks against 65).
    const unsigned lane = tid % 32;
    const float2 part = lane < cluster ? buffer[lane] : make_float2(0.f, 0.f);
    float2 total = make_float2(0.f, 0.f);
    for (unsigned r = 0; r < cluster; ++r)
      ClusterSumOp{}(total, shfl_lane(part, static_cast<int>(r)));
    return total;
  }
};

template <>
struct ClusterPushSums<1> {};  // no cluster: nothing to exchange

// Sums a pair of per-CTA values over the cluster (cluster_reduce's slot rules).
template <int kCluster>
__device__ __forceinline__ float2 cluster_sum(float2 v, float2* slot) {
  return cluster_reduce<kCluster>(v, slot, make_float2(0.f, 0.f), ClusterSumOp{});
}

// The largest of a non-negative per-CTA value (an amax) over the cluster, as cluster_sum (max
// does not depend on the order; 0 starts it).
template <int kCluster>
__device__ __forceinline__ float cluster_max(float v, float* slot) {
  return cluster_reduce<kCluster>(v, slot, 0.f, ClusterMaxOp{});
}

}  // namespace normjit
