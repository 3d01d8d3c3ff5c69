// The generic kernels' program text, names and coverage, and the compile modes.
#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "generator/bindings.hpp"
#include "normjit/error.hpp"
#include "normjit/generic.hpp"
#include "templates/normjit/generic_flags.h"

namespace normjit {
namespace {

// The epilogues of the norm program; the quantizing ones are the quant program's (forward only;
// built for sm_89 and newer, whose FP8 conversions they use).
constexpr Epilogue kNormEpilogues[] = {Epilogue::kNone, Epilogue::kReluBitmask, Epilogue::kGelu};
constexpr Epilogue kQuantEpilogues[] = {Epilogue::kFp8E4M3,   Epilogue::kFp8E5M2,   Epilogue::kFp8E4M3Row,
                                        Epilogue::kFp8E5M2Row, Epilogue::kInt8Row,   Epilogue::kMxfp8E4M3,
                                        Epilogue::kMxfp8E5M2,  Epilogue::kMxfp4,     Epilogue::kNvfp4};
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// The CTAs per SM the launch bounds ask: several rows in flight on each SM (at 512 threads and 128 registers one
// row a SM ran 21 % of copy at N = 16384, H200).
constexpr int kGenericForwardCtasPerSm = 2;  // of kGenericMaxForwardThreads: 64 registers
// The backward, a pack a round, fits 80 registers unspilled (gelu spilled 8 bytes at 64).
constexpr int kGenericBackwardCtasPerSm = 3;
// The held-row backward (generic_bwd_held) at 1 and 2 packs a thread: a pack's x, dy, weights and
// sums take about 40 registers; at two packs up to kGenericMaxHeldThreads threads, 128 registers.
constexpr int kGenericHeldCtasPerSm[kGenericMaxHeldPacks] = {3, 1};

// The residual add's kinds (norm_generic.cuh, GenericResidual): none, x's dtype, an fp32 stream.
enum ResidualKind { kNoResidual = 0, kResidualX = 1, kResidualF32 = 2 };
constexpr const char* kResidualSuffix[] = {"", "_residual", "_residual_f32"};

std::vector<ResidualKind> residual_kinds(DType x) {
  if (x == DType::kF32) return {kNoResidual, kResidualX};  // an f32 x's stream is f32 already
  return {kNoResidual, kResidualX, kResidualF32};
}

ResidualKind residual_kind(const Spec& s) {
  return s.residual_f32 ? kResidualF32 : s.residual ? kResidualX : kNoResidual;
}

std::string kernel_name(const char* phase, DType x, DType w, Epilogue e, int vec, ResidualKind residual,
                        bool from_y, bool clustered = false, int held_packs = 0) {
  return std::string("normjit_generic_") + phase + "_" + to_string(x) + "_w" + to_string(w) + "_" + to_string(e) +
         "_v" + std::to_string(vec) + kResidualSuffix[residual] + (from_y ? "_from_y" : "") +
         (clustered ? "_cluster" : "") + (held_packs ? "_held" + std::to_string(held_packs) : "");
}

// The backward's held-row kernels (1 to kGenericMaxHeldPacks packs a thread in registers across the
// slot's rows): 16-byte packs, no residual add, not memory-efficient.
bool has_held(bool backward, DType rows, int vec, ResidualKind residual, bool from_y) {
  return backward && vec == 16 / dtype_size(rows) && residual == kNoResidual && !from_y;
}

// The clustered kernels (a row split over 2-16 CTAs) come in 16-byte packs of the rows' dtype (x's, or an
// fp32 stream's) only: the backward's for every kind, the forward's for the norm program's epilogues
// without the residual add (rows that crowd the L2, read once into shared memory).
bool has_clustered(bool backward, DType rows, int vec, ResidualKind residual, Epilogue e) {
  if (vec != 16 / dtype_size(rows)) return false;
  return backward || (residual == kNoResidual && !quantizes(e));
}

// The forward's clustered CTAs: several small ones a SM (segments of at most 32 KB in shared memory); 48
// registers, two packs a round with their weights loaded ahead.
constexpr int kGenericClusterForwardCtasPerSm = 5;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

const char* to_string(CompileMode m) {
  switch (m) {
    case CompileMode::kSync: return "sync";
    case CompileMode::kAsync: return "async";
    case CompileMode::kGeneric: return "generic";
  }
  return "?";
}

CompileMode parse_compile_mode(std::string_view text, std::string_view what) {
  if (text == "sync") return CompileMode::kSync;
  if (text == "async") return CompileMode::kAsync;
  if (text == "generic") return CompileMode::kGeneric;
  throw Error(Status::kInvalidArgument,
              std::string(what) + "='" + std::string(text) + "' is not sync, async or generic");
}

CompileMode compile_mode_from_env() {
  const char* env = std::getenv("NORMJIT_COMPILE_MODE");
  if (!env || !*env) return CompileMode::kSync;
  return parse_compile_mode(env, "NORMJIT_COMPILE_MODE");
}

std::string generic_unsupported_why(const Spec& s) {
  // Strings only on a refusal: async mode asks on every launch.
  if (s.n < 1) return "spec '" + s.str() + "': no generic kernel for n=" + std::to_string(s.n);
  return {};
}

const char* to_string(GenericProgram p) { return p == GenericProgram::kQuant ? "quant" : "norm"; }

GenericProgram generic_program_of(const Spec& s) {
  return quantizes(s.epilogue) ? GenericProgram::kQuant : GenericProgram::kNorm;
}

std::vector<GenericProgram> generic_programs() { return {GenericProgram::kNorm, GenericProgram::kQuant}; }

int generic_program_min_arch(GenericProgram p) { return p == GenericProgram::kQuant ? 89 : 80; }

std::vector<int> generic_vecs(DType x) {
  std::vector<int> vecs;
  for (int v = 16 / dtype_size(x); v >= 1; v /= 2) vecs.push_back(v);
  return vecs;
}

std::string generic_kernel_name(const Spec& s, int vec, bool clustered, int held_packs) {
  return kernel_name(s.phase == Phase::kBackward ? "bwd" : "fwd", s.x_dtype, s.w_dtype, s.epilogue, vec,
                     residual_kind(s), s.memory_efficient, clustered, held_packs);
}

bool generic_has_held(const Spec& s, int vec) {
  return has_held(s.phase == Phase::kBackward, s.residual_f32 ? DType::kF32 : s.x_dtype, vec, residual_kind(s),
                  s.memory_efficient);
}

bool generic_has_clustered(const Spec& s, int vec) {
  return has_clustered(s.phase == Phase::kBackward, s.residual_f32 ? DType::kF32 : s.x_dtype, vec, residual_kind(s),
                       s.epilogue);
}

std::string generic_reduce_name(DType w) { return std::string("normjit_generic_reduce_w") + to_string(w); }

unsigned generic_backward_threads(int64_t segment_packs, unsigned as_wide_as_row,
                                  const std::function<int(unsigned)>& ctas_per_sm) {
  const int64_t packs = std::max<int64_t>(segment_packs, 1);
  unsigned picked = 0;
  std::vector<std::pair<unsigned, int>> candidates;  // threads, CTAs a SM
  int most = 0;
  for (unsigned threads = 32; threads <= static_cast<unsigned>(kGenericMaxThreads); threads += 32) {
    if (threads >= packs + 32 && threads != as_wide_as_row) break;  // wider leaves a warp idle
    const int64_t rounds = (packs + threads - 1) / threads;
    const bool even = 100 * packs >= 85 * rounds * threads;
    if (!even && threads != as_wide_as_row) continue;
    candidates.emplace_back(threads, ctas_per_sm(threads));
    most = std::max(most, candidates.back().second);
  }
  for (const auto& [threads, ctas] : candidates)
    if (10 * ctas >= 9 * most) picked = threads;  // the widest of those
  return picked;
}

GenericForwardShape generic_forward_shape(int64_t packs, int64_t row_bytes, int sm_count, int64_t l2_bytes,
                                          const std::function<int(unsigned)>& ctas_per_sm) {
  auto width = [&](unsigned widest) {
    const int64_t threads = (std::max<int64_t>(packs, 1) + kGenericUnroll - 1) / kGenericUnroll;
    return static_cast<unsigned>(std::clamp<int64_t>((threads + 31) / 32 * 32, 32, widest));
  };
  auto rows_in_flight_bytes = [&](unsigned threads) {
    return int64_t(std::max(1, ctas_per_sm(threads))) * sm_count * row_bytes;
  };
  GenericForwardShape shape{width(kGenericMaxThreads), false};
  if (const unsigned wider = width(kGenericMaxForwardThreads);
      wider > shape.threads && rows_in_flight_bytes(shape.threads) > l2_bytes)
    shape.threads = wider;
  shape.rows_past_l2 = 2 * rows_in_flight_bytes(shape.threads) > l2_bytes;
  return shape;
}

GenericBackwardHeld generic_backward_held_shape(int64_t packs) {
  GenericBackwardHeld shape;
  if (packs > int64_t(kGenericMaxHeldPacks) * kGenericMaxHeldThreads) return shape;
  shape.packs_per_thread = packs >= kGenericHeldTwoFrom ? 2 : 1;
  const int64_t used = ceil_div(std::max<int64_t>(packs, 1), shape.packs_per_thread);
  shape.threads = static_cast<unsigned>(ceil_div(used, 32) * 32);
  return shape;
}

GenericBackwardHeldCluster generic_backward_held_cluster_shape(int64_t packs, int max_cluster) {
  GenericBackwardHeldCluster shape;
  const int64_t cta_packs = int64_t(kGenericMaxHeldPacks) * kGenericMaxHeldThreads;
  if (packs <= cta_packs) return shape;  // one CTA holds it
  int64_t wanted = ceil_div(packs, kGenericHeldSegmentPacks);
  if (wanted > max_cluster) wanted = ceil_div(packs, cta_packs);
  if (wanted > max_cluster) return shape;
  const int64_t round = int64_t(kGenericMaxHeldPacks) * 32;  // a warp's two packs a lane
  shape.segment_packs = ceil_div(ceil_div(packs, wanted), round) * round;
  shape.cluster = static_cast<unsigned>(ceil_div(packs, shape.segment_packs));
  shape.threads = static_cast<unsigned>(shape.segment_packs / kGenericMaxHeldPacks);
  return shape;
}

GenericForwardCluster generic_forward_cluster_shape(int64_t packs, int64_t pack_bytes, int64_t segment_bytes,
                                                    int max_cluster) {
  packs = std::max<int64_t>(packs, 1);
  const int64_t wanted =
      std::clamp<int64_t>(ceil_div(packs * pack_bytes, std::max<int64_t>(segment_bytes, 1)), 2, max_cluster);
  GenericForwardCluster shape;
  shape.segment_packs = ceil_div(ceil_div(packs, wanted), 32) * 32;  // whole warps' packs
  shape.cluster = static_cast<unsigned>(ceil_div(packs, shape.segment_packs));
  shape.threads = static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div(shape.segment_packs, int64_t(kGenericUnroll) * 32) * 32, 32, kGenericMaxThreads));
  return shape;
}

std::vector<DType> generic_program_dtypes() { return {std::begin(kDTypes), std::end(kDTypes)}; }

GeneratedSource generic_source(DType x, GenericProgram program) {
  const bool quant = program == GenericProgram::kQuant;
  std::ostringstream src;
  src << "// normjit generic kernels, x " << to_string(x) << ", " << to_string(program)
      << " program (generator/generic.cpp)\n"
      << "#include \"normjit/norm_generic.cuh\"\n";
  std::vector<Epilogue> epilogues;
  if (quant) epilogues.assign(std::begin(kQuantEpilogues), std::end(kQuantEpilogues));
  else epilogues.assign(std::begin(kNormEpilogues), std::end(kNormEpilogues));
  for (Epilogue e : epilogues) src << "#include \"normjit/" << detail::epilogue_binding(e).header << "\"\n";
  const std::string xt = std::string("normjit::") + detail::device_type(x);
  int kernels = 0;
  auto kernel = [&](const char* phase, DType w, Epilogue e, int vec, ResidualKind residual, bool from_y,
                    bool clustered = false, int held_packs = 0) {
    const bool fwd = std::string(phase) == "fwd";
    const std::string types = xt + ", normjit::" + detail::device_type(w) + ", normjit::" +
                              detail::epilogue_binding(e).functor + ", " + std::to_string(vec);
    const bool fwd_cluster = fwd && clustered;
    const int max_threads = held_packs > 1        ? kGenericMaxHeldThreads
                            : fwd && !clustered   ? kGenericMaxForwardThreads
                                                  : kGenericMaxThreads;
    const int ctas_per_sm = fwd_cluster  ? kGenericClusterForwardCtasPerSm
                            : fwd          ? kGenericForwardCtasPerSm
                            : held_packs   ? kGenericHeldCtasPerSm[held_packs - 1]
                                           : kGenericBackwardCtasPerSm;
    const std::string body =
        fwd_cluster  ? "generic_fwd_cluster<" + types + ">"
        : held_packs ? "generic_bwd_held<" + types + ", " + std::to_string(held_packs) + (clustered ? ", true" : "") + ">"
                    : std::string("generic_") + phase + "<" + types + ", " + std::to_string(int(residual)) +
                          (fwd ? "" : from_y ? ", true" : ", false") + (clustered ? ", true" : "") + ">";
    src << "extern \"C\" __global__ void __launch_bounds__(" << max_threads << ", " << ctas_per_sm << ") "
        << kernel_name(phase, x, w, e, vec, residual, from_y, clustered, held_packs)
        << "(const normjit::NormParams p) { normjit::" << body << "(p); }\n";
    ++kernels;
  };
  for (DType w : kDTypes) {
    for (Epilogue e : epilogues)
      for (ResidualKind residual : residual_kinds(x))
        // An fp32 stream's rows are f32: vectors of at most 16 bytes of f32.
        for (int vec : generic_vecs(residual == kResidualF32 ? DType::kF32 : x)) {
          const DType rows = residual == kResidualF32 ? DType::kF32 : x;
          kernel("fwd", w, e, vec, residual, false);
          if (has_clustered(false, rows, vec, residual, e)) kernel("fwd", w, e, vec, residual, false, true);
          if (quant) continue;  // the quantizing epilogues have no backward
          const bool clustered = has_clustered(true, rows, vec, residual, e);
          kernel("bwd", w, e, vec, residual, false);
          if (clustered) kernel("bwd", w, e, vec, residual, false, true);
          if (has_held(true, rows, vec, residual, false))
            for (int held_packs = 1; held_packs <= kGenericMaxHeldPacks; ++held_packs)
              kernel("bwd", w, e, vec, residual, false, false, held_packs);
          // A held row of two packs a thread split over a cluster (rows past one CTA's 1024 packs).
          if (clustered && has_held(true, rows, vec, residual, false))
            kernel("bwd", w, e, vec, residual, false, true, kGenericMaxHeldPacks);
          // memory_efficient: epilogue none, not with an fp32 stream (the spec refuses both).
          if (e == Epilogue::kNone && residual != kResidualF32) {
            kernel("bwd", w, e, vec, residual, true);
            if (clustered) kernel("bwd", w, e, vec, residual, true, true);
          }
        }
    if (quant) continue;
    src << "extern \"C\" __global__ void __launch_bounds__(256) " << generic_reduce_name(w)
        << "(const normjit::NormParams p) { normjit::generic_bwd_reduce<normjit::" << detail::device_type(w)
        << ">(p); }\n";
    ++kernels;
  }
  GeneratedSource out;
  out.spec = std::string("generic kernels of x ") + to_string(x) + " (" + to_string(program) + ")";
  out.kernel_name = std::string("normjit_generic_") + to_string(x) + "_" + to_string(program);
  out.source = src.str();
  out.threads_per_cta = kGenericMaxThreads;
  out.rows_per_cta = 1;
  out.kernels = kernels;
  return out;
}

namespace detail {
// The build's images (generated by tools/build_generic.cpp); a library built without them has none.
__attribute__((weak)) const std::vector<GenericImage>& generic_image_table() {
  static const std::vector<GenericImage> none;
  return none;
}
}  // namespace detail

const std::vector<GenericImage>& generic_images() { return detail::generic_image_table(); }

const GenericImage* generic_image_for(DType x, GenericProgram program, int sm) {
  const GenericImage* best = nullptr;
  auto arch_of = [](const GenericImage& g) { return std::atoi(g.arch.c_str() + g.arch.find('_') + 1); };
  // A cubin runs on its own major version at or above its minor; PTX on any arch at or above it.
  for (const GenericImage& g : generic_images()) {
    if (g.x != x || g.program != program || g.is_ptx) continue;
    const int a = arch_of(g);
    if (a / 10 == sm / 10 && a <= sm && (!best || a > arch_of(*best))) best = &g;
  }
  if (best) return best;
  for (const GenericImage& g : generic_images()) {
    if (g.x != x || g.program != program || !g.is_ptx) continue;
    const int a = arch_of(g);
    if (a <= sm && (!best || a > arch_of(*best))) best = &g;
  }
  return best;
}

}  // namespace normjit
