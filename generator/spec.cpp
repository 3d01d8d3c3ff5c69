#include <algorithm>
#include <charconv>
#include <vector>

#include "normjit/error.hpp"
#include "normjit/spec.hpp"

namespace normjit {

const char* to_string(Status s) {
  switch (s) {
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kInvalidSpec: return "invalid spec";
    case Status::kNotSupported: return "not supported";
    case Status::kCompileFailed: return "compile failed";
    case Status::kDriverUnavailable: return "CUDA driver unavailable";
    case Status::kCudaError: return "CUDA error";
    case Status::kCacheError: return "cache error";
  }
  return "unknown status";
}

namespace {

template <class E>
struct Named {
  E value;
  const char* name;
};

constexpr Named<Norm> kNorms[] = {
    {Norm::kLayerNorm, "layernorm"},
    {Norm::kRMSNorm, "rmsnorm"},
    {Norm::kAdaLayerNorm, "adalayernorm"},
    {Norm::kAdaRMSNorm, "adarmsnorm"}};
constexpr Named<Phase> kPhases[] = {
    {Phase::kForwardTraining, "fwd_train"}, {Phase::kForwardInference, "fwd_infer"}, {Phase::kBackward, "bwd"}};
constexpr Named<DType> kDTypes[] = {{DType::kF32, "f32"}, {DType::kF16, "f16"}, {DType::kBF16, "bf16"}};
// The epilogue table: one row per epilogue. "none" is never printed in a spec string.
constexpr Named<Epilogue> kEpilogues[] = {
    {Epilogue::kNone, "none"},         {Epilogue::kReluBitmask, "relu_bitmask"}, {Epilogue::kGelu, "gelu"},
    {Epilogue::kFp8E4M3, "fp8_e4m3"}, {Epilogue::kFp8E5M2, "fp8_e5m2"}, {Epilogue::kFp8E4M3Row, "fp8_e4m3_row"},
    {Epilogue::kFp8E5M2Row, "fp8_e5m2_row"}, {Epilogue::kInt8Row, "int8_row"}, {Epilogue::kMxfp8E4M3, "mxfp8_e4m3"},
    {Epilogue::kMxfp8E5M2, "mxfp8_e5m2"}, {Epilogue::kMxfp4, "mxfp4"}, {Epilogue::kNvfp4, "nvfp4"}};
constexpr Named<RowCache> kRowCaches[] = {
    {RowCache::kRegisters, "reg"}, {RowCache::kGlobal, "gmem"}, {RowCache::kShared, "smem"},
    {RowCache::kSharedPipelined, "pipe"}};

template <class E, size_t K>
const char* name_of(const Named<E> (&table)[K], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <class E, size_t K>
std::optional<E> lookup(const Named<E> (&table)[K], std::string_view s) {
  for (const auto& e : table)
    if (s == e.name) return e.value;
  return std::nullopt;
}

template <class E, size_t K>
std::string choices(const Named<E> (&table)[K]) {
  std::string out;
  for (const auto& e : table) out += (out.empty() ? "" : "|") + std::string(e.name);
  return out;
}

[[noreturn]] void bad_spec(std::string_view text, const std::string& why) {
  throw Error(Status::kInvalidSpec, "'" + std::string(text) + "': " + why);
}

std::optional<int64_t> parse_int(std::string_view s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

const char* to_string(Norm v) { return name_of(kNorms, v); }
const char* to_string(Phase v) { return name_of(kPhases, v); }
const char* to_string(DType v) { return name_of(kDTypes, v); }
const char* to_string(Epilogue v) { return name_of(kEpilogues, v); }
const char* to_string(RowCache v) { return name_of(kRowCaches, v); }

int dtype_size(DType d) { return d == DType::kF32 ? 4 : 2; }

bool dbeta_sums_in_shared(const Spec& s, const BlockConfig& b) {
  if (s.phase != Phase::kBackward || !s.has_bias || !in_shared_memory(b.cache) || b.threads_per_row < 1 ||
      b.vec < 1 || b.cluster < 1)
    return false;
  const int64_t packs = segment_packs(s, b);  // the rounded-up share of a ragged cluster
  const int64_t values = (packs + b.threads_per_row - 1) / b.threads_per_row * b.vec;
  // The residual's dh_out, read as dx is written, and a memory_efficient row's beta, read to recover
  // x̂, need registers too: 8 fewer values each before the move (both spilled at 768-1024 threads;
  // memory_efficient rows with beta in the xhat table spilled without it too).
  return values > (b.threads_per_row > 768 ? 16 : 24) - (s.residual ? 8 : 0) - (s.memory_efficient ? 8 : 0);
}

bool bulk_copies_dh_out(const Spec& s, const BlockConfig& b) {
  // Rows of 3072 values or fewer lost with it (H200, LN + residual, M = 32768: 1544-3072 0.93-0.99x,
  // 3592-5120 1.03-1.18x): three rows a buffer leave fewer of their CTAs on an SM. CTAs of 1024
  // threads (64 registers) spilled 8 B with it (RMS 65536 c4, 262144 c16).
  if (s.phase != Phase::kBackward || !s.residual || s.memory_efficient || !b.bulk_copy || b.producer_warp ||
      b.cache != RowCache::kSharedPipelined || b.threads_per_row < 1 || b.threads_per_row >= 1024 || b.vec < 1 ||
      b.cluster < 1 || s.n <= 3072)
    return false;
  const int64_t segment = segment_packs(s, b) * b.vec;
  return segment * (b.stages * 3 * dtype_size(row_dtype(s)) + (dbeta_sums_in_shared(s, b) ? 4 : 0)) <=
         kMaxSharedRowBytes;
}

namespace {
// Row buffers and dbeta sums of a backward shared-memory row.
int64_t backward_row_bytes(const Spec& s, const BlockConfig& b) {
  const int64_t buffers = b.cache == RowCache::kSharedPipelined ? b.stages : 1;
  // An fp32 residual stream's backward keeps dy in a slot of x's (f32) size.
  const int64_t segment = segment_packs(s, b) * b.vec;  // a ragged cluster's rounded-up share
  const int64_t arrays = bulk_copies_dh_out(s, b) ? 3 : 2;  // x, dy (and dh_out)
  return segment * (buffers * arrays * dtype_size(row_dtype(s)) + (dbeta_sums_in_shared(s, b) ? 4 : 0));
}
}  // namespace

XhatTable xhat_table(const Spec& s, const BlockConfig& b) {
  XhatTable t;
  if (!s.memory_efficient || s.phase != Phase::kBackward || b.cache == RowCache::kGlobal || b.threads_per_row < 1 ||
      b.rows_per_cta < 1 || b.vec < 1 || b.cluster < 1)
    return t;
  const int64_t segment = segment_packs(s, b) * b.vec;
  const int64_t threads = int64_t{b.threads_per_row} * b.rows_per_cta;
  // CTAs per SM as the registers allow: the fused rows take up to about 80 a thread with beta, 64
  // without. A table that cost one (LN 4096 t256 with fp32 beta: 3 to 2, RMS 8192 t512: 2 to 1)
  // would cost more than it saves.
  const int64_t registers = s.has_bias ? 80 : 64;
  const int64_t ctas = std::clamp<int64_t>(65536 / (registers * threads), 1, std::max<int64_t>(1, 2048 / threads));
  const int64_t budget = std::min(kMaxSharedRowBytes, kSharedBytesPerSm / ctas - kSharedReservePerCta);
  int64_t bytes = (in_shared_memory(b.cache) ? backward_row_bytes(s, b) : 0) + segment * 4;
  // Sub-warp and warp rows fold their sums through static shared memory at the end.
  if (b.rows_per_cta > 1) bytes += threads / 32 * segment * 4;
  t.reciprocal = bytes <= budget;
  t.beta = t.reciprocal && s.has_bias && bytes + segment * dtype_size(s.w_dtype) <= budget;
  return t;
}

int64_t xhat_table_bytes(const Spec& s, const BlockConfig& b) {
  const XhatTable t = xhat_table(s, b);
  const int64_t segment = segment_packs(s, b) * b.vec;
  return (t.reciprocal ? segment * 4 : 0) + (t.beta ? segment * dtype_size(s.w_dtype) : 0);
}

int64_t segment_packs(const Spec& s, const BlockConfig& b) {
  if (b.vec < 1 || b.cluster < 1) return 0;
  int64_t share = (s.n / b.vec + b.cluster - 1) / b.cluster;
  // Block-scaled outputs: every CTA's segment but the last whole scale blocks, rounded up.
  if (b.cluster > 1 && scales_per_block(s.epilogue) && scale_block_size(s.epilogue) % b.vec == 0) {
    const int64_t unit = scale_block_size(s.epilogue) / b.vec;
    share = (share + unit - 1) / unit * unit;
  }
  return share;
}

int64_t last_segment_packs(const Spec& s, const BlockConfig& b) {
  if (b.vec < 1 || b.cluster < 1) return 0;
  return s.n / b.vec - (b.cluster - 1) * segment_packs(s, b);
}

bool ragged_segments(const Spec& s, const BlockConfig& b) {
  return b.vec >= 1 && b.cluster > 1 && segment_packs(s, b) * b.cluster != s.n / b.vec;
}

bool segments_hold_whole_epilogue_units(const Spec& s, const BlockConfig& b) {
  if (b.cluster <= 1) return true;
  const int64_t segment = segment_packs(s, b) * b.vec;
  if (s.epilogue == Epilogue::kReluBitmask && segment % 8 != 0) return false;
  return !scales_per_block(s.epilogue) || segment % scale_block_size(s.epilogue) == 0;
}

int64_t shared_row_bytes(const Spec& s, const BlockConfig& b) {
  const int64_t segment = segment_packs(s, b) * b.vec;
  const int64_t buffers = b.cache == RowCache::kSharedPipelined ? b.stages : 1;
  if (s.phase != Phase::kBackward) return buffers * segment * dtype_size(row_dtype(s));
  return backward_row_bytes(s, b) + (in_shared_memory(b.cache) ? xhat_table_bytes(s, b) : 0);
}

Spec Spec::make(Norm norm, Phase phase, DType x, int64_t n, bool has_bias) {
  Spec s;
  s.norm = norm;
  s.phase = phase;
  s.x_dtype = x;
  s.w_dtype = x;
  s.n = n;
  s.has_bias = has_bias;
  return s;
}

bool Spec::operator==(const Spec& o) const {
  return norm == o.norm && phase == o.phase && x_dtype == o.x_dtype && w_dtype == o.w_dtype && n == o.n &&
         has_bias == o.has_bias && zero_centered == o.zero_centered && residual == o.residual &&
         residual_f32 == o.residual_f32 && bias_in == o.bias_in && memory_efficient == o.memory_efficient && epilogue == o.epilogue && block == o.block;
}

namespace {
// A block config's row cache as spelled: ws and tma are pipelined rows filled by bulk copies.
std::string row_cache_spelling(const BlockConfig& b) {
  return b.producer_warp ? "ws" : b.bulk_copy ? "tma" : to_string(b.cache);
}
}  // namespace

std::string Spec::str() const {
  std::string s = std::string(to_string(norm)) + "." + to_string(phase) + "." + to_string(x_dtype) + ".w_" +
                  to_string(w_dtype) + ".n" + std::to_string(n);
  if (has_bias) s += ".bias";
  if (zero_centered) s += ".zero_centered";
  if (residual) s += residual_f32 ? ".residual_f32" : ".residual";
  if (bias_in) s += ".bias_in";
  if (memory_efficient) s += ".memory_efficient";
  if (epilogue != Epilogue::kNone) s += std::string(".") + to_string(epilogue);
  if (block) {
    s += ".cfg_t" + std::to_string(block->threads_per_row) + "_r" + std::to_string(block->rows_per_cta) + "_v" +
         std::to_string(block->vec) + (block->cluster > 1 ? "_c" + std::to_string(block->cluster) : "") + "_" +
         row_cache_spelling(*block);
    if (block->cache == RowCache::kSharedPipelined && block->stages != 2) s += std::to_string(block->stages);
  }
  return s;
}

static BlockConfig parse_block_token(std::string_view text, std::string_view token) {
  // cfg_t<T>_r<R>_v<V>[_c<C>]_<cache>
  std::string_view c = token;
  BlockConfig b;
  auto field = [&](char tag) -> int64_t {
    if (c.size() < 2 || c[0] != '_' || c[1] != tag)
      bad_spec(text, std::string("block config '") + std::string(token) + "' lacks _" + tag + "<int>");
    size_t end = c.find('_', 2);
    auto v = parse_int(c.substr(2, end == std::string_view::npos ? end : end - 2));
    if (!v || *v > (1 << 20)) bad_spec(text, std::string("block config field ") + tag + " is not a small integer");
    c = end == std::string_view::npos ? std::string_view{} : c.substr(end);
    return *v;
  };
  c = c.substr(3);
  b.threads_per_row = static_cast<int>(field('t'));
  b.rows_per_cta = static_cast<int>(field('r'));
  b.vec = static_cast<int>(field('v'));
  if (c.size() > 2 && c[1] == 'c' && c[2] >= '0' && c[2] <= '9') b.cluster = static_cast<int>(field('c'));
  std::string_view cache_name = c.size() > 1 ? c.substr(1) : std::string_view{};
  // tma, tma3, tma4: a pipelined row filled by bulk copies; otherwise spelled like pipe.
  std::string pipe_name;
  if (cache_name.substr(0, 2) == "ws") {  // ws, ws3 ... ws8: tma with a producer warp
    b.bulk_copy = true;
    b.producer_warp = true;
    pipe_name = "pipe" + std::string(cache_name.substr(2));
    cache_name = pipe_name;
  } else if (cache_name.substr(0, 3) == "tma") {
    b.bulk_copy = true;
    pipe_name = "pipe" + std::string(cache_name.substr(3));
    cache_name = pipe_name;
  }
  // pipe3 / pipe4: a pipelined row with that many buffers (plain pipe: 2).
  if (cache_name.size() == 5 && cache_name.substr(0, 4) == "pipe" && cache_name[4] >= '0' && cache_name[4] <= '9') {
    b.stages = cache_name[4] - '0';
    cache_name = cache_name.substr(0, 4);
    if (b.stages == 2) {
      const char* plain = b.producer_warp ? "ws" : b.bulk_copy ? "tma" : "pipe";
      bad_spec(text, std::string("a 2-buffer pipelined row is spelled '") + plain + "', not '" + plain + "2'");
    }
  }
  auto cache = cache_name.empty() ? std::nullopt : lookup(kRowCaches, cache_name);
  if (!cache)
    bad_spec(text, "block config row cache must be one of " + choices(kRowCaches) +
                       "|tma|ws (pipe3, pipe4, tma3, tma4, ws3 ... ws8: more buffers)");
  b.cache = *cache;
  return b;
}

Spec Spec::parse(std::string_view text) {
  std::vector<std::string_view> tokens;
  for (size_t start = 0;;) {
    const size_t dot = text.find('.', start);
    tokens.push_back(text.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (tokens.size() < 4) bad_spec(text, "expected <norm>.<phase>.<dtype>[.w_<dtype>].n<N>[.bias][.<epilogue>][.cfg_...]");
  Spec s;
  auto norm = lookup(kNorms, tokens[0]);
  if (!norm) bad_spec(text, "unknown norm '" + std::string(tokens[0]) + "' (expected " + choices(kNorms) + ")");
  auto phase = lookup(kPhases, tokens[1]);
  if (!phase) bad_spec(text, "unknown phase '" + std::string(tokens[1]) + "' (expected " + choices(kPhases) + ")");
  auto x = lookup(kDTypes, tokens[2]);
  if (!x) bad_spec(text, "unknown x dtype '" + std::string(tokens[2]) + "' (expected " + choices(kDTypes) + ")");
  s.norm = *norm;
  s.phase = *phase;
  s.x_dtype = s.w_dtype = *x;

  size_t i = 3;
  if (tokens[i].substr(0, 2) == "w_") {
    auto w = lookup(kDTypes, tokens[i].substr(2));
    if (!w) bad_spec(text, "unknown weight dtype '" + std::string(tokens[i]) + "' (expected w_" + choices(kDTypes) + ")");
    s.w_dtype = *w;
    ++i;
  }
  if (i >= tokens.size() || tokens[i].empty() || tokens[i][0] != 'n')
    bad_spec(text, "missing hidden size token n<N>");
  auto n = parse_int(tokens[i].substr(1));
  if (!n) bad_spec(text, "hidden size '" + std::string(tokens[i]) + "' is not n<integer>");
  s.n = *n;
  ++i;
  // Optional flags, each at most once and in this order.
  const std::pair<const char*, bool*> flags[] = {
      {"bias", &s.has_bias},         {"zero_centered", &s.zero_centered}, {"residual", &s.residual},
      {"residual_f32", &s.residual_f32}, {"bias_in", &s.bias_in},      {"memory_efficient", &s.memory_efficient}};
  for (const auto& [name, flag] : flags)
    if (i < tokens.size() && tokens[i] == name) {
      *flag = true;
      ++i;
    }
  // .residual_f32 is the residual add with an fp32 stream: one token, never both.
  if (s.residual && s.residual_f32) bad_spec(text, "give .residual or .residual_f32, not both");
  if (s.residual_f32) s.residual = true;
  if (i < tokens.size() && tokens[i].substr(0, 4) != "cfg_") {
    auto ep = lookup(kEpilogues, tokens[i]);
    if (!ep || *ep == Epilogue::kNone)
      bad_spec(text, "unknown token '" + std::string(tokens[i]) +
                         "' (expected, in this order: bias, zero_centered, residual or residual_f32, bias_in, "
                         "memory_efficient, an epilogue (" +
                         choices(kEpilogues).substr(5) + "), cfg_...)");
    s.epilogue = *ep;
    ++i;
  }
  if (i < tokens.size() && tokens[i].substr(0, 4) == "cfg_") {
    s.block = parse_block_token(text, tokens[i]);
    ++i;
  }
  if (i != tokens.size()) bad_spec(text, "unexpected trailing token '" + std::string(tokens[i]) + "'");
  validate(s);
  return s;
}

BlockConfig parse_block_config(std::string_view text) {
  if (text.substr(0, 4) != "cfg_") bad_spec(text, "a block config starts with cfg_");
  return parse_block_token(text, text);
}

void validate(const Spec& s) {
  // Built only on failure: validate() runs on every Runtime::get().
  auto where = [&s] { return "spec '" + s.str() + "': "; };
  if (quantizes(s.epilogue) && s.phase == Phase::kBackward)
    throw Error(Status::kInvalidSpec, where() + "epilogue " + to_string(s.epilogue) +
                                          " has no backward: the gradient of a quantized output is the plain "
                                          "norm's (its spec without the epilogue)");
  if (s.memory_efficient && s.phase != Phase::kBackward)
    throw Error(Status::kInvalidSpec, where() + "memory_efficient applies to the backward (it reads the forward's y "
                                          "instead of x); phase " + to_string(s.phase) + " has none");
  if (s.memory_efficient && s.epilogue != Epilogue::kNone)
    throw Error(Status::kInvalidSpec, where() + "memory_efficient recovers x̂ from y, which epilogue " +
                                          to_string(s.epilogue) + " does not leave invertible; use the backward "
                                          "that reads x");
  if (s.residual_f32 && !s.residual)
    throw Error(Status::kInvalidSpec, where() + "residual_f32 is the residual add's fp32 stream; set residual too");
  if (s.residual_f32 && s.x_dtype == DType::kF32)
    throw Error(Status::kInvalidSpec, where() + "residual_f32 with x dtype f32: the stream is x's dtype already; "
                                          "use .residual");
  if (s.residual_f32 && s.memory_efficient)
    throw Error(Status::kInvalidSpec, where() + "memory_efficient with residual_f32 is not supported: the "
                                          "backward would read y in x's dtype where its rows are fp32");
  if (s.bias_in && !s.residual)
    throw Error(Status::kInvalidSpec, where() + "bias_in is added with the residual; it needs .residual or "
                                          ".residual_f32");
  if (s.bias_in && s.phase == Phase::kBackward)
    throw Error(Status::kInvalidSpec, where() + "bias_in is forward only: the backward does not read it, and its "
                                          "gradient is the column sum of dx (use the backward spec without it)");
  if (s.n < 1 || s.n > kMaxHiddenSize)
    throw Error(Status::kInvalidSpec, where() + "n=" + std::to_string(s.n) + " is outside [1, " +
                                          std::to_string(kMaxHiddenSize) + "]");
  if (packs_fp4(s.epilogue) && s.n % 2 != 0)
    throw Error(Status::kInvalidSpec, where() + "n=" + std::to_string(s.n) + " must be even for " +
                                          to_string(s.epilogue) + ": two e2m1 codes share a byte");
  if (!s.block) return;
  const BlockConfig& b = *s.block;
  const int max_vec = 16 / dtype_size(row_dtype(s));
  if (!is_pow2(b.vec) || b.vec > max_vec || s.n % b.vec != 0)
    throw Error(Status::kInvalidSpec, where() + "vec=" + std::to_string(b.vec) + " must be a power of two <= " +
                                          std::to_string(max_vec) + " that divides n");
  const bool sub_warp = b.threads_per_row <= 32;
  if (b.threads_per_row < 1 || b.threads_per_row > 1024 || (sub_warp && !is_pow2(b.threads_per_row)) ||
      (!sub_warp && b.threads_per_row % 32 != 0))
    throw Error(Status::kInvalidSpec, where() + "threads_per_row=" + std::to_string(b.threads_per_row) +
                                          " must be a power of two <= 32 or a multiple of 32 <= 1024");
  if (b.rows_per_cta < 1 || (!sub_warp && b.rows_per_cta != 1) ||
      static_cast<int64_t>(b.rows_per_cta) * b.threads_per_row > 1024 ||
      (sub_warp && b.rows_per_cta * b.threads_per_row % 32 != 0))
    throw Error(Status::kInvalidSpec,
                where() + "rows_per_cta=" + std::to_string(b.rows_per_cta) +
                    " must be 1 for CTA-wide rows, and rows_per_cta*threads_per_row a multiple of 32 <= 1024");
  if (b.cluster != 1) {
    const int64_t packs = s.n / b.vec;
    const char* why = nullptr;
    if (b.cluster < 1 || b.cluster > kMaxCluster)
      why = "must be 1-16 CTAs";
    else if (sub_warp || b.cache == RowCache::kGlobal)
      why = "needs CTA-wide rows (threads_per_row > 32) held in registers or shared memory";
    else if (ragged_segments(s, b) && b.cache == RowCache::kSharedPipelined &&
             (s.phase != Phase::kBackward || !b.bulk_copy))
      why = packs % b.cluster != 0
                ? "must divide the row's packs (n / vec): uneven segments are for rows in registers or smem, "
                  "and the backward's tma rows"
                : "must leave each CTA whole scale blocks: uneven segments are for rows in registers or smem, "
                  "and the backward's tma rows";
    else if (last_segment_packs(s, b) < 1)
      why = "leaves the last CTA no packs (n / vec rounded up per CTA)";
    else if (!segments_hold_whole_epilogue_units(s, b) && s.epilogue == Epilogue::kReluBitmask)
      why = "must leave each CTA whole mask bytes (its segment of n a multiple of 8)";
    else if (!segments_hold_whole_epilogue_units(s, b))
      why = scale_block_size(s.epilogue) == kMxBlock
                ? "must leave each CTA whole 32-value scale blocks (its segment of n a multiple of 32)"
                : "must leave each CTA whole 16-value scale blocks (its segment of n a multiple of 16)";
    if (why)
      throw Error(Status::kInvalidSpec, where() + "cluster=" + std::to_string(b.cluster) + " " + why);
  }
  if (scales_per_block(s.epilogue) && b.threads_per_row * b.vec % scale_block_size(s.epilogue) != 0) {
    const std::string block = std::to_string(scale_block_size(s.epilogue));
    throw Error(Status::kInvalidSpec, where() + "threads_per_row=" + std::to_string(b.threads_per_row) + " x vec=" +
                                          std::to_string(b.vec) + " must be a multiple of " + block + " for " +
                                          to_string(s.epilogue) + ": a " + block + "-value scale block lies in one "
                                          "pass of the row's lanes");
  }
  if (b.producer_warp) {
    const char* why = nullptr;
    if (s.phase != Phase::kBackward)
      why = "is a backward row source";
    else if (!b.bulk_copy || b.cache != RowCache::kSharedPipelined)
      why = "fills a pipelined row by bulk copies (spelled ws)";
    else if (b.cluster != 1 || b.rows_per_cta != 1 || b.threads_per_row < 32)
      why = "takes one CTA-wide row per CTA (rows_per_cta=1, threads_per_row >= 32, no cluster)";
    else if (b.threads_per_row > 1024 - 32)
      why = "needs one more warp: threads_per_row must leave room for it (<= 992)";
    else if (s.memory_efficient)
      why = "does not recompute xhat from y (memory_efficient): use tma or smem";
    if (why) throw Error(Status::kInvalidSpec, where() + "producer warp (ws) " + why);
  }
  const int max_stages = b.producer_warp ? kMaxProducerStages : kMaxPipeStages;
  if (b.cache == RowCache::kSharedPipelined ? b.stages < 2 || b.stages > max_stages : b.stages != 2)
    throw Error(Status::kInvalidSpec, where() + "stages=" + std::to_string(b.stages) +
                                          (b.cache == RowCache::kSharedPipelined
                                               ? " must be 2-" + std::to_string(max_stages) + " row buffers"
                                               : std::string(" applies to pipelined rows (pipe) only; keep 2")));
  if (s.residual && s.phase != Phase::kBackward && b.cache == RowCache::kSharedPipelined)
    throw Error(Status::kInvalidSpec, where() + "residual forward rows cannot be pipelined (" +
                                          (b.bulk_copy ? "tma" : "pipe") + "); use smem, reg or gmem");
  if (b.bulk_copy && s.residual_f32)
    throw Error(Status::kInvalidSpec, where() + "bulk_copy (tma) rows take x and dy of one dtype; residual_f32 rows "
                                          "hold fp32 h beside dy in " + to_string(s.x_dtype) + ": use pipe");
  if (b.bulk_copy && (b.cache != RowCache::kSharedPipelined || b.vec * dtype_size(s.x_dtype) != 16))
    throw Error(Status::kInvalidSpec, where() + "bulk_copy (tma) needs a pipelined row of 16-byte packs; vec=" +
                                          std::to_string(b.vec) + " of " + to_string(s.x_dtype) + " is " +
                                          std::to_string(b.vec * dtype_size(s.x_dtype)) + " bytes");
  if (in_shared_memory(b.cache)) {
    const int64_t bytes = shared_row_bytes(s, b);
    const std::string cache = row_cache_spelling(b);
    if (sub_warp)
      throw Error(Status::kInvalidSpec, where() + "row cache '" + cache + "' needs CTA-wide rows (threads_per_row > 32)");
    if (bytes > kMaxSharedRowBytes)
      throw Error(Status::kInvalidSpec, where() + "row cache '" + cache + "' would take " + std::to_string(bytes) +
                                            " bytes of shared memory per CTA (max " +
                                            std::to_string(kMaxSharedRowBytes) + "; a cluster splits the row)");
  }
  const int64_t packs_per_thread = (segment_packs(s, b) + b.threads_per_row - 1) / b.threads_per_row;
  if (b.cache == RowCache::kRegisters && packs_per_thread > kMaxRegisterPacks)
    throw Error(Status::kInvalidSpec, where() + "row cache 'reg' would hold " + std::to_string(packs_per_thread) +
                                          " packs per thread (max 16); use more threads or gmem");
}

}  // namespace normjit
