// The block-config space the tuner searches, pruned to configurations worth timing.
#include <algorithm>
#include <cstdlib>
#include <set>

#include "normjit/error.hpp"
#include "normjit/tuning.hpp"

namespace normjit {
namespace {

bool valid(const Spec& base, const BlockConfig& b) {
  Spec s = base;
  s.block = b;
  try {
    validate(s);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

std::vector<BlockConfig> candidate_configs(const Spec& spec, int sm, int max_vec, size_t limit) {
  Spec bare = spec;
  bare.block.reset();
  const BlockConfig heuristic = *resolve(bare, max_vec, sm).block;
  std::vector<BlockConfig> grid;
  auto add = [&](int threads, int rows, int vec, RowCache cache, int cluster) {
    BlockConfig b{threads, rows, vec, cache, cluster};
    if (valid(bare, b)) grid.push_back(b);
    if (cache != RowCache::kSharedPipelined) return;
    // Pipelined rows also with three buffers, and by bulk copies (sm_90+, 16-byte packs): the
    // heuristic's bulk rows take both. Four buffers never beat three (docs/perf-notes.md).
    b.stages = 3;
    if (valid(bare, b)) grid.push_back(b);
    if (sm < 90) return;
    for (int stages : {2, 3}) {
      b.stages = stages;
      b.bulk_copy = true;
      if (valid(bare, b)) grid.push_back(b);
    }
    // And with a producer warp (backward): two buffers; three and four ran 9-17 % slower.
    b.stages = 2;
    b.producer_warp = true;
    if (valid(bare, b)) grid.push_back(b);
  };
  // Vector widths: the widest that divides N and the caller's alignment, and two narrower.
  std::vector<int> vecs;
  for (int v = std::min(16 / dtype_size(row_dtype(spec)), std::max(1, max_vec)); v >= 1 && vecs.size() < 3; v /= 2)
    if (spec.n % v == 0) vecs.push_back(v);
  const RowCache caches[] = {RowCache::kRegisters, RowCache::kShared, RowCache::kSharedPipelined, RowCache::kGlobal};
  for (int vec : vecs) {
    const int64_t packs = spec.n / vec;
    // Sub-warp and warp rows: lanes per row a power of two, 64-256 threads per CTA.
    for (int t = 1; t <= 32; t *= 2) {
      if (t * int64_t(kMaxRegisterPacks) < packs || t > 4 * packs) continue;
      for (int cta : {64, 128, 256}) add(t, cta / t, vec, RowCache::kRegisters, 1);
    }
    // CTA rows: powers of two times 32, and the counts that split the row into 1-16 packs each.
    std::set<int> threads;
    for (int t = 64; t <= 1024; t *= 2) threads.insert(t);
    for (int per = 1; per <= kMaxRegisterPacks; ++per) {
      const int64_t t = (packs + per - 1) / per;
      if (t > 32 && t <= 1024) threads.insert(static_cast<int>((t + 31) / 32 * 32));
    }
    for (int t : threads)
      for (RowCache cache : caches) add(t, 1, vec, cache, 1);
    // Clusters (sm_90+): 2-16 CTAs of 128-1024 threads share a row in registers or shared memory.
    if (sm >= 90)
      for (int c = 2; c <= kMaxCluster; c *= 2)
        for (int t = 128; t <= 1024; t *= 2)
          for (RowCache cache : {RowCache::kRegisters, RowCache::kShared, RowCache::kSharedPipelined})
            add(t, 1, vec, cache, c);
    // And clusters of the other counts, at the threads that give each CTA's segment 1-3 packs a
    // thread: the packs of an awkward N (LN 57352: 7169) may fit 5 CTAs where 4 and 8 fit badly.
    if (sm >= 90)
      for (int c = 3; c <= kMaxCluster; ++c) {
        if ((c & (c - 1)) == 0) continue;
        BlockConfig clustered{};
        clustered.vec = vec;
        clustered.cluster = c;
        const int64_t segment = segment_packs(bare, clustered);  // whole scale blocks a CTA where the epilogue has them
        for (int per = 1; per <= 3; ++per) {
          const int64_t t = ((segment + per - 1) / per + 31) / 32 * 32;
          if (t < 128 || t > 1024) continue;
          for (RowCache cache : {RowCache::kRegisters, RowCache::kShared, RowCache::kSharedPipelined})
            add(static_cast<int>(t), 1, vec, cache, c);
        }
      }
  }
  // Nearest the heuristic's threads per row first, then by the canonical cfg string.
  auto cfg = [&](const BlockConfig& b) {
    Spec s = bare;
    s.block = b;
    return s.str();
  };
  std::stable_sort(grid.begin(), grid.end(), [&](const BlockConfig& a, const BlockConfig& b) {
    const int da = std::abs(a.threads_per_row * a.cluster - heuristic.threads_per_row * heuristic.cluster);
    const int db = std::abs(b.threads_per_row * b.cluster - heuristic.threads_per_row * heuristic.cluster);
    return da != db ? da < db : cfg(a) < cfg(b);
  });
  std::vector<BlockConfig> out{heuristic};
  for (const BlockConfig& b : grid) {
    if (out.size() >= limit) break;
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  }
  return out;
}

}  // namespace normjit
