// Without a GPU the GPU test binary prints why and exits 77, which ctest reports as skipped.
// NORMJIT_GPU_TEST_LIST_SPECS=FILE (listing mode, gpu_common.hpp) needs no GPU: the cases append
// the specs they would compile to FILE, launch nothing, and the binary exits 0.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "normjit/driver.hpp"

int main(int argc, char** argv) {
  const char* listing = std::getenv("NORMJIT_GPU_TEST_LIST_SPECS");
  if (listing && *listing) {
    setenv("CUDA_VISIBLE_DEVICES", "", 1);  // cases that make their own Runtime fail at once too
    doctest::Context ctx(argc, argv);
    ctx.setOption("no-breaks", true);
    ctx.setOption("out", "/dev/null");  // every case fails its checks on the empty runs; only FILE counts
    ctx.run();
    std::printf("listing mode: specs appended to %s\n", listing);
    return 0;
  }
  std::string why;
  if (!normjit::gpu_available(&why)) {
    std::printf("SKIPPED: normjit GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
