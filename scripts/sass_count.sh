#!/usr/bin/env bash
# Static SASS counts of the kernels the build generates for SPEC... (sm_90), without a GPU:
# precompiles them into a scratch cache, takes each entry's cubin and disassembles it with
# cuobjdump/nvdisasm from NVIDIA's pip wheels (fetched once into .tools/, git-ignored).
# usage: scripts/sass_count.sh SPEC...   (after a build in build/)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || { echo "usage: $0 SPEC..." >&2; exit 2; }
TOOLS=$PWD/.tools/cuda-binutils
if [[ ! -x $TOOLS/nvidia/cu13/bin/nvdisasm ]]; then
  mkdir -p "$TOOLS" && pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$TOOLS"
  for w in "$TOOLS"/*.whl; do python3 -m zipfile -e "$w" "$TOOLS"; done
  chmod +x "$TOOLS"/nvidia/cu13/bin/*
fi
export PATH=$TOOLS/nvidia/cu13/bin:$PATH
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
build/normjit-precompile -q --cache-dir "$WORK/cache" -- "$@" >"$WORK/precompile.log" 2>&1 || { cat "$WORK/precompile.log" >&2; exit 1; }
for entry in "$WORK"/cache/*.kernel; do
  name=$(basename "$entry" .kernel)
  # An entry is normjit's header followed by the cubin (an ELF image).
  python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); open(sys.argv[2], "wb").write(d[d.find(b"\x7fELF"):])' \
    "$entry" "$WORK/${name%%.sm_*}.cubin"
  cuobjdump -sass "$WORK/${name%%.sm_*}.cubin" > "$WORK/${name%%.sm_*}.sass"
done
python3 bench/sass_count.py "$WORK"/*.sass
