// The backward's second stage: dgamma/dbeta in the weight dtype from the partial rows that the
// fused or split route left in the workspace, summed in a fixed order, so results are bitwise
// reproducible.
#pragma once
#include "normjit/bwd_common.cuh"

namespace normjit {

// Stage 2: per group, sums the partial rows in slot order. A CTA covers 32 columns with 32 lanes
// of slots each (short serial chains: small N launches few CTAs); the 32 lane sums are then added
// in lane order. Same order every run.
template <class Cfg>
__device__ __forceinline__ void norm_bwd_reduce(const NormParams& p) {
  using WT = typename Cfg::WT;
  constexpr int kSlotLanes = BwdShape<Cfg>::kReduceThreads / 32;
  __shared__ float fold[2][kSlotLanes][33];
  wait_for_prerequisites();  // the partials
  const int c = threadIdx.x % 32;
  const int slot_lane = threadIdx.x / 32;
  const int col = blockIdx.x * 32 + c;
  const long long group = blockIdx.y;
  float sum_g = 0.f, sum_b = 0.f;
  if (col < Cfg::kN) {
    const float* in_g = bwd_partial<Cfg>(p, 0, group, 0) + col;
    const float* in_b = bwd_partial<Cfg>(p, 1, group, 0) + col;
    // Up to eight slots' loads in flight per lane, predicated rather than a remainder loop: the
    // launch-bound grids (192-256 slots, 6-8 per lane) take one round trip to L2. Added in slot order.
    constexpr int kInFlight = 8;
    for (int base = slot_lane; base < p.partial_slots; base += kInFlight * kSlotLanes) {
      float g[kInFlight], b[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const long long s = base + u * kSlotLanes;
        const bool have = s < p.partial_slots;
        g[u] = have ? in_g[s * Cfg::kN] : 0.f;
        if constexpr (Cfg::kHasBias) b[u] = have ? in_b[s * Cfg::kN] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        if (base + u * kSlotLanes < p.partial_slots) {
          sum_g += g[u];
          if constexpr (Cfg::kHasBias) sum_b += b[u];
        }
    }
  }
  fold[0][slot_lane][c] = sum_g;
  fold[1][slot_lane][c] = sum_b;
  __syncthreads();
  if (slot_lane == 0 && col < Cfg::kN) {
    float g = 0.f, b = 0.f;
#pragma unroll
    for (int l = 0; l < kSlotLanes; ++l) {
      g += fold[0][l][c];
      b += fold[1][l][c];
    }
    static_cast<WT*>(p.dgamma)[group * Cfg::kN + col] = Convert<WT>::from(g);
    if constexpr (Cfg::kHasBias) static_cast<WT*>(p.dbeta)[group * Cfg::kN + col] = Convert<WT>::from(b);
  }
}

}  // namespace normjit
