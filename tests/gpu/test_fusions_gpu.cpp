// The fusions against the fp64 reference: the residual add (h = x + residual written bit for bit,
// the norm of h; backward dx = dnorm(dy) + dh_out) and zero-centred weights (scale 1 + gamma),
// over every norm, the x dtypes, odd and large N, strided and unaligned rows, the epilogues, and
// every row cache the kernels have.
#include <optional>

#include "tests/gpu/gpu_common.hpp"

using namespace gpu_test;

namespace {

struct Fusion {
  bool zero_centered, residual;
};
constexpr Fusion kFusions[] = {{false, true}, {true, false}, {true, true}};

// Strided and unaligned rows (narrower vectors), then the epilogues: LayerNorm and RMSNorm, bf16
// x, three sizes, each spec given its fusions by fuse.
void add_layout_cases(std::vector<Case>& cases, Phase phase, void (*fuse)(Spec&)) {
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm})
    for (int64_t n : {int64_t(768), int64_t(4096), int64_t(18432)}) {
      Case c;
      c.spec = Spec::make(norm, phase, DType::kBF16, n, true);
      fuse(c.spec);
      c.rows = 41;
      c.row_stride = n + 24;
      cases.push_back(c);
      c.x_offset = 1;
      cases.push_back(c);
      c.x_offset = 0;
      c.row_stride = 0;
      c.clip_upper = 1.5f;
      for (Epilogue e : {Epilogue::kReluBitmask, Epilogue::kGelu}) {
        c.spec.epilogue = e;
        cases.push_back(c);
      }
    }
}

std::vector<Case> fusion_cases(Phase phase) {
  const std::vector<int64_t> ns =
      grid_ns({1, 7, 127, 768, 1000, 4097, 7168, 12289, 18432, 20001, 32768, 65536, 100000, 131072, 262144});
  std::vector<Case> cases;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (DType x : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t n : ns)
        for (const Fusion& f : kFusions) {
          Case c;
          c.spec = Spec::make(norm, phase, x, n, norm != Norm::kRMSNorm);
          c.spec.w_dtype = x == DType::kBF16 ? DType::kF32 : x;
          c.spec.zero_centered = f.zero_centered;
          c.spec.residual = f.residual;
          for (int64_t rows : {int64_t(1), n >= 65536 ? int64_t(3) : int64_t(37)}) {
            c.rows = rows;
            c.rows_per_batch = is_adaptive(norm) ? rows : 0;
            cases.push_back(c);
          }
          if (is_adaptive(norm) && n <= 32768) {  // several batches
            c.rows = 3 * 9;
            c.rows_per_batch = 9;
            cases.push_back(c);
          }
        }
  // Strided and unaligned rows and the epilogues, with the residual.
  add_layout_cases(cases, phase, [](Spec& s) {
    s.residual = true;
    s.zero_centered = s.norm == Norm::kRMSNorm;
  });
  return cases;
}

void warm_cases(const std::vector<Case>& cases) {
  std::vector<Spec> specs;
  for (const auto& c : cases) {
    specs.push_back(c.spec);
    Spec f = c.spec;
    f.phase = Phase::kForwardTraining;
    f.memory_efficient = false;
    f.block.reset();  // the forward run_backward runs first: its own pick (a pinned backward config may not suit it)
    specs.push_back(f);
  }
  warm(specs);
}

}  // namespace

TEST_CASE("fusions forward: residual add and zero-centred weights match the reference") {
  std::vector<Case> cases = fusion_cases(Phase::kForwardTraining);
  for (Case c : fusion_cases(Phase::kForwardInference))
    if (c.rows > 1) cases.push_back(c);
  // Every forward row cache with the residual: registers (one CTA and a cluster), one CTA's shared
  // row and a cluster's, rows streamed twice from global memory.
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n32768.bias.residual.cfg_t512_r1_v8_c2_reg",
                           "rmsnorm.fwd_train.bf16.w_f32.n65536.zero_centered.residual.cfg_t512_r1_v8_smem",
                           "layernorm.fwd_train.f16.w_f16.n131072.bias.residual.cfg_t512_r1_v8_c4_smem",
                           "rmsnorm.fwd_train.bf16.w_bf16.n100000.residual.cfg_t1024_r1_v8_gmem",
                           "layernorm.fwd_train.f32.w_f32.n20001.bias.zero_centered.residual.cfg_t1024_r1_v1_gmem",
                           "adalayernorm.fwd_train.bf16.w_bf16.n4096.bias.residual.cfg_t128_r1_v8_smem"})
    cases.push_back(pinned_case(text, 3.0));
  warm_cases(cases);
  int64_t h_checked = 0;
  for (const Case& c : cases) {
    check_forward_case(c);
    if (c.spec.residual) h_checked += c.rows * c.spec.n;
  }
  CHECK(h_checked > 0);
  MESSAGE(cases.size() << " fused forward cases checked on " << runtime().device().name << "; " << h_checked
                       << " elements of h bit for bit");
}

TEST_CASE("fusions backward: dx + dh_out and zero-centred weights match the reference") {
  std::vector<Case> cases = fusion_cases(Phase::kBackward);
  // Every backward route with dh_out: registers, shared rows, pipelined (cp.async, bulk copies),
  // clusters, and the split route.
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n16384.bias.residual.cfg_t512_r1_v8_smem",
                           "rmsnorm.bwd.bf16.w_f32.n4096.zero_centered.residual.cfg_t256_r1_v8_tma3",
                           "rmsnorm.bwd.f32.w_f32.n4096.bias.residual.cfg_t256_r1_v4_pipe",
                           "layernorm.bwd.bf16.w_f32.n65536.bias.residual.cfg_t1024_r1_v8_c4_tma",
                           "rmsnorm.bwd.f16.w_f16.n8192.zero_centered.residual.cfg_t64_r1_v8_c16_smem",
                           "layernorm.bwd.f32.w_f32.n20001.bias.zero_centered.residual.cfg_t1024_r1_v1_gmem",
                           // The residual picks' clusters of small CTAs: ragged (the last CTA's
                           // segment shorter), pipelined bulk copies, and 14 CTAs (non-portable).
                           "layernorm.bwd.bf16.w_f32.n10760.bias.residual.cfg_t128_r1_v8_c6_tma",
                           "rmsnorm.bwd.f16.w_f16.n17408.residual.cfg_t224_r1_v8_c5_tma3",
                           "rmsnorm.bwd.bf16.w_f32.n28672.residual.cfg_t128_r1_v8_c14_tma",
                           // dh_out bulk-copied beside x and dy: two and three stages, AdaLN.
                           "layernorm.bwd.f16.w_f16.n13824.bias.residual.cfg_t864_r1_v8_tma",
                           "rmsnorm.bwd.bf16.w_f32.n10240.zero_centered.residual.cfg_t640_r1_v8_tma3",
                           "adalayernorm.bwd.bf16.w_f32.n9216.bias.residual.cfg_t576_r1_v8_tma"})
    cases.push_back(pinned_case(text, 3.0));
  warm_cases(cases);
  for (const Case& c : cases) check_backward_case(c);
  MESSAGE(cases.size() << " fused backward cases checked on " << runtime().device().name);
}

// The fp32 residual stream (.residual_f32: residual, h and dh_out in fp32 beside x in bf16 / f16)
// and bias_in (forward): every norm, odd and large N, strided and unaligned rows, the epilogues.
static std::vector<Case> stream_cases(Phase phase) {
  const std::vector<int64_t> ns = grid_ns({1, 7, 127, 768, 1000, 4097, 7168, 12289, 18432, 32768, 100000, 262144});
  std::vector<Case> cases;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (DType x : {DType::kBF16, DType::kF16})
      for (int64_t n : ns)
        for (int variant = 0; variant < 3; ++variant) {
          Case c;
          c.spec = Spec::make(norm, phase, x, n, norm != Norm::kRMSNorm);
          c.spec.w_dtype = x == DType::kBF16 ? DType::kF32 : x;
          c.spec.residual = true;
          c.spec.residual_f32 = variant != 1;  // variant 1: bias_in with the stream in x's dtype
          c.spec.bias_in = variant != 0 && phase != Phase::kBackward;
          c.spec.zero_centered = variant == 2;
          if (phase == Phase::kBackward && variant == 1) continue;  // the plain residual backward
          c.rows = n >= 65536 ? 3 : 37;
          c.rows_per_batch = is_adaptive(norm) ? c.rows : 0;
          cases.push_back(c);
          if (is_adaptive(norm) && n <= 32768) {
            c.rows = 3 * 9;
            c.rows_per_batch = 9;
            cases.push_back(c);
          }
        }
  // Strided and unaligned rows and the epilogues, with the fp32 stream and (forward) bias_in.
  add_layout_cases(cases, phase, [](Spec& s) {
    s.residual = s.residual_f32 = true;
    s.bias_in = s.phase != Phase::kBackward;
  });
  return cases;
}

// A grid run through the generic kernels (switched on while generic_on lives), or through the
// specialized ones with their routes pinned beside the grid (a generic kernel has one route).
static void pin_routes_or_go_generic(std::vector<Case>& cases, bool generic, std::optional<GenericKernelsOn>& generic_on,
                                     std::initializer_list<const char*> pinned) {
  if (generic) {
    generic_on.emplace();
    return;
  }
  for (const char* text : pinned) cases.push_back(pinned_case(text, 3.0));
}

void gpu_test::check_fp32_stream_forward(bool generic) {
  std::vector<Case> cases = stream_cases(Phase::kForwardTraining);
  for (Case c : stream_cases(Phase::kForwardInference))
    if (c.spec.epilogue == Epilogue::kNone && c.row_stride == 0) cases.push_back(c);
  std::optional<GenericKernelsOn> generic_on;
  // Every forward row cache: registers (one CTA and a cluster), shared rows (one CTA, a cluster),
  // rows streamed twice.
  pin_routes_or_go_generic(cases, generic, generic_on,
                           {"layernorm.fwd_train.bf16.w_bf16.n32768.bias.residual_f32.cfg_t512_r1_v4_c4_reg",
                            "rmsnorm.fwd_train.bf16.w_f32.n65536.residual_f32.bias_in.cfg_t512_r1_v4_c2_smem",
                            "layernorm.fwd_train.f16.w_f16.n16384.bias.residual_f32.bias_in.cfg_t512_r1_v4_smem",
                            "rmsnorm.fwd_train.bf16.w_bf16.n100000.residual_f32.bias_in.cfg_t1024_r1_v4_gmem",
                            "adalayernorm.fwd_train.f16.w_f16.n4096.bias.residual_f32.bias_in.cfg_t128_r1_v4_smem"});
  if (!generic) warm_cases(cases);
  int64_t h_checked = 0;
  for (const Case& c : cases) {
    check_forward_case(c);
    h_checked += c.rows * c.spec.n;
  }
  MESSAGE(cases.size() << std::string(generic ? " generic" : "") << " fp32-stream / bias_in forward cases checked on "
                       << runtime().device().name << "; " << h_checked << " elements of h bit for bit");
}

TEST_CASE("fp32 residual stream and bias_in forward: h bit for bit, y against the reference") {
  check_fp32_stream_forward(false);
}

void gpu_test::check_fp32_stream_backward(bool generic) {
  std::vector<Case> cases = stream_cases(Phase::kBackward);
  std::optional<GenericKernelsOn> generic_on;
  pin_routes_or_go_generic(cases, generic, generic_on,
                           {"layernorm.bwd.bf16.w_f32.n16384.bias.residual_f32.cfg_t512_r1_v4_smem",
                            "rmsnorm.bwd.bf16.w_f32.n4096.zero_centered.residual_f32.cfg_t256_r1_v4_pipe3",
                            "layernorm.bwd.f16.w_f32.n65536.bias.residual_f32.cfg_t1024_r1_v4_c8_pipe",
                            "rmsnorm.bwd.bf16.w_bf16.n8192.residual_f32.cfg_t64_r1_v4_c16_smem",
                            "layernorm.bwd.bf16.w_f32.n20001.bias.residual_f32.cfg_t1024_r1_v1_gmem",
                            "rmsnorm.bwd.bf16.w_bf16.n1024.bias.residual_f32.cfg_t32_r8_v4_reg"});
  if (!generic) warm_cases(cases);
  int64_t dresidual_checked = 0;
  for (const Case& c : cases) {
    const BackwardRun r = check_backward_case(c);
    CHECK(r.dresidual <= 1.0);
    CHECK(r.dresidual_dx_mismatches == 0);
    dresidual_checked += c.rows * c.spec.n;
  }
  MESSAGE(cases.size() << std::string(generic ? " generic" : "") << " fp32-stream backward cases checked on "
                       << runtime().device().name << "; " << dresidual_checked
                       << " elements of dresidual, each rounding to dx's bits");
}

TEST_CASE("fp32 residual stream backward: dx and dresidual over every route") { check_fp32_stream_backward(false); }

void gpu_test::check_memory_efficient_backward(bool generic) {
  // The fusion grid (every norm, x dtype, odd and large N, plain and with each fusion), strided and
  // unaligned rows, and every backward route pinned.
  std::vector<Case> cases;
  for (Case c : fusion_cases(Phase::kBackward)) {
    if (c.spec.epilogue != Epilogue::kNone) continue;  // a clamp or gelu cannot be inverted
    c.spec.memory_efficient = true;
    c.min_abs_scale = 0.25;  // its precondition: gamma' away from 0 (docs/fusions.md)
    cases.push_back(c);
    if (c.spec.residual && !c.spec.zero_centered && c.row_stride == 0) {  // and without either fusion
      c.spec.residual = false;
      cases.push_back(c);
    }
  }
  std::optional<GenericKernelsOn> generic_on;
  pin_routes_or_go_generic(cases, generic, generic_on,
                           {"layernorm.bwd.bf16.w_f32.n16384.bias.memory_efficient.cfg_t512_r1_v8_smem",
                            "rmsnorm.bwd.bf16.w_f32.n4096.zero_centered.memory_efficient.cfg_t256_r1_v8_tma3",
                            "layernorm.bwd.f32.w_f32.n4096.bias.memory_efficient.cfg_t256_r1_v4_pipe",
                            "layernorm.bwd.bf16.w_f32.n65536.bias.memory_efficient.cfg_t1024_r1_v8_c4_tma",
                            "rmsnorm.bwd.f16.w_f16.n8192.bias.memory_efficient.cfg_t64_r1_v8_c16_smem",
                            "layernorm.bwd.bf16.w_bf16.n1024.bias.memory_efficient.cfg_t128_r1_v8_reg",
                            "rmsnorm.bwd.bf16.w_bf16.n256.bias.memory_efficient.cfg_t32_r4_v8_reg",
                            "layernorm.bwd.f32.w_f32.n20001.bias.zero_centered.memory_efficient.cfg_t1024_r1_v1_gmem",
                            // 1/gamma' and beta from the CTA's table (xhat_table): bulk and cp.async
                            // rows, held gamma, a cluster's per-group weights
                            "layernorm.bwd.bf16.w_bf16.n4096.bias.memory_efficient.cfg_t256_r1_v8_tma3",
                            "layernorm.bwd.bf16.w_f32.n8192.bias.zero_centered.memory_efficient.cfg_t512_r1_v8_tma3",
                            "layernorm.bwd.bf16.w_f32.n8192.bias.memory_efficient.cfg_t512_r1_v8_pipe",
                            "adalayernorm.bwd.bf16.w_bf16.n24576.bias.memory_efficient.cfg_t768_r1_v8_c2_tma"});
  for (Case& c : cases) c.min_abs_scale = 0.25;
  if (!generic) warm_cases(cases);
  double worst_from_x = 0;
  for (const Case& c : cases) worst_from_x = std::max(worst_from_x, check_backward_case(c).dx_from_x);
  MESSAGE(cases.size() << std::string(generic ? " generic" : "") << " memory_efficient backward cases checked on "
                       << runtime().device().name << "; dx against the backward of x: worst " << worst_from_x
                       << " x its tolerance");
}

TEST_CASE("memory_efficient backward: x̂ recovered from y matches the reference over every route") {
  check_memory_efficient_backward(false);
}
