// NVRTC compiles every forward specialization for sm_90 without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "normjit/normjit.hpp"

using namespace normjit;

TEST_CASE("every specialization compiles for sm_90 over a grid of N") {
  const Norm norms[] = {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm};
  const Phase phases[] = {Phase::kForwardTraining, Phase::kForwardInference, Phase::kBackward};
  std::vector<Spec> specs;
  // Every op, phase, x dtype x weight dtype and bias, over odd and even N.
  for (Norm norm : norms)
    for (Phase phase : phases)
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType w : {DType::kF32, DType::kF16, DType::kBF16})
          for (bool bias : {false, true})
            for (int64_t n : {1, 7, 127, 1000, 4097}) {
              Spec s = Spec::make(norm, phase, x, n, bias);
              s.w_dtype = w;
              specs.push_back(resolve(s));
            }
  // The epilogues with every op and phase.
  for (Epilogue ep : {Epilogue::kReluBitmask, Epilogue::kGelu})
    for (Norm norm : norms)
      for (Phase phase : phases)
        for (DType x : {DType::kF32, DType::kBF16})
          for (int64_t n : {3, 7, 127, 768, 4097}) {
            Spec s = Spec::make(norm, phase, x, n, true);
            s.epilogue = ep;
            specs.push_back(resolve(s));
          }
  // Every strategy and the size extremes, per x dtype.
  for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t n : {2, 32, 256, 768, 2880, 4096, 5120, 8192, 16384, 65536, 131072, 262144})
      for (Norm norm : norms)
        for (Phase phase : {Phase::kForwardTraining, Phase::kBackward})
          specs.push_back(resolve(Spec::make(norm, phase, x, n, true)));

  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<double> ms;
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      try {
        const CompileResult r = compile(generate(specs[i]), Target{90});
        std::lock_guard<std::mutex> lock(mutex);
        ms.push_back(r.milliseconds);
        if (r.binary.image.size() < 256 || r.binary.is_ptx) failures.push_back(specs[i].str() + ": no cubin");
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back(e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(ms.size() == specs.size());
  std::sort(ms.begin(), ms.end());
  MESSAGE(specs.size() << " kernels compiled for sm_90; median " << ms[ms.size() / 2] << " ms per kernel (this CPU)");
}

TEST_CASE("a compile error carries the spec, the options and the NVRTC log") {
  GeneratedSource bad = generate(resolve(Spec::parse("rmsnorm.fwd_infer.f32.n64")));
  bad.source += "\nthis_is_not_cuda;\n";
  try {
    compile(bad, Target{90});
    FAIL("expected a compile error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(e.status() == Status::kCompileFailed);
    CHECK(what.find("rmsnorm.fwd_infer.f32.w_f32.n64") != std::string::npos);
    CHECK(what.find("-arch=sm_90") != std::string::npos);
    CHECK(what.find("this_is_not_cuda") != std::string::npos);
  }
}

TEST_CASE("targets: named archs, and PTX for an arch NVRTC does not know") {
  CHECK(Target::parse("sm_90").arch == 90);
  CHECK(Target::parse("80").arch == 80);
  CHECK_THROWS_AS(Target::parse("sm_70"), Error);
  CHECK_THROWS_AS(Target::parse("sm_9x"), Error);
  const auto archs = nvrtc_supported_archs();
  REQUIRE(!archs.empty());
  bool ptx = true;
  compile_options(Target{90}, &ptx);
  CHECK_FALSE(ptx);
  // An arch past every supported one falls back to PTX for the newest NVRTC knows.
  const int future = archs.back() + 1;
  const auto opts = compile_options(Target{future}, &ptx);
  CHECK(ptx);
  CHECK(opts[0] == "-arch=compute_" + std::to_string(archs.back()));
  const CompileResult r = compile(generate(resolve(Spec::parse("layernorm.fwd_infer.bf16.n512"))), Target{future});
  CHECK(r.binary.is_ptx);
  CHECK(std::string(r.binary.image.data()).find(".entry normjit_layernorm") != std::string::npos);
}
