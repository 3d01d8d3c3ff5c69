#!/usr/bin/env bash
# The main job: build, precompile the default manifest into the disk cache (for the GPU's arch
# when one is present, else sm_90), and on a GPU machine run a quick bench.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export PATH=/usr/local/cuda/bin:$PATH
if ! [ -f "$BUILD_DIR/build.ninja" ]; then
  scripts/test.sh -N >/dev/null   # installs dependencies and configures; -N: list tests, run none
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
arch=sm_90
if command -v nvidia-smi >/dev/null && cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1); then
  arch=sm_${cap/./}
fi
"$BUILD_DIR/normjit-precompile" --manifest manifests/default.txt --arch "$arch" -q
if [ -n "$arch" ] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  "$BUILD_DIR/normjit-bench" --rows 32768 layernorm.fwd_train.bf16.n4096.bias rmsnorm.fwd_train.bf16.n4096 \
    layernorm.fwd_infer.bf16.w_f32.n8192.bias
else
  echo "no GPU here: skipped the bench (normjit-bench needs one)"
fi
