// Without a GPU the GPU test binary prints why and exits 77, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "normjit/driver.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (!normjit::gpu_available(&why)) {
    std::printf("SKIPPED: normjit GPU tests need a GPU: %s\n", why.c_str());
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
