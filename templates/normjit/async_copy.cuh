// Copies from global into shared memory that run while the thread goes on: per-thread cp.async
// (sm_80+) and whole-segment bulk copies (sm_90 cp.async.bulk, executed by the TMA unit) that
// complete on an mbarrier; and an L2 prefetch. Pointers passed as shared_dst point into this
// CTA's shared memory.
#pragma once
#include "normjit/pack.cuh"

namespace normjit {

// The 32-bit shared-state-space address of a generic pointer into this CTA's shared memory.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
  return addr;
}

// Asynchronous copy of one pack from global to shared memory (cp.async, sm_80+). The issuing
// thread sees the data after wait_async; other threads need a barrier too. cp.async moves 4, 8
// or 16 bytes; smaller packs (2-byte elements, vec 1) are copied synchronously.
template <class T, int kVec>
__device__ __forceinline__ void copy_async(T* shared_dst, const T* global_src) {
  constexpr int kBytes = sizeof(Pack<T, kVec>);
  if constexpr (kBytes < 4) {
    store_pack<T, kVec>(shared_dst, load_pack<T, kVec>(global_src));
  } else {
    const unsigned dst = shared_address(shared_dst);
    if constexpr (kBytes == 16)  // .cg: the row is read once, so skip L1
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
    else
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(global_src), "n"(kBytes) : "memory");
  }
}
// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Bulk copies: one thread moves a whole row segment into shared memory, and the copy counts its
// bytes off an mbarrier that every thread of the CTA waits on. The buffer's readers must all be
// done (a CTA barrier, or kArrivals arrivals on a barrier of their own) before the next copy into it.
template <unsigned kArrivals = 1>
__device__ __forceinline__ void init_barrier(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "n"(kArrivals) : "memory");
#endif
}
// Makes the barriers this thread initialised visible to the async proxy that completes them.
__device__ __forceinline__ void fence_barrier_init() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void init_row_barrier(unsigned long long* bar) {
  init_barrier(bar);
  fence_barrier_init();
}
// One arrival on `bar` (of the kArrivals it was initialised with).
__device__ __forceinline__ void arrive_on_barrier(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
#endif
}
// The calling thread arrives on `bar`, announcing `bytes`, then issues the copies that deliver them.
__device__ __forceinline__ void expect_bulk_bytes(unsigned long long* bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
#endif
}
// bytes: a multiple of 16; both addresses 16-byte aligned.
__device__ __forceinline__ void bulk_copy_to_shared(void* shared_dst, const void* global_src, unsigned bytes,
                                                    unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(shared_dst)),
      "l"(global_src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
#endif
}
// Orders this thread's earlier generic-proxy accesses of shared memory before later bulk copies.
__device__ __forceinline__ void fence_shared_for_bulk_copy() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Waits until the phase of `bar` with this parity has completed (all announced bytes landed).
__device__ __forceinline__ void wait_row_barrier(unsigned long long* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{ .reg .pred done;\n"
      "WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Warms the line holding `address` into L2; no register waits on it.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

}  // namespace normjit
