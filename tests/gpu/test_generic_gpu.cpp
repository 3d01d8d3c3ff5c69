// Generic kernels (N at run time) against the fp64 reference over the specialized kernels' grids,
// and the compile modes: async's switch from the generic kernel to the specialized one in one
// process, and generic mode's refusals.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/gpu/gpu_common.hpp"

using namespace gpu_test;

namespace {

// The forward and backward grids' hidden sizes, and sizes between them no pick table names.
const std::vector<int64_t> kGenericNs = {1,     7,     127,   256,   1000,  1024,  2880,  4096,  4097,
                                         8192,  12289, 18432, 20001, 32768, 40008, 50000, 65536, 65608,
                                         98312, 131072, 131112, 262144};

// The two grids in two doctest cases each, their sizes dealt out in turn: whole, each took about
// 200 s, the last to finish of a 300 s GPU suite (H200, 12 cases at a time).
constexpr int kGenericGridShards = 2;
// A shard without its TEST_CASE below would leave its sizes unchecked.
static_assert(kGenericGridShards == 2, "one TEST_CASE a shard below, for each grid");

std::vector<Case> generic_cases(Phase phase, int shard) {
  const std::vector<int64_t> ns = grid_shard(grid_ns(kGenericNs), shard, kGenericGridShards);
  return ns.empty() ? std::vector<Case>{} : ops_grid_cases(phase, ns);
}

// A backward case's forward (training, with bias_in where given) against fp64; the mask and h
// bit for bit where the spec writes them.
void check_training_forward(const Case& c, bool bias_in) {
  Case fwd = c;
  fwd.spec.phase = Phase::kForwardTraining;
  fwd.spec.bias_in = bias_in;
  const ForwardRun f = run_forward(fwd);
  CHECK(f.worst <= 1.0);
  CHECK(f.mask_mismatches == 0);
  CHECK(f.mask_ref_mismatches == 0);
  CHECK(f.h_mismatches == 0);
}

// That forward, then the backward case itself against fp64.
void check_forward_then_backward(const Case& c, bool bias_in = false) {
  check_training_forward(c, bias_in);
  const BackwardRun b = run_backward(c);
  CHECK(b.dx <= 1.0);
  CHECK(b.dgamma <= 1.0);
  CHECK(b.dbeta <= 1.0);
}

void check_generic_forward_grid(int shard) {
  GenericKernelsOn generic;
  const uint64_t compiles = runtime().counters().compiles;
  int checked = 0;
  for (Phase phase : {Phase::kForwardTraining, Phase::kForwardInference})
    for (const Case& c : generic_cases(phase, shard)) {
      const std::string name = c.spec.str();
      CAPTURE(name);
      CAPTURE(c.rows);
      CHECK(run_forward(c).worst <= 1.0);
      ++checked;
    }
  CHECK(runtime().counters().compiles == compiles);  // no NVRTC
  MESSAGE(checked << " generic forward cases on " << runtime().device().name << " (shard " << shard + 1 << " of "
                  << kGenericGridShards << ")");
}

void check_generic_backward_grid(int shard) {
  GenericKernelsOn generic;
  int checked = 0;
  for (const Case& c : generic_cases(Phase::kBackward, shard)) {
    const std::string name = c.spec.str();
    CAPTURE(name);
    CAPTURE(c.rows);
    CAPTURE(c.rows_per_batch);
    const BackwardRun r = run_backward(c);
    CHECK(r.forward <= 1.0);
    CHECK(r.dx <= 1.0);
    CHECK(r.dgamma <= 1.0);
    CHECK(r.dbeta <= 1.0);
    ++checked;
  }
  MESSAGE(checked << " generic backward cases on " << runtime().device().name << " (shard " << shard + 1 << " of "
                  << kGenericGridShards << ")");
}

}  // namespace

TEST_CASE("generic kernels: forward matches the fp64 reference over ops x dtypes x N x rows, shard 1 of 2") {
  check_generic_forward_grid(0);
}
TEST_CASE("generic kernels: forward matches the fp64 reference over ops x dtypes x N x rows, shard 2 of 2") {
  check_generic_forward_grid(1);
}
TEST_CASE("generic kernels: backward matches the fp64 reference over ops x dtypes x N x rows, shard 1 of 2") {
  check_generic_backward_grid(0);
}
TEST_CASE("generic kernels: backward matches the fp64 reference over ops x dtypes x N x rows, shard 2 of 2") {
  check_generic_backward_grid(1);
}

TEST_CASE("generic kernels: epilogues, zero-centred weights, strided and unaligned rows") {
  GenericKernelsOn generic;
  int checked = 0;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm})
    for (Epilogue ep : {Epilogue::kNone, Epilogue::kReluBitmask, Epilogue::kGelu})
      for (DType x : {DType::kF32, DType::kBF16})
        for (int64_t n : {1, 9, 768, 4097, 20001, 65536})
          for (int layout = 0; layout < 3; ++layout) {  // contiguous; strided; strided and unaligned
            Case c;
            c.spec = Spec::make(norm, Phase::kBackward, x, n, true);
            c.spec.epilogue = ep;
            c.spec.zero_centered = (n + layout) % 2 == 1;
            c.rows = n >= 65536 ? 3 : 37;
            c.rows_per_batch = is_adaptive(norm) ? c.rows : 0;
            c.row_stride = layout > 0 ? n + 9 : 0;
            c.x_offset = layout == 2 ? 1 : 0;
            c.clip_lower = 0.f;
            c.clip_upper = 1.5f;
            const std::string name = c.spec.str();
            CAPTURE(name);
            CAPTURE(layout);
            check_forward_then_backward(c);
            ++checked;
          }
  MESSAGE(checked << " generic epilogue cases (forward and backward)");
}

TEST_CASE("generic kernels: the residual add (h written bit for bit), with bias_in, forward and backward") {
  GenericKernelsOn generic;
  int checked = 0;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaRMSNorm})
    for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
      for (int64_t n : {1, 7, 768, 4097, 20001, 40000, 65536})
        for (int layout = 0; layout < 3; ++layout) {  // contiguous; strided; strided and unaligned
          Case c;
          c.spec = Spec::make(norm, Phase::kBackward, x, n, norm == Norm::kLayerNorm);
          c.spec.w_dtype = x == DType::kF32 ? DType::kF32 : DType::kBF16;
          c.spec.residual = true;
          c.rows = n >= 65536 ? 3 : 37;
          c.rows_per_batch = is_adaptive(norm) ? c.rows : 0;
          c.row_stride = layout > 0 ? n + 9 : 0;
          c.x_offset = layout == 2 ? 1 : 0;
          const std::string name = c.spec.str();
          CAPTURE(name);
          CAPTURE(layout);
          for (bool bias_in : {false, true}) check_training_forward(c, bias_in);
          const BackwardRun b = run_backward(c);
          CHECK(b.dx <= 1.0);
          CHECK(b.dgamma <= 1.0);
          CHECK(b.dbeta <= 1.0);
          ++checked;
        }
  MESSAGE(checked << " generic residual-add cases (forward with and without bias_in, backward)");
}

TEST_CASE("generic kernels: many rows a slot, each staged backward row copied while the one before computes") {
  // The grids above give most backward slots one or two rows; here every slot takes several, so
  // each row's copy into shared memory lands while the slot's previous row is still in use.
  GenericKernelsOn generic;
  int checked = 0;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm})
    for (DType x : {DType::kF32, DType::kBF16})
      for (int64_t n : {1000, 4097, 12288})
        for (int variant = 0; variant < 3; ++variant) {  // plain; relu_bitmask, strided; residual add, unaligned
          if (x == DType::kF32 && variant > 0) continue;
          Case c;
          c.spec = Spec::make(norm, Phase::kBackward, x, n, norm != Norm::kRMSNorm);
          c.spec.epilogue = variant == 1 ? Epilogue::kReluBitmask : Epilogue::kNone;
          c.spec.residual = variant == 2 && norm != Norm::kAdaLayerNorm;
          // Three to four CTAs a SM: several rows a slot on 132 SMs.
          c.rows = n == 1000 ? 9000 : 1500;
          c.rows_per_batch = is_adaptive(norm) ? c.rows / 3 : 0;
          c.row_stride = variant > 0 ? n + 9 : 0;
          c.x_offset = variant == 2 ? 1 : 0;
          c.clip_lower = 0.f;
          c.clip_upper = 1.5f;
          const std::string name = c.spec.str();
          CAPTURE(name);
          CAPTURE(variant);
          check_forward_then_backward(c, c.spec.residual && norm == Norm::kLayerNorm);
          ++checked;
        }
  MESSAGE(checked << " generic cases of several rows a slot (forward and backward)");
}

TEST_CASE("generic kernels: the backward is bitwise deterministic, and takes a small workspace with fewer slots") {
  GenericKernelsOn generic;
  // 5003: the staged two-pass rows (narrow packs); 4096: a row held in registers, two packs a thread;
  // 12296: a held row split over a cluster of four CTAs, the last one shorter.
  for (int64_t n : {5003, 4096, 12296}) {
    Case c;
    c.spec = Spec::make(Norm::kLayerNorm, Phase::kBackward, DType::kBF16, n, true);
    c.spec.w_dtype = DType::kF32;
    c.rows = 777;
    const std::string name = c.spec.str();
    CAPTURE(name);
    std::vector<std::vector<char>> dgammas, dxs;
    const BackwardRun r = run_backward(c, 3, &dgammas, &dxs);
    CHECK(r.dx <= 1.0);
    CHECK(r.dgamma <= 1.0);
    CHECK(r.dbeta <= 1.0);
    REQUIRE(dgammas.size() == 3);
    CHECK(dgammas[0] == dgammas[1]);
    CHECK(dgammas[0] == dgammas[2]);
    CHECK(dxs[0] == dxs[2]);
    const size_t full = runtime().generic_workspace_bytes(c.spec, c.rows);
    const size_t one_slot = runtime().generic_workspace_bytes(c.spec, c.rows, 0, 1);
    CHECK(one_slot == size_t(8) * size_t(n));
    CHECK(full > one_slot);
  }
}

TEST_CASE("async mode: the generic kernel runs at once, the specialized one takes over once compiled") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("normjit-async-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    Runtime rt(0, dir);  // an empty cache: every spec misses both caches
    rt.set_compile_mode(CompileMode::kAsync);
    const LaunchingThrough through(rt);
    for (Phase phase : {Phase::kForwardTraining, Phase::kBackward}) {
      Case c;
      c.spec = Spec::make(Norm::kLayerNorm, phase, DType::kBF16, 3000 + (phase == Phase::kBackward ? 8 : 0), true);
      c.spec.w_dtype = DType::kF32;
      c.rows = 301;
      const std::string name = c.spec.str();
      CAPTURE(name);
      const RuntimeCounters before = rt.counters();
      // The backward runs its forward first, through the same runtime: it queues that one too.
      const auto t0 = std::chrono::steady_clock::now();
      const double first = phase == Phase::kBackward ? run_backward(c).dx : run_forward(c).worst;
      const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      CHECK(first <= 1.0);
      const RuntimeCounters after_first = rt.counters();
      CHECK(after_first.generic_launches > before.generic_launches);
      CHECK(after_first.compiles == before.compiles);  // nothing compiled on the launching thread
      CHECK(rt.background_state(c.spec) != BackgroundCompiler::State::kUnknown);
      rt.wait_for_background_compiles();
      CHECK(rt.background_state(c.spec) == BackgroundCompiler::State::kReady);
      const double second = phase == Phase::kBackward ? run_backward(c).dx : run_forward(c).worst;
      CHECK(second <= 1.0);
      const RuntimeCounters after_second = rt.counters();
      CHECK(after_second.background_compiles > after_first.background_compiles);
      CHECK(after_second.generic_launches == after_first.generic_launches);  // the specialized kernels ran
      MESSAGE(name << ": first call (generic, with the test's host work) " << first_ms << " ms");
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("generic mode: no NVRTC for any spec, the quantizing epilogues included") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("normjit-generic-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    Runtime rt(0, dir);
    rt.set_compile_mode(CompileMode::kGeneric);
    const LaunchingThrough through(rt);
    Case c;
    c.spec = Spec::make(Norm::kRMSNorm, Phase::kBackward, DType::kF16, 4544, false);
    c.rows = 129;
    CHECK(run_backward(c).dx <= 1.0);
    CHECK(rt.counters().compiles == 0);
    CHECK(rt.counters().generic_launches >= 2);
    const uint64_t launches = rt.counters().generic_launches;
    for (Epilogue e : {Epilogue::kFp8E4M3, Epilogue::kInt8Row, Epilogue::kMxfp8E4M3, Epilogue::kNvfp4}) {
      Case q = c;
      q.spec = Spec::make(Norm::kRMSNorm, Phase::kForwardInference, DType::kF16, 4544, false);
      q.spec.epilogue = e;
      const std::string name = q.spec.str();
      CAPTURE(name);
      const ForwardRun r = run_forward(q);
      CHECK(r.quant_checked == q.rows * q.spec.n);
      CHECK(r.quant_mismatches == 0);
    }
    CHECK(rt.counters().compiles == 0);
    CHECK(rt.counters().generic_launches == launches + 4);
  }
  fs::remove_all(dir);
}

// The quantizing epilogues and the fusions through the generic kernels, over the specialized
// kernels' grids (test_forward_gpu.cpp, test_fusions_gpu.cpp).
TEST_CASE("generic kernels: per-tensor fp8 codes and amax against the host references") {
  const uint64_t compiles = runtime().counters().compiles;
  check_fp8_grid(true);
  CHECK(runtime().counters().compiles == compiles);  // no NVRTC
}

TEST_CASE("generic kernels: per-row fp8 / int8 scales and codes against the host references") {
  check_row_quant_grid(true);
}

TEST_CASE("generic kernels: MXFP8 block scales and codes against the host references") { check_mxfp8_grid(true); }

TEST_CASE("generic kernels: MXFP4 and NVFP4 block scales and e2m1 codes against the host references") {
  check_fp4_grid(true);
}

TEST_CASE("generic kernels: the fp32 residual stream (h bit for bit) and bias_in forward") {
  const uint64_t compiles = runtime().counters().compiles;
  check_fp32_stream_forward(true);
  CHECK(runtime().counters().compiles == compiles);
}

TEST_CASE("generic kernels: the fp32 residual stream backward, dresidual and dx") { check_fp32_stream_backward(true); }

TEST_CASE("generic kernels: the memory_efficient backward, x̂ recovered from y") {
  const uint64_t compiles = runtime().counters().compiles;
  check_memory_efficient_backward(true);
  CHECK(runtime().counters().compiles == compiles);
}

TEST_CASE("generic kernels: the backward's workspace query works on a thread with no current context") {
  // torch's autograd threads size the backward's workspace with no CUDA context current.
  const Spec s = Spec::make(Norm::kLayerNorm, Phase::kBackward, DType::kBF16, 4096, true);
  size_t bytes = 0;
  std::string error;
  std::thread worker([&] {
    try {
      bytes = runtime().generic_workspace_bytes(s, 1000);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  worker.join();
  CHECK(error.empty());
  CHECK(bytes >= size_t(8) * 4096);  // dgamma's and dbeta's fp32 sums of at least one slot
}
