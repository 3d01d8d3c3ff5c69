// dx of the fused backward, one pack at a time, from gamma * d, x and the row's constants:
//   dx = rstd * (gamma*d - c1 - xhat * c2),  c1 = mean_N(gamma*d) (0 for RMSNorm),
//                                             c2 = mean_N(gamma*d*xhat)
#pragma once
#include "normjit/common.cuh"

namespace normjit {

// 16-bit x: dx = rstd*gd + (x*slope + intercept), the row's constants folded: two FFMA per
// element instead of five. The fold costs about |mean|/sigma fp32 ulps; a 16-bit row cannot
// spread less than its own spacing at the mean (|mean|/sigma < 2^8 bf16, 2^11 f16), which keeps
// that under the output's rounding. fp32 x keeps the exact form.
template <class Cfg>
constexpr bool kBwdFoldedDx = sizeof(typename Cfg::XT) == 2;

// One element of dx from its gd (gamma * d) and x; slope and intercept: the folded form's
// row constants, -rstd^2 * c2 and -rstd * c1 - slope * mean.
// memory_efficient rows pass x̂ as x: the exact form without the mean.
template <class Cfg>
__device__ __forceinline__ float dx_element(float gd, float x, float mean, float rstd, float c1, float c2, float slope,
                                            float intercept) {
  if constexpr (Cfg::kXhatFromY) return rstd * (gd - c1 - x * c2);
  return kBwdFoldedDx<Cfg> ? fmaf(rstd, gd, fmaf(slope, x, intercept)) : rstd * (gd - c1 - (x - mean) * rstd * c2);
}

}  // namespace normjit
