// Default block configuration for a spec: how many threads share a row, how many rows a CTA
// holds, the vector width, and where the row waits between the statistics and output passes.
#include <algorithm>
#include <optional>

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
// Forward rows that would take 544-640 threads run two CTAs per SM instead (see resolve()).
constexpr int64_t kTwoCtaRowThreads = 512;
constexpr int64_t kTwoCtaRowPacks = 5;
// RMSNorm register rows past this many threads keep one CTA per SM (55 registers, 100 % at 18432).
constexpr int64_t kRmsOneCtaMinThreads = 576;
constexpr int64_t kTwoCtaMaxWant = 640;
// Past this many elements per thread the row leaves registers: at 1024 threads a thread has 64
// registers, and 64 bf16 values (8 packs) spilled 180 bytes on sm_90 while 32 values did not.
constexpr int64_t kRegisterMaxElements = 32;
// Backward, fused route: at most this many elements per thread and threads per row (beyond,
// the split route). 16 elements at 512 threads fit the 128 registers a thread has there.
constexpr int64_t kBackwardElements = 16;
constexpr int64_t kBackwardMaxFusedThreads = 512;
constexpr int64_t kBackwardWarpRowPacks = 4;
// Backward past the fused register limit, sm_90 (H100 A/B, bench/NOTES.md, 2026-11-21). What
// limits these rows is resident warps: a CTA that holds 4 packs per thread and both dgamma and
// dbeta sums needs 108-122 registers, so one CTA per SM, and below ~24 warps per SM the row ran
// at 67-82 % of copy where 24-32 warps reached 85-95 %.
// - Registers, 2 packs per thread, up to 640 threads with dbeta (96 registers; 768 spilled
//   24 bytes) or 768 without.
constexpr int64_t kBackwardRegThreadsWithBias = 640;
constexpr int64_t kBackwardRegThreads = 768;
// - x and dy in shared memory: at most this much per CTA (sm_90 allows 227 KB; the reduction
//   scratch is static shared memory on top).
constexpr int64_t kBackwardSharedBytes = 200 * 1024;
// With the dbeta sums in shared memory too, up to sm_90's 227 KB less 1 KB for that scratch.
constexpr int64_t kBackwardSharedBytesWithDbeta = kMaxSharedRowBytes - 1024;
// - Clusters of shared-memory rows: 1024-thread CTAs only. Clustered CTAs of 288-896 threads ran
//   at 29-60 % of copy against 76-85 % at 1024 (cause not found).
constexpr int kClusterThreads = 1024;
// Pipelined rows (two buffers, the next row copied in while this one runs; sm_80+, 2-byte x), H100
// A/B against the rows below at M = 32768 (bench/NOTES.md, session 5):
// - 1024-thread shared-memory rows, one CTA or a cluster, up to this much shared memory per CTA:
//   LN 16384 86.6 -> 90.3 %, LN / RMS 32768 (2-CTA clusters) 78.0 / 86.9 -> 88.4 / 88.7 %, LN
//   65536 (4) 69.8 -> 83.1 %, LN 131072 (8) 59.6 -> 73.6 %. At 196 KB (RMS 98304, 4-CTA) it fell
//   from 81.9 to 62.9 %, and below 1024 threads it lost (LN 18432 t768, RMS 20480 t864, LN 24576
//   c2 t768: 2-7 points).
constexpr int64_t kBackwardPipeBytes = 160 * 1024;
// Fewest threads per CTA of the 2-CTA bulk-copied rows that replace one CTA keeping dbeta sums in
// shared memory (see backward_large_row).
// 640: LN 20480 t864 smem -> c2 t640 tma 84.2 -> 89.6 % (H100), 65.6 -> 76.9 % (H200), session 12;
// at 576 threads (LN 18432) the H100 lost 2.4 points. The 4-8-CTA rows keep 640 (below it they
// lost: see backward_large_row); the 2-CTA rows start at 608 (LN 19456 t832 smem -> c2 t608 tma
// 55.6 / 74.7 -> 74.2 / 86.8 % on the H200 / H100, session 14 calls 17 / 18).
constexpr int kDbetaClusterMinThreads = 640;
constexpr int kDbetaPairMinThreads = 608;
// RMSNorm one-CTA 3-pack bulk rows (backward_large_row): at most this many threads.
constexpr int kRmsBulkRowMaxThreads = 960;
// One-CTA rows of 2 packs per thread filled by bulk copies (see backward_large_row): threads.
constexpr int64_t kBulkRowMinThreads = 640;
constexpr int64_t kBulkRowMaxThreads = 896;
// RMSNorm rows of 4 packs a thread split over 2 CTAs of 2 packs: at least this many threads.
constexpr int kRmsPairMinThreads = 768;
// RMSNorm's 4-8-CTA bulk rows (see backward_large_row): at least this many threads.
constexpr int kRmsManyMinThreads = 768;
// Clustered segments of more than 2 and at most 3 packs per thread keep one buffer (see
// backward_large_row).
constexpr int64_t kOneBufferMinPacks = 2;
constexpr int64_t kOneBufferMaxPacks = 3;
// - Register rows of 2 packs per thread at these thread counts (pipelined rows hold only the
//   sums in registers: 64-71 registers instead of 96-122, so 2-4 CTAs per SM). LN with dbeta: 3584
//   84.8 -> 89.0 %, 4096 87.8 -> 88.6, 7168 81.4 -> 85.1, 8192 85.1 -> 93.8; RMS 8192 85.9 -> 93.9.
//   Slower at LN 2048 / 2880 / 5120 / 10240 (t128 / t192 / t320 / t640: 78-82 against 90-94 %)
//   and RMS 4096 (89.3 against 92.6 %).
bool backward_pipe_register_row(const Spec& s, int64_t threads) {
  if (s.has_bias) return threads == 224 || threads == 256 || threads == 448 || threads == 512;
  return threads == 512;
}

// - Of those 2-pack rows on sm_90, the thread counts where the same row filled by bulk copies with
//   three buffers (tma3) measured faster still (bf16, M = 32768, H100, session 9, calls 1-3): LN
//   with dbeta 4096 / 6144 / 7168 / 8192 89.5 / 78.9 / 85.5 / 93.4 -> 93.5 / 87.7 / 88.3 / 94.4 %,
//   RMS 4096 / 8192 93.9 / 93.8 -> 96.0 / 95.2 %. Slower at LN t192 / t224 / t320 / t640 and RMS
//   t192-t448 except t256 and t384 (level), t640, t768 (by 2-14 points).
bool backward_bulk_register_row(const Spec& s, int64_t threads) {
  if (s.has_bias) return threads == 256 || threads == 384 || threads == 448 || threads == 512;
  return threads == 256 || threads == 512;
}

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Bulk-copied backward rows of 672-736 threads (21-23 warps) measured below their neighbours on both
// GPUs (session 13: 704 threads at 11264 and 45056); the cause was not found.
bool odd_warp_pair(int64_t threads) { return threads > 640 && threads < 768; }

// Pipelined rows were measured with 16-byte packs only; odd N takes narrower ones (2-byte packs are
// copied synchronously).
bool sixteen_byte_packs(const Spec& s, int vec) { return vec * dtype_size(s.x_dtype) == 16; }

// Backward rows too long for the fused register route (sm_90): the block config, or nullopt
// for the split route. `packs` are 16-byte vectors of x.
std::optional<BlockConfig> backward_large_row(const Spec& s, int vec, int64_t packs, int max_cluster) {
  BlockConfig b;
  b.vec = vec;
  b.rows_per_cta = 1;
  // Threads (a multiple of 32) holding `elements` values each of one CTA's row (16, 24 or 32: the
  // bf16 figures below are 2, 3 or 4 16-byte packs).
  auto threads_for = [&](int64_t elements) {
    const int64_t per_thread = std::max<int64_t>(1, elements / vec);
    return round_up((packs + per_thread - 1) / per_thread, 32);
  };
  // Pipelined rows as measured: 16-byte packs (bulk copies need them), two buffers within
  // kBackwardPipeBytes, or three within the shared memory a CTA has.
  const bool bulk = sixteen_byte_packs(s, vec);
  auto pipe_fits = [&](BlockConfig c) {
    c.cache = RowCache::kSharedPipelined;
    return bulk && shared_row_bytes(s, c) <= kBackwardPipeBytes;
  };
  auto two_buffers_fit = [&](BlockConfig c) {
    c.cache = RowCache::kSharedPipelined;
    return bulk && shared_row_bytes(s, c) <= kBackwardSharedBytes;
  };
  auto bulk3_fits = [&](BlockConfig c) {
    c.cache = RowCache::kSharedPipelined;
    c.stages = 3;
    return bulk && shared_row_bytes(s, c) <= kBackwardSharedBytesWithDbeta;
  };
  // Rows of 2 packs a thread at 640-896 threads: filled by bulk copies, three buffers, gamma held
  // in registers. bf16, M = 32768, session 13 (calls 3 / 4), H200 / H100, against the register
  // rows (640-768 threads) or the one-CTA shared rows: LN 10240 83.0 / 94.2 -> 94.7 / 93.3 %, LN
  // 11264 59.1 / 77.4 -> 81.0 / 84.2, LN 13312 61.8 / 80.2 -> 92.3 / 93.4, RMS 10240 84.1 / 95.3 ->
  // 95.4 / 95.1, RMS 12288 88.2 / 97.2 -> 94.6 / 94.9, RMS 13312 / 14336 80 / 87 -> 93-94 / 94-95.
  // RMSNorm at 704 threads lost (11264: 82.0 / 85.0 against t352 smem 83.9 / 92.2, calls 5 / 6); at
  // 576 both lost on the H100 (9216: 83.7-84.7 against 89.7-90.9 %, +2.5-2.8 on the H200).
  if (const int64_t t = threads_for(16); dtype_size(s.x_dtype) == 2 && t >= kBulkRowMinThreads &&
                                          t <= kBulkRowMaxThreads && (s.has_bias || !odd_warp_pair(t))) {
    BlockConfig row = b;
    row.threads_per_row = static_cast<int>(t);
    row.cache = RowCache::kSharedPipelined;
    row.stages = 3;
    row.bulk_copy = true;
    if (bulk3_fits(row) && !dbeta_sums_in_shared(s, row)) return row;
  }
  if (const int64_t t = threads_for(16); t <= (s.has_bias ? kBackwardRegThreadsWithBias : kBackwardRegThreads)) {
    b.threads_per_row = static_cast<int>(t);
    b.cache = RowCache::kRegisters;
    return b;
  }
  // Measured for 2-byte x only; fp32 x with these thread counts spilled 12-124 bytes (ptxas).
  if (dtype_size(s.x_dtype) > 2) return std::nullopt;
  b.cache = RowCache::kShared;
  auto fits = [&](const BlockConfig& c) {
    return shared_row_bytes(s, c) <= (dbeta_sums_in_shared(s, c) ? kBackwardSharedBytesWithDbeta : kBackwardSharedBytes);
  };
  // One CTA. With dbeta: 2 packs per thread up to 1024 threads, else 3 up to 768 (both sums in
  // registers), else 3 or 4 with the dbeta sums in shared memory. Without: 4 packs, or 3 where 4
  // would leave a 544-736-thread CTA alone on its SM (N = 18432: 82 -> 92 % of copy).
  int64_t t = s.has_bias ? threads_for(16) : threads_for(32);
  if (s.has_bias && t > 1024) t = threads_for(24) <= 1024 ? threads_for(24) : threads_for(32);
  if (!s.has_bias && t > 512 && t < 768) t = threads_for(24);
  b.threads_per_row = static_cast<int>(std::min<int64_t>(t, 1024));
  // With dbeta, where one CTA of 896-1024 threads would keep the dbeta sums in shared memory, a
  // 2-CTA pipelined cluster of 2 packs per thread (both sums in registers) measured faster once the
  // cluster sums stopped waiting on every thread's stores (bf16, H100, session 6: 28672 c2 t896
  // 73.9 -> 84.5 %); at 768 threads it tied (24576: 79.9 -> 80.4 %) and at 640 lost (20480: 83.4
  // -> 75.9 %). Filled by bulk copies (pipelined rows have 16-byte packs, so they always can be)
  // it gained again (session 9, call 3: 28672 85.3 -> 88.2 %), and from 768 threads on it beat the
  // one-CTA row (24576 / 26624: 80.0 / 74.1 -> 83.3 / 82.0 %); at 640 threads (20480) it lost
  // until gamma was held in registers (session 12; see kDbetaPairMinThreads).
  if (s.has_bias && t <= 1024 && fits(b) && dbeta_sums_in_shared(s, b) && packs % 2 == 0) {
    BlockConfig pair = b;
    pair.cluster = 2;
    pair.cache = RowCache::kSharedPipelined;
    pair.bulk_copy = true;
    pair.threads_per_row = static_cast<int>(round_up((packs / 2 + 1) / 2, 32));
    if (pair.threads_per_row >= kDbetaPairMinThreads && pair.threads_per_row <= kClusterThreads &&
        !dbeta_sums_in_shared(s, pair) && pipe_fits(pair))
      return pair;
  }
  // Bulk copies (16-byte packs) for one-CTA rows, where both the H100 and the H200 measured them
  // level or faster (bf16, M = 32768, session 9, calls 1-3 and 15; H100 -> H200 figures):
  // - the 1024-thread pipelined row (LN 16384): 88.5 -> 88.5 %, 69.8 -> 76.1 %;
  // - RMSNorm's CTA of 768-1024 threads x 4 packs as 2 CTAs of 2 packs (gamma held): 32768 t1024
  //   87.6 -> 90.7 %, 65.3 -> 78.0 % (session 9); session 13 (calls 3 / 4, H200 / H100): 28672 t896
  //   70.6 / 88.1 -> 88.0 / 97.7 %, 24576 t768 81.2 / 92.7 -> 81.7 / 94.4 %. Before gamma was held
  //   these narrower rows lost on the H100 (24576-30720: 4-7 points, session 9).
  // LayerNorm's 3-pack rows at 768 threads (18432) took three bulk-copied buffers from session 9 to
  // 12; with gamma reloaded (24 values a thread) they fell behind the one-buffer row: 61.1 / 84.7
  // against 74.2 / 88.7 % (session 13, calls 3 / 4).
  if (t <= 1024 && fits(b)) {
    if (b.threads_per_row == kClusterThreads && pipe_fits(b)) {
      b.cache = RowCache::kSharedPipelined;
      b.bulk_copy = true;
    } else if (bulk && !s.has_bias && b.threads_per_row >= kRmsPairMinThreads && packs == 4 * b.threads_per_row) {
      b.cluster = 2;
      b.cache = RowCache::kSharedPipelined;
      b.bulk_copy = true;
    } else if (bulk && !s.has_bias && b.threads_per_row > kRmsPairMinThreads &&
               b.threads_per_row <= kRmsBulkRowMaxThreads && packs <= 3 * b.threads_per_row && two_buffers_fit(b)) {
      // RMSNorm's one-CTA 3-pack rows of 800-960 threads, by bulk copies into two buffers, against
      // the shared row, H200 / H100, session 14: 19456 t832 66.1 / 81.6 -> 84.2 / 93.5 % (calls 12 /
      // 11), 20480 t864 79.9 / 92.7 -> 83.5 / 92.1 (calls 8 / 9), 21504 t896 – / 89.4 -> – / 89.6
      // (call 18), 22528 t960 71.2 / 89.1 -> 80.9 / 94.4 (calls 17 / 18). At 992 threads (23552) the
      // H100 lost 3.8 points (call 18).
      b.cache = RowCache::kSharedPipelined;
      b.bulk_copy = true;
    }
    return b;
  }
  // Where 2 CTAs would take more than 2 packs per thread, 4 or 8 CTAs of at most 2 packs by bulk
  // copies (two buffers, gamma held in registers), from 640 threads. bf16, H100 / H200, against the
  // former picks: session 12 (calls 5 / 6): LN 49152 c2 smem 81.7 / 61.7 -> c4 t768 tma 88.0 /
  // 74.5 %, RMS 49152 89.5 / 71.7 -> 88.7 / 75.2, LN 65536 c4 pipe 86.4 / 64.6 -> c4 t1024 tma 86.5 /
  // 69.3, RMS 65536 c2 smem 89.0 (session 11) / 69.6 -> 95.9 / 81.8; session 13 (calls 3 / 4): LN
  // 40960 c2 smem 83.1 / 63.2 -> c4 t640 84.1 / 69.5; M = 4096: LN 98304 c4 smem 72.9 / 54.1 -> c8
  // t768 81.4 / 63.3, LN 131072 c8 pipe 78.9 / 57.3 -> c8 t1024 79.3 / 60.6, RMS 131072 c4 smem
  // 81.7 / 60.9 -> c8 t1024 92.2 / 72.3; (call 5, H200) LN / RMS 114688 c8 pipe 54.7 / 58.9 -> c8
  // t896 71.2 / 73.8, LN 81920 c4 smem 54.9 -> c8 t640 59.6. Below 640 threads they lost: 36864 c4
  // t576 (5 points on both), 73728 c8 t576 (LN 7 / 3, RMS 7 / 5); RMSNorm below 768 too (H200, call
  // 5: 40960 c4 t640 70.3, 45056 c4 t704 60.4, 81920 c8 t640 60.9 against c2 / c4 smem 78.9 / 76.5 /
  // 69.4), and LayerNorm at 704 (45056: 61.3 / 80.5 against c2 smem 61.4 / 81.5, calls 5 / 6).
  for (int c = 4; bulk && c <= std::min(max_cluster, kMaxPortableCluster); c *= 2) {
    BlockConfig many = b;
    many.cluster = c;
    many.cache = RowCache::kSharedPipelined;
    many.bulk_copy = true;
    many.threads_per_row = static_cast<int>(round_up((packs / c + 1) / 2, 32));
    // LayerNorm rows past 896 threads cannot hold gamma (kHoldGamma): a full CTA's ragged
    // segment measured faster (61440 c4 t960 63.1 / 76.0 against t1024 66.9 / 84.6 %, calls 5 / 6).
    if (s.has_bias && many.threads_per_row > kBulkRowMaxThreads && many.threads_per_row < kClusterThreads)
      many.threads_per_row = kClusterThreads;
    if (packs % c != 0 || packs / 2 <= 2 * kClusterThreads || many.threads_per_row > kClusterThreads) continue;
    if (odd_warp_pair(many.threads_per_row)) break;
    if (s.epilogue == Epilogue::kReluBitmask && (s.n / c) % 8 != 0) continue;
    const int min_threads = s.has_bias ? kDbetaClusterMinThreads : kRmsManyMinThreads;
    if (many.threads_per_row >= min_threads && pipe_fits(many) && !dbeta_sums_in_shared(s, many)) return many;
    break;
  }
  // A cluster shares the row: the fewest 1024-thread CTAs that hold it in shared memory at up to
  // 32 values per thread (with dbeta, past 16 its sums go to shared memory). 16 CTAs (non-portable)
  // only where 8 cannot hold the row and the segments are whole iterations (262144 with dbeta),
  // which took the split route: at most one 16-CTA cluster per GPC is resident (7-8 on an H100),
  // and wherever 8 CTAs fit they measured faster (bf16, H100, session 10: RMS 262144 78.5 % at c8
  // against 59.5-67.6 % at c16; LN / RMS 131072 78.7 / 82.5 % against 37-60 %). Ragged 16-CTA
  // segments (204800, 1.56 packs per thread) ran 1-2 points below the split route (calls 1-2).
  const int64_t per_thread = std::max<int64_t>(1, 32 / vec);
  b.threads_per_row = kClusterThreads;
  for (int c = 2; c <= max_cluster; c *= 2) {
    b.cluster = c;
    b.cache = RowCache::kShared;
    if (packs % c != 0 || packs / c > per_thread * kClusterThreads) continue;
    if (c > kMaxPortableCluster && (packs / c) % kClusterThreads != 0) continue;
    if (s.epilogue == Epilogue::kReluBitmask && (s.n / c) % 8 != 0) continue;
    // Pipelined segments may be ragged (RMS 40960, 2 x 1024 threads of 2.5 packs: 81.1 % against
    // 57.6 % split); one-buffer ones only whole iterations (ragged: 40-55 % at N = 20480-49152)...
    // ...except segments of 2-3 packs per thread in 2 or 4 CTAs: one buffer, ragged or not (bf16,
    // H100, session 7, against the pipelined picks: RMS 34816-45056 (2 CTAs, M = 32768) 79-85 ->
    // 89-92 % of copy, LN with the dbeta sums in shared memory 36864-45056 71-78 -> 81-83 % (against
    // 4 CTAs); M = 4096, 4 CTAs: RMS 73728-90112 68-72 -> 83-86 %, LN 73728-90112 61-72 -> 72-75 %.
    // At 3.5-3.75 packs it lost: 114688 by 9-11 points, RMS / LN 57344 by 6 / 10).
    const int64_t segment = packs / c;
    if (c <= 4 && segment > kOneBufferMinPacks * kClusterThreads && segment <= kOneBufferMaxPacks * kClusterThreads &&
        fits(b))
      return b;
    if (pipe_fits(b)) {
      b.cache = RowCache::kSharedPipelined;
      // 2-CTA rows by bulk copies: LN 32768 88.3 -> 89.2 % (H100), 71.1 -> 76.7 % (H200); LN 30720
      // 86.9 -> 85.9 % (H100; not measured on the H200). At 4 CTAs they lost on the H100 (LN / RMS
      // 61440, LN 65536: 1.7-2.1 points). 16-CTA rows, bf16, M = 4096, H100 (session 10, call 1):
      // LN 262144 55.8 % split -> 59.6 % cp.async, 64.6 % bulk copies (RMS 61.7 -> 67.6 %).
      b.bulk_copy = c == 2 || c == 16;
      return b;
    }
    if (fits(b) && (packs / c) % kClusterThreads == 0) return b;
  }
  return std::nullopt;
}

// Forward rows past registers (sm_90): one CTA's pipelined rows (two row buffers) up to this much
// shared memory. Against one buffer or streaming the row twice (bf16, H100, session 5): LN 40960
// 72.7 -> 86.9 %, 49152 83.9 -> 89.1 %; RMS 40960 86.2 -> 94.9 %, 49152 95.8 -> 95.1 %.
constexpr int64_t kForwardSharedBytes = 200 * 1024;
// Streaming measured faster at exactly this N for RMSNorm (LN / RMS 85.0 / 94.9 % against 70-81 %
// for 2- and 4-CTA clusters in shared memory and 76-88 % pipelined, H100, session 5); every other
// size past registers takes shared memory (unmeasured ones included). LayerNorm since session 13:
// 2 CTAs of 512 threads x 8 packs in shared memory, 72.8 / 90.7 -> 83.5 / 95.1 % (H200 / H100,
// calls 3 / 4), with 40 registers a CTA where the streaming row has 64.
constexpr int64_t kForwardStreamingN = 65536;
// LayerNorm's one-CTA shared-memory rows of 8 packs a thread (one buffer, 40 registers), taken in
// session 13 at 576-640 threads (36864-40960) and 896 (57344), gave way in session 14 to the
// register rows of forward_layernorm_long_register_row, which cover those sizes (bench/NOTES.md).
// LayerNorm's one-CTA shared-memory rows of 4 packs, against the register row (one CTA per SM at
// 85 registers), bf16, M = 32768, session 13, H200 / H100:
// 24576 t768 78.0 / 96.2 -> 91.8 / 100.1 %, 22528 t704 (calls 5 / 6) 72.0 / 92.8 -> 91.9 / 99.9; at
// 896 (28672) and 1024 (32768) registers stayed ahead (82.2 / 98.2 against 80.1 / 94.7 %; 83.0 /
// 100.0 against 75.4 / 90.4).
constexpr int64_t kForwardShared4MinThreads = 704;
constexpr int64_t kForwardShared4MaxThreads = 768;

// LayerNorm forward rows of 2-byte x past 32768 in registers, 16-byte packs: 1024 threads up to 6
// packs each (ragged allowed), then 8 packs a thread at 832-896 threads (64-72 registers; at 960
// threads AdaLayerNorm f16 with fp32 weights and the mask spilled 48 bytes). Against the shared
// and wide-register picks, bf16, M = 32768, session 14 (calls 8-10), H200 / H100: 36864 84.8 /
// 97.1 -> 88.1 / 99.4 %, 40960 87.1 / 95.4 -> 88.4 / 97.9, 45056 83.7 / 96.3 -> 84.7 / 97.4, 49152
// 82.0 / 94.4 -> 85.9 / 96.8, 53248 81.4 / 94.1 -> 81.9 / 95.6, 57344 78.7 / 92.2 -> 83.5 / 95.0.
constexpr int64_t kForwardLongRegisterMaxPacks1024 = 6;
constexpr int64_t kForwardLongRegisterPacks = 8;
constexpr int64_t kForwardLongRegisterMaxThreads = 896;

std::optional<BlockConfig> forward_layernorm_long_register_row(const Spec& s, int vec, int64_t packs) {
  if (s.norm == Norm::kRMSNorm || !sixteen_byte_packs(s, vec) || dtype_size(s.x_dtype) != 2) return std::nullopt;
  BlockConfig b;
  b.vec = vec;
  b.rows_per_cta = 1;
  b.cache = RowCache::kRegisters;
  if (packs <= 1024 * kForwardLongRegisterMaxPacks1024) {
    b.threads_per_row = 1024;
    return b;
  }
  const int64_t threads = round_up((packs + kForwardLongRegisterPacks - 1) / kForwardLongRegisterPacks, 32);
  if (threads > kForwardLongRegisterMaxThreads) return std::nullopt;
  b.threads_per_row = static_cast<int>(threads);
  return b;
}
// LayerNorm forward at exactly 32768 (2-byte x): 8-byte packs of 4 (8 a thread) where 16-byte
// packs of 8 (4 a thread) are the rule. H200 83.1 -> 94.0 / 94.2 % (calls 8, 10), H100 99.8 ->
// 98.6 (call 9). Not at 26624-30720 (8-byte packs 2.3-2.4 points lower on the H200, call 10).
constexpr int64_t kForwardHalfPackN = 32768;

// Past one CTA: a cluster whose CTAs take this much of the row each, 8 packs per thread
// (bf16, H100, session 5: N = 98304, 4 x 384 threads, LN / RMS 90.2 / 94.3 % against 72.4 / 79.3 %
// for one CTA; 131072 4 x 512: 88.0 / 98.0 %; 262144 8 x 512: 84.9 / 97.3 %).
constexpr int64_t kForwardClusterSegmentBytes = 64 * 1024;
constexpr int64_t kForwardClusterPacks = 8;
constexpr int64_t kForwardClusterSegmentBytesLayerNorm = 48 * 1024;

// Past 32 elements per thread in 16-byte packs, rows of 2-byte x stay in 1024 threads' registers
// as 8-byte packs of 4 elements, up to this many per thread; no spill at either bound (ptxas,
// sm_90). bf16, H100, session 7 (against the pipelined row or the 2-CTA shared row): RMS 36864-61440
// 94-95 -> 99.0-100.3 % of copy; LN 36864-49152 86.6-89.2 -> 92.5-95.4 %, but LN 53248 93.6 against
// 94.8 % and 57344 / 61440 82 against 90-91 %, so LayerNorm stops at 12.
constexpr int64_t kWideRegisterPacks = 15;
constexpr int64_t kWideRegisterPacksLayerNorm = 12;

// `vec`: the widest pack the caller's alignment allows.
std::optional<BlockConfig> forward_wide_register_row(const Spec& s, int vec) {
  constexpr int kVec = 4;
  // Whole iterations only: ragged rows (N = 33792, 8.25 packs) spilled 24-64 bytes.
  if (vec < kVec || dtype_size(s.x_dtype) != 2 || s.n % (kVec * 1024) != 0 || s.n == kForwardStreamingN)
    return std::nullopt;
  const int64_t per_thread = (s.n / kVec + 1023) / 1024;
  if (per_thread > (s.norm == Norm::kRMSNorm ? kWideRegisterPacks : kWideRegisterPacksLayerNorm)) return std::nullopt;
  BlockConfig b;
  b.vec = kVec;
  b.rows_per_cta = 1;
  b.threads_per_row = 1024;
  b.cache = RowCache::kRegisters;
  return b;
}

std::optional<BlockConfig> forward_large_row(const Spec& s, int vec, int64_t packs) {
  const bool pipelined = sixteen_byte_packs(s, vec);
  BlockConfig b;
  b.vec = vec;
  b.rows_per_cta = 1;
  // RMSNorm at 65536 in 16-byte packs: one CTA of 1024 threads, the row in 128 KB of shared memory
  // (one buffer). Against streaming, bf16, session 14 (calls 8-9): H200 90.4 -> 92.3 %, H100 94.6
  // -> 95.0.
  if (s.n == kForwardStreamingN && s.norm == Norm::kRMSNorm && pipelined && dtype_size(s.x_dtype) == 2) {
    b.threads_per_row = 1024;
    b.cache = RowCache::kShared;
    return b;
  }
  // RMSNorm rows of narrower packs (odd N) keep streaming below 65536, as measured before pipelining.
  if ((s.n == kForwardStreamingN && (s.norm == Norm::kRMSNorm || dtype_size(s.x_dtype) != 2)) ||
      (!pipelined && s.norm == Norm::kRMSNorm && s.n < kForwardStreamingN))
    return std::nullopt;
  b.threads_per_row = 1024;
  b.cache = pipelined ? RowCache::kSharedPipelined : RowCache::kShared;
  if (shared_row_bytes(s, b) <= kForwardSharedBytes) return b;
  b.cache = RowCache::kShared;
  // LayerNorm first tries smaller segments (it also reads beta): bf16, H100, session 7, M = 4096:
  // 114688 c4 t448 85.1 -> c8 t224 90.5 %, 131072 c4 t512 90.4 -> c8 t256 93.3 %; where the 4-CTA
  // segment stays within it (81920, 98304) the 8-CTA one lost a point.
  // Below 65536 the 2-CTA segments stay (53248-61440: 89-95 %, the 4-CTA ones not measured).
  const bool layernorm = s.norm != Norm::kRMSNorm && s.n > kForwardStreamingN;
  const int64_t limits[] = {kForwardClusterSegmentBytesLayerNorm, kForwardClusterSegmentBytes};
  for (int pass = layernorm ? 0 : 1; pass < 2; ++pass) {
    const int64_t limit = limits[pass];
    for (int c = 2; c <= kMaxPortableCluster; c *= 2) {
      b.cluster = c;
      if (packs % c != 0 || shared_row_bytes(s, b) > limit) continue;
      if (s.epilogue == Epilogue::kReluBitmask && (s.n / c) % 8 != 0) continue;
      const int64_t t = round_up((packs / c + kForwardClusterPacks - 1) / kForwardClusterPacks, 32);
      if (t > 1024) continue;
      b.threads_per_row = static_cast<int>(t);
      return b;
    }
  }
  return std::nullopt;
}

}  // namespace

Spec resolve(const Spec& spec, int max_vec, int sm, int max_cluster) {
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
    } else if (const auto large = packs > kBackwardMaxFusedThreads * per_thread && sm >= 90
                                      ? backward_large_row(s, b.vec, packs, max_cluster)
                                      : std::nullopt) {
      b = *large;
    } else {
      const int64_t want = (packs + per_thread - 1) / per_thread;
      b.rows_per_cta = 1;
      b.threads_per_row = want <= kBackwardMaxFusedThreads ? static_cast<int>((want + 31) / 32 * 32) : 1024;
      // Past the fused limit the row-sum pass streams the row with 1024 threads.
      if (want > kBackwardMaxFusedThreads) b.cache = RowCache::kGlobal;
      else if (dtype_size(s.x_dtype) == 2 && per_thread * b.vec == kBackwardElements) {
        // Rows of 2 packs per thread: pipelined, or filled by bulk copies, at the measured threads.
        if (sm >= 90 && sixteen_byte_packs(s, b.vec) && backward_bulk_register_row(s, b.threads_per_row)) {
          b.cache = RowCache::kSharedPipelined;
          b.stages = 3;
          b.bulk_copy = true;
        } else if (sm >= 80 && backward_pipe_register_row(s, b.threads_per_row)) {
          b.cache = RowCache::kSharedPipelined;
        }
      }
    }
  } else if (packs <= 32 * kWarpRowMaxPacks) {
    b.threads_per_row = 32;
    b.rows_per_cta = 4;
    b.cache = RowCache::kRegisters;
  } else {
    // Clusters only for rows past one CTA's shared memory: every clustered configuration measured
    // at N = 18432-65536 (2-8 CTAs of 128-1024 threads) ran below one CTA per row (bench/NOTES.md).
    const int64_t want = (packs + kCtaRowTargetPacks - 1) / kCtaRowTargetPacks;
    b.threads_per_row = static_cast<int>(std::min<int64_t>(1024, (want + 31) / 32 * 32));
    b.rows_per_cta = 1;
    // Register rows of 544-640 threads took 70-74 registers (LayerNorm) or 56 (RMSNorm past 576):
    // one CTA per SM (N = 18432 LayerNorm 80 % of copy, RMSNorm at 55 registers 100 %; 20480: 85 /
    // 96 %). Two CTAs per SM instead (bf16, H100): 512 threads of 5 whole packs in registers (the
    // generator caps 512-thread rows at 64 registers; 20480: 99.6 / 99.8 %). Between (19456), 512
    // threads in shared memory measured no better (LN 84.8 against 84.4 %; RMS 81.7 against 92.8 %).
    // LayerNorm rows of 544-576 threads took shared memory (56 registers) from session 7 to 13,
    // when their register rows took 70-74. Since session 11 the register row takes 46-52, so two
    // CTAs fit an SM there too: LN 18432 t576 90.5 -> 98.4 % on the H200, 100.3 -> 100.1 on the
    // H100, 17408 t544 99.8 -> 100.0 (H100; session 14, calls 3-5).
    const bool one_cta_row = dtype_size(s.x_dtype) <= 2 && want <= kTwoCtaMaxWant &&
                             want > (s.norm == Norm::kRMSNorm ? kRmsOneCtaMinThreads : kTwoCtaRowThreads);
    const bool two_cta_row = one_cta_row && packs == kTwoCtaRowThreads * kTwoCtaRowPacks;
    if (two_cta_row) b.threads_per_row = kTwoCtaRowThreads;
    const int64_t per_thread = (packs + b.threads_per_row - 1) / b.threads_per_row;
    // validate() caps a register row at 16 packs per thread (found by fuzzing: odd N in
    // (16384, 32768] took vec 1 and 32 single-element packs).
    const bool fits_registers =
        two_cta_row || (per_thread * b.vec <= kRegisterMaxElements && per_thread <= kMaxRegisterPacks);
    b.cache = fits_registers ? RowCache::kRegisters : RowCache::kGlobal;
    if (b.cache == RowCache::kRegisters && sm >= 90 && s.norm != Norm::kRMSNorm && dtype_size(s.x_dtype) == 2 &&
        sixteen_byte_packs(s, b.vec) && b.threads_per_row >= kForwardShared4MinThreads &&
        b.threads_per_row <= kForwardShared4MaxThreads)
      b.cache = RowCache::kShared;
    if (b.cache == RowCache::kRegisters && sm >= 90 && s.n == kForwardHalfPackN && s.norm != Norm::kRMSNorm &&
        dtype_size(s.x_dtype) == 2 && sixteen_byte_packs(s, b.vec) && b.threads_per_row == 1024)
      b.vec = 4;
    if (b.cache == RowCache::kGlobal && sm >= 90)
      if (const auto reg = forward_layernorm_long_register_row(s, b.vec, packs)) b = *reg;
    if (b.cache == RowCache::kGlobal && sm >= 90)
      if (const auto wide = forward_wide_register_row(s, b.vec)) b = *wide;
    if (b.cache == RowCache::kGlobal && sm >= 90)
      if (const auto large = forward_large_row(s, b.vec, packs)) b = *large;
  }
  s.block = b;
  validate(s);
  return s;
}

}  // namespace normjit
