// The generic kernels' program text, names and coverage, and the compile modes.
#include <cstdlib>
#include <sstream>

#include "generator/bindings.hpp"
#include "normjit/error.hpp"
#include "normjit/generic.hpp"
#include "templates/normjit/generic_flags.h"

namespace normjit {
namespace {

// The epilogues the generic kernels carry. The quantized ones keep NVRTC (their scale layouts
// constrain the row's split over threads).
constexpr Epilogue kGenericEpilogues[] = {Epilogue::kNone, Epilogue::kReluBitmask, Epilogue::kGelu};
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// The CTAs per SM the launch bounds ask: several rows in flight on each SM (at 512 threads and 128 registers one
// row a SM ran 21 % of copy at N = 16384, H200).
constexpr int kGenericForwardCtasPerSm = 4;  // 64 registers
// The backward, a pack a round, fits 80 registers unspilled (gelu spilled 8 bytes at 64).
constexpr int kGenericBackwardCtasPerSm = 3;

std::string kernel_name(const char* phase, DType x, DType w, Epilogue e, int vec, bool residual) {
  return std::string("normjit_generic_") + phase + "_" + to_string(x) + "_w" + to_string(w) + "_" + to_string(e) +
         "_v" + std::to_string(vec) + (residual ? "_residual" : "");
}

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
  auto no = [&](const std::string& what) { return "spec '" + s.str() + "': no generic kernel for " + what; };
  bool epilogue_ok = false;
  for (Epilogue e : kGenericEpilogues) epilogue_ok |= e == s.epilogue;
  if (!epilogue_ok)
    return no(std::string("epilogue=") + to_string(s.epilogue) + " (generic kernels carry none, relu_bitmask and gelu)");
  if (s.residual_f32) return no("residual_f32 (an fp32 residual stream; the residual add in x's dtype is covered)");
  if (s.memory_efficient) return no("memory_efficient (a backward from y)");
  if (s.n < 1) return no("n=" + std::to_string(s.n));
  return {};
}

std::vector<int> generic_vecs(DType x) {
  std::vector<int> vecs;
  for (int v = 16 / dtype_size(x); v >= 1; v /= 2) vecs.push_back(v);
  return vecs;
}

std::string generic_kernel_name(const Spec& s, int vec) {
  return kernel_name(s.phase == Phase::kBackward ? "bwd" : "fwd", s.x_dtype, s.w_dtype, s.epilogue, vec, s.residual);
}

std::string generic_reduce_name(DType w) { return std::string("normjit_generic_reduce_w") + to_string(w); }

std::vector<DType> generic_program_dtypes() { return {std::begin(kDTypes), std::end(kDTypes)}; }

GeneratedSource generic_source(DType x) {
  std::ostringstream src;
  src << "// normjit generic kernels, x " << to_string(x) << " (generator/generic.cpp)\n"
      << "#include \"normjit/norm_generic.cuh\"\n";
  for (Epilogue e : kGenericEpilogues) src << "#include \"normjit/" << detail::epilogue_binding(e).header << "\"\n";
  const std::string xt = std::string("normjit::") + detail::device_type(x);
  int kernels = 0;
  for (DType w : kDTypes) {
    const std::string wt = std::string("normjit::") + detail::device_type(w);
    for (Epilogue e : kGenericEpilogues) {
      const std::string epi = std::string("normjit::") + detail::epilogue_binding(e).functor;
      for (int vec : generic_vecs(x))
        for (bool residual : {false, true})
          for (const char* phase : {"fwd", "bwd"}) {
            src << "extern \"C\" __global__ void __launch_bounds__(" << kGenericMaxThreads
                << ", "
                << (std::string(phase) == "fwd" ? kGenericForwardCtasPerSm : kGenericBackwardCtasPerSm)
                << ") " << kernel_name(phase, x, w, e, vec, residual) << "(const normjit::NormParams p) { normjit::generic_"
                << phase << "<" << xt << ", " << wt << ", " << epi << ", " << vec << ", " << (residual ? "true" : "false")
                << ">(p); }\n";
            ++kernels;
          }
    }
    src << "extern \"C\" __global__ void __launch_bounds__(256) " << generic_reduce_name(w)
        << "(const normjit::NormParams p) { normjit::generic_bwd_reduce<" << wt << ">(p); }\n";
    ++kernels;
  }
  GeneratedSource out;
  out.spec = std::string("generic kernels of x ") + to_string(x);
  out.kernel_name = std::string("normjit_generic_") + to_string(x);
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

const GenericImage* generic_image_for(DType x, int sm) {
  const GenericImage* best = nullptr;
  auto arch_of = [](const GenericImage& g) { return std::atoi(g.arch.c_str() + g.arch.find('_') + 1); };
  // A cubin runs on its own major version at or above its minor; PTX on any arch at or above it.
  for (const GenericImage& g : generic_images()) {
    if (g.x != x || g.is_ptx) continue;
    const int a = arch_of(g);
    if (a / 10 == sm / 10 && a <= sm && (!best || a > arch_of(*best))) best = &g;
  }
  if (best) return best;
  for (const GenericImage& g : generic_images()) {
    if (g.x != x || !g.is_ptx) continue;
    const int a = arch_of(g);
    if (a <= sm && (!best || a > arch_of(*best))) best = &g;
  }
  return best;
}

}  // namespace normjit
