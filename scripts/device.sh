#!/usr/bin/env bash
# shellcheck disable=SC2317  # the jobs are called as "job_$JOB"
# The project's GPU jobs, for the lent device machine or any CUDA machine. `scripts/device.sh -h`
# lists them; docs/measuring.md says how their figures are read.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/device.sh JOB [ARGS...]
  test                  build; every ctest test, GPU tests included (their kernels from .gpu-test-bundle when
                        carried: scripts/gpu_test_bundle.sh); compute-sanitizer memcheck beside them
  bench                 normjit at the standard sizes (per-N table), launch-bound shapes, compile and load times
  peers                 normjit, then torch eager, torch.compile, Liger, cuDNN, QuACK, FlashInfer: tables and plots
  sweep [FROM TO STEP]  LN / RMS forward and backward every STEP from FROM to TO (16384 65536 1024)
  tune SPEC...          normjit-tune over the specs, then the bench reading the database it wrote
  profile SPEC...       Nsight Compute over each spec's kernels
  specs SPEC...         the specs, pinned (.cfg_...) or not, timed in one process: any A/B
  ab SPEC...            the specs on a base tree (.ab-base/, staged by scripts/ab_base.sh REV and carried),
                        on the working tree, then on the base again: base / new / base again % of copy
  fusions               normjit-bench over the residual-add and zero-centred specs beside the plain ones;
                        bench/fusions.py: add + RMSNorm fused, unfused, torch eager/compile, Liger, QuACK,
                        FlashInfer; with QUANT=1 also bench/quant.py (add + RMSNorm + FP8/int8, FlashInfer too)
  python                pip install . into the image's Python; pytest (GPU tests included); normjit.torch's
                        host time, graph replay, and its cost against normjit-bench and torch eager
  generic               the generic kernels against the specialized ones (LN / RMS forward and backward, bf16),
                        and each compile mode's first launch of a new spec in a fresh process
env: SPECS_FILE (tune, profile, specs, ab: more specs, one a line), OUT (results, default ./.out), M (rows; default 32768, 4096 past N = 65536, sweep 16384),
  BUILD_DIR (default build), BENCH_ARGS (more normjit-bench / normjit-tune options)
  test: GPU_TC (doctest -tc of the GPU cases; unset: all), each case in its own process (the longest first), GPU_JOBS
        at a time (default 12), NORMJIT_GPU_TEST_NS, NORMJIT_GPU_TEST_SEED, CPU_TESTS=0, MEMCHECK=0, MEMCHECK_TC
  peers: PEER_NS, PEER_NORMS, PEER_PROVIDERS, PEER_PHASES (fwd bwd), PEER_S (seconds per phase's peers)
  sweep: FROM, TO, STEP, PHASES (fwd bwd)   tune: TUNE_BUDGET_S, TUNE_CANDIDATES   generic: GENERIC_NS
  profile: KERNEL (kernel-name regex, default normjit_), NCU_ARGS (default: a set of sections), BENCH_ARGS
           (e.g. --generic: the generic kernels)
  fusions: FUSION_NS (sizes), FUSION_PROVIDERS (bench/fusions.py --providers), QUANT=1 (bench/quant.py too),
    QUANT_NS, QUANT_PROVIDERS (its --ns / --providers, space-separated), QUANT_ARGS (more of its options,
    e.g. "--formats mxfp8 mxfp4 nvfp4" or "--residual-dtype f32")
  peers, fusions: FlashInfer needs .whl/fi carried (scripts/flashinfer_slim.sh; peers_setup.sh stages it)
  python: PYTEST_ARGS (more pytest options, e.g. -k), PY_NS (wrapper-cost sizes), PY_BENCH=0 (tests only),
  PYTEST_S (pytest's time limit, default 420)
Each job leaves OUT/JOB.md (its tables, also printed) and OUT/JOB.tgz (logs, JSON); peers adds PNGs.
EOF
  exit "$1"
}
JOB=${1:-}
[[ $JOB == -h || $JOB == --help ]] && usage 0
[[ -z $JOB ]] && usage 2
shift
# SPECS_FILE: more specs, one a line (# comments), for lists longer than a command line.
if [[ -n ${SPECS_FILE:-} ]]; then
  [[ -r $SPECS_FILE ]] || { echo "device.sh: SPECS_FILE '$SPECS_FILE' cannot be read" >&2; exit 2; }
  mapfile -t file_specs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$SPECS_FILE" | grep -v '^$')
  set -- "$@" "${file_specs[@]}"
fi
case $JOB in
  test | bench | peers | sweep | python | fusions | generic) ;;
  tune | profile | specs | ab) (($# > 0)) || { echo "device.sh $JOB: no SPEC given (arguments or SPECS_FILE)" >&2; usage 2; } ;;
  *) echo "device.sh: unknown job '$JOB'" >&2; usage 2 ;;
esac

OUT=$(realpath -m "${OUT:-$(dirname "$0")/../.out}")
cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${BUILD_DIR:-build}
WORK=/tmp/normjit-$JOB
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT" || exit 1
export PATH=/usr/local/cuda/bin:$PATH
# A cache kept between calls on a warm machine; its keys hash the generated source, so edits
# to templates/ never hit stale kernels.
export NORMJIT_CACHE_DIR=${NORMJIT_CACHE_DIR:-/tmp/normjit-cache}
MD=$WORK/$JOB.md
KEEP=("$MD")
STATUS=0
ROWS=32768  # rows up to N = 65536 where M is unset
# The device tool returns at most 8 files: the tables and one archive of everything else.
finish() {
  tar czf "$OUT/$JOB.tgz" -C "$WORK" . && cp "${KEEP[@]}" "$OUT"/ 2>/dev/null
  echo "== $JOB: $OUT/$JOB.md and $OUT/$JOB.tgz"
}
trap finish EXIT
trap 'exit 143' TERM INT

md() { tee -a "$MD"; }
say() { echo "$*" | md; }

GPU=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -1)
ARCH=sm_90
[[ -n $GPU ]] && ARCH=sm_$(cut -d, -f3 <<<"$GPU" | tr -d ' .')
say "# device.sh $JOB $*"
say "GPU: ${GPU:-none}; tree $(git describe --always --dirty 2>/dev/null || echo '(no git)');" \
  "$(date -u '+%F %H:%M UTC')"
say ""

# build [TARGET...]: those targets (all without any), with the carried .deps/ where present.
build() {
  local prefix=() targets=()
  if [[ -d .deps/root/usr ]]; then
    prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
    export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  fi
  (($#)) && targets=(--target "$@")
  if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$WORK/configure.log" 2>&1 ||
    ! cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}" >"$WORK/build.log" 2>&1; then
    tail -20 "$WORK/configure.log"; grep -E "error|FAILED" -A3 "$WORK/build.log" | head -40
    say "build failed (configure.log, build.log)"; exit 1
  fi
}

# precompile NAME JOBS [normjit-precompile options]: compiles on JOBS threads ahead of the
# tools, which would compile one kernel at a time on first use.
precompile() {
  local name=$1 jobs=$2; shift 2
  "$BUILD_DIR/normjit-precompile" -q -a "$ARCH" -j "$jobs" --json "$WORK/compile_$name.json" "$@" \
    >"$WORK/compile_$name.log" 2>&1 && { tail -1 "$WORK/compile_$name.log"; return; }
  grep -iE "error|invalid|failed" "$WORK/compile_$name.log" | head -5
  say "normjit-precompile failed ($name): compile_$name.log"
  return 1
}

# Rows for a spec: M when set, else ROWS up to N = 65536 and 4096 past it, as the per-N tables run.
rows_for() {
  local n=${1#*.n}
  n=${n%%[!0-9]*}
  echo "${M:-$((${n:-0} > 65536 ? 4096 : ROWS))}"
}

# run_grouped NAME TOOL [TOOL OPTIONS] -- SPEC...: one TOOL process per row count (specs of one
# N share a process, so pinned and unpinned variants are compared in the same one), writing
# WORK/NAME_m<rows>.json and .txt.
run_grouped() {
  local name=$1 tool=$2 opts=() spec rows
  shift 2
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  local -A groups=()
  for spec; do rows=$(rows_for "$spec"); groups[$rows]+=" $spec"; done
  for rows in $(printf '%s\n' "${!groups[@]}" | sort -rn); do
    # shellcheck disable=SC2086  # BENCH_ARGS and the group are word lists
    "$BUILD_DIR/$tool" --rows "$rows" --json "$WORK/${name}_m$rows.json" ${BENCH_ARGS:-} "${opts[@]}" ${groups[$rows]} \
      >"$WORK/${name}_m$rows.txt" 2>&1 ||
      { STATUS=1; say "$tool failed (${name}_m$rows.txt): $(tail -1 "$WORK/${name}_m$rows.txt" | cut -c1-160)"; }
  done
}

tables() { python3 bench/tables.py "$@" | md; say ""; }

# The standard classes: LayerNorm with bias and RMSNorm, bf16 x; forward training with bf16
# weights, backward with fp32 weights (PyTorch genai_layers' setting).
std_specs() {  # std_specs PHASES N...: one spec a line
  local phases=$1 n ph; shift
  for n; do for ph in $phases; do
    if [[ $ph == fwd ]]; then printf '%s\n' "layernorm.fwd_train.bf16.n$n.bias" "rmsnorm.fwd_train.bf16.n$n"
    else printf '%s\n' "layernorm.bwd.bf16.w_f32.n$n.bias" "rmsnorm.bwd.bf16.w_f32.n$n"; fi
  done; done
}

# run_sharded BIN JOBS LOG [FILTER]: each doctest test case of BIN (those FILTER, e.g. -tc=..., lets
# through) in its own process, JOBS at a time (the GPU grids spend most of their time in the host's
# fp64 reference, one case at a time); the logs one after the other in LOG, then the summed doctest
# totals. Returns the worst exit code (77: BIN skipped itself, as without a GPU).
# The GPU test cases that run longest with their kernels precompiled (the host's fp64 reference
# and inputs: 100-200 s each at 12 at a time on an H200, 2026-11-29), started first so that no
# long case starts last.
LONG_GPU_CASES=("generic kernels: forward matches" "generic kernels: backward matches" "backward matches the fp64"
  "generic kernels: the memory_efficient" "memory_efficient backward" "generic kernels: many rows"
  "forward kernels match" "fusions forward" "fusions backward" "quantized output: MXFP4" "quantized output: per-row"
  "quantized output: MXFP8" "quantized output: fp8" "fp32 residual stream")

run_sharded() {
  local bin=$1 jobs=$2 log=$3 filter=${4:-} dir k list rc=0 r i failed=0
  dir=$(mktemp -d "$WORK/shards.XXXX")
  list=$("$bin" --list-test-cases ${filter:+"$filter"} 2>&1) || { echo "$list" >"$log"; return 77; }
  k=$(sed -n 's/.*passing the current filters: //p' <<<"$list")
  ((k > 0)) || { echo "no GPU test case passes the filter ${filter:-(none)}" >"$log"; return 1; }
  # doctest's --first / --last count the test cases that pass the filters, from 1, in the order
  # it lists them: the long ones first, then the rest.
  local order=() names=() p
  mapfile -t names < <(awk '/listing all test case names/ {on = 1; next}
                            on && /^=+$/ {if (seen++) exit; next} on' <<<"$list")
  for p in "${LONG_GPU_CASES[@]}"; do
    for i in "${!names[@]}"; do [[ ${names[i]} == "$p"* ]] && order+=($((i + 1))); done
  done
  for i in $(seq 1 "$k"); do [[ " ${order[*]} " == *" $i "* ]] || order+=("$i"); done
  # shellcheck disable=SC2016  # $0, $1 and $2 expand in the inner shell
  printf '%s\n' "${order[@]}" | xargs -P "$jobs" -I{} sh -c 'start=$(date +%s); "$0" --first={} --last={} ${2:+"$2"} >"$1/{}.log" 2>&1; echo $? >"$1/{}.rc"; echo $(($(date +%s) - start)) >"$1/{}.s"' \
    "$bin" "$dir" "$filter"
  for i in $(seq 1 "$k"); do
    cat "$dir/$i.log" >>"$log"
    r=$(cat "$dir/$i.rc" 2>/dev/null || echo 1)
    ((r == 0)) || failed=$((failed + 1))
    ((r > rc)) && rc=$r
    # Each case's wall seconds (killed cases have none), for what keeps the suite past a call.
    printf '%s\t%s\n' "$(cat "$dir/$i.s" 2>/dev/null || echo '-')" "${names[i - 1]:-case $i}" >>"${log%.log}_seconds.tsv"
  done
  # One summary over the shards in doctest's words; a shard's own test-case line counts the cases
  # outside its range as passed, so the cases are counted by exit code (a crash leaves no line).
  awk -F'|' '/^\[doctest\] assertions:/ {split($1, a, ":"); an += a[2]; ap += $2; af += $3}
             END {printf "[doctest] test cases: %d | %d passed | %d failed (one process each)\n", k, k - f, f;
                  printf "[doctest] assertions: %d | %d passed | %d failed |\n", an, ap, af;
                  printf "[doctest] Status: %s\n", (f || af) ? "FAILURE!" : "SUCCESS!"}' k="$k" f="$failed" \
    <(grep -h '^\[doctest\] assertions' "$dir"/*.log) >>"$log"
  return "$rc"
}

job_test() {
  if [[ ${CPU_TESTS:-1} == 1 ]]; then build; else build normjit_gpu_tests normjit-precompile; fi
  # Every kernel the GPU cases compile (about 10000: NVRTC for them would take most of a call),
  # compiled before the cases start: imported from the bundle scripts/gpu_test_bundle.sh made
  # where it is carried (.gpu-test-bundle), the rest on every core. Else each case would compile
  # its own, many one at a time, and the same forwards in several cases at once.
  local bundle=.gpu-test-bundle/gpu_tests.$ARCH.njb.xz
  if [[ -f $bundle ]]; then
    xz -dc "$bundle" >"$WORK/gpu_tests.njb" &&
      "$BUILD_DIR/normjit-precompile" --import "$WORK/gpu_tests.njb" -c "$NORMJIT_CACHE_DIR" >"$WORK/bundle_import.log" 2>&1 ||
      say "importing $bundle failed (bundle_import.log); compiling its kernels here"
    say "$(tail -1 "$WORK/bundle_import.log")"
    rm -f "$WORK/gpu_tests.njb"
  fi
  BUILD_DIR=$BUILD_DIR scripts/gpu_test_specs.sh "$ARCH" ${GPU_TC:+"-tc=$GPU_TC"} >"$WORK/gpu_test_specs.txt" ||
    say "listing the GPU tests' specs failed; the cases compile their own"
  say "GPU test specs: $(wc -l <"$WORK/gpu_test_specs.txt")"
  # A spec that fails here is left to the tests, which report it themselves.
  precompile gpu_tests "$(nproc)" --manifest "$WORK/gpu_test_specs.txt"
  touch "$WORK/precompiled.mark"  # kernels the cases compile after this: what the listing missed
  if [[ ${CPU_TESTS:-1} == 1 ]]; then
    ctest --test-dir "$BUILD_DIR" --output-on-failure -E '^normjit_gpu_tests$' >"$WORK/cpu_tests.log" 2>&1 || STATUS=1
    say "ctest (all but normjit_gpu_tests): $(grep -E 'tests passed|tests failed' "$WORK/cpu_tests.log")"
    grep -A20 "The following tests FAILED" "$WORK/cpu_tests.log" | md
  fi
  local rc memcheck_pid=
  if [[ ${MEMCHECK:-1} == 1 && -n $GPU ]]; then
    # Strided and unaligned rows, the seeds, the epilogues' backward and the pipelined rows: in one
    # process beside the cases (whose tail leaves cores idle), its kernels already compiled.
    { local start=$SECONDS
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD_DIR/tests/normjit_gpu_tests" \
        -tc="${MEMCHECK_TC:-strided*,variance*,unaligned*,seed*,epilogue backward*,pipelined*}" >"$WORK/memcheck.log" 2>&1
      local r=$?
      echo $((SECONDS - start)) >"$WORK/memcheck.s"
      exit $r; } &
    memcheck_pid=$!
  fi
  run_sharded "$BUILD_DIR/tests/normjit_gpu_tests" "${GPU_JOBS:-12}" "$WORK/gpu_tests.log" ${GPU_TC:+"-tc=$GPU_TC"}
  rc=$?
  if ((rc == 77)); then say "normjit_gpu_tests: skipped ($(head -1 "$WORK/gpu_tests.log"))"
  else
    ((rc == 0)) || STATUS=1
    say "normjit_gpu_tests ${GPU_TC:+GPU_TC=$GPU_TC }${NORMJIT_GPU_TEST_NS:+NORMJIT_GPU_TEST_NS=$NORMJIT_GPU_TEST_NS }" \
      "rc=$rc:"
    # Failures first, then the totals (the last summary: the shards' sum when sharded).
    { grep -E 'ERROR|FAILED|CRASHED' "$WORK/gpu_tests.log" | head -25
      grep -E '^\[doctest\] (test cases|assertions|Status)' "$WORK/gpu_tests.log" | tail -3
      echo "slowest cases (wall seconds, ${GPU_JOBS:-12} at a time):"
      sort -rn "$WORK/gpu_tests_seconds.tsv" 2>/dev/null | head -8 | sed 's/^/  /'; } | md
    say "kernels the cases compiled themselves (not listed ahead): $(find "$NORMJIT_CACHE_DIR" -name '*.kernel' \
      -newer "$WORK/precompiled.mark" | wc -l)"
  fi
  if [[ -n $memcheck_pid ]]; then
    wait "$memcheck_pid"
    rc=$?
    ((rc == 0)) || STATUS=1
    say "memcheck rc=$rc (124: past 300 s; $(cat "$WORK/memcheck.s" 2>/dev/null || echo '?') s beside the cases):" \
      "$(grep -c 'Invalid' "$WORK/memcheck.log") invalid accesses; $(grep -E 'ERROR SUMMARY' "$WORK/memcheck.log")"
  fi
}

job_bench() {
  build normjit-bench normjit-precompile
  local s f g=() d fresh=/tmp/normjit-fresh
  # The per-N tables' sizes: powers of two, the hidden sizes models use, and sizes between them.
  mapfile -t s < <(std_specs "fwd bwd" 256 512 768 1024 2048 2880 3584 4096 5120 7168 8192 10240 12288 13312 14336 \
    16384 18432 20480 24576 28672 32768 36864 40960 49152 57344 61440 65536 73728 81920 98304 114688 131072 262144)
  mapfile -t f < <(std_specs fwd 256 512 1024 2048 4096 8192 16384 32768 65536)
  # From empty caches: one kernel at a time (NVRTC's time per kernel), the smallest kernels (its
  # floor), the default manifest on all cores, then the bench's own specs.
  rm -rf "$fresh"
  precompile one_at_a_time 1 -c "$fresh/one" -- "${f[@]}" || exit 1
  precompile floor 1 -c "$fresh/floor" -- rmsnorm.fwd_infer.{f32,f16,bf16}.n1 || exit 1
  precompile manifest "$(nproc)" -c "$fresh/manifest" --manifest manifests/default.txt || STATUS=1
  precompile bench "$(nproc)" -c "$fresh/bench" -- "${s[@]}" || exit 1
  # Fresh processes over that cache: every first get() is a disk hit.
  run_grouped bench normjit-bench --cache-dir "$fresh/bench" -- "${s[@]}"
  # Launch-bound shapes: a CUDA graph of K launches next to one of K copies; then the host's
  # cost of a launch against a raw cuLaunchKernel.
  for d in f16 bf16; do
    g+=("layernorm.fwd_train.$d.n768.bias" "layernorm.bwd.$d.n768.bias" "rmsnorm.fwd_train.$d.n128" "rmsnorm.bwd.$d.n128")
  done
  "$BUILD_DIR/normjit-bench" --graph --rows 4096 --json "$WORK/launch_graph.json" "${g[@]}" \
    >"$WORK/launch_graph.txt" 2>&1 || STATUS=1
  "$BUILD_DIR/normjit-bench" --launch-overhead --rows 4096 --json "$WORK/launch_host.json" \
    layernorm.fwd_train.f16.n768.bias rmsnorm.fwd_train.f16.n128 layernorm.fwd_train.bf16.n4096.bias \
    >"$WORK/launch_host.txt" 2>&1 || STATUS=1
  tables pern "$WORK"/bench_m*.json
  tables launch "$WORK"/launch_graph.json "$WORK"/launch_host.json
  tables compile "18 forward bench kernels, one at a time=$WORK/compile_one_at_a_time.json" \
    "NVRTC floor (rmsnorm n1, 3 dtypes)=$WORK/compile_floor.json" \
    "default manifest, all cores=$WORK/compile_manifest.json" "the bench's specs, all cores=$WORK/compile_bench.json"
  tables load "$WORK"/bench_m*.json
}

job_peers() {
  build normjit-bench normjit-precompile
  install_python_package  # the normjit.torch provider
  bash scripts/peers_setup.sh >"$WORK/peers_setup.log" 2>&1
  export PYTHONPATH=$PWD/.peers/site${PYTHONPATH:+:$PYTHONPATH}
  local ns=${PEER_NS:-256 1024 2880 4096 8192 12288 16384 18432 24576 32768 65536} rows=${M:-32768} ph s limit n
  ns=${ns//,/ }
  for ph in ${PEER_PHASES:-fwd bwd}; do
    # shellcheck disable=SC2086  # a list of sizes
    mapfile -t s < <(std_specs "$ph" $ns)
    # normjit.torch's no-grad forward runs the inference kernel: time that one too.
    if [[ $ph == fwd && ${PEER_PROVIDERS:-normjit.torch} == *normjit.torch* ]]; then
      for n in $ns; do s+=("layernorm.fwd_infer.bf16.n$n.bias" "rmsnorm.fwd_infer.bf16.n$n"); done
    fi
    precompile "normjit_$ph" "$(nproc)" -- "${s[@]}" || exit 1
    # shellcheck disable=SC2086
    "$BUILD_DIR/normjit-bench" --rows "$rows" --json "$WORK/normjit_$ph.json" ${BENCH_ARGS:-} "${s[@]}" \
      >"$WORK/normjit_$ph.txt" 2>&1 || STATUS=1
    # peers.py rewrites its JSON after every shape: a phase cut at its limit keeps what it timed.
    limit=${PEER_S:-$([[ $ph == fwd ]] && echo 200 || echo 260)}
    PYTHONUNBUFFERED=1 timeout "$limit" python3 bench/peers.py --phase "$ph" --rows "$rows" --ns "${ns// /,}" \
      --norms "${PEER_NORMS:-layernorm,rmsnorm}" --providers "${PEER_PROVIDERS:-torch.eager,torch.compile,normjit.torch,liger,cudnn,quack,flashinfer}" --json "$WORK/peers_$ph.json" \
      >"$WORK/peers_$ph.txt" 2>&1
    # Each message once, with the number of shapes that printed it.
    grep -hE "^skip|fell|Error" "$WORK/peers_$ph.txt" | cut -c1-160 | sort | uniq -c | sort -rn | head -20 | md
    [[ -s $WORK/peers_$ph.json ]] || { say "peers $ph: no results (peers_$ph.txt)"; STATUS=1; continue; }
    python3 bench/report.py "$WORK/normjit_$ph.json" "$WORK/peers_$ph.json" "$ph" | md
    say ""
    python3 bench/plot.py --out "$WORK/$ph.png" --phase "$ph" --date "$(date -u +%F)" "$WORK/normjit_$ph.json" \
      "$WORK/peers_$ph.json" >>"$WORK/plot.log" 2>&1 && KEEP+=("$WORK/$ph.png")
  done
}

job_sweep() {
  local from=${1:-${FROM:-16384}} to=${2:-${TO:-65536}} step=${3:-${STEP:-1024}} v s
  for v in "FROM=$from" "TO=$to" "STEP=$step"; do
    [[ ${v#*=} =~ ^[1-9][0-9]*$ ]] || { say "sweep: $v is not a positive whole number"; exit 2; }
  done
  ((from <= to)) || { say "sweep: FROM=$from is past TO=$to"; exit 2; }
  mapfile -t s < <(std_specs "${PHASES:-fwd bwd}" $(seq "$from" "$step" "$to"))
  ROWS=16384  # about 200 specs in one 10-minute call
  build normjit-bench normjit-precompile
  precompile sweep "$(nproc)" -- "${s[@]}" || exit 1
  run_grouped sweep normjit-bench -- "${s[@]}"
  tables pern --lowest 10 "$WORK"/sweep_m*.json
}

job_tune() {
  build normjit-bench normjit-tune normjit-precompile
  precompile tune "$(nproc)" -- "$@" || exit 1
  run_grouped tune normjit-tune --budget-s "${TUNE_BUDGET_S:-15}" --max-candidates "${TUNE_CANDIDATES:-12}" \
    --tuning-db "$WORK/tuning.json" -- "$@"
  sed -sn '/speedup/,$p' "$WORK"/tune_m*.txt | md  # each file's summary
  say ""
  # The runtime reads the database: the tuned configs, timed by plain normjit-bench.
  NORMJIT_TUNING_DB=$WORK/tuning.json run_grouped tuned normjit-bench -- "$@"
  tables specs "$WORK"/tuned_m*.json
}

job_profile() {
  build normjit-bench normjit-precompile
  precompile profile "$(nproc)" -- "$@" || exit 1
  local spec rows
  for spec; do
    rows=$(rows_for "$spec")
    # Clocks as the bench leaves them; past the first launches; three launches hold every kernel
    # of a backward (main, or row sums and column tiles, then the reduction).
    # shellcheck disable=SC2086  # NCU_ARGS is a word list
    timeout 300 ncu --clock-control none -k "regex:${KERNEL:-normjit_}" --launch-skip 2 --launch-count 3 \
      ${NCU_ARGS:---section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis} \
      "$BUILD_DIR/normjit-bench" --rows "$rows" --reps 3 --warmup 1 --no-verify ${BENCH_ARGS:-} "$spec" \
      >"$WORK/ncu_$spec.txt" 2>&1 || STATUS=1
    say "## $spec, M = $rows"
    grep -E "^  [a-z]|Duration|Memory Throughput|Registers Per|Occupancy|No Eligible|Issued Warp|Block Limit" \
      "$WORK/ncu_$spec.txt" | md
    say ""
  done
}

job_ab() {
  [[ -f .ab-base/CMakeLists.txt ]] || { say "ab: no .ab-base/ here (scripts/ab_base.sh REV stages it; carry it)"; exit 2; }
  say "base: $(cat .ab-base/REVISION 2>/dev/null || echo '?'); new: the working tree"
  build normjit-bench normjit-precompile
  precompile ab_new "$(nproc)" -- "$@" || exit 1
  # The base builds beside its own sources; kernels of both trees share the cache (keyed by source).
  (cd .ab-base && ln -sfn ../.deps .deps && BUILD_DIR=build && build normjit-bench normjit-precompile &&
    precompile ab_base "$(nproc)" -- "$@") || exit 1
  (cd .ab-base && BUILD_DIR=build run_grouped ab_base normjit-bench -- "$@")
  run_grouped ab_new normjit-bench -- "$@"
  (cd .ab-base && BUILD_DIR=build run_grouped ab_again normjit-bench -- "$@")
  tables ab --base "$WORK"/ab_base_m*.json --new "$WORK"/ab_new_m*.json --again "$WORK"/ab_again_m*.json
}

# The generic kernels (normjit-bench --generic) beside the specialized ones over GENERIC_NS, then
# each compile mode's first launch (normjit-bench --first-call) from an empty cache.
job_generic() {
  build normjit-bench normjit-precompile
  local s=() n mode spec
  # shellcheck disable=SC2086  # GENERIC_NS is a word list
  mapfile -t s < <(std_specs "fwd bwd" ${GENERIC_NS:-1024 2880 4096 7168 8192 16384 32768 50000 65536 131072 262144})
  precompile generic "$(nproc)" -- "${s[@]}" || exit 1
  run_grouped specialized normjit-bench -- "${s[@]}"
  run_grouped generic normjit-bench --generic -- "${s[@]}"
  tables specs "$WORK"/specialized_m*.json "$WORK"/generic_m*.json
  for mode in sync async generic; do
    for spec in layernorm.fwd_train.bf16.n5000.bias rmsnorm.fwd_infer.bf16.n12345 layernorm.fwd_train.bf16.n30000.bias; do
      rm -rf "$WORK/first-call-cache"
      NORMJIT_COMPILE_MODE=$mode "$BUILD_DIR/normjit-bench" --first-call --rows 4096 --cache-dir "$WORK/first-call-cache" \
        --json "$WORK/first_call_${mode}_$spec.json" "$spec" 2>&1 | tail -1 | md
    done
  done
}

job_specs() {
  build normjit-bench normjit-precompile
  precompile specs "$(nproc)" -- "$@" || exit 1
  run_grouped specs normjit-bench -- "$@"
  tables specs "$WORK"/specs_m*.json
}

# The Python package, built against the carried .deps (spdlog and fmt header-only), into the image's
# Python (--no-deps: the image has torch); once per machine unless the tree changed.
install_python_package() {
  local stamp=/tmp/normjit-python-installed tree
  tree=$(git describe --always --dirty 2>/dev/null)-$(git diff 2>/dev/null | md5sum | cut -c1-8)
  [[ -e $stamp && $(cat "$stamp") == "$tree" ]] && python3 -c "import normjit.torch" 2>/dev/null && return
  # The generic kernels build() just compiled, embedded instead of compiled again.
  local generic_cpp prebuilt=()
  generic_cpp=$(cd "$BUILD_DIR" && pwd)/generated/generic_images.cpp
  [[ -f $generic_cpp ]] && prebuilt=(-C "cmake.define.NORMJIT_GENERIC_PREBUILT=$generic_cpp")
  if ! CMAKE_PREFIX_PATH=$PWD/.deps/root/usr python3 -m pip install -v --no-build-isolation --no-deps "${prebuilt[@]}" . \
    >"$WORK/pip_install.log" 2>&1; then
    tail -30 "$WORK/pip_install.log"; say "pip install . failed (pip_install.log)"; exit 1
  fi
  echo "$tree" >"$stamp"
}

job_python() {
  build normjit-bench normjit-precompile
  install_python_package
  local root=$PWD ns=${PY_NS:-768 2880 4096 7168 12288 18432 32768} ph s=()
  # From outside the tree, so the installed package is what is imported.
  # shellcheck disable=SC2086  # PYTEST_ARGS is a word list
  (cd "$WORK" && timeout "${PYTEST_S:-420}" python3 -m pytest -ra -q -p no:cacheprovider ${PYTEST_ARGS:-} \
    "$root/tests/python") >"$WORK/pytest.log" 2>&1 || STATUS=1
  say "pytest: $(tail -1 "$WORK/pytest.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$WORK/pytest.log" | cut -c1-200 | head -30 | md
  say ""
  [[ ${PY_BENCH:-1} == 1 ]] || return
  python3 bench/torch_host_time.py --rows 4096 --n 768 --json "$WORK/host_time.json" >"$WORK/host_time.txt" 2>&1 ||
    STATUS=1
  say "## normjit.torch per call at 4096 x 768, bf16"; md <"$WORK/host_time.txt"; say ""
  "$BUILD_DIR/normjit-bench" --graph --rows 4096 --json "$WORK/graph_768.json" layernorm.fwd_infer.bf16.n768.bias \
    rmsnorm.fwd_infer.bf16.n768 >"$WORK/graph_768.txt" 2>&1 || STATUS=1
  tables launch "$WORK/graph_768.json"
  # normjit-bench's figures for the kernels normjit.torch runs, then the wrapper against raw launches.
  # shellcheck disable=SC2086  # a list of sizes
  mapfile -t s < <(std_specs fwd $ns | sed 's/fwd_train/fwd_infer/'; std_specs bwd $ns)
  precompile wrapper "$(nproc)" -- "${s[@]}" || exit 1
  "$BUILD_DIR/normjit-bench" --rows "${M:-32768}" --json "$WORK/bench_wrapper.json" "${s[@]}" \
    >"$WORK/bench_wrapper.txt" 2>&1 || STATUS=1
  say "## normjit.torch against raw launches of the same kernel, M = ${M:-32768}, bf16 (bwd: fp32 weights)"
  PYTHONUNBUFFERED=1 python3 bench/wrapper_cost.py --rows "${M:-32768}" --ns "${ns// /,}" \
    --json "$WORK/wrapper_cost.json" --bench "$WORK/bench_wrapper.json" 2>"$WORK/wrapper_cost.err" | md || STATUS=1
  tail -5 "$WORK/wrapper_cost.err"
  say ""
}

job_fusions() {
  build normjit-bench normjit-precompile
  local ns=${FUSION_NS:-1024 2880 4096 5120 7168 8192 12288 16384} n s=()
  # Each fused spec right after its plain one, in one process per row count.
  for n in $ns; do
    s+=("rmsnorm.fwd_train.bf16.n$n" "rmsnorm.fwd_train.bf16.n$n.residual"
      "rmsnorm.fwd_train.bf16.n$n.zero_centered.residual"
      "layernorm.fwd_train.bf16.n$n.bias" "layernorm.fwd_train.bf16.n$n.bias.residual"
      "rmsnorm.bwd.bf16.w_f32.n$n" "rmsnorm.bwd.bf16.w_f32.n$n.residual"
      "layernorm.bwd.bf16.w_f32.n$n.bias" "layernorm.bwd.bf16.w_f32.n$n.bias.residual")
  done
  precompile fusions "$(nproc)" -- "${s[@]}" || exit 1
  run_grouped fusions normjit-bench -- "${s[@]}"
  say "## normjit-bench: fused specs beside the plain ones (bytes: each input read once, each output written once)"
  tables specs "$WORK"/fusions_m*.json
  install_python_package
  local pp
  pp=$(bash scripts/peers_setup.sh 2>"$WORK/peers_setup.err" | tail -1)
  cat "$WORK/peers_setup.err"
  say "## add + RMSNorm through normjit.torch against the unfused work and the peers"
  # shellcheck disable=SC2086  # FUSION_NS is a word list
  env "$pp" PYTHONUNBUFFERED=1 python3 bench/fusions.py --ns "$(tr ' ' , <<<"$ns")" \
    ${FUSION_PROVIDERS:+--providers "$FUSION_PROVIDERS"} --json "$WORK/fusions_torch.json" \
    2>"$WORK/fusions_torch.err" | md || STATUS=1
  tail -5 "$WORK/fusions_torch.err"
  [[ ${QUANT:-0} == 1 ]] || return 0
  say "## add + RMSNorm + quantization through normjit.torch against the unfused work and FlashInfer"
  # shellcheck disable=SC2086  # QUANT_NS, QUANT_PROVIDERS and QUANT_ARGS are word lists
  env "$pp" PYTHONUNBUFFERED=1 python3 bench/quant.py ${QUANT_NS:+--ns $QUANT_NS} \
    ${QUANT_PROVIDERS:+--providers $QUANT_PROVIDERS} ${QUANT_ARGS:-} --json "$WORK/quant.json" 2>"$WORK/quant.err" |
    tee "$WORK/quant.txt" | grep -v '^{' | md || STATUS=1
  tail -5 "$WORK/quant.err"
}

"job_$JOB" "$@"
exit "$STATUS"
