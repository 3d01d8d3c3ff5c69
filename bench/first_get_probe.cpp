// Fresh-process load path, step by step: image from the disk cache, cuModuleLoadData,
// cuModuleGetFunction, an occupancy query; each kernel in turn (ms).
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include "normjit/compiler.hpp"
#include "normjit/spec.hpp"
using namespace normjit;
using C = std::chrono::steady_clock;
static double ms(C::time_point a, C::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
int main(int argc, char** argv) {
  auto t_init = C::now();
  cuInit(0);
  CUdevice dev; cuDeviceGet(&dev, 0);
  CUcontext ctx; cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
  std::printf("init+ctx %.3f ms\n", ms(t_init, C::now()));
  DiskCache cache(argv[1]);
  for (int i = 2; i < argc; ++i) {
    auto t0 = C::now();
    const Spec s = resolve(Spec::parse(argv[i]));
    Binary b = cache.get_or_compile(s, Target{90});
    auto t1 = C::now();
    CUmodule m; CUresult r = cuModuleLoadData(&m, b.image.data());
    auto t2 = C::now();
    CUfunction f; const std::string name = b.kernel_name + (s.phase == Phase::kBackward ? "_reduce" : "");
    cuModuleGetFunction(&f, m, name.c_str());
    auto t3 = C::now();
    int blocks = 0; cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, b.threads_per_cta, 0);
    auto t4 = C::now();
    std::printf("%-50s rc %d image %.3f load %.3f getfn %.3f occ %.3f total %.3f\n", s.str().substr(0, 50).c_str(), r,
                ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t0, t4));
  }
}
