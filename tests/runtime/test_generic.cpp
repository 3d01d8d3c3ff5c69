// Generic kernels and the compile modes without a GPU: the images built into the library, their
// coverage, the mode switch, and the background compiler (compiles with NVRTC, failures, the
// shutdown while a compile is in flight).
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "normjit/normjit.hpp"
#include "templates/normjit/generic_flags.h"

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
  for (const auto& [name, bytes] : *frames)
    if (name.rfind("normjit_generic_", 0) == 0) names.insert(name);  // kernels, not device functions
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

namespace {

// Every spec the grammar allows, over the norms, phases, dtypes, epilogues and fusions.
std::vector<Spec> every_kind_of_spec(int64_t n) {
  std::vector<Spec> specs;
  const Epilogue all_epilogues[] = {Epilogue::kNone,       Epilogue::kReluBitmask, Epilogue::kGelu,
                                    Epilogue::kFp8E4M3,    Epilogue::kFp8E5M2,     Epilogue::kFp8E4M3Row,
                                    Epilogue::kFp8E5M2Row, Epilogue::kInt8Row,     Epilogue::kMxfp8E4M3,
                                    Epilogue::kMxfp8E5M2,  Epilogue::kMxfp4,       Epilogue::kNvfp4};
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (Phase phase : {Phase::kForwardTraining, Phase::kForwardInference, Phase::kBackward})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType w : {DType::kF32, DType::kF16, DType::kBF16})
          for (Epilogue e : all_epilogues)
            for (int residual = 0; residual < 3; ++residual)
              for (bool from_y : {false, true}) {
                Spec s = Spec::make(norm, phase, x, n, norm != Norm::kRMSNorm);
                s.w_dtype = w;
                s.epilogue = e;
                s.residual = residual > 0;
                s.residual_f32 = residual == 2;
                s.memory_efficient = from_y;
                s.zero_centered = (residual + int(from_y)) % 2 == 1;
                try {
                  specs.push_back(Spec::parse(s.str()));  // only what the grammar accepts
                } catch (const Error&) {
                }
              }
  return specs;
}

}  // namespace

TEST_CASE("generic kernels cover every norm, phase, epilogue and fusion the grammar allows") {
  int covered = 0;
  for (int64_t n : {1, 50000, 262144})
    for (const Spec& s : every_kind_of_spec(n)) {
      CHECK_MESSAGE(generic_unsupported_why(s).empty(), s.str());
      CHECK(generic_program_of(s) == (quantizes(s.epilogue) ? GenericProgram::kQuant : GenericProgram::kNorm));
      ++covered;
    }
  CHECK(covered > 3000);
  MESSAGE(covered << " specs covered");
  Spec none = Spec::make(Norm::kRMSNorm, Phase::kForwardInference, DType::kBF16, 4096, false);
  none.n = 0;
  CHECK(generic_unsupported_why(none).find("n=0") != std::string::npos);
  CHECK(generic_program_min_arch(GenericProgram::kQuant) == 89);
  CHECK(generic_program_min_arch(GenericProgram::kNorm) == 80);
}

TEST_CASE("the library carries generic images (norm: sm_80, sm_90, compute_90; quant: sm_90, compute_90), with every kernel") {
  REQUIRE(generic_images().size() == 5 * generic_program_dtypes().size());
  const std::vector<Spec> specs = every_kind_of_spec(4096);
  for (DType x : generic_program_dtypes())
    for (GenericProgram program : generic_programs()) {
      const std::string what = std::string(to_string(x)) + " " + to_string(program);
      CAPTURE(what);
      const bool quant = program == GenericProgram::kQuant;
      const GenericImage* sm90 = generic_image_for(x, program, 90);
      const GenericImage* sm86 = generic_image_for(x, program, 86);
      const GenericImage* sm100 = generic_image_for(x, program, 100);
      REQUIRE(sm90);
      REQUIRE(sm100);
      CHECK(sm90->arch == "sm_90");
      CHECK(sm90->program == program);
      if (quant) {
        CHECK(sm86 == nullptr);  // sm_89's FP8 conversions: no sm_80 image
      } else {
        REQUIRE(sm86);
        CHECK(sm86->arch == "sm_80");  // a cubin runs on later minor versions of its major
      }
      CHECK(sm100->arch == "compute_90");
      CHECK(sm100->is_ptx);
      CHECK(generic_image_for(x, program, 75) == nullptr);
      CHECK(sm100->image.data()[sm100->image.size()] == '\0');  // the driver reads PTX as a C string
      CHECK(sm100->image.find(".entry normjit_generic_") != std::string_view::npos);
      for (const GenericImage* cubin : {sm90, sm86}) {
        if (!cubin) continue;
        const std::set<std::string> names = kernels_in(*cubin);
        std::set<std::string> expected;
        for (const Spec& s : specs) {
          if (s.x_dtype != x || generic_program_of(s) != program) continue;
          if (!quant && s.phase == Phase::kBackward) expected.insert(generic_reduce_name(s.w_dtype));
          for (int vec : generic_vecs(s.residual_f32 ? DType::kF32 : x)) {
            expected.insert(generic_kernel_name(s, vec));
            if (generic_has_clustered(s, vec)) expected.insert(generic_kernel_name(s, vec, true));
            if (generic_has_held(s, vec))
              for (int held_packs = 1; held_packs <= kGenericMaxHeldPacks; ++held_packs)
                expected.insert(generic_kernel_name(s, vec, false, held_packs));
            if (generic_has_held(s, vec) && generic_has_clustered(s, vec))
              expected.insert(generic_kernel_name(s, vec, true, kGenericMaxHeldPacks));
          }
        }
        for (const std::string& name : expected) CHECK_MESSAGE(names.count(name) == 1, name);
        CHECK(names.size() == expected.size());  // nothing the specs do not name
        MESSAGE(what << " " << cubin->arch << ": " << expected.size() << " kernels, " << cubin->image.size()
                     << " bytes");
      }
    }
}

TEST_CASE("generic backward width: the widest CTA within 10 % of the most CTAs a SM, over even rounds") {
  std::vector<unsigned> asked;
  auto occupancy = [&](std::map<unsigned, int> ctas) {
    return [&asked, ctas](unsigned threads) {
      asked.push_back(threads);
      const auto it = ctas.find(threads);
      return it == ctas.end() ? 1 : it->second;
    };
  };
  SUBCASE("N = 1024, 16-byte packs: shared memory holds 13 CTAs, registers 12 of 64 threads") {
    // 96 threads are uneven (128 packs in two rounds of 96) and never asked.
    CHECK(generic_backward_threads(128, 128, occupancy({{32, 13}, {64, 12}, {128, 6}})) == 64u);
    CHECK(asked == std::vector<unsigned>{32, 64, 128});
  }
  SUBCASE("uneven rounds are skipped, the row's own width is always asked") {
    // 96 packs: 64 threads would leave a quarter of their slots idle.
    CHECK(generic_backward_threads(96, 96, occupancy({{32, 17}, {96, 8}})) == 32u);
    CHECK(asked == std::vector<unsigned>{32, 96});
  }
  SUBCASE("a tie goes to the widest") {
    // 1024 packs, shared memory holds two CTAs at any width.
    CHECK(generic_backward_threads(1024, 256, occupancy({{32, 2}, {64, 2}, {128, 2}, {256, 2}})) == 256u);
    CHECK(asked.back() == 256u);
  }
  SUBCASE("more CTAs a SM beat a wider CTA") {
    // 360 packs (RMS 2880): six CTAs at 96 and 128 threads, four at 192.
    CHECK(generic_backward_threads(360, 192, occupancy({{32, 6}, {64, 6}, {96, 6}, {128, 6}, {192, 4}})) == 128u);
    for (unsigned t : asked) CHECK(100 * 360 >= 85 * ((360 + t - 1) / t) * t);
  }
  SUBCASE("one pack: one warp") {
    CHECK(generic_backward_threads(1, 32, occupancy({})) == 32u);
    CHECK(asked == std::vector<unsigned>{32});
  }
}

TEST_CASE("generic forward shape: wider CTAs where the rows in flight outgrow the L2, and the L2 flag past half of it") {
  // An H200: 132 SMs, 60 MB of L2; registers hold four CTAs of 256 threads a SM, two of 512.
  constexpr int kSms = 132;
  constexpr int64_t kL2 = 60 << 20;
  std::vector<unsigned> asked;
  auto occupancy = [&](unsigned threads) {
    asked.push_back(threads);
    return threads <= 256 ? 4 : 2;
  };
  SUBCASE("bf16 N = 1024: four packs a thread, one warp; the rows fit") {
    const GenericForwardShape s = generic_forward_shape(128, 2048, kSms, kL2, occupancy);
    CHECK(s.threads == 32u);
    CHECK_FALSE(s.rows_past_l2);
  }
  SUBCASE("bf16 N = 16384: 256 threads, 17 MB in flight, under half the L2") {
    const GenericForwardShape s = generic_forward_shape(2048, 32768, kSms, kL2, occupancy);
    CHECK(s.threads == 256u);
    CHECK_FALSE(s.rows_past_l2);
  }
  SUBCASE("bf16 N = 32768: 256 threads, 34 MB in flight, past half the L2") {
    const GenericForwardShape s = generic_forward_shape(4096, 65536, kSms, kL2, occupancy);
    CHECK(s.threads == 256u);
    CHECK(s.rows_past_l2);
  }
  SUBCASE("bf16 N = 65536: 67 MB at 256 threads, more than the L2: 512 threads") {
    const GenericForwardShape s = generic_forward_shape(8192, 131072, kSms, kL2, occupancy);
    CHECK(s.threads == 512u);
    CHECK(s.rows_past_l2);
    CHECK(asked == std::vector<unsigned>{256, 512});
  }
  SUBCASE("a short row is never widened, however large the rows' bytes") {
    const GenericForwardShape s = generic_forward_shape(64, int64_t(1) << 30, kSms, kL2, occupancy);
    CHECK(s.threads == 32u);
    CHECK(s.rows_past_l2);
  }
}

TEST_CASE("generic backward held rows: a pack a thread under 64 packs, two up to 1024, in whole warps") {
  auto check = [](int64_t packs, int per_thread, unsigned threads) {
    CAPTURE(packs);
    const GenericBackwardHeld s = generic_backward_held_shape(packs);
    CHECK(s.packs_per_thread == per_thread);
    CHECK(s.threads == threads);
    if (per_thread > 0) CHECK(int64_t(s.threads) * s.packs_per_thread >= packs);  // every pack has a thread
  };
  check(1, 1, 32);       // bf16 N = 8: one warp, one pack a thread
  check(63, 1, 64);      // the last size of one pack a thread
  check(64, 2, 32);      // bf16 N = 512
  check(128, 2, 64);     // bf16 N = 1024
  check(360, 2, 192);    // bf16 N = 2880: 180 threads rounded up to whole warps
  check(1024, 2, 512);   // bf16 N = 8192: the widest held row
  check(1025, 0, 0);     // past it: the staged kernels
  check(32768, 0, 0);
}

TEST_CASE("generic backward held clusters: segments of about 512 packs, 1024 where eight CTAs would not hold 512") {
  auto check = [](int64_t packs, unsigned cluster, int64_t segment) {
    CAPTURE(packs);
    const GenericBackwardHeldCluster s = generic_backward_held_cluster_shape(packs, 8);
    CHECK(s.cluster == cluster);
    CHECK(s.segment_packs == segment);
    if (cluster == 0) return;
    CHECK(s.segment_packs % 64 == 0);  // whole warps at two packs a lane
    CHECK(int64_t(s.threads) * 2 == s.segment_packs);
    CHECK(s.threads <= 512u);
    CHECK(int64_t(s.cluster) * s.segment_packs >= packs);        // every pack has a CTA
    CHECK(int64_t(s.cluster - 1) * s.segment_packs < packs);     // and every CTA a pack
  };
  check(1024, 0, 0);      // bf16 N = 8192: one CTA holds it (generic_backward_held_shape)
  check(1025, 3, 384);    // bf16 N = 8200: three CTAs, the last one 257 packs
  check(1536, 3, 512);    // bf16 N = 12288
  check(2048, 4, 512);    // bf16 N = 16384
  check(2304, 5, 512);    // bf16 N = 18432: 460.8 packs a CTA, rounded up to 512
  check(4096, 8, 512);    // bf16 N = 32768: the last size of 512-pack segments
  check(4097, 5, 832);    // past eight of 512: the fewest CTAs of at most 1024
  check(8192, 8, 1024);   // bf16 N = 65536
  check(8193, 0, 0);      // past eight CTAs of 1024 packs: the staged kernels
  CHECK(generic_backward_held_cluster_shape(8192, 16).cluster == 16u);  // where non-portable clusters are asked
}

TEST_CASE("generic forward clusters: the fewest CTAs whose segments of whole warps' packs fit the segment bytes") {
  constexpr int64_t kSegment = 32 * 1024, kPack = 16;  // 16-byte packs
  SUBCASE("bf16 N = 32768 (64 KB): two CTAs of 2048 packs, 256 threads") {
    const GenericForwardCluster s = generic_forward_cluster_shape(4096, kPack, kSegment, 16);
    CHECK(s.cluster == 2u);
    CHECK(s.segment_packs == 2048);
    CHECK(s.threads == 256u);
  }
  SUBCASE("bf16 N = 98304 (192 KB): six CTAs") {
    const GenericForwardCluster s = generic_forward_cluster_shape(12288, kPack, kSegment, 16);
    CHECK(s.cluster == 6u);
    CHECK(s.segment_packs == 2048);
  }
  SUBCASE("bf16 N = 65608: five segments of whole warps, the last one shorter") {
    const GenericForwardCluster s = generic_forward_cluster_shape(8201, kPack, kSegment, 16);
    CHECK(s.segment_packs == 1664);  // 8201 / 5 = 1640.2, up to 52 warps' packs
    CHECK(s.cluster == 5u);
    CHECK(4 * s.segment_packs < 8201);
    CHECK(s.threads == 256u);  // 1664 / 4 = 416 threads, capped at 256
  }
  SUBCASE("bf16 N = 262144 (512 KB): sixteen CTAs, or eight where sixteen are not allowed") {
    CHECK(generic_forward_cluster_shape(32768, kPack, kSegment, 16).cluster == 16u);
    const GenericForwardCluster portable = generic_forward_cluster_shape(32768, kPack, kSegment, 8);
    CHECK(portable.cluster == 8u);
    CHECK(portable.segment_packs == 4096);  // 64 KB a CTA
  }
  SUBCASE("never fewer than two CTAs, and one where the row has a single warp's packs") {
    CHECK(generic_forward_cluster_shape(1024, kPack, kSegment, 16).cluster == 2u);  // 16 KB: two of 512
    CHECK(generic_forward_cluster_shape(32, kPack, kSegment, 16).cluster == 1u);
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
