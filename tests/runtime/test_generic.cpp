// Generic kernels and the compile modes without a GPU: the images built into the library, their
// coverage, the mode switch, and the background compiler (compiles with NVRTC, failures, the
// shutdown while a compile is in flight).
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "normjit/normjit.hpp"

using namespace normjit;

namespace {

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

std::set<std::string> kernels_in(const GenericImage& image) {
  std::set<std::string> names;
  const auto frames = cubin_frame_bytes(std::vector<char>(image.image.begin(), image.image.end()));
  REQUIRE(frames.has_value());
  for (const auto& [name, bytes] : *frames) names.insert(name);
  return names;
}

}  // namespace

TEST_CASE("compile modes: names, the environment variable and its errors") {
  CHECK(parse_compile_mode("sync") == CompileMode::kSync);
  CHECK(parse_compile_mode("async") == CompileMode::kAsync);
  CHECK(parse_compile_mode("generic") == CompileMode::kGeneric);
  CHECK(std::string(to_string(CompileMode::kAsync)) == "async");
  CHECK(compile_mode_from_env() == CompileMode::kSync);
  {
    EnvVar env("NORMJIT_COMPILE_MODE", "async");
    CHECK(compile_mode_from_env() == CompileMode::kAsync);
  }
  EnvVar env("NORMJIT_COMPILE_MODE", "lazy");
  try {
    compile_mode_from_env();
    FAIL("NORMJIT_COMPILE_MODE=lazy was accepted");
  } catch (const Error& e) {
    CHECK(e.status() == Status::kInvalidArgument);
    CHECK(std::string(e.what()).find("NORMJIT_COMPILE_MODE='lazy'") != std::string::npos);
  }
}

TEST_CASE("generic kernels cover the plain norms and the activation epilogues; the rest is named") {
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (Epilogue e : {Epilogue::kNone, Epilogue::kReluBitmask, Epilogue::kGelu})
      for (int64_t n : {1, 50000, 262144}) {
        Spec s = Spec::make(norm, Phase::kBackward, DType::kBF16, n, true);
        s.epilogue = e;
        s.zero_centered = true;
        CHECK_MESSAGE(generic_unsupported_why(s).empty(), s.str());
      }
  Spec fp8 = Spec::make(Norm::kRMSNorm, Phase::kForwardInference, DType::kBF16, 4096, false);
  fp8.epilogue = Epilogue::kFp8E4M3;
  CHECK(generic_unsupported_why(fp8).find("epilogue=fp8_e4m3") != std::string::npos);
  Spec residual = Spec::make(Norm::kRMSNorm, Phase::kForwardTraining, DType::kBF16, 4096, false);
  residual.residual = true;
  residual.bias_in = true;
  CHECK(generic_unsupported_why(residual).empty());  // the residual add in x's dtype, with bias_in
  residual.residual_f32 = true;
  CHECK(generic_unsupported_why(residual).find("residual_f32") != std::string::npos);
  Spec from_y = Spec::make(Norm::kLayerNorm, Phase::kBackward, DType::kBF16, 4096, true);
  from_y.memory_efficient = true;
  CHECK(generic_unsupported_why(from_y).find("memory_efficient") != std::string::npos);
}

TEST_CASE("the library carries generic images for sm_80, sm_90 and compute_90, with every kernel") {
  REQUIRE(generic_images().size() == 3 * generic_program_dtypes().size());
  for (DType x : generic_program_dtypes()) {
    const std::string dtype = to_string(x);
    CAPTURE(dtype);
    const GenericImage* sm90 = generic_image_for(x, 90);
    const GenericImage* sm86 = generic_image_for(x, 86);
    const GenericImage* sm100 = generic_image_for(x, 100);
    REQUIRE(sm90);
    REQUIRE(sm86);
    REQUIRE(sm100);
    CHECK(sm90->arch == "sm_90");
    CHECK(sm86->arch == "sm_80");  // a cubin runs on later minor versions of its major
    CHECK(sm100->arch == "compute_90");
    CHECK(sm100->is_ptx);
    CHECK(generic_image_for(x, 75) == nullptr);
    CHECK(sm100->image.data()[sm100->image.size()] == '\0');  // the driver reads PTX as a C string
    CHECK(sm100->image.find(".entry normjit_generic_") != std::string_view::npos);
    for (const GenericImage* cubin : {sm90, sm86}) {
      const std::set<std::string> names = kernels_in(*cubin);
      int expected = 0;
      for (DType w : generic_program_dtypes()) {
        CHECK(names.count(generic_reduce_name(w)) == 1);
        for (Epilogue e : {Epilogue::kNone, Epilogue::kReluBitmask, Epilogue::kGelu})
          for (Phase phase : {Phase::kForwardTraining, Phase::kBackward})
            for (int vec : generic_vecs(x))
            for (bool residual : {false, true}) {
              Spec s = Spec::make(Norm::kLayerNorm, phase, x, 4096, true);
              s.w_dtype = w;
              s.epilogue = e;
              s.residual = residual;
              CHECK_MESSAGE(names.count(generic_kernel_name(s, vec)) == 1, generic_kernel_name(s, vec));
              ++expected;
            }
      }
      MESSAGE(dtype << " " << cubin->arch << ": " << expected << " row kernels, " << cubin->image.size()
                           << " bytes");
    }
  }
}

TEST_CASE("background compiler: compiles a spec with NVRTC once, and hands its binary over once") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("normjit-bg-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  DiskCache cache(dir);
  std::atomic<int> calls{0};
  const Spec spec = resolve(Spec::make(Norm::kRMSNorm, Phase::kForwardTraining, DType::kBF16, 3000, false));
  {
    BackgroundCompiler bg(
        [&](const Spec& s) {
          ++calls;
          return cache.get_or_compile(s, Target{90});
        },
        2);
    CHECK(bg.state(7) == BackgroundCompiler::State::kUnknown);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(bg.request(7, spec) == BackgroundCompiler::State::kQueued);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(5));  // returns at once
    CHECK(bg.request(7, spec) != BackgroundCompiler::State::kUnknown);  // known: not queued twice
    bg.wait_idle();
    CHECK(bg.state(7) == BackgroundCompiler::State::kReady);
    CHECK(bg.request(7, spec) == BackgroundCompiler::State::kReady);
    const std::optional<Binary> binary = bg.take(7);
    REQUIRE(binary.has_value());
    CHECK(binary->kernel_name.find("normjit_") == 0);
    CHECK(binary->image.size() > 1000);
    CHECK_FALSE(bg.take(7).has_value());
    CHECK(calls == 1);
    CHECK(cache.has_entry(spec, Target{90}));  // stored: the next process loads it from disk
  }
  fs::remove_all(dir);
}

TEST_CASE("background compiler: a failed compile is kept as failed, with its error, and not retried") {
  std::atomic<int> calls{0};
  BackgroundCompiler bg(
      [&](const Spec& s) -> Binary {
        ++calls;
        throw Error(Status::kCompileFailed, "compiling " + s.str() + ": injected failure");
      },
      1);
  const Spec spec = resolve(Spec::make(Norm::kLayerNorm, Phase::kBackward, DType::kF16, 777, true));
  bg.request(1, spec);
  bg.wait_idle();
  CHECK(bg.state(1) == BackgroundCompiler::State::kFailed);
  CHECK(bg.error(1).find("injected failure") != std::string::npos);
  CHECK_FALSE(bg.take(1).has_value());
  CHECK(bg.request(1, spec) == BackgroundCompiler::State::kFailed);
  bg.wait_idle();
  CHECK(calls == 1);
}

TEST_CASE("background compiler: shutdown drops queued compiles and waits for the one in flight") {
  std::atomic<int> started{0}, finished{0};
  const Spec spec = resolve(Spec::make(Norm::kLayerNorm, Phase::kForwardTraining, DType::kBF16, 1024, true));
  auto bg = std::make_unique<BackgroundCompiler>(
      [&](const Spec&) -> Binary {
        ++started;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ++finished;
        return Binary{};
      },
      1);
  for (uint64_t key = 0; key < 4; ++key) bg->request(key, spec);
  while (started == 0) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  bg.reset();  // one compile in flight, three queued
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(started == 1);
  CHECK(finished == 1);  // the destructor returned after the compile in flight, not before
  CHECK(waited_ms < 1000);
  MESSAGE("shutdown waited " << waited_ms << " ms for the compile in flight");
}

TEST_CASE("background compiler: NORMJIT_COMPILE_THREADS, and bad values named") {
  {
    EnvVar env("NORMJIT_COMPILE_THREADS", "3");
    CHECK(BackgroundCompiler::default_threads() == 3);
  }
  CHECK(BackgroundCompiler::default_threads() >= 1);
  EnvVar env("NORMJIT_COMPILE_THREADS", "0");
  try {
    BackgroundCompiler::default_threads();
    FAIL("NORMJIT_COMPILE_THREADS=0 was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("NORMJIT_COMPILE_THREADS='0'") != std::string::npos);
  }
}
