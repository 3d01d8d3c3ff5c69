// Default block configuration for a spec: the measured picks of the GPU class's table
// (generator/picks/sm*.txt, embedded at build time), over a small rule-based fallback for the sizes
// and GPUs the tables do not cover. docs/picks.md describes the table; docs/perf-notes.md keeps
// the measurements behind its rows.
#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "generator/embedded.hpp"
#include "generator/pick_table.hpp"
#include "normjit/error.hpp"
#include "normjit/spec.hpp"

namespace normjit {
using detail::PickTable;
using detail::TableBlock;
using detail::TableRow;
namespace {

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The fallback, for any GPU and N: a power-of-two group of lanes per row for tiny rows, then warp
// rows, then a CTA per row with the row in registers, and past registers the streamed forward row
// (gmem) or the split backward route. The backward keeps x, dy and two fp32 sums per element, so
// it holds 16 values a thread where the forward holds 32.
BlockConfig fallback(const Spec& s, int vec) {
  BlockConfig b;
  b.vec = vec;
  b.rows_per_cta = 1;
  b.cache = RowCache::kRegisters;
  const int64_t packs = s.n / vec;
  if (packs <= 32) {
    b.threads_per_row = next_pow2(packs);
    b.rows_per_cta = 256 / b.threads_per_row;
    return b;
  }
  if (s.phase == Phase::kBackward) {
    const int64_t per_thread = std::max<int64_t>(1, 16 / vec);
    // Warp rows, 8 per CTA, up to 4 packs a lane: 8x fewer dgamma partial rows than CTA rows.
    if (packs <= 32 * std::max<int64_t>(per_thread, 4)) {
      b.threads_per_row = 32;
      b.rows_per_cta = 8;
      return b;
    }
    const int64_t want = (packs + per_thread - 1) / per_thread;
    // 16 values a thread at 512 threads fill the 128 registers a thread has there.
    if (want <= 512) {
      b.threads_per_row = static_cast<int>(round_up(want, 32));
    } else {
      b.threads_per_row = 1024;
      b.cache = RowCache::kGlobal;
    }
    return b;
  }
  if (packs <= 32 * 4) {
    b.threads_per_row = 32;
    b.rows_per_cta = 4;
    return b;
  }
  // A CTA row aims for 4 packs a thread: loads in flight without crowding out CTAs per SM.
  b.threads_per_row = static_cast<int>(std::min<int64_t>(1024, round_up((packs + 3) / 4, 32)));
  const int64_t per_thread = (packs + b.threads_per_row - 1) / b.threads_per_row;
  // 32 values a thread is the most a 1024-thread row holds in its 64 registers without spilling.
  if (per_thread * vec > 32 || per_thread > kMaxRegisterPacks) b.cache = RowCache::kGlobal;
  return b;
}

[[noreturn]] void bad_table(const std::string& name, int line, const std::string& why) {
  throw Error(Status::kInvalidSpec, "pick table " + name + ":" + std::to_string(line) + ": " + why);
}

std::optional<int64_t> to_int(std::string_view t) {
  if (t.empty() || t.size() > 9) return std::nullopt;
  int64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// "t1024_r1_v8_c2_tma@even" or "p8_r1_v8_c4_smem@ragged": a spec's cfg_ suffix, with p<K> allowed.
TableBlock parse_block(const std::string& name, int line, std::string_view text) {
  TableBlock tb;
  if (const size_t at = text.find('@'); at != std::string_view::npos) {
    std::string_view flags = text.substr(at);
    text = text.substr(0, at);
    while (!flags.empty()) {
      const size_t next = flags.find('@', 1);
      const std::string_view flag = flags.substr(0, next);
      if (flag == "@even") tb.even_only = true;
      else if (flag == "@ragged") tb.ragged = true;
      else if (flag == "@warps4") tb.whole_warp_groups = true;
      else bad_table(name, line, "unknown block flag '" + std::string(flag) + "'");
      flags = next == std::string_view::npos ? std::string_view{} : flags.substr(next);
    }
  }
  if (text.size() < 2 || (text[0] != 't' && text[0] != 'p'))
    bad_table(name, line, "block '" + std::string(text) + "' must start with t<threads> or p<packs per thread>");
  const bool by_packs = text[0] == 'p';
  const size_t sep = text.find('_');
  const auto lead = to_int(text.substr(1, sep == std::string_view::npos ? sep : sep - 1));
  if (!lead || *lead < 1 || sep == std::string_view::npos) bad_table(name, line, "bad block '" + std::string(text) + "'");
  // The rest parses as a spec's block config; the thread count is a placeholder for p<K>.
  try {
    tb.block = parse_block_config("cfg_t" + std::to_string(by_packs ? 32 : *lead) + std::string(text.substr(sep)));
  } catch (const Error& e) {
    bad_table(name, line, "bad block '" + std::string(text) + "': " + e.what());
  }
  if (by_packs) tb.packs_per_thread = static_cast<int>(*lead);
  if (tb.even_only && by_packs) bad_table(name, line, "@even needs a fixed thread count (t<T>)");
  if (tb.whole_warp_groups && !by_packs) bad_table(name, line, "@warps4 needs a thread count from packs (p<K>)");
  if (tb.ragged && (tb.block.cluster < 2 || (tb.block.cache != RowCache::kShared && tb.block.cache != RowCache::kRegisters &&
                                              !(tb.block.cache == RowCache::kSharedPipelined && tb.block.bulk_copy))))
    bad_table(name, line, "@ragged needs a cluster (c<C>) of rows in registers, smem or tma (the backward's)");
  return tb;
}

}  // namespace

PickTable detail::parse_pick_table(std::string_view name, std::string_view text) {
  PickTable t;
  t.name = std::string(name);
  int line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string_view> f;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && line[i] == ' ') ++i;
      const size_t j = std::min(line.find(' ', i), line.size());
      if (j > i) f.push_back(line.substr(i, j - i));
      i = j;
    }
    if (f.empty()) continue;
    if (f.size() < 8) bad_table(t.name, line_no, "expected: phase norm bias x vec n_from n_to block [| block ...]");
    TableRow r;
    std::string_view phase = f[0];
    constexpr std::string_view kQuant = "+quant";
    if (phase.size() > kQuant.size() && phase.substr(phase.size() - kQuant.size()) == kQuant) {
      r.quant_only = true;
      phase.remove_suffix(kQuant.size());
    }
    if (phase != "fwd" && phase != "bwd" && phase != "bwd+residual" && phase != "fwd+residual_f32" &&
        phase != "bwd+residual_f32")
      bad_table(t.name, line_no,
                "phase must be fwd, bwd, bwd+residual, fwd+residual_f32 or bwd+residual_f32, with +quant for "
                "the forward's, not '" + std::string(f[0]) + "'");
    r.backward = phase.substr(0, 3) == "bwd";
    if (r.quant_only && r.backward)
      bad_table(t.name, line_no, "+quant names quantized outputs, a forward's: not '" + std::string(f[0]) + "'");
    r.residual_only = phase == "bwd+residual";
    r.stream_f32_only = phase == "fwd+residual_f32" || phase == "bwd+residual_f32";
    if (f[1] == "layernorm") r.norm = Norm::kLayerNorm;
    else if (f[1] == "rmsnorm") r.norm = Norm::kRMSNorm;
    else if (f[1] != "*") bad_table(t.name, line_no, "norm must be layernorm, rmsnorm or *, not '" + std::string(f[1]) + "'");
    if (f[2] == "bias") r.has_bias = true;
    else if (f[2] == "-") r.has_bias = false;
    else if (f[2] != "*") bad_table(t.name, line_no, "bias must be bias, - or *, not '" + std::string(f[2]) + "'");
    if (f[3] != "x2" && f[3] != "x4") bad_table(t.name, line_no, "x must be x2 or x4, not '" + std::string(f[3]) + "'");
    r.x_bytes = f[3][1] - '0';
    const auto vec = f[4].size() > 1 && f[4][0] == 'v' ? to_int(f[4].substr(1)) : std::nullopt;
    if (!vec || (*vec != 1 && *vec != 2 && *vec != 4 && *vec != 8))
      bad_table(t.name, line_no, "vec must be v1, v2, v4 or v8, not '" + std::string(f[4]) + "'");
    r.vec = static_cast<int>(*vec);
    const auto from = to_int(f[5]), to = to_int(f[6]);
    if (!from || !to || *from < 1 || *to < *from || *to > kMaxHiddenSize)
      bad_table(t.name, line_no, "bad range " + std::string(f[5]) + ".." + std::string(f[6]));
    r.n_from = *from;
    r.n_to = *to;
    for (size_t i = 7; i < f.size(); ++i) {
      if (i > 7) {
        if (f[i] != "|" || i + 1 >= f.size()) bad_table(t.name, line_no, "blocks are separated by ' | '");
        ++i;
      }
      r.blocks.push_back(parse_block(t.name, line_no, f[i]));
    }
    t.rows.push_back(std::move(r));
  }
  return t;
}

const PickTable* detail::pick_table_for_sm(int sm) {
  static std::once_flag once;
  static std::vector<PickTable> tables;
  std::call_once(once, [] {
    for (const auto& f : detail::embedded_pick_tables()) tables.push_back(parse_pick_table(f.path, f.contents));
  });
  // sm_90 and newer share the Hopper table; sm_80-89 the Ampere/Ada one.
  const std::string want = sm >= 90 ? "sm90.txt" : "sm80.txt";
  for (const PickTable& t : tables)
    if (t.name == want) return &t;
  return nullptr;
}

namespace {

bool row_holds(const TableRow& r, const Spec& s, int vec) {
  const Norm norm = base_norm(s.norm);
  return r.backward == (s.phase == Phase::kBackward) && (!r.residual_only || s.residual) &&
         (!r.stream_f32_only || s.residual_f32) && (!r.quant_only || quantizes(s.epilogue)) &&
         (!r.norm || *r.norm == norm) &&
         (!r.has_bias || *r.has_bias == s.has_bias) && r.x_bytes == dtype_size(row_dtype(s)) && r.vec == vec &&
         s.n >= r.n_from && s.n <= r.n_to;
}

}  // namespace

std::optional<BlockConfig> detail::apply_pick_block(const TableBlock& tb, const Spec& s, int max_cluster) {
  BlockConfig b = tb.block;
  if (b.cluster > max_cluster || s.n % b.vec != 0) return std::nullopt;
  const int64_t segment = segment_packs(s, b);
  if (ragged_segments(s, b) && (!tb.ragged || last_segment_packs(s, b) < 1)) return std::nullopt;
  // The backward's @ragged blocks with an epilogue (gelu, relu_bitmask: f16 x, fp32 weights)
  // spilled 8-88 B at the top of their rows: those specs keep the rows before them, or the split route.
  if (tb.ragged && s.phase == Phase::kBackward && s.epilogue != Epilogue::kNone) return std::nullopt;
  if (!segments_hold_whole_epilogue_units(s, b)) return std::nullopt;
  if (tb.packs_per_thread > 0)
    b.threads_per_row = static_cast<int>(round_up((segment + tb.packs_per_thread - 1) / tb.packs_per_thread,
                                                  tb.whole_warp_groups ? 128 : 32));
  if (b.threads_per_row > 1024) return std::nullopt;  // p<K> past a CTA: the next alternative
  if (tb.even_only && segment % b.threads_per_row != 0) return std::nullopt;
  if (scales_per_block(s.epilogue) && b.threads_per_row * b.vec % scale_block_size(s.epilogue) != 0) return std::nullopt;
  // A shared-memory row past a CTA's shared memory (a ragged backward row with its dbeta sums
  // there, near the top of its range): the next alternative.
  if (in_shared_memory(b.cache) && shared_row_bytes(s, b) > kMaxSharedRowBytes) return std::nullopt;
  return b;
}

Spec resolve(const Spec& spec, int max_vec, int sm, int max_cluster) {
  validate(spec);
  if (spec.block) return spec;
  Spec s = spec;
  // An fp32 residual stream's rows are f32: f32 picks, at most 4 elements a pack.
  int vec = std::min(16 / dtype_size(row_dtype(s)), std::max(1, max_vec));
  while (vec > 1 && s.n % vec != 0) vec /= 2;
  std::optional<BlockConfig> picked;
  const PickTable* table = detail::pick_table_for_sm(sm);
  if (table)
    for (const TableRow& r : table->rows) {
      if (!row_holds(r, s, vec)) continue;
      for (const TableBlock& tb : r.blocks)
        if ((picked = detail::apply_pick_block(tb, s, max_cluster))) break;
      break;
    }
  s.block = picked ? *picked : fallback(s, vec);
  if (scales_per_block(s.epilogue) && s.block->threads_per_row * s.block->vec < scale_block_size(s.epilogue)) {
    // A block's 32 (NVFP4: 16) values in one pass of the row's lanes: at least block / vec lanes a row.
    s.block->threads_per_row = scale_block_size(s.epilogue) / s.block->vec;
    s.block->rows_per_cta = std::max(1, 256 / s.block->threads_per_row);
  }
  if (s.residual && s.phase != Phase::kBackward && s.block->cache == RowCache::kSharedPipelined) {
    // The pipelined rows copy only x into their buffers: the same row, held once in shared memory.
    s.block->cache = RowCache::kShared;
    s.block->stages = 2;
    s.block->bulk_copy = false;
  }
  // Bulk copies move x and dy as one type; an fp32 stream's rows take the per-thread copies.
  if (s.residual_f32 && s.block->bulk_copy) {
    s.block->bulk_copy = false;
    s.block->producer_warp = false;
    s.block->stages = std::min(s.block->stages, kMaxPipeStages);
  }
  try {
    validate(s);
  } catch (const Error& e) {
    throw Error(Status::kInvalidSpec, "the heuristic picked an invalid block config for " + s.str() +
                                       (table ? " (pick table " + table->name + ")" : "") + ": " + e.what());
  }
  return s;
}

}  // namespace normjit
