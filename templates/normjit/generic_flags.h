// The generic kernels' launch flags (NormParams::generic_flags) and their streaming depth, shared
// by host and device code (norm_generic.cuh, runtime/runtime.cpp).
#pragma once
#if defined(__CUDACC_RTC__)
#include "normjit/host_device.h"
#else
#include "host_device.h"
#endif

namespace normjit {

enum GenericFlag : int {
  kGenericSubtractsMean = 1,  // LayerNorm / AdaLayerNorm
  kGenericHasBias = 2,
  kGenericPerGroup = 4,      // AdaLayerNorm / AdaRMSNorm: weights [groups, n]
  kGenericZeroCentered = 8,  // the scale is 1 + gamma
  kGenericTraining = 16,     // forward: write mean (with kGenericSubtractsMean) and rstd
  kGenericSharedSums = 32,   // backward: dgamma/dbeta sums in dynamic shared memory, else the workspace
  kGenericBiasIn = 64,       // forward, residual kernels: bias_in [n] (weight dtype) in the residual add
  kGenericStaged = 128,      // backward: x and dy copied into shared memory (the first
                             // NormParams::generic_stage_packs packs), the next row's while this one computes
  kGenericTwoStages = 256,   // with kGenericStaged: two stages, the next row copied into the other one
                             // (else one, each pack's copy after its last use)
  kGenericRowsPastL2 = 512,  // forward: the rows in flight take more than half the L2, so the statistics
                             // pass walks the row from its end (the next pass starts where it finished)
                             // and the last pass's reads and y's stores stream (evict-first)
};

// Packs in flight per thread in each streaming pass; the launch gives a row about this many a thread.
constexpr int kGenericUnroll = 4;
// Most threads a generic CTA takes (their launch bounds), but the forward's widest rows and the
// held backward rows of two packs a thread (kGenericMaxForwardThreads, kGenericMaxHeldThreads).
constexpr int kGenericMaxThreads = 256;
// Most packs a thread of the backward's held rows (generic_bwd_held): rows of at most this many
// times kGenericMaxHeldThreads packs keep x, dy, the weights and the dgamma / dbeta sums in registers.
constexpr int kGenericMaxHeldPacks = 2;
// The widest CTA of the held rows at two packs a thread, and the fewest packs a row that take two.
constexpr int kGenericMaxHeldThreads = 512;
constexpr int kGenericHeldTwoFrom = 64;
// The packs a CTA of a held row split over a cluster aims at: 256 threads, two CTAs a SM.
constexpr int kGenericHeldSegmentPacks = 512;
// The forward's widest CTA: rows whose CTAs of kGenericMaxThreads would not fit the L2 together
// take fewer, wider ones (generic_forward_shape). Its launch bounds keep the same 64 registers.
constexpr int kGenericMaxForwardThreads = 512;
// Most CTAs of a backward slot's cluster (the _cluster kernels): past the portable 8 a cluster is
// non-portable (sm_90 holds 16 in a GPC), for rows whose sums fit no cluster of 8.
constexpr int kGenericMaxCluster = 16;

// Bytes of one of the backward's stages: x's first `staged_packs` packs (the rows' type: h for an
// fp32 stream), then dy's, rounded up to 16 so that the next stage's 16-byte copies stay aligned.
NORMJIT_HOST_DEVICE constexpr int generic_stage_bytes(int staged_packs, int vec, int row_bytes, int x_bytes) {
  return (staged_packs * vec * (row_bytes + x_bytes) + 15) / 16 * 16;
}

}  // namespace normjit
