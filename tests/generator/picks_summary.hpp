#pragma once
// A summary of the heuristic's picks: per class of specs, a hash of the block config resolved at
// every N from 1 to 262144, and the configs at the hidden sizes models use. The golden copy
// (tests/golden/picks_summary.txt) makes any change to the picks show up as a diff.
#include <cstdint>
#include <sstream>
#include <string>

#include "normjit/spec.hpp"

namespace normjit::testing {

inline std::string block_text(const BlockConfig& b) {
  Spec s = Spec::make(Norm::kRMSNorm, Phase::kForwardTraining, DType::kBF16, 8);
  s.block = b;
  const std::string t = s.str();
  return t.substr(t.find(".cfg_") + 5);
}

inline uint64_t fnv1a(uint64_t h, const std::string& text) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

struct PickClass {
  int sm;
  int max_cluster;
  Spec spec;  // n is replaced
  int max_vec;
};

inline std::string pick_class_name(const PickClass& c) {
  Spec s = c.spec;
  s.n = 1;
  std::string name = s.str();
  name.replace(name.find(".n1"), 3, "");
  return "sm" + std::to_string(c.sm) + " c" + std::to_string(c.max_cluster) + " v" + std::to_string(c.max_vec) + " " + name;
}

inline std::string picks_summary_line(const PickClass& c) {
  static const int64_t kModelSizes[] = {128,   768,   1024,  2048,  2560,  2880,  3000,  3584,   4096,   4544,  5120,
                                        6144,  7168,  8192,  10240, 12288, 13824, 14336, 16384,  18432,  20480, 24576,
                                        28672, 32768, 40960, 50000, 53248, 65536, 98304, 131072, 262144};
  uint64_t h = 1469598103934665603ull;
  for (int64_t n = 1; n <= kMaxHiddenSize; ++n) {
    Spec s = c.spec;
    s.n = n;
    h = fnv1a(h, block_text(*resolve(s, c.max_vec, c.sm, c.max_cluster).block));
  }
  std::ostringstream out;
  out << pick_class_name(c) << " all-N fnv1a " << std::hex << h << std::dec << "\n ";
  for (int64_t n : kModelSizes) {
    Spec s = c.spec;
    s.n = n;
    out << ' ' << n << '=' << block_text(*resolve(s, c.max_vec, c.sm, c.max_cluster).block);
  }
  return out.str();
}

// The classes the golden summary covers: every strategy-relevant dimension (phase, norm, bias,
// x size, the mask epilogue, the GPU class and its cluster limit), plus spot checks that the
// dimensions the picks ignore (AdaLayerNorm, f16, gelu, fwd_infer, weight dtype) stay ignored.
inline std::vector<PickClass> pick_classes() {
  std::vector<PickClass> out;
  const std::pair<int, int> gpus[] = {{80, kMaxPortableCluster}, {90, kMaxCluster}, {90, kMaxPortableCluster}};
  for (auto [sm, max_cluster] : gpus)
    for (Phase phase : {Phase::kForwardTraining, Phase::kBackward})
      for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm})
        for (bool bias : {false, true})
          for (DType x : {DType::kBF16, DType::kF32})
            for (Epilogue ep : {Epilogue::kNone, Epilogue::kReluBitmask}) {
              Spec s = Spec::make(norm, phase, x, 1, bias);
              if (phase == Phase::kBackward) s.w_dtype = DType::kF32;
              s.epilogue = ep;
              out.push_back({sm, max_cluster, s, 16});
            }
  for (const char* text : {"adalayernorm.bwd.f16.w_bf16.n1.bias.gelu", "adalayernorm.fwd_infer.f16.w_f32.n1.bias",
                           "rmsnorm.fwd_train.f16.w_f16.n1.gelu", "layernorm.bwd.bf16.w_bf16.n1.bias"}) {
    out.push_back({90, kMaxCluster, Spec::parse(text), 16});
  }
  // The residual add: its own backward rows, and its forward's pipelined picks turned into smem.
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n1.bias.residual", "rmsnorm.bwd.bf16.w_f32.n1.residual",
                           "rmsnorm.bwd.bf16.w_f32.n1.bias.zero_centered.residual.relu_bitmask",
                           "layernorm.fwd_train.bf16.w_bf16.n1.bias.residual", "rmsnorm.fwd_infer.bf16.w_bf16.n1.residual"})
    for (auto [sm, max_cluster] : gpus) out.push_back({sm, max_cluster, Spec::parse(text), 16});
  // The fp32 residual stream, plain and with a quantized output (+quant rows).
  for (const char* text : {"rmsnorm.fwd_infer.bf16.w_bf16.n1.residual_f32",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n1.residual_f32.fp8_e4m3_row",
                           "layernorm.fwd_infer.bf16.w_bf16.n1.bias.residual_f32",
                           "layernorm.fwd_infer.bf16.w_bf16.n1.bias.residual_f32.fp8_e4m3"})
    out.push_back({90, kMaxCluster, Spec::parse(text), 16});
  out.push_back({90, kMaxCluster, Spec::parse("layernorm.bwd.bf16.w_f32.n1.bias"), 4});
  out.push_back({90, kMaxCluster, Spec::parse("rmsnorm.fwd_train.bf16.w_bf16.n1"), 4});
  return out;
}

}  // namespace normjit::testing
