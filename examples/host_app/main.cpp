// A host application using an installed normjit: LayerNorm forward (training) on bf16 rows.
// Without a GPU it still compiles the kernel for sm_90 into the cache, then says it skips the launch.
#include <normjit/normjit.hpp>
#include <normjit/reference.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  using namespace normjit;
  const Spec spec = Spec::parse("layernorm.fwd_train.bf16.w_bf16.n4096.bias");

  // Offline: compile for a named arch into the disk cache (no GPU needed).
  DiskCache cache(DiskCache::default_dir());
  const Binary cubin = cache.get_or_compile(resolve(spec), Target::parse("sm_90"));
  std::printf("%s -> %s, %zu bytes for %s\n", spec.str().c_str(), cubin.kernel_name.c_str(), cubin.image.size(),
              cubin.arch.c_str());

  std::string why;
  if (!gpu_available(&why)) {
    std::printf("no GPU (%s): skipping the launch\n", why.c_str());
    return 0;
  }

  // Online: a runtime for device 0, then launch with raw device pointers.
  Runtime rt(0);
  const int64_t rows = 64, n = spec.n;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> hx(rows * n), hg(n), hb(n), hy(rows * n);
  for (auto& v : hx) v = reference::float_to_bf16(dist(rng));
  for (auto& v : hg) v = reference::float_to_bf16(1.f + 0.1f * dist(rng));
  for (auto& v : hb) v = reference::float_to_bf16(0.1f * dist(rng));

  const DriverApi& cu = driver();
  CUdeviceptr x, y, g, b, mean, rstd;
  NORMJIT_CU(cuMemAlloc(&x, hx.size() * 2));
  NORMJIT_CU(cuMemAlloc(&y, hy.size() * 2));
  NORMJIT_CU(cuMemAlloc(&g, n * 2));
  NORMJIT_CU(cuMemAlloc(&b, n * 2));
  NORMJIT_CU(cuMemAlloc(&mean, rows * 4));
  NORMJIT_CU(cuMemAlloc(&rstd, rows * 4));
  NORMJIT_CU(cuMemcpyHtoD(x, hx.data(), hx.size() * 2));
  NORMJIT_CU(cuMemcpyHtoD(g, hg.data(), n * 2));
  NORMJIT_CU(cuMemcpyHtoD(b, hb.data(), n * 2));

  LaunchArgs args;
  args.x = reinterpret_cast<const void*>(x);
  args.gamma = reinterpret_cast<const void*>(g);
  args.beta = reinterpret_cast<const void*>(b);
  args.y = reinterpret_cast<void*>(y);
  args.mean = reinterpret_cast<float*>(mean);
  args.rstd = reinterpret_cast<float*>(rstd);
  args.rows = rows;
  args.row_stride = n;
  args.eps = 1e-5f;
  rt.launch(spec, args);  // compiles or loads once, then launches
  NORMJIT_CU(cuCtxSynchronize());
  NORMJIT_CU(cuMemcpyDtoH(hy.data(), y, hy.size() * 2));

  const auto ref = reference::forward(spec, hx.data(), hg.data(), hb.data(), rows, n, 1e-5);
  double max_err = 0;
  for (size_t i = 0; i < hy.size(); ++i) max_err = std::max(max_err, std::abs(reference::bf16_to_float(hy[i]) - ref.y[i]));
  std::printf("launched on %s: max |y - ref| = %.3g\n", rt.device().name.c_str(), max_err);
  for (CUdeviceptr p : {x, y, g, b, mean, rstd}) cu.cuMemFree(p);
  return max_err < 0.05 ? 0 : 1;
}
