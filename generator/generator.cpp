// Spec -> CUDA source. The stub template only binds parameters; kernel logic lives in the
// embedded .cuh headers that the stub includes.
#include <map>
#include <string>

#include "generator/bindings.hpp"
#include "generator/embedded.hpp"
#include "normjit/compiler.hpp"
#include "normjit/error.hpp"

namespace normjit {
namespace detail {

const char* device_type(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

EpilogueBinding epilogue_binding(Epilogue e) {
  switch (e) {
    case Epilogue::kNone: return {"epilogue_none.cuh", "EpilogueNone"};
    case Epilogue::kReluBitmask: return {"epilogue_relu_bitmask.cuh", "EpilogueReluBitmask"};
    case Epilogue::kGelu: return {"epilogue_gelu.cuh", "EpilogueGelu"};
    case Epilogue::kFp8E4M3: return {"epilogue_fp8.cuh", "EpilogueFp8<false>"};
    case Epilogue::kFp8E5M2: return {"epilogue_fp8.cuh", "EpilogueFp8<true>"};
    case Epilogue::kFp8E4M3Row: return {"epilogue_quant_row.cuh", "EpilogueRowQuant<normjit::RowQuantFormat::kE4M3>"};
    case Epilogue::kFp8E5M2Row: return {"epilogue_quant_row.cuh", "EpilogueRowQuant<normjit::RowQuantFormat::kE5M2>"};
    case Epilogue::kInt8Row: return {"epilogue_quant_row.cuh", "EpilogueRowQuant<normjit::RowQuantFormat::kInt8>"};
    case Epilogue::kMxfp8E4M3: return {"epilogue_mx.cuh", "EpilogueMx<false>"};
    case Epilogue::kMxfp8E5M2: return {"epilogue_mx.cuh", "EpilogueMx<true>"};
    case Epilogue::kMxfp4: return {"epilogue_fp4.cuh", "EpilogueFp4<false>"};
    case Epilogue::kNvfp4: return {"epilogue_fp4.cuh", "EpilogueFp4<true>"};
  }
  throw Error(Status::kNotSupported, std::string("epilogue '") + to_string(e) + "' has no device binding");
}

}  // namespace detail

namespace {
using detail::device_type;
using detail::epilogue_binding;
using detail::EpilogueBinding;

std::string_view template_text(std::string_view path) {
  for (const auto& f : detail::embedded_templates())
    if (f.path == path) return f.contents;
  throw Error(Status::kNotSupported, "template '" + std::string(path) + "' is not embedded in this build");
}

// Replaces every {{KEY}}; a key the template uses but the map lacks, or one the map has but the
// template never uses, is a generator bug and throws.
std::string render(std::string_view tpl, const std::map<std::string, std::string>& values, const std::string& spec) {
  std::string out;
  std::map<std::string, bool> used;
  size_t pos = 0;
  while (true) {
    const size_t open = tpl.find("{{", pos);
    out.append(tpl.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (open == std::string_view::npos) break;
    const size_t close = tpl.find("}}", open);
    if (close == std::string_view::npos) throw Error(Status::kNotSupported, spec + ": unterminated {{ in template");
    const std::string key(tpl.substr(open + 2, close - open - 2));
    auto it = values.find(key);
    if (it == values.end()) throw Error(Status::kNotSupported, spec + ": template parameter {{" + key + "}} has no value");
    out += it->second;
    used[key] = true;
    pos = close + 2;
  }
  for (const auto& [key, value] : values)
    if (!used.count(key)) throw Error(Status::kNotSupported, spec + ": parameter " + key + " is not used by the template");
  return out;
}

// A forward kernel's launch bounds: the CTAs per SM it asks for (0: none) and the local memory it
// may keep for them (GeneratedSource::spill_allowance_bytes).
struct ForwardLaunchBounds {
  bool capped = false;  // NORMJIT_CAPPED_LAUNCH_BOUNDS: compiled uncapped past the allowance
  int min_ctas = 0;
  int spill_allowance_bytes = 0;
};
ForwardLaunchBounds forward_launch_bounds(const Spec& spec, const BlockConfig& b) {
  // A 512-thread row in registers or one CTA's shared memory asks for two CTAs per SM (64
  // registers): LayerNorm register rows of 5 packs per thread otherwise took 70-78, one CTA per SM.
  // Not where two CTAs' shared memory cannot fit one SM anyway.
  const bool two_ctas = b.rows_per_cta == 1 && b.threads_per_row == 512 && b.cluster == 1 &&
                        (b.cache == RowCache::kRegisters ||
                         (b.cache == RowCache::kShared && 2 * shared_row_bytes(spec, b) <= kMaxSharedRowBytes));
  if (two_ctas) return {false, 2, 0};
  // Per-tensor FP8 and MXFP8 register rows ask for the CTAs 48 registers a thread would allow
  // and keep a spill of up to 32 bytes for them: LN + fp8 at 14336 (448 threads) went from 50
  // registers and two CTAs to 40 and three, 88.5 -> 98.5 % of copy (H100). The per-row and FP4
  // epilogues spill far more or lost speed under the same cap (docs/perf-notes.md).
  const bool capped = (scales_per_tensor(spec.epilogue) || spec.epilogue == Epilogue::kMxfp8E4M3 ||
                       spec.epilogue == Epilogue::kMxfp8E5M2) &&
                      b.cache == RowCache::kRegisters && b.rows_per_cta == 1 && b.cluster == 1 &&
                      b.threads_per_row >= 128;
  if (const int ctas = capped ? 65536 / (b.threads_per_row * 48) : 0; ctas >= 2) return {true, ctas, 32};
  // A row in one CTA's shared memory asks for as many CTAs as the shared memory holds: with none
  // asked, ptxas gave LN bf16 65536 (two CTAs of 512 threads, 64 KB each) 46 registers and two CTAs
  // where three fit. No spill is allowed for it: a spilling copy is compiled uncapped.
  if (b.cache == RowCache::kShared && b.rows_per_cta == 1) {
    const int64_t by_shared = kSharedBytesPerSm / (shared_row_bytes(spec, b) + kSharedReservePerCta);
    const int ctas = static_cast<int>(std::min<int64_t>(by_shared, 2048 / b.threads_per_row));
    if (ctas >= 2) return {true, ctas, 0};
  }
  return {};
}

}  // namespace

int spill_allowance_bytes(const Spec& resolved) {
  if (resolved.phase == Phase::kBackward || !resolved.block) return 0;
  return forward_launch_bounds(resolved, *resolved.block).spill_allowance_bytes;
}

GeneratedSource generate(const Spec& spec) {
  validate(spec);
  const std::string name = spec.str();
  if (!spec.block) throw Error(Status::kInvalidArgument, "generate(" + name + "): spec has no block config; call resolve() first");
  const BlockConfig& b = *spec.block;
  GeneratedSource g;
  g.spec = name;
  g.kernel_name = "normjit_" + name;
  for (char& c : g.kernel_name)
    if (c == '.') c = '_';
  g.threads_per_cta = b.threads_per_row * b.rows_per_cta + (b.producer_warp ? 32 : 0);
  g.rows_per_cta = b.rows_per_cta;
  // The backward: the fused kernel or row sums and tiles, then the reduction.
  g.kernels = spec.phase != Phase::kBackward ? 1 : b.cache != RowCache::kGlobal ? 2 : 3;
  const EpilogueBinding ep = epilogue_binding(spec.epilogue);
  const bool backward = spec.phase == Phase::kBackward;
  std::map<std::string, std::string> values = {
      {"SPEC", name},
      {"KERNEL_NAME", g.kernel_name},
      {"X_TYPE", device_type(row_dtype(spec))},
      {"Y_TYPE", device_type(spec.x_dtype)},
      {"W_TYPE", device_type(spec.w_dtype)},
      {"EPILOGUE_HEADER", ep.header},
      {"EPILOGUE_FUNCTOR", ep.functor},
      // The Ada norms are LayerNorm / RMSNorm math with per-group weights.
      {"NORM_KIND", subtracts_mean(spec.norm) ? "kLayerNorm" : "kRMSNorm"},
      {"PER_GROUP_WEIGHTS", is_adaptive(spec.norm) ? "true" : "false"},
      {"HAS_BIAS", spec.has_bias ? "true" : "false"},
      {"ZERO_CENTERED", spec.zero_centered ? "true" : "false"},
      {"PROLOGUE_FUNCTOR", spec.residual ? std::string("PrologueResidualAdd<normjit::") + device_type(row_dtype(spec)) +
                                               (spec.bias_in ? ", true>" : ", false>")
                                         : std::string("PrologueNone")},
      {"N", std::to_string(spec.n)},
      {"VEC", std::to_string(b.vec)},
      {"THREADS_PER_ROW", std::to_string(b.threads_per_row)},
      {"ROWS_PER_CTA", std::to_string(b.rows_per_cta)},
      {"THREADS_PER_CTA", std::to_string(g.threads_per_cta)},
      {"CLUSTER", std::to_string(b.cluster)},
      {"STAGES", std::to_string(b.stages)},
      {"BULK_COPY", b.bulk_copy ? "true" : "false"},
      // Compile-time cluster shape: a plain cuLaunchKernel then launches clusters.
      {"CLUSTER_DIMS", b.cluster > 1 ? " __cluster_dims__(" + std::to_string(b.cluster) + ", 1, 1)" : ""},
  };
  values["ROW_CACHE"] = b.cache == RowCache::kRegisters          ? "kRegisters"
                        : b.cache == RowCache::kShared           ? "kShared"
                        : b.cache == RowCache::kSharedPipelined ? "kSharedPipelined"
                                                                 : "kGlobal";
  if (backward) {
    // Rows in registers or shared memory: the fused persistent kernel; streamed: the split route.
    values["FUSED"] = b.cache != RowCache::kGlobal ? "1" : "0";
    values["DBETA_SHARED"] = dbeta_sums_in_shared(spec, b) ? "true" : "false";
    values["XHAT_FROM_Y"] = spec.memory_efficient ? "true" : "false";
    // memory_efficient and producer-warp specs only: one more binding line each, so the other
    // specs' source stays as it was.
    values["EXTRA_BINDINGS"] = "";
    if (b.producer_warp)
      values["EXTRA_BINDINGS"] = "\n  static constexpr bool kProducerWarp = true;  // the CTA's last warp fills the row buffers";
    if (bulk_copies_dh_out(spec, b))
      values["EXTRA_BINDINGS"] = "\n  static constexpr bool kBulkDhOut = true;  // dh_out bulk-copied beside x and dy";
    if (spec.memory_efficient) {
      const XhatTable t = xhat_table(spec, b);
      values["EXTRA_BINDINGS"] = std::string("\n  static constexpr bool kReciprocalTable = ") +
                             (t.reciprocal ? "true" : "false") + ";  // 1/gamma' per column in shared memory" +
                             "\n  static constexpr bool kBetaTable = " + (t.beta ? "true" : "false") + ";  // beta too";
    }
  } else {
    values["TRAINING"] = spec.phase == Phase::kForwardTraining ? "true" : "false";
    // Segments rounded up to whole scale blocks (segment_packs): the packs a CTA takes, bound only
    // where they differ from n / vec / cluster rounded up, so the other specs' source stays as it was.
    values["EXTRA_BINDINGS"] = "";
    if (const int64_t packs = segment_packs(spec, b); packs != (spec.n / b.vec + b.cluster - 1) / b.cluster)
      values["EXTRA_BINDINGS"] = "\n  static constexpr int kSegmentPacks = " + std::to_string(packs) +
                                 ";  // per CTA: whole scale blocks";
    const ForwardLaunchBounds bounds = forward_launch_bounds(spec, b);
    values["LAUNCH_BOUNDS"] = bounds.capped          ? "NORMJIT_CAPPED_LAUNCH_BOUNDS"
                              : bounds.min_ctas > 0 ? "__launch_bounds__"
                                                    : "NORMJIT_LAUNCH_BOUNDS";
    values["MIN_CTAS_PER_SM"] = bounds.min_ctas > 0 ? ", " + std::to_string(bounds.min_ctas) : "";
    g.spill_allowance_bytes = bounds.spill_allowance_bytes;
    g.capped = bounds.capped;
    g.row_y_renormalize_option = scales_per_row(spec.epilogue) && b.cache == RowCache::kRegisters;
  }
  g.batchable = !quantizes(spec.epilogue);
  g.source = render(template_text(backward ? "norm_bwd.cu.in" : "norm_fwd.cu.in"), values, name);
  return g;
}

const std::vector<std::pair<std::string, std::string>>& device_headers() {
  static const std::vector<std::pair<std::string, std::string>> headers = [] {
    std::vector<std::pair<std::string, std::string>> h;
    for (const auto& f : detail::embedded_templates())
      if (f.path.size() < 6 || f.path.substr(f.path.size() - 6) != ".cu.in")
        h.emplace_back(std::string(f.path), std::string(f.contents));
    return h;
  }();
  return headers;
}

}  // namespace normjit
