#!/usr/bin/env bash
# Prints every spec the GPU test cases compile for ARCH (default sm_90), one a line, sorted: those
# the cases list themselves (the test binary's listing mode, tests/gpu/gpu_main.cpp: no GPU work,
# none needed) and the literal specs in tests/gpu/*.cpp with the forward each backward runs first.
# Usage: scripts/gpu_test_specs.sh [ARCH] [doctest options, e.g. -tc=...]; BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-sm_90}
shift || true
bin=${BUILD_DIR:-build}/tests/normjit_gpu_tests
[[ -x $bin ]] || { echo "gpu_test_specs.sh: $bin not built (cmake --build ${BUILD_DIR:-build} --target normjit_gpu_tests)" >&2; exit 2; }
listed=$(mktemp)
trap 'rm -f "$listed"' EXIT
NORMJIT_GPU_TEST_LIST_SPECS=$listed NORMJIT_GPU_TEST_ARCH=${arch#sm_} "$bin" "$@" >/dev/null
# Cases chosen by a filter may compile nothing (the generic ones); the whole suite never does.
(($#)) || [[ -s $listed ]] || { echo "gpu_test_specs.sh: the listing run of $bin listed nothing" >&2; exit 1; }
{ grep -ohE '"(ada)?(layer|rms)norm\.[a-z0-9_.]+"' tests/gpu/*.cpp | tr -d '"' |
    sed -E 'p; /\.bwd\./!d; s/\.bwd\./.fwd_train./; s/\.memory_efficient//; s/\.cfg_.*//'
  cat "$listed"; } | sort -u
