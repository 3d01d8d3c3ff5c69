// Epilogue slot. An epilogue is a functor with two constants (kAlwaysStoresY: y is stored; false:
// only where p.y is set, the epilogue writing its own output; kNeedsPreActivation: see backward)
// and two hooks the norm kernels call:
//   forward<YT, kVec, kThreadsPerRow>(v, valid, p, row, col, lane): v holds kVec finished outputs (pre-activation); the
//     functor rewrites them in place and may write side outputs. Every lane of the row group
//     calls it (valid = false for lanes past the row's end), so it may use shuffles.
//   backward(dy, pre, valid, p, row, col): rewrites dy into the gradient of the
//     pre-activation. `pre` is the recomputed pre-activation when kNeedsPreActivation.
// Two optional parts: `kRowScaled` (the forward hook takes one more argument, row_arg<kAhead>(amax)
// of the row's max |y|, which the norm kernel measures in a pass before the output pass; kAhead:
// formed once ahead of the packs, or in them) and a `State` type (each
// thread's, passed by reference as the forward hook's last argument, then handed to
// `finish<kThreadsPerRow>(state, p)` once, which every thread of the CTA reaches).
// Adding an epilogue means a new header and a row in the generator's table; the norm kernels
// never change.
#pragma once
#include "normjit/common.cuh"

namespace normjit {

struct EpilogueNone {
  static constexpr bool kAlwaysStoresY = true;  // y is always an output
  static constexpr bool kNeedsPreActivation = false;
  template <class YT, int kVec, int kThreadsPerRow>
  static __device__ __forceinline__ void forward(float (&)[kVec], bool, const NormParams&, long long, int, int) {}
  template <int kVec>
  static __device__ __forceinline__ void backward(float (&)[kVec], const float (&)[kVec], bool, const NormParams&,
                                                  long long, int) {}
};

}  // namespace normjit
