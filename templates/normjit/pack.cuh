// Element types, conversions to and from fp32, and packs of kVec elements moved as one vector
// access. Deliberately free of cuda_fp16.h / cuda_bf16.h: they dominate NVRTC time for small kernels.
#pragma once
#include "normjit/params.h"

namespace normjit {

using f32 = float;
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

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

// A pack loaded where it is written in the code: the volatile asm keeps the compiler from hoisting
// an unrolled loop's loads ahead of it, which holds every pack's registers at once (the fused
// backward's last pass spilled so at 768-1024 threads). Packs of 2 bytes use the plain load.
template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_pack_in_order(const T* p) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * kVec;
  Pack<T, kVec> v;
  unsigned* w = reinterpret_cast<unsigned*>(&v);
  if constexpr (kBytes == 16) {
    asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
  } else if constexpr (kBytes == 8) {
    asm volatile("ld.global.v2.b32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else if constexpr (kBytes == 4) {
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  } else {
    v = load_pack<T, kVec>(p);
  }
  return v;
}

// A pack's elements as floats. A bf16 pair shares one 32-bit word: its halves come out with one
// instruction each (shift, mask), where to_float per element first extracts the upper half (two).
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
    // Reading the pair as one punned 32-bit word instead cost the forward kernels registers and
    // speed.
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
// 13 split plain 16-byte stores into 2- and 4-byte ones (sm_90), whatever alignment the code
// asserted. Elsewhere the plain store: the asm is volatile, so the compiler keeps later loads
// behind it, which cost registers (spills at 1024 threads) and speed. The kernel never reads these
// outputs back: no memory clobber.
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

}  // namespace normjit
