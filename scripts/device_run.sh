#!/usr/bin/env bash
# One device call: build on the GPU machine with the carried .deps, run all tests (GPU included),
# a memcheck pass, the launch-bound shapes under CUDA-graph replay, cold compile / disk-hit /
# in-process-hit timings, and the forward bench with torch peers. Everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL_OUT=${OUT:-/tmp/normjit-out}; OUT=/tmp/normjit-results; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL_OUT"
# The device tool returns at most 8 files: everything is packed into one archive at exit.
trap 'tar czf "$FINAL_OUT/results.tgz" -C "$OUT" . ; cp "$OUT"/table_*.md "$FINAL_OUT"/ 2>/dev/null' EXIT
DEPS=$PWD/.deps/root/usr
export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
STAGE=${1:-all}  # all, or a comma-separated list: tests,launch,perf,bwd,bench
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build -j 16 >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "== build ok"
LB=layernorm.bwd.bf16.w_f32; RB=rmsnorm.bwd.bf16.w_f32; LF=layernorm.fwd_train.bf16.w_bf16; RF=rmsnorm.fwd_train.bf16.w_bf16
# A/B lists: `lb SPEC CFG...` adds SPEC (the heuristic's pick) and SPEC.cfg_CFG for each CFG to the
# M = 32768 list X; `lbl` to the M = 4096 list Y. `run_ab NAME` benches both and tabulates them.
lb() { local v=$1; shift; X="$X $v"; for c in "$@"; do X="$X $v.cfg_$c"; done; }
lbl() { local v=$1; shift; Y="$Y $v"; for c in "$@"; do Y="$Y $v.cfg_$c"; done; }
run_ab() {
  local files=""
  [[ -n $X ]] && build/normjit-bench --rows 32768 --json "$OUT/$1.json" $X > "$OUT/$1.txt" 2>&1 && files="$OUT/$1.json"
  [[ -n $Y ]] && build/normjit-bench --rows 4096 --json "$OUT/$1_large.json" $Y > "$OUT/$1_large.txt" 2>&1 &&
    files="$files $OUT/$1_large.json"
  python3 bench/summary.py $files | tee "$OUT/table_$1.md"
  grep -iE "error|fail|exceed" "$OUT"/$1*.txt | head
}
# Compile-time A/B over X (M = 32768) and Y (M = 4096): `macro_ab NAME OPTS_NEW OPTS_OLD LABEL_NEW
# LABEL_OLD` benches both builds (NVRTC options) in alternating processes, two rounds, and tabulates them.
# OLD_BENCH (default build/normjit-bench) runs the old arm: a build of other templates (oldnew).
macro_ab() {
  local name=$1 label_new=$4 label_old=$5 opt mode round bench
  for round in 1 2; do for mode in new old; do
    opt=$([[ $mode == new ]] && echo "$2" || echo "$3")
    bench=$([[ $mode == new ]] && echo build/normjit-bench || echo "${OLD_BENCH:-build/normjit-bench}")
    NORMJIT_NVRTC_EXTRA_OPTIONS="$opt" $bench --rows 32768 --json "$OUT/${name}_${mode}_r$round.json" $X > "$OUT/${name}_${mode}_r$round.txt" 2>&1
    NORMJIT_NVRTC_EXTRA_OPTIONS="$opt" $bench --rows 4096 --json "$OUT/${name}_${mode}_large_r$round.json" $Y > "$OUT/${name}_${mode}_large_r$round.txt" 2>&1
  done; done
  local f=() r
  for mode in new old; do for r in 1 2; do f+=("$OUT/${name}_${mode}_r$r.json,$OUT/${name}_${mode}_large_r$r.json"); done; done
  python3 bench/ab_rounds.py "$label_new" "$label_old" "${f[@]}" | tee "$OUT/table_$name.md"
  grep -iE "error|fail|exceed" "$OUT"/${name}_*.txt | head
}
# `build_tree DIR LOG TARGET...`: configures and builds another source tree (an old arm) in DIR/build.
build_tree() {
  local dir=$1 log=$2; shift 2
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" >"$OUT/configure_$log.log" 2>&1 &&
    cmake --build "$dir/build" -j 16 --target "$@" >"$OUT/build_$log.log" 2>&1 || { tail -20 "$OUT/build_$log.log"; exit 1; }
}
if [[ ,$STAGE, == *,oldnew,* ]]; then
  # The working tree's templates against those carried in .old_templates (the last commit's), each
  # embedded in its own build; LN / RMS forward and backward over OLDNEW_NS (M = 32768) and
  # OLDNEW_NS_LARGE (M = 4096).
  rm -rf /tmp/oldsrc && mkdir -p /tmp/oldsrc && tar cf - --exclude=./build --exclude=./.deps --exclude=./.whl . | tar xf - -C /tmp/oldsrc
  rm -rf /tmp/oldsrc/templates && cp -r .old_templates /tmp/oldsrc/templates
  build_tree /tmp/oldsrc old normjit-bench
  X=""; Y=""
  # OLDNEW_PHASES: "fwd bwd" (default), or one of them where only one template changed.
  on() { local n=$1 ph; for ph in ${OLDNEW_PHASES:-fwd bwd}; do
    [[ $ph == fwd ]] && echo -n " $LF.n$n.bias $RF.n$n"; [[ $ph == bwd ]] && echo -n " $LB.n$n.bias $RB.n$n"; done; }
  for n in ${OLDNEW_NS:-1024 4096 8192 12288 16384 20480 24576 32768 49152 57344 65536}; do X="$X $(on $n)"; done
  for n in ${OLDNEW_NS_LARGE:-131072 262144}; do Y="$Y $(on $n)"; done
  OLD_BENCH=/tmp/oldsrc/build/normjit-bench macro_ab oldnew "" "" new old
fi
# Session 11, call 3 (split3) timed the shuffle fold, the word unpack and FFMA forms of xhat / y
# each against the other two through -DNORMJIT_AB_* macros; the FFMA forms were reverted and the
# macros removed with them (data: bench/data/2026-11-22/session11/call3_*).
if [[ ,$STAGE, == *,firstgetab,* ]]; then
  # Fresh processes' disk-cache hits, this tree against the tree in .old_src (carried: `git archive`
  # of another commit), each precompiling into its own cache; 6 alternating rounds per build, LAZY.
  rm -rf /tmp/oldsrc2 && cp -r .old_src /tmp/oldsrc2
  build_tree /tmp/oldsrc2 oldsrc normjit-bench normjit-precompile
  FS="$LF.n4096.bias $RF.n4096 $LB.n4096.bias $RB.n4096 $LF.n768.bias $RF.n768 $LB.n768.bias $RB.n768"
  FS="$FS $LF.n12288.bias $RF.n12288 $LB.n12288.bias $RB.n12288 $LF.n1024.bias $RF.n1024 $LB.n1024.bias $RB.n1024"
  declare -A BIN=([new]=build [old]=/tmp/oldsrc2/build)
  for arm in new old; do ${BIN[$arm]}/normjit-precompile -q --cache-dir /tmp/fg_$arm -j 16 -- $FS 2>&1 | tail -1; done
  for i in 1 2 3 4 5 6; do for arm in new old; do
    CUDA_MODULE_LOADING=LAZY ${BIN[$arm]}/normjit-bench --no-verify --reps 1 --warmup 0 --rows 4096 --cache-dir /tmp/fg_$arm \
      --json "$OUT/firstgetab_${arm}_$i.json" $FS > /dev/null 2>&1
  done; done
  for arm in new old; do echo "== $arm"; python3 bench/load_stats.py "$OUT"/firstgetab_${arm}_*.json; done | tee "$OUT/table_firstgetab.md"
fi
if [[ ,$STAGE, == *,fill,* ]]; then
  # Session 12: one-buffer shared-memory rows filled by cp.async against the register-staged fill
  # (NORMJIT_BWD_STAGED_FILL), at the sizes whose backward picks are smem rows.
  X=""; Y=""
  for n in 16384 18432 20480 24576 28672 36864 49152 65536; do X="$X $LB.n$n.bias $RB.n$n"; done
  Y="$LB.n98304.bias $RB.n98304 $RB.n131072 $RB.n262144"
  macro_ab fill "" "-DNORMJIT_BWD_STAGED_FILL" async staged
fi
if [[ ,$STAGE, == *,gamma12,* ]]; then
  # Session 12: gamma held in registers in bulk-copied rows whose packs fit 64 bytes a thread
  # (except LayerNorm rows of 1024 threads) against the session-9 rule (NORMJIT_BWD_HOLD_GAMMA_NARROW:
  # LayerNorm rows of 384-512 threads). Call 4 (H200) timed a first form held in every such row.
  # GAMMA_CANDS: further specs (cfgs pinned) timed in both arms.
  X=""; Y=""
  for n in 4096 8192 12288 16384 18432 24576 28672 32768; do X="$X $LB.n$n.bias $RB.n$n"; done
  X="$X ${GAMMA_CANDS:-}"; Y="$LB.n131072.bias $RB.n131072"
  macro_ab gamma12 "" "-DNORMJIT_BWD_HOLD_GAMMA_NARROW" wide narrow
fi
if [[ ,$STAGE, == *,ncusrc,* ]]; then
  # Per-instruction stall samples (SASS) of NCU_SPECS, one launch each at M = 32768.
  for spec in ${NCU_SPECS:-$LB.n12288.bias $LB.n18432.bias}; do
    timeout 150 ncu --clock-control none -k regex:_fused --launch-skip 2 --launch-count 1 --section WarpStateStats \
      --section SourceCounters -o "$OUT/src_$spec" -f build/normjit-bench --rows 32768 --reps 3 --warmup 1 --no-verify $spec >/dev/null 2>&1
    ncu -i "$OUT/src_$spec.ncu-rep" --page source --csv --print-source sass > "$OUT/src_$spec.csv" 2>&1
    echo "== ncusrc $spec rc=$? $(wc -l < "$OUT/src_$spec.csv") lines"; rm -f "$OUT/src_$spec.ncu-rep"
  done
fi
if [[ ,$STAGE, == *,cands,* ]]; then
  # Session 12: clustered register rows of 1-3 packs per thread (two or more CTAs per SM, so one
  # CTA issues while another waits at its row's barriers) against the heuristic's one-CTA-per-SM
  # backward picks; CANDS_NS at M = 32768, CANDS_NS_LARGE at M = 4096.
  X=""; Y=""
  cand() {  # cand N CLUSTER PACKS_PER_THREAD: the cfg of a v8 register row split over CLUSTER CTAs
    local t=$(( ($1 / 8 / $2 + $3 - 1) / $3 )); t=$(( (t + 31) / 32 * 32 ))
    (( t <= 1024 )) && echo -n " t${t}_r1_v8_c$2_reg"
  }
  for n in ${CANDS_NS:-16384 18432 20480 24576 28672 32768 36864 49152 65536}; do
    C="$(cand $n 2 2)$(cand $n 2 3)$(cand $n 4 2)$(cand $n 4 1)"; (( n >= 32768 )) && C="$C$(cand $n 8 2)$(cand $n 8 1)"
    lb $LB.n$n.bias $C; lb $RB.n$n $C; done
  for n in ${CANDS_NS_LARGE:-98304 131072}; do C="$(cand $n 8 2)$(cand $n 8 1)$(cand $n 16 1)"; lbl $LB.n$n.bias $C; lbl $RB.n$n $C; done
  run_ab cands
fi
if [[ ,$STAGE, == *,picks13,* ]]; then
  # Session 13: pinned configs against the heuristic's picks where session 12's tables left the
  # H200 (and some H100 shapes) under the goals: 2-pack tma3 rows at 640-960 threads, pipe / smem
  # at LN 16384 / 18432, 4-8-CTA bulk-copied rows of 2 packs, LN forward past 20480.
  X=""; Y=""
  lb $LB.n10240.bias t640_r1_v8_tma3 t640_r1_v8_pipe; lb $LB.n11264.bias t704_r1_v8_tma3
  lb $LB.n13312.bias t832_r1_v8_tma3; lb $LB.n15360.bias t960_r1_v8_tma3; lb $LB.n16384.bias t1024_r1_v8_pipe
  lb $LB.n18432.bias t768_r1_v8_smem; lb $LB.n36864.bias t1024_r1_v8_c2_tma
  lb $LB.n40960.bias t640_r1_v8_c4_tma; lb $LB.n61440.bias t1024_r1_v8_c4_tma t480_r1_v8_c8_tma t960_r1_v8_c4_pipe
  lb $RB.n10240 t640_r1_v8_tma3; lb $RB.n12288 t768_r1_v8_tma3; lb $RB.n13312 t832_r1_v8_tma3; lb $RB.n14336 t896_r1_v8_tma3
  lb $RB.n18432 t576_r1_v8_c2_tma; lb $RB.n24576 t768_r1_v8_c2_tma; lb $RB.n28672 t896_r1_v8_c2_tma
  ${PICKS_FWD:-true} && {
    lb $LF.n24576.bias t1024_r1_v8_pipe t768_r1_v8_smem t384_r1_v8_c2_reg; lb $LF.n32768.bias t1024_r1_v8_pipe t512_r1_v8_c2_reg
    lb $LF.n49152.bias t1024_r1_v8_pipe t768_r1_v8_c2_reg t384_r1_v8_c4_reg
    lb $LF.n65536.bias t1024_r1_v8_c2_reg t512_r1_v8_c4_reg t1024_r1_v8_c2_pipe t512_r1_v8_c2_pipe
    # one-buffer shared rows (40 registers: two CTAs per SM where shared memory allows)
    lb $LF.n28672.bias t896_r1_v8_smem t448_r1_v8_smem; lb $LF.n32768.bias t1024_r1_v8_smem t512_r1_v8_smem
    lb $LF.n36864.bias t576_r1_v8_smem t768_r1_v8_smem; lb $LF.n40960.bias t640_r1_v8_smem; lb $LF.n49152.bias t768_r1_v8_smem
    lb $LF.n57344.bias t896_r1_v8_smem; lb $LF.n65536.bias t1024_r1_v8_smem t512_r1_v8_c2_smem; }
  lb $LB.n15360.bias t480_r1_v8_c2_tma; lb $LB.n36864.bias t576_r1_v8_c4_tma t288_r1_v8_c8_tma
  ${PICKS_LARGE:-true} && lbl $LB.n73728.bias t576_r1_v8_c8_tma && lbl $LB.n98304.bias t768_r1_v8_c8_tma && lbl $LB.n131072.bias t1024_r1_v8_c8_tma &&
    lbl $LB.n262144.bias && lbl $RB.n73728 t576_r1_v8_c8_tma && lbl $RB.n131072 t1024_r1_v8_c8_tma && lbl $RB.n262144 t1024_r1_v8_c16_tma
  X="$X ${PICKS_EXTRA:-}"; Y="$Y ${PICKS_EXTRA_LARGE:-}"
  run_ab picks13
fi
if [[ ,$STAGE, == *,picks13b,* ]]; then
  # Session 13: the new heuristic's picks (first of each group) against the session-12 picks and
  # untried neighbours, pinned, in one process; then the LayerNorm 832-896-thread held-gamma rows
  # with mean/rstd one row ahead (NORMJIT_BWD_STATS_AHEAD_ALWAYS, 4-8 bytes spilled) against the
  # row's own loaded at its start, alternating processes.
  X=""; Y=""
  lb $LB.n9216.bias t576_r1_v8_tma3; lb $RB.n9216 t576_r1_v8_tma3; lb $LB.n10000.bias t640_r1_v8_reg
  lb $LB.n10240.bias t640_r1_v8_reg; lb $LB.n11264.bias t704_r1_v8_smem; lb $LB.n18432.bias t768_r1_v8_tma3
  lb $LB.n40960.bias t1024_r1_v8_c2_smem; lb $LB.n45056.bias t1024_r1_v8_c2_smem; lb $LB.n61440.bias t1024_r1_v8_c4_tma t960_r1_v8_c4_pipe
  lb $RB.n10240 t640_r1_v8_reg; lb $RB.n11264 t352_r1_v8_smem; lb $RB.n12288 t768_r1_v8_reg; lb $RB.n13312 t416_r1_v8_smem
  lb $RB.n14336 t448_r1_v8_smem; lb $RB.n24576 t768_r1_v8_smem; lb $RB.n26624 t832_r1_v8_smem; lb $RB.n28672 t896_r1_v8_smem
  lb $RB.n30720 t960_r1_v8_smem; lb $RB.n40960 t640_r1_v8_c4_tma; lb $RB.n45056 t704_r1_v8_c4_tma
  lb $LF.n22528.bias t704_r1_v8_reg; lb $LF.n24576.bias t768_r1_v8_reg; lb $LF.n36864.bias t1024_r1_v4_reg
  lb $LF.n40960.bias t1024_r1_v4_reg; lb $LF.n46080.bias t736_r1_v8_smem; lb $LF.n53248.bias t832_r1_v8_smem
  lb $LF.n57344.bias t448_r1_v8_c2_smem; lb $LF.n61440.bias t960_r1_v8_smem; lb $LF.n65536.bias t1024_r1_v8_gmem
  lb $RF.n65536 t512_r1_v8_c2_smem
  for n in 81920 98304 114688; do lbl $LB.n$n.bias; lbl $RB.n$n; done
  Y="$Y $LB.n81920.bias.cfg_t1024_r1_v8_c4_smem $RB.n81920.cfg_t640_r1_v8_c8_tma $RB.n98304.cfg_t1024_r1_v8_c4_smem"
  Y="$Y $LB.n114688.bias.cfg_t1024_r1_v8_c8_pipe $RB.n114688.cfg_t1024_r1_v8_c8_pipe"
  run_ab picks13b
  X=""; Y=""
  for n in 13312 14336 26624 28672 57344; do X="$X $LB.n$n.bias"; done; Y="$LB.n114688.bias"
  macro_ab ahead "" "-DNORMJIT_BWD_STATS_AHEAD_ALWAYS" own ahead
fi
if [[ ,$STAGE, == *,pins,* ]]; then
  # Any specs, pinned or not: PINS (M = 32768) and PINS_LARGE (M = 4096), one process each.
  X="${PINS:-}"; Y="${PINS_LARGE:-}"; run_ab pins
fi
if [[ ,$STAGE, == *,fwdclus,* ]]; then
  # Forward rows split over clusters of small CTAs (256-512 threads, 4-8 packs each, 38-40
  # registers): several CTAs per SM instead of one, as QuACK's RMS forward runs at 65536.
  X=""; Y=""
  fc() { local n=$1; shift; lb $LF.n$n.bias "$@"; lb $RF.n$n "$@"; }
  fc 28672 t448_r1_v8_c2_smem t224_r1_v8_c4_smem t448_r1_v8_c4_smem
  fc 32768 t256_r1_v8_c2_smem t512_r1_v8_c2_smem t256_r1_v8_c4_smem t128_r1_v8_c4_smem
  fc 40960 t320_r1_v8_c2_smem t640_r1_v8_c2_smem t320_r1_v8_c4_smem
  fc 49152 t384_r1_v8_c2_smem t384_r1_v8_c4_smem t192_r1_v8_c4_smem
  fc 57344 t448_r1_v8_c2_smem t448_r1_v8_c4_smem t224_r1_v8_c4_smem
  fc 65536 t256_r1_v8_c4_smem t512_r1_v8_c4_smem t256_r1_v8_c8_smem t512_r1_v8_c2_smem t256_r1_v8_c4_tma
  fl() { local n=$1; shift; lbl $LF.n$n.bias "$@"; lbl $RF.n$n "$@"; }
  fl 81920 t320_r1_v8_c4_smem t320_r1_v8_c8_smem
  fl 131072 t256_r1_v8_c8_smem t512_r1_v8_c8_smem t256_r1_v8_c16_smem
  fl 262144 t256_r1_v8_c16_smem t512_r1_v8_c16_smem
  run_ab fwdclus
fi
if [[ ,$STAGE, == *,stages4,* ]]; then
  # Four bulk-copied buffers, as cuDNN's RMS bwd 12288 kernel holds (197 KB of shared memory,
  # session 14 call 1), against the picks' two or three, one-CTA rows and 2-CTA rows.
  X=""; Y=""
  lb $RB.n4096 t256_r1_v8_tma4; lb $LB.n4096.bias t256_r1_v8_tma4
  lb $RB.n8192 t512_r1_v8_tma4; lb $RB.n10240 t640_r1_v8_tma4; lb $RB.n12288 t768_r1_v8_tma4
  lb $RB.n14336 t896_r1_v8_tma4; lb $RB.n16384 t1024_r1_v8_c2_tma4 t512_r1_v8_c2_tma4
  lb $RB.n20480 t640_r1_v8_c2_tma4; lb $RB.n24576 t768_r1_v8_c2_tma3 t768_r1_v8_c2_tma4
  lb $RB.n32768 t1024_r1_v8_c2_tma3
  lb $LB.n8192.bias t512_r1_v8_tma4; lb $LB.n10240.bias t640_r1_v8_tma4; lb $LB.n12288.bias t768_r1_v8_tma4
  lb $LB.n13312.bias t832_r1_v8_tma4; lb $LB.n16384.bias t1024_r1_v8_c2_tma4
  lb $LB.n18432.bias t576_r1_v8_c2_tma3 t576_r1_v8_c2_tma4; lb $LB.n20480.bias t640_r1_v8_c2_tma3 t640_r1_v8_c2_tma4
  lb $LB.n24576.bias t768_r1_v8_c2_tma3 t768_r1_v8_c2_tma4; lb $LB.n32768.bias t1024_r1_v8_c2_tma3
  lb $LF.n32768.bias t256_r1_v8_c2_smem
  run_ab stages4
fi
if [[ ,$STAGE, == *,fewthreads,* ]]; then
  # cuDNN's LN bwd 18432 shape (session 14 call 2): 2-CTA clusters of 288 threads, 4 packs each,
  # 3 stages, against the picks' 576-1024-thread rows of 1-3 packs.
  X=""; Y=""
  lb $LB.n16384.bias t256_r1_v8_c2_tma3 t512_r1_v8_c2_tma3
  lb $LB.n18432.bias t288_r1_v8_c2_tma3 t288_r1_v8_c2_tma t384_r1_v8_c2_tma3 t288_r1_v8_c2_smem
  lb $LB.n20480.bias t320_r1_v8_c2_tma3 t320_r1_v8_c2_tma
  lb $LB.n24576.bias t384_r1_v8_c2_tma3 t384_r1_v8_c2_tma
  lb $LB.n32768.bias t512_r1_v8_c2_tma
  lb $RB.n18432 t288_r1_v8_c2_tma3 t384_r1_v8_c2_tma3; lb $RB.n24576 t384_r1_v8_c2_tma3
  lb $RB.n32768 t512_r1_v8_c2_tma3
  run_ab fewthreads
fi
if [[ ,$STAGE, == *,asyncfill,* ]]; then
  # Forward shared-memory rows filled by cp.async (all of a thread's packs in flight at once)
  # against the fill through registers (NORMJIT_FWD_SHARED_ASYNC_FILL), picks and pinned rows.
  # Session 14 call 7: the async fill lost everywhere; the macro was removed from norm_fwd.cuh
  # (commit 'norm_fwd: NORMJIT_FWD_SHARED_ASYNC_FILL' holds it), so this stage needs it back.
  X=""; Y=""
  for n in 12288 22528 24576 36864 40960 57344 65536; do X="$X $LF.n$n.bias"; done
  X="$X $RF.n65536.cfg_t256_r1_v8_c4_smem $RF.n65536.cfg_t512_r1_v8_c2_smem $LF.n65536.bias.cfg_t256_r1_v8_c4_smem"
  X="$X $LF.n32768.bias.cfg_t256_r1_v8_c2_smem $RF.n49152.cfg_t384_r1_v8_c2_smem $RF.n16384.cfg_t512_r1_v8_smem"
  for n in 81920 98304 131072 262144; do Y="$Y $LF.n$n.bias $RF.n$n"; done
  macro_ab asyncfill "-DNORMJIT_FWD_SHARED_ASYNC_FILL" "" async regs
fi
if [[ ,$STAGE, == *,sweep,* ]]; then
  # Every SWEEP_STEP from SWEEP_FROM to SWEEP_TO (LN with bias and RMS, bf16, fp32 weights in the
  # backward), M = SWEEP_ROWS: the sizes between the bench's, where a pick may be a pothole.
  SW=""
  for ((n = ${SWEEP_FROM:-16384}; n <= ${SWEEP_TO:-65536}; n += ${SWEEP_STEP:-1024})); do
    for ph in ${SWEEP_PHASES:-bwd}; do
      [[ $ph == fwd ]] && SW="$SW $LF.n$n.bias $RF.n$n" || SW="$SW $LB.n$n.bias $RB.n$n"
    done
  done
  build/normjit-bench --rows ${SWEEP_ROWS:-16384} --json "$OUT/sweep.json" $SW > "$OUT/sweep.txt" 2>&1
  grep -iE "error|fail|exceed" "$OUT/sweep.txt" | head
  grep "% copy" "$OUT/sweep.txt" | awk '{print $1, $(NF-2)}' | sort -k2 -n | head -${SWEEP_SHOW:-40}
fi
if [[ ,$STAGE, == *,ncu,* ]]; then
  # Where the backward's warps wait: Nsight Compute on one launch of each of NCU_SPECS (M = 32768).
  for spec in ${NCU_SPECS:-$LB.n16384.bias $LB.n18432.bias $RB.n65536}; do
    timeout 120 ncu --clock-control none -k regex:_fused --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      build/normjit-bench --rows 32768 --reps 3 --warmup 1 --no-verify $spec > "$OUT/ncu_$spec.txt" 2>&1
    echo "== ncu $spec rc=$?"; grep -E "Duration|Memory Throughput|Issued Ipc|No Eligible|Stall|Registers Per|Achieved Occ|Block Limit" "$OUT/ncu_$spec.txt" | head -24
  done
fi
if [[ $STAGE == all || ,$STAGE, == *,tests,* ]]; then
  if [[ -n ${GPU_TC:-} ]]; then  # a subset of the GPU cases (doctest -tc filters)
    timeout ${GPU_TIMEOUT:-0} build/tests/normjit_gpu_tests -tc="$GPU_TC" 2>&1 | tail -40 | tee "$OUT/gpu_tests.log" | tail -15
    echo "== gpu tests rc=${PIPESTATUS[0]} (124: past GPU_TIMEOUT)"
  else
    (cd build && ctest --output-on-failure -V -R normjit_gpu_tests 2>&1 | tail -40) | tee "$OUT/gpu_tests.log" | tail -15
  fi
  [[ ${CPU_TESTS:-1} == 1 ]] && (cd build && ctest --output-on-failure -E normjit_gpu_tests >"$OUT/cpu_tests.log" 2>&1; tail -8 "$OUT/cpu_tests.log")
  if [[ ${MEMCHECK:-1} == 1 ]]; then
    timeout ${MEMCHECK_S:-240} compute-sanitizer --tool memcheck --error-exitcode 9 build/tests/normjit_gpu_tests \
      -tc="${MEMCHECK_TC:-strided*,variance*,unaligned*,seed*,epilogue backward*,pipelined*}" \
      >"$OUT/memcheck.log" 2>&1; echo "== memcheck rc=$? ($(grep -c 'Invalid' "$OUT/memcheck.log") invalid accesses)"; tail -3 "$OUT/memcheck.log"
  fi
fi
if [[ $STAGE == all || ,$STAGE, == *,launch,* ]]; then
  # Launch-bound shapes (the issue's bound: fwd <= 1.15x, bwd <= 1.3x a D2D copy of M·N·itemsize):
  # CUDA-graph replay of K launches over rotating sets > 4x L2, next to a graph of K copies.
  LSPECS=""; for dt in f16 bf16; do
    LSPECS="$LSPECS layernorm.fwd_train.$dt.n768.bias layernorm.bwd.$dt.n768.bias rmsnorm.fwd_train.$dt.n128 rmsnorm.bwd.$dt.n128"
  done
  build/normjit-bench --graph --rows 4096 --json "$OUT/normjit_launch.json" $LSPECS 2>&1 | tee "$OUT/normjit_launch.txt"
  # Host-side launch cost against a raw cuLaunchKernel, and get() hits (autotuning issue's figures).
  build/normjit-bench --launch-overhead --rows 4096 --json "$OUT/normjit_launch_overhead.json" \
    layernorm.fwd_train.f16.n768.bias rmsnorm.fwd_train.f16.n128 layernorm.fwd_train.bf16.n4096.bias 2>&1 \
    | tee "$OUT/normjit_launch_overhead.txt" | grep -E "host launch|^layernorm|^rmsnorm"
fi
if [[ $STAGE == all || ,$STAGE, == *,perf,* ]]; then
  # normjit alone over powers of two, the hidden sizes models use and sizes between them, bf16,
  # M = 32768 (M = 4096 past 65536; M*N >= 2^24 everywhere), forward training and backward (fp32
  # weights); then the previous heuristic's picks, pinned by cfg, for an A/B in this process.
  NS=${PERF_NS:-"256 512 768 1024 2048 2880 3584 4096 5120 7168 8192 10240 12288 13312 14336 16384 18432 20480 24576 28672 32768 36864 40960 49152 57344 61440 65536"}
  SPECS=""; for n in $NS; do SPECS="$SPECS layernorm.fwd_train.bf16.n$n.bias rmsnorm.fwd_train.bf16.n$n"; done
  for n in $NS; do SPECS="$SPECS layernorm.bwd.bf16.w_f32.n$n.bias rmsnorm.bwd.bf16.w_f32.n$n"; done
  build/normjit-bench --rows 32768 --json "$OUT/normjit_perf.json" $SPECS 2>&1 | tee "$OUT/normjit_perf.txt" | tail -3
  L=""; for n in ${PERF_NS_LARGE:-73728 81920 98304 114688 131072 262144}; do
    L="$L layernorm.fwd_train.bf16.n$n.bias rmsnorm.fwd_train.bf16.n$n layernorm.bwd.bf16.w_f32.n$n.bias rmsnorm.bwd.bf16.w_f32.n$n"; done
  build/normjit-bench --rows 4096 --json "$OUT/normjit_perf_large.json" $L 2>&1 | tail -3
  # The previous (session 8) heuristic's picks where this session's changed, pinned by cfg.
  AB="$LB.n4096.bias.cfg_t256_r1_v8_pipe $LB.n6144.bias.cfg_t384_r1_v8_reg $LB.n7168.bias.cfg_t448_r1_v8_pipe"
  AB="$AB $LB.n8192.bias.cfg_t512_r1_v8_pipe $RB.n4096.cfg_t256_r1_v8_reg $RB.n8192.cfg_t512_r1_v8_pipe"
  AB="$AB $LB.n24576.bias.cfg_t1024_r1_v8_smem $LB.n26624.bias.cfg_t832_r1_v8_smem $LB.n28672.bias.cfg_t896_r1_v8_c2_pipe"
  AB="$AB $LB.n12288.bias.cfg_t768_r1_v8_smem $LB.n14336.bias.cfg_t896_r1_v8_smem $LB.n16384.bias.cfg_t1024_r1_v8_pipe"
  AB="$AB $LB.n18432.bias.cfg_t768_r1_v8_smem $LB.n32768.bias.cfg_t1024_r1_v8_c2_pipe $RB.n32768.cfg_t1024_r1_v8_smem"
  build/normjit-bench --rows 32768 --json "$OUT/normjit_perf_ab.json" $AB 2>&1 | tail -3
  ABL=""
  [[ -n $ABL ]] && build/normjit-bench --rows 4096 --json "$OUT/normjit_perf_ab_large.json" $ABL 2>&1 | tail -3
  python3 bench/summary.py "$OUT"/normjit_perf.json "$OUT"/normjit_perf_large.json "$OUT"/normjit_perf_ab.json \
    $(ls "$OUT"/normjit_perf_ab_large.json 2>/dev/null) | tee "$OUT/table_perf.md"
fi
if [[ ,$STAGE, == *,peers,* ]]; then
  # normjit and every peer (torch eager/compile, Liger, cuDNN, QuACK) in this one process tree.
  bash scripts/peers_setup.sh >"$OUT/peers_setup.log" 2>&1; export PYTHONPATH=$PWD/.peers/site
  PN=${PEER_NS:-"256 1024 4096 16384 65536"}
  NSC=$(echo $PN | tr ' ' ,)
  PROV=${PEER_PROVIDERS:-torch.eager,torch.compile,liger,cudnn,quack}
  for ph in ${PEER_PHASES:-fwd bwd}; do  # one phase per call where the sizes are many (10 min limit)
    SPECS=""
    for n in $PN; do
      if [[ $ph == fwd ]]; then SPECS="$SPECS layernorm.fwd_train.bf16.n$n.bias rmsnorm.fwd_train.bf16.n$n"
      else SPECS="$SPECS layernorm.bwd.bf16.w_f32.n$n.bias rmsnorm.bwd.bf16.w_f32.n$n"; fi
    done
    build/normjit-bench --rows 32768 --json "$OUT/normjit_$ph.json" $SPECS >"$OUT/normjit_$ph.txt" 2>&1
    LIMIT=$([[ $ph == fwd ]] && echo ${PEER_FWD_S:-200} || echo ${PEER_BWD_S:-260})
    PHASE_ARG=$([[ $ph == bwd ]] && echo "--phase bwd")
    # PEER_PROVIDERS_BWD: other providers for the backward (QuACK alone, after a call without it).
    [[ $ph == bwd && -n ${PEER_PROVIDERS_BWD:-} ]] && PROV=$PEER_PROVIDERS_BWD
    PYTHONUNBUFFERED=1 timeout $LIMIT python3 bench/peers.py --providers $PROV $PHASE_ARG --ns $NSC \
      --json "$OUT/peers_$ph.json" >"$OUT/peers_$ph.txt" 2>&1
    grep -hE "skip|fell" "$OUT/peers_$ph.txt" | cut -c1-160 | head -20
    python3 bench/report.py "$OUT/normjit_$ph.json" "$OUT/peers_$ph.json" $ph | tee "$OUT/table_$ph.md"
    python3 bench/plot.py --out "$OUT/$ph.png" --phase $ph --date "$(date +%F)" "$OUT/normjit_$ph.json" "$OUT/peers_$ph.json" 2>&1 | tail -2
  done
fi
if [[ ,$STAGE, == *,profile,* ]]; then
  # ncu launch figures (grid, block, registers, duration, DRAM %) of normjit's kernels and cuDNN's
  # at the shapes where cuDNN leads: how many kernels, what grid, what share of DRAM.
  bash scripts/peers_setup.sh >"$OUT/peers_setup.log" 2>&1; export PYTHONPATH=$PWD/.peers/site
  M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size"
  M="$M,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__shared_mem_per_block_dynamic"
  M="$M,launch__cluster_dim_x,dram__bytes_read.sum,dram__bytes_write.sum"
  # PROFILE_JOBS: "phase:norm:N ..." (default: the session-8 list).
  for job in ${PROFILE_JOBS:-bwd:rmsnorm:1024 bwd:rmsnorm:4096 bwd:rmsnorm:16384 bwd:layernorm:16384 fwd:layernorm:65536}; do
    IFS=: read -r ph norm n <<< "$job"
    PA=$([[ $ph == bwd ]] && echo "--phase bwd")
    timeout 150 ncu --csv --metrics $M ${PROFILE_KFILTER:+-k regex:$PROFILE_KFILTER} -c ${PROFILE_KERNELS:-60} python3 bench/peers.py --providers cudnn $PA --norms $norm \
      --ns $n --json /tmp/p.json > "$OUT/ncu_cudnn_${ph}_${norm}_$n.csv" 2>&1
    b=$([[ $norm == layernorm ]] && echo .bias); w=$([[ $ph == bwd ]] && echo w_f32 || echo w_bf16)
    spec=$norm.$([[ $ph == bwd ]] && echo bwd || echo fwd_train).bf16.$w.n$n$b
    timeout 100 ncu --csv --metrics $M -k regex:normjit_ build/normjit-bench --rows 32768 --no-verify --warmup 1 --reps 1 \
      --batch 1 $spec > "$OUT/ncu_normjit_${ph}_${norm}_$n.csv" 2>&1
  done
  timeout 120 ncu --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis -k regex:normjit_.*fused \
    -c 1 build/normjit-bench --rows 32768 --no-verify --warmup 0 --reps 1 --batch 1 rmsnorm.bwd.bf16.w_f32.n4096 \
    > "$OUT/ncu_normjit_rms_bwd_4096_stalls.txt" 2>&1
  python3 bench/ncu_table.py "$OUT"/ncu_*.csv | tee "$OUT/table_profile.md"
fi
if [[ ,$STAGE, == *,spills,* ]]; then
  # The default manifest's six configs that spilled 4-8 B to reach ptxas's occupancy target, as
  # compiled again with one CTA per SM asked (default) against the spilling build
  # (-DNORMJIT_KEEP_SPILLS), alternating processes, two rounds.
  X="layernorm.fwd_train.bf16.w_f32.n1024.bias rmsnorm.fwd_train.bf16.w_f32.n768 rmsnorm.fwd_infer.bf16.w_f32.n2048"
  X="$X rmsnorm.bwd.f16.w_f16.n2880 rmsnorm.bwd.f16.w_f16.n3072 rmsnorm.bwd.f32.w_f32.n4096"
  for round in 1 2; do for mode in new old; do
    opt=$([[ $mode == old ]] && echo "-DNORMJIT_KEEP_SPILLS")
    NORMJIT_NVRTC_EXTRA_OPTIONS="$opt" build/normjit-bench --rows 32768 --json "$OUT/spills_${mode}_r$round.json" $X \
      > "$OUT/spills_${mode}_r$round.txt" 2>&1
  done; done
  python3 bench/ab_rounds.py recompiled spilling "$OUT"/spills_new_r1.json "$OUT"/spills_new_r2.json \
    "$OUT"/spills_old_r1.json "$OUT"/spills_old_r2.json | tee "$OUT/table_spills.md"
  grep -iE "error|fail|exceed" "$OUT"/spills*.txt | head
fi
if [[ ,$STAGE, == *,tunelarge,* ]]; then
  # normjit-tune over the shapes that miss the goals, where the space holds clustered and
  # pipelined rows; then the runtime re-times the winners from the database.
  T=${TUNE_SPECS:-"$LB.n20480.bias $LB.n24576.bias $LB.n40960.bias $LF.n49152.bias $LF.n65536.bias $RB.n16384"}
  TL=${TUNE_SPECS_LARGE:-"$LB.n81920.bias $RB.n81920 $LB.n131072.bias"}
  build/normjit-tune --rows 32768 --budget-s ${TUNE_BUDGET_S:-25} --max-candidates ${TUNE_CANDIDATES:-24} \
    --tuning-db "$OUT/tuning.json" --json "$OUT/tunelarge.json" $T 2>"$OUT/tunelarge.err" | tee "$OUT/tunelarge.txt" | tail -8
  build/normjit-tune --rows 4096 --budget-s ${TUNE_BUDGET_S:-25} --max-candidates ${TUNE_CANDIDATES:-24} \
    --tuning-db "$OUT/tuning.json" --json "$OUT/tunelarge_l.json" $TL 2>"$OUT/tunelarge_l.err" | tee "$OUT/tunelarge_l.txt" | tail -5
  grep -c pruned "$OUT"/tunelarge*.err
  NORMJIT_TUNING_DB="$OUT/tuning.json" build/normjit-bench --rows 32768 --json "$OUT/tunelarge_db.json" $T 2>&1 | tail -7
  NORMJIT_TUNING_DB="$OUT/tuning.json" build/normjit-bench --rows 4096 --json "$OUT/tunelarge_db_l.json" $TL 2>&1 | tail -4
fi
if [[ ,$STAGE, == *,sweep7,* ]]; then
  # After the session-7 tuning run: forward rows of 9-15 4-element packs per thread in registers
  # (1024 threads) against the picks at 36864-61440; backward clusters at 73728-131072 (M = 4096)
  # in one buffer or two, 4 or 8 CTAs; LayerNorm backward rows of 4-element packs at 18432-28672.
  X=""; Y=""
  for n in 36864 40960 45056 49152 53248 57344 61440; do
    lb $LF.n$n.bias t1024_r1_v4_reg; lb $RF.n$n t1024_r1_v4_reg; done
  for n in 18432 20480 24576 28672; do lb $LB.n$n.bias t1024_r1_v4_smem; done
  lb $RB.n24576 t1024_r1_v4_smem
  lbl $LB.n73728.bias t1024_r1_v8_c4_smem t1024_r1_v8_c8_smem t1024_r1_v8_c4_pipe t1024_r1_v8_c8_pipe
  for n in 81920 90112 98304 114688; do lbl $LB.n$n.bias t1024_r1_v8_c4_smem t1024_r1_v8_c8_smem t1024_r1_v8_c8_pipe; done
  lbl $LB.n131072.bias t1024_r1_v8_c8_smem t1024_r1_v8_c8_pipe
  for n in 73728 81920 90112 98304 114688; do
    lbl $RB.n$n t1024_r1_v8_c4_smem t1024_r1_v8_c8_smem t1024_r1_v8_c4_pipe t1024_r1_v8_c8_pipe; done
  lbl $RB.n131072 t1024_r1_v8_c4_smem t1024_r1_v8_c8_smem t1024_r1_v8_c8_pipe
  run_ab sweep7
fi
if [[ ,$STAGE, == *,ab7b,* ]]; then
  # One-buffer 2-CTA backward segments of 2-3 packs per thread against the pipelined picks (RMS
  # 34816-45056); LN forward one-CTA shared rows at 53248-61440 against 2-CTA ones; LN forward
  # 8-CTA shared rows of 7-8 packs per thread at 81920-131072.
  X=""; Y=""
  for n in 34816 36864 40960 45056; do lb $RB.n$n t1024_r1_v8_c2_smem; done
  lb $LF.n53248.bias t832_r1_v8_smem; lb $LF.n57344.bias t896_r1_v8_smem; lb $LF.n61440.bias t960_r1_v8_smem
  lbl $LF.n81920.bias t160_r1_v8_c8_smem; lbl $LF.n98304.bias t192_r1_v8_c8_smem
  lbl $LF.n114688.bias t224_r1_v8_c8_smem t256_r1_v8_c8_smem; lbl $LF.n131072.bias t256_r1_v8_c8_smem
  run_ab ab7b
fi
if [[ ,$STAGE, == *,ab7c,* ]]; then
  # 2-CTA one-buffer backward segments where the one-buffer rule does not reach yet: LayerNorm
  # with the dbeta sums in shared memory (36864-57344), and 3.5-3.75 packs per thread (RMS 57344 /
  # 61440), against the picks (4-CTA pipelined).
  X=""; Y=""
  for n in 36864 40960 45056 57344; do lb $LB.n$n.bias t1024_r1_v8_c2_smem; done
  for n in 57344 61440; do lb $RB.n$n t1024_r1_v8_c2_smem; done
  run_ab ab7c
fi
if [[ ,$STAGE, == *,loadstats,* ]]; then
  # First get of every kernel that came from the disk cache, over all of this call's bench runs.
  python3 bench/load_stats.py $(ls "$OUT"/*.json | grep -v tuning.json) | tee "$OUT/table_loadstats.md"
fi
if [[ ,$STAGE, == *,tune,* ]]; then
  # normjit-tune over a few specs per route; the summary prints heuristic against tuned times.
  T=""; for n in ${TUNE_NS:-768 4096 12288 16384 65536}; do T="$T layernorm.fwd_train.bf16.n$n.bias layernorm.bwd.bf16.w_f32.n$n.bias"; done
  T=${TUNE_SPECS:-$T}  # or any specs
  build/normjit-tune --rows 32768 --budget-s ${TUNE_BUDGET_S:-15} --max-candidates ${TUNE_CANDIDATES:-12} \
    --tuning-db "$OUT/tuning.json" --json "$OUT/tune.json" $T 2>&1 | tee "$OUT/tune.txt" | tail -14
  # The runtime reads the database: the tuned configs, run by plain normjit-bench.
  NORMJIT_TUNING_DB="$OUT/tuning.json" build/normjit-bench --rows 32768 --json "$OUT/tuned_bench.json" $T 2>&1 | tail -11
fi
if [[ ,$STAGE, == *,rows,* ]]; then
  # Where the row waits at large N (shared memory, one CTA or a cluster) against the heuristic's
  # pick, pinned by cfg in one process: backward 10240-65536, forward 18432, 65536, 262144.
  X=""
  for norm in layernorm rmsnorm; do
    b=$([[ $norm == layernorm ]] && echo .bias)
    bw() { for c in "${@:2}"; do X="$X $norm.bwd.bf16.w_f32.n$1$b.cfg_$c"; done; }
    fw() { for c in "${@:2}"; do X="$X $norm.fwd_train.bf16.w_bf16.n$1$b.cfg_$c"; done; }
    bw 10240 t320_r1_v8_smem t640_r1_v8_smem t640_r1_v8_reg t320_r1_v8_c2_reg t1024_r1_v8_gmem
    bw 12288 t384_r1_v8_smem t768_r1_v8_smem t768_r1_v8_reg t1024_r1_v2_reg t384_r1_v8_c2_smem t384_r1_v8_c2_reg
    bw 16384 t512_r1_v8_smem t1024_r1_v8_smem t512_r1_v8_c2_smem t512_r1_v8_c2_reg t256_r1_v8_c4_reg
    bw 18432 t576_r1_v8_smem t768_r1_v8_smem t576_r1_v8_c2_smem t288_r1_v8_c2_smem
    bw 28672 t896_r1_v8_smem t896_r1_v8_c2_smem t448_r1_v8_c4_smem t448_r1_v8_c2_smem
    bw 32768 t1024_r1_v8_smem t1024_r1_v8_c2_smem t512_r1_v8_c4_smem t1024_r1_v8_c4_smem t256_r1_v8_c8_reg
    bw 65536 t1024_r1_v8_c2_smem t1024_r1_v8_c4_smem t512_r1_v8_c4_smem t1024_r1_v8_c8_smem t512_r1_v8_c8_smem
    fw 18432 t576_r1_v8_reg t768_r1_v8_reg t384_r1_v8_reg t576_r1_v8_smem t1024_r1_v8_reg
    fw 65536 t1024_r1_v8_gmem t1024_r1_v8_c2_smem t1024_r1_v8_c2_reg t512_r1_v8_c4_smem t1024_r1_v8_c4_smem
  done
  build/normjit-bench --rows 32768 --json "$OUT/rows.json" $X > "$OUT/rows.txt" 2>&1
  Y=""; for norm in layernorm rmsnorm; do b=$([[ $norm == layernorm ]] && echo .bias)
    for c in t1024_r1_v8_gmem t512_r1_v8_c8_smem t1024_r1_v8_c4_smem t1024_r1_v8_c8_smem t256_r1_v8_c8_smem; do
      Y="$Y $norm.fwd_train.bf16.w_bf16.n262144$b.cfg_$c"; done
    for c in t1024_r1_v8_gmem t1024_r1_v8_c8_smem t512_r1_v8_c8_smem; do Y="$Y $norm.bwd.bf16.w_f32.n262144$b.cfg_$c"; done
  done
  build/normjit-bench --rows 4096 --json "$OUT/rows_262144.json" $Y > "$OUT/rows_262144.txt" 2>&1
  python3 bench/summary.py "$OUT/rows.json" "$OUT/rows_262144.json" | tee "$OUT/table_rows.md"
  grep -iE "error|fail|exceed" "$OUT"/rows*.txt | head
fi
if [[ ,$STAGE, == *,dbeta,* ]]; then
  # LayerNorm backward with dbeta past 18432: the dbeta sums in shared memory (one CTA, then
  # clusters) against the split route and other thread counts, pinned by cfg in one process.
  X=""; bw() { for c in "${@:2}"; do X="$X layernorm.bwd.bf16.w_f32.n$1.bias.cfg_$c"; done; }
  bw 20480 t864_r1_v8_smem t1024_r1_v8_smem t1024_r1_v8_gmem
  bw 24576 t1024_r1_v8_smem t768_r1_v8_smem t1024_r1_v8_gmem
  bw 28672 t896_r1_v8_smem t1024_r1_v8_gmem
  bw 40960 t1024_r1_v8_c2_smem t864_r1_v8_c2_smem t1024_r1_v8_gmem
  bw 49152 t1024_r1_v8_c2_smem t1024_r1_v8_gmem
  X="$X rmsnorm.bwd.bf16.w_f32.n40960.cfg_t1024_r1_v8_c2_smem rmsnorm.bwd.bf16.w_f32.n40960.cfg_t864_r1_v8_c2_smem"
  X="$X rmsnorm.bwd.bf16.w_f32.n40960.cfg_t640_r1_v8_c2_smem rmsnorm.bwd.bf16.w_f32.n40960.cfg_t1024_r1_v8_gmem"
  build/normjit-bench --rows 32768 --json "$OUT/dbeta.json" $X > "$OUT/dbeta.txt" 2>&1
  Y=""; for c in t1024_r1_v8_c4_smem t1024_r1_v8_gmem; do Y="$Y layernorm.bwd.bf16.w_f32.n98304.bias.cfg_$c"; done
  build/normjit-bench --rows 4096 --json "$OUT/dbeta_large.json" $Y > "$OUT/dbeta_large.txt" 2>&1
  python3 bench/summary.py "$OUT/dbeta.json" "$OUT/dbeta_large.json" | tee "$OUT/table_dbeta.md"
  grep -iE "error|fail|exceed" "$OUT"/dbeta*.txt | head
fi
if [[ ,$STAGE, == *,pipe,* ]]; then
  # Pipelined shared-memory rows (two buffers, cp.async of the next row) against the heuristic's
  # pick (no cfg) for the same spec, in one process. bf16 x; backward with fp32 weights.
  X=""; Y=""
  lb $LB.n3584.bias t224_r1_v8_pipe t448_r1_v8_pipe
  lb $LB.n7168.bias t448_r1_v8_pipe t896_r1_v8_pipe
  lb $LB.n12288.bias t768_r1_v8_pipe t512_r1_v8_pipe
  lb $LB.n16384.bias t1024_r1_v8_pipe t512_r1_v8_pipe
  lb $RB.n16384 t1024_r1_v8_pipe t512_r1_v8_pipe
  lb $LB.n18432.bias t768_r1_v8_pipe
  lb $LB.n20480.bias t640_r1_v8_c2_pipe
  lb $RB.n20480 t864_r1_v8_pipe t640_r1_v8_pipe
  lb $LB.n24576.bias t768_r1_v8_c2_pipe
  lb $LB.n28672.bias t896_r1_v8_c2_pipe
  lb $LB.n32768.bias t1024_r1_v8_c2_pipe
  lb $RB.n32768 t1024_r1_v8_c2_pipe
  lb $LB.n40960.bias t640_r1_v8_c4_pipe
  lb $RB.n40960 t1024_r1_v8_c2_pipe t640_r1_v8_c4_pipe
  lb $LB.n49152.bias t768_r1_v8_c4_pipe
  lb $RB.n49152 t768_r1_v8_c4_pipe
  lb $LB.n65536.bias t1024_r1_v8_c4_pipe
  lb $RB.n65536 t1024_r1_v8_c4_pipe
  lb $LF.n19456.bias t608_r1_v8_pipe
  lb $LF.n24576.bias t768_r1_v8_pipe
  lb $LF.n40960.bias t1024_r1_v8_pipe
  lb $RF.n40960 t1024_r1_v8_pipe
  lb $LF.n49152.bias t1024_r1_v8_pipe
  lb $RF.n49152 t1024_r1_v8_pipe
  lb $LF.n65536.bias t1024_r1_v8_c2_pipe
  lb $RF.n65536 t1024_r1_v8_c2_pipe
  lbl $LB.n98304.bias t768_r1_v8_c8_pipe
  lbl $RB.n98304 t768_r1_v8_c4_pipe
  lbl $LB.n131072.bias t1024_r1_v8_c8_pipe
  lbl $RB.n131072 t1024_r1_v8_c8_pipe
  lbl $LF.n98304.bias t768_r1_v8_c4_pipe
  lbl $RF.n98304 t768_r1_v8_c4_pipe
  lbl $LF.n131072.bias t1024_r1_v8_c4_pipe
  lbl $RF.n131072 t1024_r1_v8_c4_pipe
  lbl $LF.n262144.bias t1024_r1_v8_c8_pipe
  lbl $RF.n262144 t1024_r1_v8_c8_pipe
  run_ab pipe
fi
if [[ ,$STAGE, == *,pipe2,* ]]; then
  # After the cluster/pipelined store fix: pipelined rows against the heuristic's pick at the
  # sizes still below goal, and forward clusters in shared memory at 65536/98304.
  X=""; Y=""
  lb $LB.n2048.bias t128_r1_v8_pipe
  lb $LB.n2880.bias t192_r1_v8_pipe
  lb $LB.n3584.bias t224_r1_v8_pipe
  lb $LB.n4096.bias t256_r1_v8_pipe
  lb $LB.n5120.bias t320_r1_v8_pipe
  lb $LB.n7168.bias t448_r1_v8_pipe
  lb $LB.n8192.bias t512_r1_v8_pipe
  lb $LB.n10240.bias t640_r1_v8_pipe
  lb $RB.n4096 t256_r1_v8_pipe
  lb $RB.n8192 t512_r1_v8_pipe
  lb $RB.n10240 t640_r1_v8_pipe
  lb $LB.n16384.bias t1024_r1_v8_pipe
  lb $LB.n24576.bias t768_r1_v8_c2_pipe
  lb $LB.n28672.bias t896_r1_v8_c2_pipe
  lb $LB.n32768.bias t1024_r1_v8_c2_pipe
  lb $RB.n32768 t1024_r1_v8_c2_pipe
  lb $LB.n40960.bias t640_r1_v8_c4_pipe
  lb $RB.n40960 t1024_r1_v8_c2_pipe
  lb $LB.n49152.bias t768_r1_v8_c4_pipe
  lb $RB.n49152 t768_r1_v8_c4_pipe
  lb $LB.n65536.bias t1024_r1_v8_c4_pipe
  lb $RB.n65536 t1024_r1_v8_c4_pipe
  lb $LF.n40960.bias t1024_r1_v8_pipe
  lb $RF.n40960 t1024_r1_v8_pipe
  lb $LF.n49152.bias t1024_r1_v8_pipe
  lb $RF.n49152 t1024_r1_v8_pipe
  lb $LF.n65536.bias t512_r1_v8_c4_smem t1024_r1_v8_c2_smem t512_r1_v8_c4_pipe
  lb $RF.n65536 t512_r1_v8_c4_smem t1024_r1_v8_c2_smem
  lbl $LF.n98304.bias t384_r1_v8_c4_smem t768_r1_v8_c2_smem
  lbl $RF.n98304 t384_r1_v8_c4_smem t768_r1_v8_c2_smem
  lbl $LB.n98304.bias t768_r1_v8_c8_pipe
  lbl $RB.n98304 t1024_r1_v8_c4_pipe
  lbl $LB.n131072.bias t1024_r1_v8_c8_pipe
  lbl $RB.n131072 t1024_r1_v8_c8_pipe
  lbl $LB.n262144.bias
  lbl $RB.n262144
  lbl $LF.n262144.bias
  lbl $RF.n262144
  run_ab pipe2
fi
if [[ ,$STAGE, == *,stages,* ]]; then
  # Deeper pipelined rows (pipe3 / pipe4: 3-4 row buffers) and smaller CTAs per cluster against
  # the heuristic's pick, pinned by cfg in one process; forward N = 256 row shapes (QuACK leads).
  X=""; Y=""
  lb $LF.n256.bias t16_r16_v8_reg t8_r32_v8_reg t32_r16_v8_reg t16_r8_v8_reg
  lb $RF.n256 t16_r16_v8_reg t8_r32_v8_reg t32_r16_v8_reg
  lb $LF.n24576.bias t768_r1_v8_pipe3
  lb $LF.n28672.bias t896_r1_v8_pipe3
  lb $LF.n32768.bias t512_r1_v8_c2_pipe3 t1024_r1_v8_pipe3
  lb $LF.n40960.bias t512_r1_v8_c2_pipe3 t256_r1_v8_c4_pipe4 t640_r1_v8_c2_pipe3
  lb $LF.n49152.bias t768_r1_v8_c2_pipe3 t384_r1_v8_c4_pipe4
  lb $LF.n57344.bias t448_r1_v8_c4_pipe4 t896_r1_v8_c2_pipe3
  lb $LF.n65536.bias t256_r1_v8_c4_pipe4 t256_r1_v8_c4_pipe3 t512_r1_v8_c4_pipe3 t512_r1_v8_c2_pipe3 t256_r1_v8_c8_pipe4 t1024_r1_v8_c4_pipe4
  lb $RF.n65536 t256_r1_v8_c4_pipe4 t512_r1_v8_c4_pipe3 t512_r1_v8_c2_pipe3
  lb $LB.n12288.bias t384_r1_v8_c2_pipe3 t768_r1_v8_pipe3
  lb $LB.n16384.bias t512_r1_v8_c2_pipe3 t512_r1_v8_c2_pipe4
  lb $RB.n16384 t512_r1_v8_c2_pipe3 t256_r1_v8_c2_pipe4
  lb $LB.n20480.bias t640_r1_v8_c2_pipe3 t320_r1_v8_c4_pipe4
  lb $RB.n20480 t640_r1_v8_c2_pipe3
  lb $LB.n24576.bias t768_r1_v8_c2_pipe3
  lb $LB.n28672.bias t896_r1_v8_c2_pipe3
  lb $LB.n32768.bias t1024_r1_v8_c2_pipe3 t512_r1_v8_c4_pipe3
  lb $LB.n40960.bias t640_r1_v8_c4_pipe3
  lb $LB.n49152.bias t768_r1_v8_c4_pipe3
  lb $RB.n49152 t768_r1_v8_c4_pipe3
  lb $LB.n65536.bias t1024_r1_v8_c4_pipe3
  lb $RB.n65536 t1024_r1_v8_c4_pipe3
  lbl $LF.n98304.bias t384_r1_v8_c8_pipe4 t768_r1_v8_c4_pipe3
  lbl $LF.n131072.bias t512_r1_v8_c8_pipe4 t256_r1_v8_c8_pipe4 t1024_r1_v8_c4_pipe3
  lbl $RF.n131072 t512_r1_v8_c8_pipe4
  lbl $LF.n262144.bias t512_r1_v8_c8_pipe3 t1024_r1_v8_c8_pipe3
  lbl $LB.n81920.bias t640_r1_v8_c8_pipe3
  lbl $LB.n98304.bias t768_r1_v8_c8_pipe3
  lbl $LB.n131072.bias t1024_r1_v8_c8_pipe3
  lbl $RB.n131072 t1024_r1_v8_c8_pipe3
  run_ab stages
fi
if [[ ,$STAGE, == *,held,* ]]; then
  # Pipelined forward rows of at most 512 threads now hold gamma / beta in registers (loaded once
  # per CTA) instead of reading them per row: clusters of such CTAs against the heuristic's pick.
  X=""; Y=""
  lb $LF.n19456.bias t160_r1_v8_c4_pipe
  lb $LF.n24576.bias t384_r1_v8_c2_pipe
  lb $LF.n28672.bias t448_r1_v8_c2_pipe
  lb $LF.n32768.bias t512_r1_v8_c2_pipe
  lb $LF.n40960.bias t320_r1_v8_c4_pipe
  lb $RF.n40960 t320_r1_v8_c4_pipe
  lb $LF.n49152.bias t384_r1_v8_c4_pipe
  lb $RF.n49152 t384_r1_v8_c4_pipe
  lb $LF.n57344.bias t448_r1_v8_c4_pipe
  lb $LF.n65536.bias t512_r1_v8_c4_pipe t256_r1_v8_c8_pipe t512_r1_v8_c4_pipe3
  lb $RF.n65536 t512_r1_v8_c4_pipe t256_r1_v8_c8_pipe
  lbl $LF.n98304.bias t384_r1_v8_c8_pipe
  lbl $LF.n131072.bias t512_r1_v8_c8_pipe
  lbl $RF.n131072 t512_r1_v8_c8_pipe
  run_ab held
fi
# A/B of a launch switch: `launch_ab VAR NAME LABEL` benches the backward at M = 32768 and the
# launch-bound shapes under CUDA-graph replay with VAR=1 (default) and VAR=0 (LABEL "plain"),
# alternating processes, two rounds, and tabulates NAME1 against NAME0.
launch_ab() {
  local var=$1 name=$2 label=$3
  local B="" G="layernorm.bwd.f16.n768.bias layernorm.bwd.bf16.n768.bias rmsnorm.bwd.f16.n128 rmsnorm.bwd.bf16.n128"
  for n in 256 1024 2048 4096 7168 16384; do B="$B $LB.n$n.bias $RB.n$n"; done
  for round in 1 2; do for mode in 1 0; do
    env "$var=$mode" build/normjit-bench --rows 32768 --json "$OUT/$name${mode}_r$round.json" $B > "$OUT/$name${mode}_r$round.txt" 2>&1
    env "$var=$mode" build/normjit-bench --graph --rows 4096 --json "$OUT/$name${mode}_graph_r$round.json" $G 2>&1 \
      | tee "$OUT/$name${mode}_graph_r$round.txt" | grep -E "bwd" | sed "s/^/mode=$mode round=$round /"
  done; done
  python3 bench/ab_rounds.py "$label" plain "$OUT"/${name}1_r{1,2}.json "$OUT"/${name}0_r{1,2}.json | tee "$OUT/table_$name.md"
  grep -iE "error|fail|exceed" "$OUT"/$name*.txt | head
}
# The backward's reduction (and the split route's column tiles) as programmatic dependents of the
# kernel before, against plain launches.
[[ ,$STAGE, == *,pdl,* ]] && launch_ab NORMJIT_DEPENDENT_LAUNCH pdl "dependent launch"
# The backward's first kernel as a programmatic dependent of the stream's previous kernel.
[[ ,$STAGE, == *,pdlfirst,* ]] && launch_ab NORMJIT_BWD_FIRST_DEPENDENT pdlfirst "first kernel dependent"
if [[ ,$STAGE, == *,tma,* ]]; then
  # Pipelined rows filled by bulk copies (tma) against the heuristic's pick at the sizes where it
  # is a pipelined or shared-memory row, forward (LN 57344-65536) and backward; same process.
  X=""; Y=""
  lb $LB.n4096.bias t256_r1_v8_tma t256_r1_v8_tma3; lb $LB.n7168.bias t448_r1_v8_tma
  lb $LB.n12288.bias t768_r1_v8_tma t384_r1_v8_tma; lb $LB.n16384.bias t1024_r1_v8_tma t512_r1_v8_tma
  lb $LB.n18432.bias t768_r1_v8_tma t576_r1_v8_tma; lb $LB.n28672.bias t896_r1_v8_c2_tma
  lb $LB.n32768.bias t1024_r1_v8_c2_tma; lb $LB.n40960.bias t640_r1_v8_c4_tma
  lb $RB.n4096 t256_r1_v8_tma t512_r1_v8_tma; lb $RB.n7168 t448_r1_v8_tma
  lb $RB.n16384 t512_r1_v8_tma t1024_r1_v8_tma; lb $RB.n24576 t768_r1_v8_tma
  lb $RB.n32768 t1024_r1_v8_c2_tma t512_r1_v8_c2_tma; lb $LF.n49152.bias t1024_r1_v8_tma
  lbl $LB.n61440.bias t1024_r1_v8_c4_tma; lbl $RB.n61440 t1024_r1_v8_c4_tma
  lbl $LF.n57344.bias t448_r1_v8_c2_tma; lbl $LF.n65536.bias t512_r1_v8_c2_tma t256_r1_v8_c4_tma t256_r1_v8_c4_tma3
  lbl $RF.n65536 t256_r1_v8_c4_tma
  run_ab tma
fi
if [[ ,$STAGE, == *,tma2,* ]]; then
  # Bulk-copied rows with 3-4 buffers (call 1: two buffers were one row of lead too little).
  X=""; Y=""
  lb $LB.n4096.bias t256_r1_v8_pipe t256_r1_v8_tma3 t256_r1_v8_tma4 t128_r1_v8_tma3 t128_r1_v8_tma4 t512_r1_v8_tma3
  lb $LB.n7168.bias t448_r1_v8_tma t448_r1_v8_tma3 t448_r1_v8_tma4 t224_r1_v8_tma3
  lb $LB.n12288.bias t768_r1_v8_tma3 t384_r1_v8_tma3; lb $LB.n16384.bias t1024_r1_v8_tma3
  lb $LB.n18432.bias t768_r1_v8_tma3; lb $LB.n20480.bias t640_r1_v8_c2_tma t640_r1_v8_c2_tma3
  lb $LB.n24576.bias t768_r1_v8_c2_tma t512_r1_v8_c2_tma3; lb $LB.n28672.bias t896_r1_v8_c2_tma t896_r1_v8_c2_tma3
  lb $LB.n32768.bias t1024_r1_v8_c2_tma t1024_r1_v8_c2_tma3
  lb $LB.n40960.bias t1024_r1_v8_c4_tma t640_r1_v8_c4_tma3; lb $LB.n49152.bias t768_r1_v8_c4_tma t768_r1_v8_c4_tma3
  lb $RB.n4096 t256_r1_v8_tma3 t256_r1_v8_tma4 t128_r1_v8_tma4; lb $RB.n7168 t448_r1_v8_tma3
  lb $RB.n16384 t512_r1_v8_tma3 t1024_r1_v8_tma3; lb $RB.n24576 t768_r1_v8_c2_tma t384_r1_v8_c2_tma3
  lb $RB.n32768 t1024_r1_v8_c2_tma t1024_r1_v8_c2_tma3; lb $RB.n40960 t1024_r1_v8_c2_tma; lb $RB.n49152 t1024_r1_v8_c2_tma
  lbl $LB.n61440.bias t1024_r1_v8_c4_tma3; lbl $RB.n61440 t1024_r1_v8_c4_tma3
  lbl $LB.n65536.bias t1024_r1_v8_c4_tma t1024_r1_v8_c4_tma3; lbl $RB.n65536 t1024_r1_v8_c4_tma3
  lbl $LF.n65536.bias t512_r1_v8_c4_tma t256_r1_v8_c8_tma
  run_ab tma2
fi
if [[ ,$STAGE, == *,tmasweep,* ]]; then
  # Backward, M = 32768, N = 2048-49152: each pick against its bulk-copy twin (one CTA: 3 buffers
  # at the same threads; clusters: 2 buffers; one-CTA smem rows also a 2-CTA tma row of 2 packs
  # per thread). Generated from the heuristic's picks (session 9).
  X=""; Y=""
  lb $LB.n1024.bias t64_r1_v8_tma3 t128_r1_v8_tma3; lb $RB.n1024 t64_r1_v8_tma3 t128_r1_v8_tma3
  lb $LB.n2048.bias t128_r1_v8_tma3 t256_r1_v8_tma3
  lb $LB.n2880.bias t192_r1_v8_tma3
  lb $LB.n3072.bias t192_r1_v8_tma3
  lb $LB.n3584.bias t224_r1_v8_tma3
  lb $LB.n4096.bias t256_r1_v8_tma3
  lb $LB.n5120.bias t320_r1_v8_tma3
  lb $LB.n6144.bias t384_r1_v8_tma3
  lb $LB.n7168.bias t448_r1_v8_tma3
  lb $LB.n8192.bias t512_r1_v8_tma3
  lb $LB.n10240.bias t640_r1_v8_tma3
  lb $LB.n12288.bias t768_r1_v8_tma3 t384_r1_v8_c2_tma
  lb $LB.n14336.bias t896_r1_v8_tma3 t448_r1_v8_c2_tma
  lb $LB.n16384.bias t1024_r1_v8_tma3
  lb $LB.n18432.bias t768_r1_v8_tma3 t576_r1_v8_c2_tma
  lb $LB.n20480.bias t640_r1_v8_c2_tma
  lb $LB.n24576.bias t768_r1_v8_c2_tma
  lb $LB.n26624.bias t832_r1_v8_c2_tma
  lb $LB.n28672.bias t896_r1_v8_c2_tma
  lb $LB.n30720.bias t1024_r1_v8_c2_tma
  lb $LB.n32768.bias t1024_r1_v8_c2_tma
  lb $LB.n36864.bias t1024_r1_v8_c2_tma
  lb $RB.n2048 t128_r1_v8_tma3 t256_r1_v8_tma3
  lb $RB.n2880 t192_r1_v8_tma3
  lb $RB.n3072 t192_r1_v8_tma3
  lb $RB.n3584 t224_r1_v8_tma3
  lb $RB.n4096 t256_r1_v8_tma3
  lb $RB.n5120 t320_r1_v8_tma3
  lb $RB.n6144 t384_r1_v8_tma3
  lb $RB.n7168 t448_r1_v8_tma3
  lb $RB.n8192 t512_r1_v8_tma3
  lb $RB.n10240 t640_r1_v8_tma3
  lb $RB.n12288 t768_r1_v8_tma3
  lb $RB.n14336 t448_r1_v8_tma3 t448_r1_v8_c2_tma
  lb $RB.n16384 t512_r1_v8_tma3 t512_r1_v8_c2_tma
  lb $RB.n18432 t768_r1_v8_tma3 t576_r1_v8_c2_tma
  lb $RB.n20480 t640_r1_v8_c2_tma
  lb $RB.n24576 t768_r1_v8_c2_tma
  lb $RB.n26624 t832_r1_v8_c2_tma
  lb $RB.n28672 t896_r1_v8_c2_tma
  lb $RB.n30720 t960_r1_v8_c2_tma
  lb $RB.n32768 t1024_r1_v8_c2_tma
  lb $RB.n36864 t1024_r1_v8_c2_tma
  lb $RB.n40960 t1024_r1_v8_c2_tma
  lb $RB.n45056 t1024_r1_v8_c2_tma
  lb $RB.n49152 t1024_r1_v8_c2_tma
  run_ab tmasweep
fi
if [[ ,$STAGE, == *,gap,* ]]; then
  # RMS bwd against cuDNN: per-kernel durations with clocks and caches left as the bench has them
  # (ncu --clock-control none --cache-control none), next to each provider's bench median.
  bash scripts/peers_setup.sh >"$OUT/peers_setup.log" 2>&1; export PYTHONPATH=$PWD/.peers/site
  M="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size"
  for n in ${GAP_NS:-4096 8192}; do
    timeout 150 ncu --csv --clock-control none --cache-control none --metrics $M -k regex:ln_ -c 40 \
      python3 bench/peers.py --providers cudnn --phase bwd --norms rmsnorm --ns $n --json /tmp/p.json \
      > "$OUT/ncu_gap_cudnn_$n.csv" 2>&1
    timeout 100 ncu --csv --clock-control none --cache-control none --metrics $M -k regex:normjit_.*bwd -c 40 \
      build/normjit-bench --rows 32768 --no-verify --warmup 1 --reps 2 --batch 10 $RB.n$n \
      > "$OUT/ncu_gap_normjit_$n.csv" 2>&1
  done
  python3 bench/ncu_table.py "$OUT"/ncu_gap_*.csv | tee "$OUT/table_gap.md"
fi
if [[ ,$STAGE, == *,gapfull,* ]]; then
  # One launch of each main kernel (RMS bwd 4096: cuDNN's and normjit's) under ncu's full set,
  # clocks and caches as the bench has them, for stall reasons and memory behaviour.
  bash scripts/peers_setup.sh >"$OUT/peers_setup.log" 2>&1; export PYTHONPATH=$PWD/.peers/site
  timeout 200 ncu --set full --clock-control none --cache-control none -k regex:ln_tma_bwd -s 3 -c 1 \
    python3 bench/peers.py --providers cudnn --phase bwd --norms rmsnorm --ns 4096 --json /tmp/p.json \
    > "$OUT/ncu_full_cudnn_4096.txt" 2>&1
  timeout 200 ncu --set full --clock-control none --cache-control none -k regex:normjit_.*fused -s 3 -c 1 \
    build/normjit-bench --rows 32768 --no-verify --warmup 1 --reps 1 --batch 4 $RB.n4096 \
    > "$OUT/ncu_full_normjit_4096.txt" 2>&1
  X=""; Y=""
  lb $RB.n4096 t512_r1_v8_tma3 t512_r1_v8_tma4 t1024_r1_v8_tma4 t256_r1_v8_tma4 t128_r1_v8_tma3
  lb $RB.n8192 t1024_r1_v8_tma3 t1024_r1_v8_tma4 t256_r1_v8_tma3
  run_ab gapcfg
fi
if [[ ,$STAGE, == *,heldgamma,* ]]; then
  # Backward shared-memory rows with gamma held in registers (default) against reloading it per
  # pass (-DNORMJIT_BWD_NO_HELD_GAMMA), alternating processes, two rounds, M = 32768.
  B="$RB.n4096 $RB.n8192"; for n in 3584 4096 6144 7168 8192; do B="$B $LB.n$n.bias"; done
  for round in 1 2; do for mode in held reload; do
    ( [[ $mode == reload ]] && export NORMJIT_NVRTC_EXTRA_OPTIONS=-DNORMJIT_BWD_NO_HELD_GAMMA
      build/normjit-bench --rows 32768 --json "$OUT/gamma_${mode}_r$round.json" $B > "$OUT/gamma_${mode}_r$round.txt" 2>&1 )
  done; done
  python3 bench/ab_rounds.py "gamma held" "gamma reloaded" "$OUT"/gamma_held_r{1,2}.json "$OUT"/gamma_reload_r{1,2}.json | tee "$OUT/table_heldgamma.md"
  grep -iE "error|fail|exceed" "$OUT"/gamma_*.txt | head
fi
if [[ ,$STAGE, == *,firstget,* ]]; then
  # Fresh processes: where the first kernel's disk-cache hit spends its time (issue: autotuning,
  # <= 0.5 ms per kernel). A step-by-step probe, then normjit-bench's own split, lazy and eager.
  # FG_DIRS: cache folders to compare (e.g. one on tmpfs: is the image's time the filesystem's?).
  FS="$LF.n4096.bias $RF.n4096 $LB.n4096.bias $RB.n4096 $LF.n768.bias $RF.n768 $LB.n768.bias $RB.n768"
  FS="$FS $LF.n12288.bias $RF.n12288 $LB.n12288.bias $RB.n12288 $LF.n1024.bias $RF.n1024 $LB.n1024.bias $RB.n1024"
  g++ -O2 -std=c++17 -Iinclude -I/usr/local/cuda/include bench/first_get_probe.cpp -Lbuild -lnormjit \
    -L/usr/local/cuda/lib64/stubs -lcuda -Wl,-rpath,$PWD/build -o /tmp/firstprobe 2>&1 | tail -3
  for dir in ${FG_DIRS:-/tmp/fgcache}; do
    tag=$(basename "$(dirname "$dir")")
    build/normjit-precompile -q --cache-dir "$dir" -j 16 -- $FS 2>&1 | tail -1
    for mode in ${FG_MODES:-LAZY EAGER}; do for i in 1 2 3; do
      echo "== probe $dir $mode $i"; CUDA_MODULE_LOADING=$mode /tmp/firstprobe "$dir" $FS 2>&1 | head -8
    done; done > "$OUT/firstget_probe_$tag.txt"
    for mode in ${FG_MODES:-LAZY EAGER}; do for i in 1 2 3 4; do
      CUDA_MODULE_LOADING=$mode build/normjit-bench --no-verify --reps 1 --warmup 0 --rows 4096 --cache-dir "$dir" \
        --json "$OUT/firstget_${tag}_${mode}_$i.json" $FS > /dev/null 2>&1
    done; echo "== bench $dir $mode"; python3 bench/load_stats.py "$OUT"/firstget_${tag}_${mode}_*.json; done | tee -a "$OUT/table_firstget.md"
    head -30 "$OUT/firstget_probe_$tag.txt"
  done
fi
if [[ ,$STAGE, == *,h200tma,* ]]; then
  # H200 (session 9): bulk-copied rows with 2-3 buffers against the H100-measured picks at the
  # sizes past 8192, where the picks run at 62-89 % of copy; same process, M = 32768.
  X=""; Y=""
  lb $LF.n12288.bias t384_r1_v8_tma3 t768_r1_v8_tma3; lb $LF.n24576.bias t768_r1_v8_tma3 t384_r1_v8_tma3 t768_r1_v8_pipe
  lb $LF.n32768.bias t1024_r1_v8_tma3 t512_r1_v8_tma3; lb $LF.n49152.bias t1024_r1_v8_tma t768_r1_v8_tma
  lb $LF.n65536.bias t512_r1_v8_c2_tma3; lb $RF.n24576 t768_r1_v8_tma3; lb $RF.n32768 t1024_r1_v8_tma3
  lb $LB.n12288.bias t768_r1_v8_tma3 t384_r1_v8_c2_tma; lb $LB.n16384.bias t1024_r1_v8_tma t1024_r1_v8_tma3
  lb $LB.n24576.bias t768_r1_v8_c2_tma3 t384_r1_v8_c4_tma
  lb $LB.n32768.bias t1024_r1_v8_c2_tma t1024_r1_v8_c2_tma3 t512_r1_v8_c4_tma3
  lb $RB.n16384 t512_r1_v8_tma3 t1024_r1_v8_tma3 t512_r1_v8_c2_tma
  lb $RB.n32768 t1024_r1_v8_c2_tma t1024_r1_v8_c2_tma3 t512_r1_v8_c2_tma3
  run_ab h200tma
fi
if [[ ,$STAGE, == *,c16,* ]]; then
  # Session 10: 16-CTA (non-portable) clusters against the picks before them (the split route, or
  # 8 CTAs), M = 4096, pinned by cfg in one process.
  X=""; Y=""
  lbl $LB.n262144.bias t1024_r1_v8_c16_smem t1024_r1_v8_c16_tma t1024_r1_v8_gmem
  lbl $RB.n262144 t1024_r1_v8_c16_pipe t1024_r1_v8_c16_smem t1024_r1_v8_c16_tma
  lbl $LB.n204800.bias t1024_r1_v8_c16_smem t1024_r1_v8_gmem
  lbl $RB.n204800 t1024_r1_v8_gmem
  lbl $LB.n131072.bias t512_r1_v8_c16_pipe t512_r1_v8_c16_tma t1024_r1_v8_c16_smem
  lbl $RB.n131072 t512_r1_v8_c16_pipe t1024_r1_v8_c16_smem
  run_ab c16
fi
# The backward's reduction with 8 slots' loads in flight per lane (default) against 4
# (-DNORMJIT_BWD_REDUCE_UNROLL4): launch-bound shapes under graph replay and M = 32768.
if [[ ,$STAGE, == *,reduce,* ]]; then
  B="" G="layernorm.bwd.f16.n768.bias layernorm.bwd.bf16.n768.bias rmsnorm.bwd.f16.n128 rmsnorm.bwd.bf16.n128"
  for n in 256 1024 4096 16384; do B="$B $LB.n$n.bias $RB.n$n"; done
  for round in 1 2; do for mode in 1 0; do
    opt=$([[ $mode == 0 ]] && echo "-DNORMJIT_BWD_REDUCE_UNROLL4")
    NORMJIT_NVRTC_EXTRA_OPTIONS="$opt" build/normjit-bench --rows 32768 --json "$OUT/reduce${mode}_r$round.json" $B > "$OUT/reduce${mode}_r$round.txt" 2>&1
    NORMJIT_NVRTC_EXTRA_OPTIONS="$opt" build/normjit-bench --graph --rows 4096 --json "$OUT/reduce${mode}_graph_r$round.json" $G 2>&1 \
      | tee "$OUT/reduce${mode}_graph_r$round.txt" | grep -E "bwd" | sed "s/^/mode=$mode round=$round /"
  done; done
  python3 bench/ab_rounds.py "unroll 8" "unroll 4" "$OUT"/reduce1_r{1,2}.json "$OUT"/reduce0_r{1,2}.json | tee "$OUT/table_reduce.md"
  grep -iE "error|fail|exceed" "$OUT"/reduce*.txt | head
fi
if [[ ,$STAGE, == *,c16b,* ]]; then
  # 16-CTA rows by bulk copies (the pick) against the split route, ragged and whole.
  X=""; Y=""
  lbl $LB.n204800.bias t1024_r1_v8_c16_pipe t1024_r1_v8_gmem
  lbl $RB.n204800 t1024_r1_v8_c16_pipe t1024_r1_v8_gmem
  lbl $LB.n262144.bias t1024_r1_v8_gmem
  run_ab c16b
fi
if [[ ,$STAGE, == *,csum2,* ]]; then
  # Clustered rows: the cluster sum gathered by one lane per CTA and shuffled against every thread
  # reading every CTA's slot (-DNORMJIT_CLUSTER_SUM_PER_THREAD). Session 10, call 2; the gathered
  # sum measured slower and was reverted, so both arms now build the same kernels.
  X=""; Y=""
  for n in 32768 40960 49152 61440 65536; do X="$X $LB.n$n.bias $RB.n$n"; done
  X="$X $LF.n65536.bias.cfg_t512_r1_v8_c4_smem $RF.n65536.cfg_t512_r1_v8_c4_pipe"
  for n in 81920 98304 131072 262144; do Y="$Y $LF.n$n.bias $RF.n$n $LB.n$n.bias $RB.n$n"; done
  macro_ab csum2 "" -DNORMJIT_CLUSTER_SUM_PER_THREAD warp-gathered per-thread
fi
if [[ ,$STAGE, == *,l1,* ]]; then
  # Row tensors (x, dy) read past L1 (-DNORMJIT_ROW_L1_NO_ALLOCATE) against plain loads. Session
  # 10, call 5; measured slower and reverted, so both arms now build the same kernels.
  X=""; Y=""
  for n in 16384 24576 32768 49152 57344 65536; do X="$X $LF.n$n.bias $RF.n$n"; done
  for n in 1024 12288 20480; do X="$X $LB.n$n.bias $RB.n$n"; done
  X="$X $RB.n6144"; Y="$LF.n131072.bias $RF.n131072"
  macro_ab l1 -DNORMJIT_ROW_L1_NO_ALLOCATE "" "past L1" plain
fi
if [[ ,$STAGE, == *,slots,* ]]; then
  # Fewer partial rows for small multi-row CTAs (default) against one CTA per row block up to the
  # resident count (NORMJIT_BWD_PARTIAL_CAP=0), alternating processes, two rounds: the
  # launch-bound shapes under CUDA-graph replay (each next to an M·N copy and a copy of its own
  # bytes), and M = 4096 at small N.
  G="layernorm.bwd.f16.n768.bias layernorm.bwd.bf16.n768.bias rmsnorm.bwd.f16.n128 rmsnorm.bwd.bf16.n128"
  G="$G layernorm.fwd_train.f16.n768.bias layernorm.fwd_train.bf16.n768.bias rmsnorm.fwd_train.f16.n128 rmsnorm.fwd_train.bf16.n128"
  B=""; for n in 256 512 768 1024 2048; do B="$B $LB.n$n.bias $RB.n$n layernorm.bwd.f16.n$n.bias"; done
  for round in 1 2; do for mode in cap nocap; do
    ( [[ $mode == nocap ]] && export NORMJIT_BWD_PARTIAL_CAP=0
      build/normjit-bench --graph --rows 4096 --json "$OUT/slots_${mode}_graph_r$round.json" $G 2>&1 \
        | tee "$OUT/slots_${mode}_graph_r$round.txt" | grep -E "bwd|fwd" | sed "s/^/$mode round=$round /"
      build/normjit-bench --rows 4096 --json "$OUT/slots_${mode}_r$round.json" $B > "$OUT/slots_${mode}_r$round.txt" 2>&1 )
  done; done
  python3 bench/ab_rounds.py "capped partials" "one CTA per row block" "$OUT"/slots_cap_r{1,2}.json "$OUT"/slots_nocap_r{1,2}.json | tee "$OUT/table_slots.md"
  grep -iE "error|fail|exceed" "$OUT"/slots*.txt | head
fi
if [[ ,$STAGE, == *,csum,* ]]; then
  # Clustered rows: the row-sum exchange released by its one writer (default) against a release
  # arrive by every thread (-DNORMJIT_CLUSTER_RELEASE_ALL), alternating processes, two rounds.
  X=""; Y=""
  for n in 32768 40960 57344 65536; do X="$X $LB.n$n.bias"; done
  for n in 40960 49152 57344 65536; do X="$X $RB.n$n"; done
  X="$X $LF.n57344.bias $RF.n57344"
  X="$X $LF.n65536.bias.cfg_t512_r1_v8_c4_pipe $LF.n65536.bias.cfg_t512_r1_v8_c4_smem $LF.n65536.bias.cfg_t256_r1_v8_c4_pipe4"
  X="$X $RF.n65536.cfg_t512_r1_v8_c4_pipe $LF.n40960.bias.cfg_t320_r1_v8_c4_pipe $LF.n49152.bias.cfg_t512_r1_v8_c2_smem"
  X="$X $LB.n16384.bias.cfg_t512_r1_v8_c2_pipe3 $LB.n16384.bias.cfg_t512_r1_v8_c2_pipe $LB.n20480.bias.cfg_t640_r1_v8_c2_pipe3"
  X="$X $LB.n28672.bias.cfg_t896_r1_v8_c2_pipe $RB.n16384.cfg_t512_r1_v8_c2_pipe3"
  for n in 81920 98304 131072 262144; do Y="$Y $LF.n$n.bias $RF.n$n $LB.n$n.bias $RB.n$n"; done
  macro_ab csum "" -DNORMJIT_CLUSTER_RELEASE_ALL writer-released all-released
fi
if [[ ,$STAGE, == *,clusters2,* ]]; then
  # After the writer-released cluster sums: 2-8-CTA pipelined rows of two packs per thread
  # against the heuristic's pick, pinned by cfg in one process.
  X=""; Y=""
  lb $LB.n12288.bias t384_r1_v8_c2_pipe
  lb $LB.n18432.bias t576_r1_v8_c2_pipe
  lb $LB.n20480.bias t640_r1_v8_c2_pipe
  lb $RB.n20480 t640_r1_v8_c2_pipe
  lb $LB.n24576.bias t768_r1_v8_c2_pipe
  lb $LB.n28672.bias t896_r1_v8_c2_pipe
  lb $RB.n28672 t896_r1_v8_c2_pipe
  lb $LB.n40960.bias t640_r1_v8_c4_pipe
  lb $LB.n49152.bias t768_r1_v8_c4_pipe
  lb $RB.n49152 t768_r1_v8_c4_pipe
  lb $LF.n40960.bias t640_r1_v8_c2_smem
  lb $LF.n65536.bias t1024_r1_v8_c2_smem t1024_r1_v8_c2_pipe t512_r1_v8_c4_smem
  lbl $RB.n81920 t640_r1_v8_c8_pipe
  lbl $LB.n98304.bias t768_r1_v8_c8_pipe
  lbl $RB.n98304 t768_r1_v8_c8_pipe
  lbl $RB.n131072 t1024_r1_v8_c8_pipe
  run_ab clusters2
fi
if [[ ,$STAGE, == *,fwd2,* ]]; then
  # LayerNorm forward at 17408-20480: two CTAs per SM (512-thread register rows, or 544-576-thread
  # shared-memory rows) against the one-CTA register rows the heuristic took before.
  X=""; for n in 17408 18432 19456 20480; do t=$(( ((n / 8 + 3) / 4 + 31) / 32 * 32 ))
    X="$X layernorm.fwd_train.bf16.w_bf16.n$n.bias layernorm.fwd_train.bf16.w_bf16.n$n.bias.cfg_t${t}_r1_v8_reg"; done
  for n in 19456 20480; do X="$X rmsnorm.fwd_train.bf16.w_bf16.n$n rmsnorm.fwd_train.bf16.w_bf16.n$n.cfg_t$((n / 32))_r1_v8_reg"; done
  build/normjit-bench --rows 32768 --json "$OUT/fwd2.json" $X > "$OUT/fwd2.txt" 2>&1
  python3 bench/summary.py "$OUT/fwd2.json" | tee "$OUT/table_fwd2.md"
  grep -iE "error|fail|exceed" "$OUT"/fwd2.txt | head
fi
if [[ ,$STAGE, == *,rows2,* ]]; then
  # LayerNorm forward CTA rows: registers against shared memory; forward 40960/49152 in shared memory.
  X=""; for n in 13312 14336 16384 18432 20480 24576; do t=$(( (n / 8 + 3) / 4 )); t=$(( (t + 31) / 32 * 32 ))
    X="$X layernorm.fwd_train.bf16.w_bf16.n$n.bias.cfg_t${t}_r1_v8_reg layernorm.fwd_train.bf16.w_bf16.n$n.bias.cfg_t${t}_r1_v8_smem"; done
  for n in 40960 49152; do X="$X layernorm.fwd_train.bf16.w_bf16.n$n.bias.cfg_t1024_r1_v8_smem rmsnorm.fwd_train.bf16.w_bf16.n$n.cfg_t1024_r1_v8_smem"; done
  build/normjit-bench --rows 32768 --json "$OUT/rows2.json" $X > "$OUT/rows2.txt" 2>&1
  python3 bench/summary.py "$OUT/rows2.json" | tee "$OUT/table_rows2.md"
fi
if [[ ,$STAGE, == *,explore,* ]]; then
  # Block-config A/B in one process (cfg pinned), then ncu stall reasons for clustered vs one-CTA rows.
  X=""
  for norm in layernorm rmsnorm; do
    b=$([[ $norm == layernorm ]] && echo .bias)
    for c in t512_r1_v8_c2 t256_r1_v8_c2 t256_r1_v8_c4 t128_r1_v8_c4 t128_r1_v8_c8 t1024_r1_v8; do
      X="$X $norm.fwd_train.bf16.w_bf16.n32768$b.cfg_${c}_reg"; done
    for c in t288_r1_v8_c2_reg t576_r1_v8_reg t160_r1_v8_c2_reg t288_r1_v8_c4_reg t256_r1_v8_c2_reg; do
      X="$X $norm.fwd_train.bf16.w_bf16.n18432$b.cfg_$c"; done
    for c in t512_r1_v8_c4_reg t256_r1_v8_c8_reg t1024_r1_v8_gmem; do
      X="$X $norm.fwd_train.bf16.w_bf16.n65536$b.cfg_$c"; done
    for c in t512_r1_v8_c2_reg t256_r1_v8_c4_reg t1024_r1_v8_gmem; do X="$X $norm.bwd.bf16.w_f32.n16384$b.cfg_$c"; done
    for c in t384_r1_v8_c2_reg t1024_r1_v8_gmem; do X="$X $norm.bwd.bf16.w_f32.n12288$b.cfg_$c"; done
    for n in 768 1024; do for c in t64_r1_v8_reg t32_r8_v8_reg t32_r4_v8_reg; do X="$X $norm.bwd.bf16.w_f32.n$n$b.cfg_$c"; done; done
  done
  build/normjit-bench --rows 32768 --json "$OUT/explore.json" $X > "$OUT/explore.txt" 2>&1
  python3 bench/summary.py "$OUT/explore.json" | tee "$OUT/table_explore.md"
  build/normjit-bench --graph --rows 4096 --json "$OUT/explore_launch.json" layernorm.bwd.f16.n768.bias \
    layernorm.bwd.f16.w_f16.n768.bias.cfg_t32_r8_v8_reg layernorm.bwd.f16.w_f16.n768.bias.cfg_t32_r4_v8_reg \
    rmsnorm.bwd.f16.n128 layernorm.fwd_train.f16.n768.bias rmsnorm.fwd_train.f16.n128 2>&1 | tee "$OUT/explore_launch.txt" | tail -7
  for k in t512_r1_v8_c2 t1024_r1_v8; do
    timeout 120 ncu --section WarpStateStats --section Occupancy --section SpeedOfLight --section LaunchStats -c 1 \
      -k regex:normjit_layernorm_fwd_train_bf16_w_bf16_n32768_bias_cfg_${k}_reg \
      build/normjit-bench --rows 32768 --no-verify --warmup 0 --reps 1 --batch 1 \
      layernorm.fwd_train.bf16.w_bf16.n32768.bias.cfg_${k}_reg > "$OUT/ncu_$k.txt" 2>&1
    grep -E "Duration|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles Per Issued|Block Limit|Cluster" "$OUT/ncu_$k.txt" | head -30
  done
fi
if [[ ,$STAGE, == *,bwd,* ]]; then
  NS="256 512 1024 2048 4096 8192 16384 32768 65536"
  BSPECS=""; for n in $NS; do BSPECS="$BSPECS layernorm.bwd.bf16.w_f32.n$n.bias rmsnorm.bwd.bf16.w_f32.n$n"; done
  build/normjit-bench --rows 32768 --json "$OUT/normjit_bwd.json" $BSPECS 2>&1 | tee "$OUT/normjit_bwd.txt" | tail -3
  PYTHONUNBUFFERED=1 timeout ${PEER_BWD_S:-300} python3 bench/peers.py --phase bwd --json "$OUT/peers_bwd.json" >"$OUT/peers_bwd.txt" 2>&1
  grep -E "^torch|skip|fell" "$OUT/peers_bwd.txt" | cut -c1-150
  python3 bench/report.py "$OUT/normjit_bwd.json" "$OUT/peers_bwd.json" bwd | tee "$OUT/table_bwd.md"
fi
if [[ $STAGE == all || ,$STAGE, == *,bench,* ]]; then
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
