#!/usr/bin/env bash
# Installs what the build needs (Debian/Ubuntu, as root), builds normjit and its tests, runs ctest.
# GPU tests are reported as skipped when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
need=()
for pkg in cmake ninja-build g++ clang libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev doctest-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing packages (install as root): ${need[*]}" >&2; exit 1
  fi
fi
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
cd "$BUILD_DIR"
# ctest lists a skipped test without its output; say up front why the GPU tests will be skipped.
if [ "$*" != "-N" ] && ! tests/normjit_gpu_tests --list-test-cases >/dev/null 2>&1; then
  tests/normjit_gpu_tests | head -1 || true  # exits 77 by design
fi
ctest --output-on-failure "$@"
