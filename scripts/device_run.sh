#!/usr/bin/env bash
# One device call: build on the GPU machine with the carried .deps, run all tests (GPU included),
# a memcheck pass, cold compile / disk-hit / in-process-hit timings, and the forward bench with
# torch peers. Everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL_OUT=${OUT:-/tmp/normjit-out}; OUT=/tmp/normjit-results; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL_OUT"
# The device tool returns at most 8 files: everything is packed into one archive at exit.
trap 'tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . ; cp "$OUT"/table_*.md "$FINAL_OUT"/ 2>/dev/null' EXIT
DEPS=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
STAGE=${1:-all}
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build -j 16 >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "== build ok"
if [[ $STAGE == all || $STAGE == tests ]]; then
  (cd build && ctest --output-on-failure -V -R normjit_gpu_tests 2>&1 | tail -40) | tee "$OUT/gpu_tests.log" | tail -15
  (cd build && ctest --output-on-failure -E normjit_gpu_tests 2>&1 | tail -8)
  compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/normjit_gpu_tests \
    -tc="strided*,variance*,unaligned*,seed*,epilogue backward*" \
    >"$OUT/memcheck.log" 2>&1; echo "== memcheck rc=$? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"; tail -3 "$OUT/memcheck.log"
fi
if [[ $STAGE == bwd ]]; then
  NS="256 512 1024 2048 4096 8192 16384 32768 65536"
  BSPECS=""; for n in $NS; do BSPECS="$BSPECS layernorm.bwd.bf16.w_f32.n$n.bias rmsnorm.bwd.bf16.w_f32.n$n"; done
  build/normjit-bench --rows 32768 --json "$OUT/normjit_bwd.json" $BSPECS 2>&1 | tee "$OUT/normjit_bwd.txt" | tail -3
  PYTHONUNBUFFERED=1 timeout ${PEER_BWD_S:-300} python3 bench/peers.py --phase bwd --json "$OUT/peers_bwd.json" >"$OUT/peers_bwd.txt" 2>&1
  grep -E "^torch|skip|fell" "$OUT/peers_bwd.txt" | cut -c1-150
  python3 bench/report.py "$OUT/normjit_bwd.json" "$OUT/peers_bwd.json" bwd | tee "$OUT/table_bwd.md"
fi
if [[ $STAGE == all || $STAGE == bench ]]; then
  NS="256 512 1024 2048 4096 8192 16384 32768 65536"
  SPECS=""; for n in $NS; do SPECS="$SPECS layernorm.fwd_train.bf16.n$n.bias rmsnorm.fwd_train.bf16.n$n"; done
  rm -rf /tmp/njcache
  # Cold compiles, one at a time (per-kernel time), then the default manifest in parallel.
  build/normjit-precompile -j 1 -q --arch sm_90 --cache-dir /tmp/njcache --json "$OUT/compile_cold.json" $SPECS 2>&1 | tail -1
  build/normjit-precompile -j 16 -q --arch sm_90 --cache-dir /tmp/njcache2 --manifest manifests/default.txt \
    --json "$OUT/compile_manifest.json" 2>&1 | tail -1
  # NVRTC's floor on this CPU: the smallest kernels normjit generates.
  build/normjit-precompile -j 1 -q --arch sm_90 --cache-dir /tmp/njcache-floor --json "$OUT/compile_floor.json" \
    rmsnorm.fwd_infer.f32.n1 rmsnorm.fwd_infer.f16.n1 rmsnorm.fwd_infer.bf16.n1 2>&1 | tail -1
  # A fresh process: every first get() is a disk hit.
  build/normjit-bench --rows 32768 --cache-dir /tmp/njcache --json "$OUT/normjit_fwd.json" $SPECS 2>&1 | tee "$OUT/normjit_fwd.txt"
  # Backward, the genai_layers setting: bf16 x, fp32 weights.
  BSPECS=""; for n in $NS; do BSPECS="$BSPECS layernorm.bwd.bf16.w_f32.n$n.bias rmsnorm.bwd.bf16.w_f32.n$n"; done
  build/normjit-bench --rows 32768 --cache-dir /tmp/njcache --json "$OUT/normjit_bwd.json" $BSPECS 2>&1 | tee "$OUT/normjit_bwd.txt"
  # Fast-compile experiment: compile time and kernel speed with NVRTC's -Ofc levels.
  for level in ${OFC_LEVELS:-}; do
    NORMJIT_NVRTC_EXTRA_OPTIONS="-Ofc=$level" build/normjit-precompile -j 1 -q --arch sm_90 --cache-dir /tmp/njcache-$level \
      --json "$OUT/compile_cold_ofc_$level.json" $SPECS 2>&1 | tail -1
  done
  SUB=""; for n in 256 1024 4096 16384 65536; do SUB="$SUB layernorm.fwd_train.bf16.n$n.bias rmsnorm.fwd_train.bf16.n$n"; done
  [[ -n ${OFC_LEVELS:-} ]] && NORMJIT_NVRTC_EXTRA_OPTIONS="-Ofc=mid" build/normjit-bench --rows 32768 --cache-dir /tmp/njcache-mid $SUB 2>&1 | tail -11 | tee "$OUT/normjit_fwd_ofc_mid.txt"
  [[ ${PEERS:-1} == 1 ]] || exit 0
  PYTHONUNBUFFERED=1 timeout ${PEER_FWD_S:-200} python3 bench/peers.py --json "$OUT/peers_fwd.json" >"$OUT/peers_fwd.txt" 2>&1
  PYTHONUNBUFFERED=1 timeout ${PEER_BWD_S:-260} python3 bench/peers.py --phase bwd --json "$OUT/peers_bwd.json" >"$OUT/peers_bwd.txt" 2>&1
  grep -E "skip|fall" "$OUT"/peers_*.txt | head
  python3 bench/report.py "$OUT/normjit_fwd.json" "$OUT/peers_fwd.json" fwd | tee "$OUT/table_fwd.md"
  python3 bench/report.py "$OUT/normjit_bwd.json" "$OUT/peers_bwd.json" bwd | tee "$OUT/table_bwd.md"
fi
