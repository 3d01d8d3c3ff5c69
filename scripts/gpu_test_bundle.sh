#!/usr/bin/env bash
# Compiles every kernel of the GPU test suite here (NVRTC needs no GPU) into one bundle for the
# lent device machine, where compiling them (about 10000) would take most of a call:
# scripts/device.sh test imports .gpu-test-bundle/gpu_tests.ARCH.njb.xz when it is carried, and
# compiles only what the bundle lacks. The cache under .gpu-test-bundle/cache is kept, so a run
# after a change compiles only the kernels whose source changed (26 minutes from empty on
# two cores). Usage: scripts/gpu_test_bundle.sh [ARCH] (default sm_90); BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-sm_90}
build=${BUILD_DIR:-build}
dir=.gpu-test-bundle
mkdir -p "$dir"
specs=$dir/specs.$arch.txt
scripts/gpu_test_specs.sh "$arch" >"$specs"
echo "gpu_test_bundle.sh: $(wc -l <"$specs") specs for $arch"
# Specs that do not compile (a test may expect that) stay out of the bundle; the tests meet them.
if ! "$build/normjit-precompile" -q -a "$arch" -c "$dir/cache" --manifest "$specs" 2>"$dir/precompile.log"; then
  sed -n 's/^\[[0-9]*\/[0-9]*\] FAILED *[^ ]* //p' "$dir/precompile.log" | sort -u >"$dir/failed.txt"
  echo "gpu_test_bundle.sh: $(wc -l <"$dir/failed.txt") specs failed to compile ($dir/precompile.log); left out"
  grep -vxFf "$dir/failed.txt" "$specs" >"$specs.ok" && mv "$specs.ok" "$specs"
fi
tail -1 "$dir/precompile.log"
"$build/normjit-precompile" -q -a "$arch" -c "$dir/cache" --bundle "$dir/gpu_tests.$arch.njb" --manifest "$specs"
xz -T0 -6 -f "$dir/gpu_tests.$arch.njb"
ls -l "$dir/gpu_tests.$arch.njb.xz"
