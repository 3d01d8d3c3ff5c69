// Compiles a list of resolved specs with the library's own generate() and compile() and writes each
// kernel image to OUT_DIR/<spec>.sm_<arch>.cubin, for scripts/sass_compare.sh to disassemble.
//   sass_dump OUT_DIR                 the default list (below); written to OUT_DIR/specs.txt
//   sass_dump OUT_DIR SPECS           the "<arch> <spec>" lines of SPECS (a spec without a block
//                                     gets its pick), e.g. another dump's specs.txt: the same
//                                     kernels even if the picks moved
// The default list: the heuristic's picks for the grid, epilogues, strategies, bench sizes and
// default manifest of tests/runtime/test_compile.cpp's spill check, the bench sizes as picked for
// sm_80, and pinned strategies the heuristic may not pick (every row source, cluster and epilogue).
#include <atomic>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "normjit/normjit.hpp"
#include "tests/runtime/pinned_specs.hpp"
#include "tools/manifest.hpp"

using namespace normjit;

namespace {

std::vector<std::pair<int, Spec>> default_list(const std::string& manifest) {
  std::vector<std::pair<int, Spec>> out;
  const Norm norms[] = {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm};
  const Phase phases[] = {Phase::kForwardTraining, Phase::kForwardInference, Phase::kBackward};
  auto add = [&](const Spec& s, int arch = 90) { out.emplace_back(arch, s); };
  for (Norm norm : norms)
    for (Phase phase : phases)
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType w : {DType::kF32, DType::kF16, DType::kBF16})
          for (bool bias : {false, true})
            for (int64_t n : {1, 7, 127, 1000, 4097}) {
              Spec s = Spec::make(norm, phase, x, n, bias);
              s.w_dtype = w;
              add(resolve(s));
            }
  for (Epilogue ep : {Epilogue::kReluBitmask, Epilogue::kGelu})
    for (Norm norm : norms)
      for (Phase phase : phases)
        for (DType x : {DType::kF32, DType::kBF16})
          for (int64_t n : {3, 7, 127, 768, 4097}) {
            Spec s = Spec::make(norm, phase, x, n, true);
            s.epilogue = ep;
            add(resolve(s));
          }
  for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t n : {2, 32, 256, 768, 2880, 4096, 5120, 8192, 12288, 16384, 18432, 28672, 40960, 65536, 81920,
                      131072, 262144})
      for (Norm norm : norms)
        for (Phase phase : {Phase::kForwardTraining, Phase::kBackward}) add(resolve(Spec::make(norm, phase, x, n, true)));
  // The bench's sizes (bf16 x; backward with fp32 weights), picked for sm_90 and for sm_80.
  for (int64_t n : {256, 512, 768, 1024, 2048, 2880, 3584, 4096, 5120, 7168, 8192, 10240, 11264, 12288, 13312, 14336,
                    15360, 16384, 18432, 20480, 22528, 24576, 26624, 28672, 30720, 32768, 36864, 40960, 45056, 49152,
                    53248, 57344, 61440, 65536, 73728, 81920, 98304, 114688, 122880, 131072, 262144})
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm}) {
      const bool bias = norm == Norm::kLayerNorm;
      Spec backward = Spec::make(norm, Phase::kBackward, DType::kBF16, n, bias);
      backward.w_dtype = DType::kF32;
      for (int arch : {90, 80}) {
        add(resolve(Spec::make(norm, Phase::kForwardTraining, DType::kBF16, n, bias), 16, arch), arch);
        add(resolve(backward, 16, arch), arch);
      }
    }
  for (const char* text : normjit::testing::kPinnedStrategySpecs) add(Spec::parse(text));
  for (const char* text : {
           // Every row source of the backward: cp.async pipelines, bulk copies, 3-4 buffers,
           // clusters of 2-16 CTAs, shared dbeta sums; f32, f16 and bf16 x; every epilogue.
           "layernorm.bwd.bf16.w_f32.n8192.bias.cfg_t512_r1_v8_pipe",
           "layernorm.bwd.bf16.w_bf16.n7168.bias.cfg_t448_r1_v8_pipe3",
           "rmsnorm.bwd.f16.w_f16.n8192.cfg_t256_r1_v8_pipe4",
           "layernorm.bwd.bf16.w_f32.n12288.bias.cfg_t768_r1_v8_tma3",
           "rmsnorm.bwd.bf16.w_f32.n12288.cfg_t384_r1_v8_tma4",
           "layernorm.bwd.bf16.w_bf16.n18432.bias.cfg_t768_r1_v8_tma",
           "layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t768_r1_v8_c2_tma",
           "rmsnorm.bwd.bf16.w_f32.n32768.cfg_t512_r1_v8_c2_tma",
           "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_tma",
           "layernorm.bwd.f32.w_f32.n16384.bias.cfg_t512_r1_v4_c2_pipe",
           "layernorm.bwd.bf16.w_f32.n32768.bias.cfg_t512_r1_v8_c2_smem",
           "rmsnorm.bwd.bf16.w_f32.n65536.cfg_t512_r1_v8_c4_smem",
           "layernorm.bwd.bf16.w_f32.n131072.bias.cfg_t1024_r1_v8_c8_smem",
           "rmsnorm.bwd.bf16.w_bf16.n262144.cfg_t1024_r1_v8_c16_smem",
           "layernorm.bwd.f16.w_f32.n65536.bias.relu_bitmask.cfg_t512_r1_v8_c4_smem",
           "layernorm.bwd.bf16.w_f32.n65536.bias.gelu.cfg_t1024_r1_v8_c4_tma",
           "adalayernorm.bwd.bf16.w_f32.n8192.bias.cfg_t512_r1_v8_pipe",
           "adalayernorm.bwd.f16.w_f16.n24576.bias.cfg_t768_r1_v8_c2_smem",
           "adalayernorm.bwd.bf16.w_bf16.n4096.bias.gelu.cfg_t512_r1_v8_tma",
           "rmsnorm.bwd.f32.w_f32.n14336.bias.cfg_t896_r1_v4_smem",
           "rmsnorm.bwd.bf16.w_f32.n24576.bias.cfg_t768_r1_v8_smem",
           "layernorm.bwd.bf16.w_f32.n1024.bias.cfg_t32_r4_v8_reg",
           "rmsnorm.bwd.f16.w_f16.n128.bias.relu_bitmask.cfg_t8_r16_v2_reg",
           "layernorm.bwd.bf16.w_f32.n4096.bias.cfg_t512_r1_v8_gmem",
           // The forward's row sources likewise.
           "layernorm.fwd_train.bf16.w_f32.n8192.bias.cfg_t512_r1_v8_pipe",
           "rmsnorm.fwd_infer.f16.w_f16.n16384.cfg_t512_r1_v8_pipe3",
           "layernorm.fwd_train.bf16.w_bf16.n12288.bias.cfg_t384_r1_v8_tma3",
           "layernorm.fwd_train.f32.w_f32.n8192.bias.gelu.cfg_t256_r1_v4_tma4",
           "adalayernorm.fwd_train.bf16.w_f32.n16384.bias.cfg_t512_r1_v8_c2_tma",
           "rmsnorm.fwd_train.bf16.w_bf16.n131072.relu_bitmask.cfg_t512_r1_v8_c8_pipe",
           "layernorm.fwd_infer.bf16.w_bf16.n262144.bias.cfg_t1024_r1_v8_c16_smem",
           "layernorm.fwd_train.f16.w_f16.n65536.bias.cfg_t1024_r1_v8_gmem",
           "rmsnorm.fwd_train.f32.w_f32.n1000.relu_bitmask.cfg_t32_r4_v4_reg",
       })
    add(Spec::parse(text));
  for (const Spec& s : tools::read_manifest(manifest)) add(resolve(s));
  // Each kernel once.
  std::set<std::string> seen;
  std::vector<std::pair<int, Spec>> unique;
  for (auto& [arch, s] : out)
    if (seen.insert(std::to_string(arch) + ' ' + s.str()).second) unique.emplace_back(arch, s);
  return unique;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: sass_dump OUT_DIR [SPECS]   (run from the repository root)\n";
    return 2;
  }
  const std::string out_dir = argv[1];
  std::vector<std::pair<int, Spec>> specs;
  try {
    if (argc == 3) {
      std::ifstream in(argv[2]);
      if (!in) throw Error(Status::kInvalidArgument, std::string("SPECS '") + argv[2] + "' cannot be opened");
      int arch;
      std::string text;
      while (in >> arch >> text) {
        const Spec s = Spec::parse(text);
        specs.emplace_back(arch, s.block ? s : resolve(s));  // a spec without a block gets its pick
      }
    } else {
      specs = default_list("manifests/default.txt");
    }
  } catch (const Error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
  std::ofstream list(out_dir + "/specs.txt");
  for (const auto& [arch, s] : specs) list << arch << ' ' << s.str() << '\n';
  list.close();

  std::atomic<size_t> next{0};
  std::atomic<int> failed{0};
  std::mutex mutex;
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      const auto& [arch, spec] = specs[i];
      const std::string name = spec.str() + ".sm_" + std::to_string(arch);
      try {
        const CompileResult r = compile(generate(spec), Target{arch});
        std::ofstream(out_dir + "/" + name + ".cubin", std::ios::binary)
            .write(r.binary.image.data(), static_cast<std::streamsize>(r.binary.image.size()));
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        std::cerr << name << ": " << e.what() << '\n';
        ++failed;
      }
    }
  };
  // NVRTC is thread safe; two threads keep a shared 2-core machine usable.
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  std::cout << specs.size() << " kernels compiled, " << failed << " failed, into " << out_dir << '\n';
  return failed ? 1 : 0;
}
