#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  // Where a CUDA driver is installed, NVRTC's ptxas reuses the driver's compute cache
  // (~/.nv/ComputeCache), and a cache hit leaves no ptxas report in the log: the resource test
  // then has nothing to check (seen on the device machine from the second run on). Before any
  // NVRTC call, and only when the caller has not chosen.
  setenv("CUDA_CACHE_DISABLE", "1", /*overwrite=*/0);
  return doctest::Context(argc, argv).run();
}
