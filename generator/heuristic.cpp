// Default block configuration for a spec: how many threads share a row, how many rows a CTA
// holds, the vector width, and where the row waits between the statistics and output passes.
#include <algorithm>

#include "normjit/error.hpp"
#include "normjit/spec.hpp"

namespace normjit {
namespace {

int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// A warp per row up to this many packs per thread, then a CTA per row.
constexpr int64_t kWarpRowMaxPacks = 4;
// A CTA-wide row aims for this many 16-byte packs per thread: enough loads in flight per thread
// without crowding out CTAs per SM.
constexpr int64_t kCtaRowTargetPacks = 4;
// Past this many elements per thread the row leaves registers: at 1024 threads a thread has 64
// registers, and 64 bf16 values (8 packs) spilled 180 bytes on sm_90 while 32 values did not.
constexpr int64_t kRegisterMaxElements = 32;
// Backward, fused route: at most this many elements per thread and threads per row (beyond,
// the split route). 16 elements at 512 threads fit the 128 registers a thread has there.
constexpr int64_t kBackwardElements = 16;
constexpr int64_t kBackwardMaxFusedThreads = 512;
constexpr int64_t kBackwardWarpRowPacks = 4;
// Backward, clustered rows (sm_90): only where each CTA gets exactly this many threads. Measured on
// an H100 (bench/NOTES.md, 2026-11-21): 256-thread cluster CTAs beat the split route (RMSNorm
// N = 16384: 87 % of copy against 58 %), while 288-512-thread ones ran at 29-60 %, below it.
constexpr int64_t kClusterThreads = 256;

// The cluster (a power of two <= kMaxCluster) that gives each CTA kClusterThreads threads of
// `per_thread` packs, with whole mask bytes when the epilogue writes a mask; 0 when none does.
int backward_cluster(const Spec& s, int64_t packs, int64_t per_thread) {
  for (int c = 2; c <= kMaxCluster; c *= 2) {
    if (packs != c * kClusterThreads * per_thread) continue;
    if (s.epilogue == Epilogue::kReluBitmask && (s.n / c) % 8 != 0) continue;
    return c;
  }
  return 0;
}

}  // namespace

Spec resolve(const Spec& spec, int max_vec, int sm) {
  validate(spec);
  if (spec.block) return spec;
  Spec s = spec;
  BlockConfig b;
  b.vec = std::min(16 / dtype_size(s.x_dtype), std::max(1, max_vec));
  while (b.vec > 1 && s.n % b.vec != 0) b.vec /= 2;
  const int64_t packs = s.n / b.vec;

  if (packs <= 32) {
    // Tiny rows: a power-of-two group of lanes per row, 256 threads per CTA.
    b.threads_per_row = next_pow2(packs);
    b.rows_per_cta = 256 / b.threads_per_row;
    b.cache = RowCache::kRegisters;
  } else if (s.phase == Phase::kBackward) {
    // Backward keeps x, dy, gamma*d and two accumulators per element: fewer elements per thread.
    const int64_t per_thread = std::max<int64_t>(1, kBackwardElements / b.vec);
    b.cache = RowCache::kRegisters;
    // Warp rows (8 per CTA) up to 4 packs per lane: at N = 768-1024 bf16 they beat 64-thread CTA
    // rows (H100: 89-92 % of copy against 82-87 %), with 8x fewer dgamma partial rows.
    if (packs <= 32 * std::max(per_thread, kBackwardWarpRowPacks)) {
      b.threads_per_row = 32;
      b.rows_per_cta = 8;
    } else if (const int c = packs > kBackwardMaxFusedThreads * per_thread && sm >= 90
                                 ? backward_cluster(s, packs, per_thread)
                                 : 0) {
      // Past one CTA's registers, a cluster shares the row and stays fused: x and dy are read
      // once instead of twice on the split route.
      b.rows_per_cta = 1;
      b.threads_per_row = static_cast<int>(kClusterThreads);
      b.cluster = c;
    } else {
      const int64_t want = (packs + per_thread - 1) / per_thread;
      b.rows_per_cta = 1;
      b.threads_per_row = want <= kBackwardMaxFusedThreads ? static_cast<int>((want + 31) / 32 * 32) : 1024;
      // Past the fused limit the row-sum pass streams the row with 1024 threads.
      if (want > kBackwardMaxFusedThreads) b.cache = RowCache::kGlobal;
    }
  } else if (packs <= 32 * kWarpRowMaxPacks) {
    b.threads_per_row = 32;
    b.rows_per_cta = 4;
    b.cache = RowCache::kRegisters;
  } else {
    // Clusters are not chosen for the forward: every clustered configuration measured (2-8 CTAs
    // of 128-512 threads, N = 18432-65536) ran below one CTA per row (bench/NOTES.md).
    const int64_t want = (packs + kCtaRowTargetPacks - 1) / kCtaRowTargetPacks;
    b.threads_per_row = static_cast<int>(std::min<int64_t>(1024, (want + 31) / 32 * 32));
    b.rows_per_cta = 1;
    const int64_t per_thread = (packs + b.threads_per_row - 1) / b.threads_per_row;
    // validate() caps a register row at 16 packs per thread (found by fuzzing: odd N in
    // (16384, 32768] took vec 1 and 32 single-element packs).
    b.cache = per_thread * b.vec <= kRegisterMaxElements && per_thread <= kMaxRegisterPacks ? RowCache::kRegisters
                                                                                            : RowCache::kGlobal;
  }
  s.block = b;
  validate(s);
  return s;
}

}  // namespace normjit
