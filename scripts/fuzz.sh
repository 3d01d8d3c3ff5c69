#!/usr/bin/env bash
# Builds the libFuzzer targets (spec parser, manifest reader, tuning database) with clang, ASan and UBSan, and runs
# each for a bounded time from a seed corpus of the default manifest's specs.
# Usage: scripts/fuzz.sh [seconds per target (default 10)] [build dir (default build-fuzz)]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-10}
OUT=${2:-build-fuzz}
CXX=${FUZZ_CXX:-clang++}
mkdir -p "$OUT/corpus_spec" "$OUT/corpus_manifest" "$OUT/corpus_tuning_db"
# shellcheck disable=SC2054  # the commas are inside one -fsanitize= option
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -I.)
# The heuristic reads the pick tables that the library build embeds; embed them the same way.
cmake -DPICKS_DIR="$PWD/generator/picks" -DOUTPUT="$OUT/embedded_picks.cpp" -P cmake/embed_picks.cmake
core=(generator/spec.cpp generator/heuristic.cpp "$OUT/embedded_picks.cpp")
"$CXX" "${flags[@]}" tests/fuzz/fuzz_spec.cpp "${core[@]}" -o "$OUT/fuzz_spec"
"$CXX" "${flags[@]}" tests/fuzz/fuzz_manifest.cpp "${core[@]}" -o "$OUT/fuzz_manifest"
"$CXX" "${flags[@]}" tests/fuzz/fuzz_tuning_db.cpp runtime/tuning_db.cpp "${core[@]}" -o "$OUT/fuzz_tuning_db"
# Seeds: every default-manifest spec (with and without a block config), and the manifest itself.
i=0
grep -v '^#' manifests/default.txt | grep . | while read -r spec; do
  printf '%s' "$spec" > "$OUT/corpus_spec/m$i"; i=$((i + 1))
done
printf '%s' "layernorm.fwd_train.bf16.w_f32.n32768.bias.relu_bitmask.cfg_t512_r1_v8_c2_reg" > "$OUT/corpus_spec/cluster"
printf '%s' "rmsnorm.fwd_infer.f16.w_f16.n65536.gelu.cfg_t1024_r1_v8_smem" > "$OUT/corpus_spec/smem"
cp manifests/default.txt "$OUT/corpus_manifest/default"
cat > "$OUT/corpus_tuning_db/one" <<'JSON'
{"format": "normjit-tuning-db", "version": 1, "entries": [{"device": "NVIDIA H100 80GB HBM3", "sm": 90,
 "sm_count": 132, "driver": 13000, "nvrtc": 13000, "normjit": "0.1.0", "spec": "layernorm.fwd_train.bf16.w_f32.n4096.bias",
 "config": "t128_r1_v8_reg", "us": 183.5, "heuristic_us": 183.5, "rows": 32768}]}
JSON
for target in fuzz_spec fuzz_manifest fuzz_tuning_db; do
  corpus="$OUT/corpus_${target#fuzz_}"
  "$OUT/$target" -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$OUT/" "$corpus" \
    2>"$OUT/$target.log" || { tail -40 "$OUT/$target.log"; exit 1; }
  echo "$target: $(grep -E '^stat::number_of_executed_units' "$OUT/$target.log" | awk '{print $2}') inputs in ${SECONDS_PER_TARGET} s, no crash"
done
