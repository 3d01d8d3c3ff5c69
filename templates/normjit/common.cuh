// Types, conversions, vector access and reductions for normjit kernels.
// Deliberately free of cuda_fp16.h / cuda_bf16.h: they dominate NVRTC time for small kernels.
#pragma once
#include "normjit/params.h"

// Launch bounds of a row kernel with no minimum CTA count of its own. The compiler defines
// NORMJIT_NO_OCCUPANCY_SPILL when recompiling a kernel that spilled (runtime/nvrtc_compiler.cpp):
// asking for one CTA per SM lets ptxas use the few registers it had spilled to keep occupancy.
#ifdef NORMJIT_NO_OCCUPANCY_SPILL
#define NORMJIT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads, 1)
#else
#define NORMJIT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#endif

namespace normjit {

using f32 = float;
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

enum class NormKind { kLayerNorm, kRMSNorm };
enum class RowCache { kRegisters, kGlobal, kShared, kSharedPipelined };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}
__device__ __forceinline__ float to_float(f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}

template <class T> struct Convert;
template <> struct Convert<float> {
  static __device__ __forceinline__ float from(float v) { return v; }
};
template <> struct Convert<bf16> {
  static __device__ __forceinline__ bf16 from(float v) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
  }
};
template <> struct Convert<f16> {
  static __device__ __forceinline__ f16 from(float v) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
  }
};

// kVec consecutive elements, aligned so that one copy is one (or, past 16 bytes, several)
// vector memory instructions.
template <class T, int kVec>
struct alignas(sizeof(T) * kVec >= 16 ? 16 : sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, kVec>*>(p);
}
template <class T, int kVec>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, kVec>& v) {
  *reinterpret_cast<Pack<T, kVec>*>(p) = v;
}

// A pack's elements as floats. A bf16 pair shares one 32-bit word: its halves come out with one
// instruction each (shift, mask), where to_float per element first extracts the upper half (two).
// H200, session 11 (call 3): LN fwd 12288 / 262144 +10 / +13 %, RMS fwd 32768 +8 %.
template <class T, int kVec>
__device__ __forceinline__ void unpack(const Pack<T, kVec>& p, float (&out)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) out[j] = to_float(p.v[j]);
}
template <int kVec>
__device__ __forceinline__ void unpack(const Pack<bf16, kVec>& p, float (&out)[kVec]) {
#pragma unroll
  for (int j = 0; j + 1 < kVec; j += 2) {
    // In PTX: written in C++, the compiler splits the word into halves and shifts the upper one.
    // Reading the pair as one punned 32-bit word instead cost forward kernels registers (LN fwd
    // 262144 c8 40 -> 52) and 4-14 points on the H200 (session 11, call 10).
    unsigned lo, hi;
    asm("{ .reg .b32 w; mov.b32 w, {%2, %3}; shl.b32 %0, w, 16; and.b32 %1, w, 0xffff0000; }"
        : "=r"(lo), "=r"(hi)
        : "h"(p.v[j].bits), "h"(p.v[j + 1].bits));
    out[j] = __uint_as_float(lo);
    out[j + 1] = __uint_as_float(hi);
  }
  if constexpr (kVec % 2 == 1) out[kVec - 1] = to_float(p.v[kVec - 1]);
}

__device__ __forceinline__ unsigned element_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned element_bits(bf16 v) { return v.bits; }
__device__ __forceinline__ unsigned element_bits(f16 v) { return v.bits; }

// A pack of an output (y, dx, dgamma/dbeta partials) to global memory. With kVectorAsm, one
// st.global.v4 per 16 bytes through inline PTX: in clustered and the forward's pipelined rows NVRTC
// 13 split plain 16-byte stores into 2- and 4-byte ones (sm_90; forward pipelined rows ran at 25 %
// of copy), whatever alignment the code asserted. Elsewhere the plain store: the asm is volatile,
// so the compiler keeps later loads behind it (LayerNorm backward at 1024 threads spilled and ran
// 3-14 points slower with it). The kernel never reads these outputs back: no memory clobber.
template <class T, int kVec, bool kVectorAsm>
__device__ __forceinline__ void store_output_pack(T* p, const Pack<T, kVec>& v) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  constexpr int kWords = kVec / kPerWord;  // 0: a lone 2-byte element
  if constexpr (!kVectorAsm || kWords == 0) {
    store_pack<T, kVec>(p, v);
  } else {
    unsigned w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      w[i] = kPerWord == 1 ? element_bits(v.v[i]) : element_bits(v.v[2 * i]) | element_bits(v.v[2 * i + 1]) << 16;
    if constexpr (kWords >= 4) {
#pragma unroll
      for (int i = 0; i < kWords; i += 4)
        asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; st.global.v4.b32 [g], {%1, %2, %3, %4}; }"
                     ::"l"(p + i * kPerWord), "r"(w[i]), "r"(w[i + 1]), "r"(w[i + 2]), "r"(w[i + 3]));
    } else if constexpr (kWords == 2) {
      asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; st.global.v2.b32 [g], {%1, %2}; }"
                   ::"l"(p), "r"(w[0]), "r"(w[1]));
    } else {
      asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; st.global.b32 [g], %1; }" ::"l"(p), "r"(w[0]));
    }
  }
}

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
// Bulk copies (sm_90 cp.async.bulk, executed by the TMA unit): one thread moves a whole row
// segment into shared memory, and the copy counts its bytes off an mbarrier that every thread of
// the CTA waits on. The buffer's readers must all be done (a CTA barrier) before the next copy into it.
__device__ __forceinline__ void init_row_barrier(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
  // Makes the initialised barrier visible to the async proxy that completes it.
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
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

// Programmatic dependent launch (sm_90+; no-ops elsewhere, and when the host launched the next
// kernel plainly). allow_dependent_launch: the next kernel in the stream may begin launching now.
// wait_for_prerequisites: blocks until the kernels this one depends on have finished and their
// writes are visible; everything that reads their results comes after it.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisites() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Warms the line holding `address` into L2; no register waits on it.
__device__ __forceinline__ void prefetch_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}
// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// How a row of Cfg::kN elements maps onto Cfg::kThreadsPerRow threads in packs of Cfg::kVec:
// pack p of a row belongs to lane p % kThreads, in its iteration p / kThreads. With a cluster
// of kCluster CTAs per row, each CTA owns one contiguous segment of kVecs packs.
template <class Cfg>
struct RowShape {
  static constexpr int kVec = Cfg::kVec;
  static constexpr int kThreads = Cfg::kThreadsPerRow;
  static constexpr int kCluster = Cfg::kCluster;
  static constexpr int kVecs = Cfg::kN / kVec / kCluster;           // packs per row (per CTA segment)
  static constexpr int kSegment = kVecs * kVec;                     // elements per CTA segment
  static constexpr int kIters = (kVecs + kThreads - 1) / kThreads;  // packs per thread
  // Paths that stream a row take this many packs per thread at a time.
  static constexpr int kChunk = kIters < 4 ? kIters : 4;
  static constexpr float kInvN = 1.0f / static_cast<float>(Cfg::kN);
  static_assert(Cfg::kN % kVec == 0, "vec must divide N");
  static_assert(Cfg::kN / kVec % kCluster == 0, "the cluster must divide the row's packs");
  static_assert(kCluster == 1 || Cfg::kRowsPerCta == 1, "a clustered row spans whole CTAs");
};

// AdaLayerNorm: the group (batch) of a row. validate_launch keeps such launches below 2^32 rows,
// so 32 bits suffice: a 64-bit division expands into a called routine that needs a stack frame.
__device__ __forceinline__ long long group_of_row(long long row, long long rows_per_group) {
  return static_cast<unsigned>(row) / static_cast<unsigned>(rows_per_group);
}

// Thread-block clusters (sm_90+). Every thread of every CTA of the cluster must reach each
// barrier (the .aligned forms); arrive/wait may be split to overlap work with the wait.
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
// row's output) to be performed. NORMJIT_CLUSTER_RELEASE_ALL restores that, for A/B timing.
template <int kCluster>
__device__ __forceinline__ float2 cluster_sum(float2 v, float2* slot) {
  if constexpr (kCluster == 1) {
    return v;
  } else {
#ifdef NORMJIT_CLUSTER_RELEASE_ALL
    if (threadIdx.x == 0) *slot = v;
    cluster_arrive();
#else
    if (threadIdx.x == 0) {
      *slot = v;
      asm volatile("fence.acq_rel.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
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

// Sum over an aligned group of kWidth (power of two, <= 32) lanes; every lane gets the result.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
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

// Past this many warps, each warp folds the per-warp partials by shuffles (one shared load per lane,
// five steps) instead of every thread reading and adding all of them: at 1024 threads that was 16
// shared loads and 64 adds per thread per row pair. Same order in every warp, so same bits.
// H200, session 11 (call 3): LN fwd 32768 / 65536 +6 / +15 %, LN bwd 16384 +7 %; but clustered
// backward rows lost 1-3 %, so the backward asks for the serial fold there (kShuffleFold).
constexpr int kSerialFold = 8;

// Row-wide reductions for a row spread over kThreads threads: a sub-warp group (kThreads <= 32,
// power of two) or whole warps of one CTA (kThreads a multiple of 32, one row per CTA).
// Every thread of the row gets the result. The CTA variants use `scratch` in shared memory
// (kThreads / 32 slots) and have no trailing barrier: give each call its own scratch.
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

// Two sums at once (one barrier); scratch holds kThreads / 32 pairs.
template <int kThreads, bool kShuffleFold = (kThreads / 32 > kSerialFold)>
__device__ __forceinline__ void row_sum_pair(float& a, float& b, float2* scratch) {
  if constexpr (kThreads <= 32) {
    a = group_sum<kThreads>(a);
    b = group_sum<kThreads>(b);
  } else {
    constexpr int kWarps = kThreads / 32;
    a = group_sum<32>(a);
    b = group_sum<32>(b);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = make_float2(a, b);
    __syncthreads();
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
