// GPU tests: forward kernels against the fp64 CPU reference on fresh random inputs.
// Without a GPU the binary prints why and exits 77, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "normjit/normjit.hpp"
#include "normjit/reference.hpp"

using namespace normjit;

namespace {

Runtime& runtime() {
  static Runtime rt(0);
  return rt;
}

std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    const uint64_t seed = std::random_device{}();
    std::printf("gpu tests: seed %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }());
  return r;
}

struct DeviceMem {
  CUdeviceptr ptr = 0;
  explicit DeviceMem(size_t bytes) { NORMJIT_CU(cuMemAlloc(&ptr, std::max<size_t>(bytes, 16))); }
  ~DeviceMem() { driver().cuMemFree(ptr); }
  char* get() const { return reinterpret_cast<char*>(ptr); }
};

struct Case {
  Spec spec;
  int64_t rows = 1;
  int64_t row_stride = 0;  // 0: n
  int64_t x_offset = 0;    // elements: shifts x/y off 16-byte alignment
  double center = 0.0;     // x = center + noise
};

// Runs one case through Runtime::launch; returns the worst err / tolerance.
double run_case(const Case& c) {
  runtime();  // its context must be current before this test's own allocations
  const Spec& s = c.spec;
  const int64_t n = s.n, stride = c.row_stride ? c.row_stride : n;
  const int xs = dtype_size(s.x_dtype), ws = dtype_size(s.w_dtype);
  const bool training = s.phase == Phase::kForwardTraining;
  const bool has_mean = training && s.norm == Norm::kLayerNorm;
  // One extra row past the end checks that nothing is written beyond `rows`.
  const int64_t elems = (c.rows + 1) * stride + c.x_offset;
  std::vector<char> hx(elems * xs), hy(elems * xs), hg(n * ws), hb(n * ws);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < elems; ++i) reference::store(hx.data(), s.x_dtype, i, float(c.center + normal(rng())));
  for (int64_t i = 0; i < n; ++i) {
    reference::store(hg.data(), s.w_dtype, i, float(1.0 + 0.5 * normal(rng())));
    reference::store(hb.data(), s.w_dtype, i, float(0.5 * normal(rng())));
  }
  DeviceMem x(hx.size()), y(hy.size()), g(hg.size()), b(hb.size()), mean(4 * (c.rows + 1)), rstd(4 * (c.rows + 1));
  NORMJIT_CU(cuMemcpyHtoD(x.ptr, hx.data(), hx.size()));
  NORMJIT_CU(cuMemcpyHtoD(g.ptr, hg.data(), hg.size()));
  NORMJIT_CU(cuMemcpyHtoD(b.ptr, hb.data(), hb.size()));
  NORMJIT_CU(cuMemsetD8(y.ptr, 0xff, hy.size()));  // NaN poison in every dtype
  NORMJIT_CU(cuMemsetD8(mean.ptr, 0xff, 4 * (c.rows + 1)));
  NORMJIT_CU(cuMemsetD8(rstd.ptr, 0xff, 4 * (c.rows + 1)));

  LaunchArgs a;
  a.x = x.get() + c.x_offset * xs;
  a.y = y.get() + c.x_offset * xs;
  a.gamma = g.get();
  a.beta = s.has_bias ? b.get() : nullptr;
  a.mean = has_mean ? reinterpret_cast<float*>(mean.get()) : nullptr;
  a.rstd = training ? reinterpret_cast<float*>(rstd.get()) : nullptr;
  a.rows = c.rows;
  a.row_stride = stride;
  a.eps = 1e-5f;
  runtime().launch(s, a);
  NORMJIT_CU(cuCtxSynchronize());
  NORMJIT_CU(cuMemcpyDtoH(hy.data(), y.ptr, hy.size()));
  std::vector<float> hmean(c.rows + 1), hrstd(c.rows + 1);
  NORMJIT_CU(cuMemcpyDtoH(hmean.data(), mean.ptr, 4 * (c.rows + 1)));
  NORMJIT_CU(cuMemcpyDtoH(hrstd.data(), rstd.ptr, 4 * (c.rows + 1)));

  const auto ref = reference::forward(s, hx.data() + c.x_offset * xs, hg.data(), s.has_bias ? hb.data() : nullptr,
                                      c.rows, stride, 1e-5);
  const reference::Tolerance tol = reference::tolerance(s.x_dtype);
  double worst = 0;
  auto track = [&](double got, double want, double atol, double rtol) {
    const double e = std::abs(got - want) / (atol + rtol * std::abs(want));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  };
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < n; ++i)
      track(reference::load(hy.data(), s.x_dtype, c.x_offset + r * stride + i), ref.y[r * n + i], tol.atol, tol.rtol);
    if (training) track(hrstd[r], ref.rstd[r], 1e-6, 1e-4);
    if (has_mean) track(hmean[r], ref.mean[r], 1e-5, 1e-4);
  }
  // Padding between rows and the row past the end keep their poison.
  uint8_t poison[4];
  std::memset(poison, 0xff, sizeof(poison));
  for (int64_t r = 0; r <= c.rows; ++r)
    for (int64_t i = (r == c.rows ? 0 : n); i < stride; ++i)
      if (std::memcmp(hy.data() + (c.x_offset + r * stride + i) * xs, poison, xs) != 0) worst = INFINITY;
  if (training && std::memcmp(&hrstd[c.rows], poison, 4) != 0) worst = INFINITY;
  return worst;
}

// Compiles (or loads) many specs on all cores before the checks run.
void warm(const std::vector<Spec>& specs) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t)
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < specs.size();) runtime().disk_cache().get_or_compile(resolve(specs[i]), runtime().target());
    });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("forward kernels match the fp64 reference over dtypes x N x rows") {
  const int64_t ns[] = {1, 7, 127, 256, 1000, 2880, 4096, 4097, 8192, 65536, 262144};
  std::vector<Case> cases;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm})
    for (Phase phase : {Phase::kForwardTraining, Phase::kForwardInference})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType w : {x, DType::kF32})
          for (int64_t n : ns)
            for (bool bias : {false, true}) {
              if (w == DType::kF32 && x == DType::kF32 && w != x) continue;
              Case c;
              c.spec = Spec::make(norm, phase, x, n, bias);
              c.spec.w_dtype = w;
              // rows = 1, an odd count, and enough rows to cover several CTAs; fewer for huge rows.
              for (int64_t rows : {int64_t(1), n >= 65536 ? int64_t(3) : int64_t(37), n <= 1000 ? int64_t(1031) : int64_t(0)}) {
                if (rows == 0) continue;
                c.rows = rows;
                cases.push_back(c);
              }
            }
  std::vector<Spec> specs;
  for (const auto& c : cases) specs.push_back(c.spec);
  runtime();  // create the runtime (and make its context current) on this thread
  warm(specs);
  int checked = 0;
  for (const Case& c : cases) {
    const std::string name = c.spec.str();
    CAPTURE(name);
    CAPTURE(c.rows);
    CHECK(run_case(c) <= 1.0);
    ++checked;
  }
  MESSAGE(checked << " forward cases checked on " << runtime().device().name);
}

TEST_CASE("variance has no cancellation: x = 1e4 + noise in f32") {
  for (int64_t n : {7, 1000, 4096, 65536, 262144}) {
    Case c;
    c.spec = Spec::make(Norm::kLayerNorm, Phase::kForwardTraining, DType::kF32, n, true);
    c.rows = 5;
    c.center = 1e4;
    CAPTURE(n);
    CHECK(run_case(c) <= 1.0);
  }
}

TEST_CASE("strided rows and unaligned pointers fall back to narrower vectors, still correct") {
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n4096.bias", "rmsnorm.fwd_infer.f16.w_f32.n768",
                           "layernorm.fwd_infer.f32.w_f32.n1000", "rmsnorm.fwd_train.bf16.w_bf16.n65536"}) {
    const std::string name = text;
    for (int64_t offset : {0, 1, 3})
      for (int64_t pad : {0, 1, 8}) {
        Case c;
        c.spec = Spec::parse(text);
        c.rows = 9;
        c.row_stride = c.spec.n + pad;
        c.x_offset = offset;
        CAPTURE(name);
        CAPTURE(offset);
        CAPTURE(pad);
        CHECK(run_case(c) <= 1.0);
      }
  }
}

TEST_CASE("runtime caches: in-process hits after the first get") {
  const Spec s = Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n3584");
  const RuntimeCounters before = runtime().counters();
  const Kernel& k1 = runtime().get(s);
  const Kernel& k2 = runtime().get(s);
  const RuntimeCounters after = runtime().counters();
  CHECK(&k1 == &k2);
  CHECK(after.memory_hits == before.memory_hits + 1);
  CHECK(after.compiles + after.disk_hits == before.compiles + before.disk_hits + 1);
}

TEST_CASE("a thread with no current context can launch") {
  const Spec s = Spec::parse("layernorm.fwd_infer.bf16.n512");
  const Kernel& k = runtime().get(s);
  DeviceMem x(512 * 2 * 4), y(512 * 2 * 4), g(512 * 2);
  NORMJIT_CU(cuMemsetD8(x.ptr, 0x3c, 512 * 2 * 4));
  NORMJIT_CU(cuMemsetD8(g.ptr, 0x3c, 512 * 2));
  LaunchArgs a;
  a.x = x.get();
  a.y = y.get();
  a.gamma = g.get();
  a.rows = 4;
  a.row_stride = 512;
  std::string error;
  std::thread worker([&] {
    try {
      k.launch(a);
      NORMJIT_CU(cuCtxSynchronize());
    } catch (const Error& e) {
      error = e.what();
    }
  });
  worker.join();
  CHECK(error == "");
}

TEST_CASE("explicit launch arguments are validated before any launch") {
  const Kernel& k = runtime().get(Spec::parse("layernorm.fwd_infer.bf16.n512"));
  LaunchArgs a;
  CHECK_THROWS_WITH_AS(k.launch(a), doctest::Contains("x is null"), Error);
}

int main(int argc, char** argv) {
  std::string why;
  if (!gpu_available(&why)) {
    std::printf("SKIPPED: normjit GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
