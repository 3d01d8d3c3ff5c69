// Golden files of generated source: a codegen change shows up as a diff here.
// NORMJIT_UPDATE_GOLDEN=1 rewrites them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "normjit/normjit.hpp"

using namespace normjit;

TEST_CASE("generated source matches the golden files") {
  const char* specs[] = {
      "layernorm.fwd_train.bf16.w_f32.n4096.bias",
      "rmsnorm.fwd_infer.f16.w_f16.n7",
      "layernorm.fwd_infer.f32.w_bf16.n262144",
      "rmsnorm.fwd_train.bf16.w_bf16.n128.bias",
      "layernorm.bwd.bf16.w_f32.n4096.bias",
      "layernorm.bwd.bf16.w_f32.n65536.bias",
      "rmsnorm.bwd.bf16.w_f32.n16384",
      "adalayernorm.fwd_train.f16.w_f16.n768.bias",
      "layernorm.fwd_train.f32.w_f32.n768.bias.relu_bitmask",
      "rmsnorm.bwd.f16.w_f16.n128.bias.gelu",
      "rmsnorm.fwd_infer.bf16.w_bf16.n4096.fp8_e4m3",
      "rmsnorm.fwd_infer.bf16.w_bf16.n4096.int8_row",
      "rmsnorm.fwd_infer.bf16.w_bf16.n4096.mxfp8_e4m3",
      "rmsnorm.fwd_infer.bf16.w_bf16.n4096.nvfp4",
      "rmsnorm.fwd_train.bf16.w_bf16.n4096.zero_centered.residual",
      "layernorm.bwd.bf16.w_f32.n4096.bias.memory_efficient",
      "layernorm.bwd.bf16.w_f32.n4096.bias.residual",
      "rmsnorm.fwd_train.bf16.w_bf16.n4096.residual_f32.bias_in",
      "layernorm.bwd.bf16.w_f32.n4096.bias.residual_f32",
  };
  const bool update = std::getenv("NORMJIT_UPDATE_GOLDEN") != nullptr;
  for (const std::string text : specs) {
    CAPTURE(text);
    const GeneratedSource g = generate(resolve(Spec::parse(text)));
    // Deterministic: the same spec always gives the same bytes.
    CHECK(generate(resolve(Spec::parse(text))).source == g.source);
    const std::string path = std::string(NORMJIT_GOLDEN_DIR) + "/" + text + ".cu";
    if (update) {
      std::ofstream(path, std::ios::binary) << g.source;
      MESSAGE("updated " << path);
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "missing golden file " << path << " (run with NORMJIT_UPDATE_GOLDEN=1)");
    std::stringstream want;
    want << in.rdbuf();
    CHECK(want.str() == g.source);
  }
}

TEST_CASE("generated source binds parameters only and names the kernel after the spec") {
  const GeneratedSource g = generate(resolve(Spec::parse("layernorm.fwd_train.bf16.w_f32.n4096.bias")));
  CHECK(g.kernel_name == "normjit_layernorm_fwd_train_bf16_w_f32_n4096_bias_cfg_t128_r1_v8_reg");
  CHECK(g.source.find("#include \"normjit/norm_fwd.cuh\"") != std::string::npos);
  CHECK(g.source.find("static constexpr int kN = 4096;") != std::string::npos);
  CHECK(g.source.find("using WT = normjit::f32;") != std::string::npos);
  CHECK(g.source.find("{{") == std::string::npos);
  CHECK(g.threads_per_cta == 128);
}

TEST_CASE("epilogues are a template slot: the norm kernels are the same text for every epilogue") {
  const GeneratedSource none = generate(resolve(Spec::parse("layernorm.fwd_train.bf16.n768.bias")));
  const GeneratedSource relu = generate(resolve(Spec::parse("layernorm.fwd_train.bf16.n768.bias.relu_bitmask")));
  const GeneratedSource gelu = generate(resolve(Spec::parse("layernorm.fwd_train.bf16.n768.bias.gelu")));
  CHECK(relu.source.find("#include \"normjit/epilogue_relu_bitmask.cuh\"") != std::string::npos);
  CHECK(gelu.source.find("using Epilogue = normjit::EpilogueGelu;") != std::string::npos);
  CHECK(none.source.find("using Epilogue = normjit::EpilogueNone;") != std::string::npos);
  const GeneratedSource fp8 = generate(resolve(Spec::parse("layernorm.fwd_train.bf16.n768.bias.fp8_e5m2")));
  CHECK(fp8.source.find("#include \"normjit/epilogue_fp8.cuh\"") != std::string::npos);
  CHECK(fp8.source.find("using Epilogue = normjit::EpilogueFp8<true>;") != std::string::npos);
  const GeneratedSource row = generate(resolve(Spec::parse("layernorm.fwd_train.bf16.n768.bias.int8_row")));
  CHECK(row.source.find("#include \"normjit/epilogue_quant_row.cuh\"") != std::string::npos);
  CHECK(row.source.find("using Epilogue = normjit::EpilogueRowQuant<normjit::RowQuantFormat::kInt8>;") !=
        std::string::npos);
  // Backward routes: fused for rows in registers or shared memory (one CTA, or a cluster of them
  // on sm_90), row sums + tiles beyond.
  CHECK(generate(resolve(Spec::parse("rmsnorm.bwd.bf16.n4096"))).source.find("#if 1") != std::string::npos);
  const std::string clustered = generate(resolve(Spec::parse("rmsnorm.bwd.bf16.n65536"))).source;
  CHECK(clustered.find("#if 1") != std::string::npos);
  CHECK(clustered.find("__cluster_dims__(4, 1, 1)") != std::string::npos);
  CHECK(generate(resolve(Spec::parse("rmsnorm.bwd.bf16.n65536"), 16, 80)).source.find("#if 0") != std::string::npos);
  CHECK(generate(resolve(Spec::parse("layernorm.bwd.bf16.n262144.bias"), 16, 90, kMaxPortableCluster))
            .source.find("#if 0") != std::string::npos);
  CHECK(generate(resolve(Spec::parse("layernorm.bwd.bf16.n262144.bias"))).source.find("__cluster_dims__(16, 1, 1)") !=
        std::string::npos);
}

TEST_CASE("fusions are template slots: a fused spec's source differs from its plain twin in the bindings only") {
  // Lines of `fused` not in `plain`, and the other way round, after removing the kernel's name.
  auto differing = [](const std::string& plain_text, const std::string& fused_text) {
    const Spec plain = resolve(Spec::parse(plain_text));
    Spec fused = resolve(Spec::parse(fused_text));
    fused.block = plain.block;  // the same block config, whatever each would pick
    auto lines = [](const Spec& s) {
      std::vector<std::string> out;
      std::istringstream in(generate(s).source);
      for (std::string line; std::getline(in, line);)
        if (line.find("normjit_") == std::string::npos && line.find("// normjit kernel") == std::string::npos)
          out.push_back(line);
      return out;
    };
    // As multisets, so that a binding line the fused kernel adds does not shift the rest.
    std::vector<std::string> a = lines(plain), b = lines(fused), diff;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
    return diff;
  };
  for (const auto& [plain, fused] : std::vector<std::pair<std::string, std::string>>{
           {"rmsnorm.fwd_train.bf16.n4096", "rmsnorm.fwd_train.bf16.n4096.zero_centered.residual"},
           {"layernorm.bwd.bf16.w_f32.n65536.bias", "layernorm.bwd.bf16.w_f32.n65536.bias.residual"},
           {"adalayernorm.fwd_infer.f16.n768.bias.relu_bitmask", "adalayernorm.fwd_infer.f16.n768.bias.residual.relu_bitmask"},
           // An fp32 stream's kernel is the f32 kernel with x, y, dy and dx in x's dtype.
           {"rmsnorm.fwd_train.f32.w_bf16.n4096", "rmsnorm.fwd_train.bf16.w_bf16.n4096.residual_f32.bias_in"},
           {"layernorm.bwd.f32.w_f32.n12288.bias", "layernorm.bwd.bf16.w_f32.n12288.bias.residual_f32"}}) {
    CAPTURE(fused);
    const std::vector<std::string> diff = differing(plain, fused);
    // The lines that bind the fusions (each line of the plain kernel and its fused replacement),
    // kDbetaShared: the residual backward holds dh_out too, so its dbeta sums move to shared memory
    // at fewer values per thread (dbeta_sums_in_shared), and kBulkDhOut: its bulk-copied rows bring
    // dh_out in with the row (bulk_copies_dh_out).
    REQUIRE(diff.size() <= 6);
    CHECK(!diff.empty());
    for (const std::string& d : diff) {
      INFO(d);
      CHECK((d.find("using Prologue = ") != std::string::npos || d.find("kZeroCenteredGamma = ") != std::string::npos ||
             d.find("kDbetaShared = ") != std::string::npos || d.find("using YT = ") != std::string::npos ||
             d.find("kBulkDhOut = ") != std::string::npos));
    }
  }
}
