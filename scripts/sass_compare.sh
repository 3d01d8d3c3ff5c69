#!/usr/bin/env bash
# Compares the SASS of kernels between two builds of normjit, without a GPU: a change to the
# device code (templates/) that should not change codegen can be checked kernel by kernel.
#   scripts/sass_compare.sh dump BUILD_DIR OUT_DIR [SPECS]
#       compiles scripts/sass_dump.cpp's spec list (or the "<arch> <spec>" lines of SPECS) with the
#       library in BUILD_DIR, which embeds the templates it was built from, and disassembles each
#       kernel into OUT_DIR/<spec>.sm_<arch>.sass (OUT_DIR/specs.txt lists them).
#   scripts/sass_compare.sh diff BASE_DIR NEW_DIR
#       compares two dumps instruction by instruction and lists the kernels that differ, with
#       their instruction counts; exits 1 if any does.
# Typical use: dump a build of the old templates to /tmp/base, change and rebuild, then
#   scripts/sass_compare.sh dump build /tmp/new /tmp/base/specs.txt
#   scripts/sass_compare.sh diff /tmp/base /tmp/new
# cuobjdump and nvdisasm (which it runs) come from NVIDIA's pip wheels, fetched once into .tools/
# (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 dump BUILD_DIR OUT_DIR [SPECS] | diff BASE_DIR NEW_DIR" >&2; exit 2; }
[[ $# -ge 3 ]] || usage

# The instruction stream of a disassembly: one opcode and operands per line, without the
# addresses and encodings that cuobjdump prints beside them.
instructions() { sed -n 's@^ */\*[0-9a-f]*\*/ *\(.*[^ ]\) *;.*@\1@p' "$1"; }

case $1 in
dump)
  build=$2 out=$3 specs=${4:-}
  [[ -f $build/libnormjit.so ]] || { echo "$build/libnormjit.so not found: build normjit first" >&2; exit 1; }
  TOOLS=$PWD/.tools/cuda-binutils
  if [[ ! -x $TOOLS/nvidia/cu13/bin/cuobjdump || ! -x $TOOLS/nvidia/cu13/bin/nvdisasm ]]; then
    mkdir -p "$TOOLS" && pip download -q --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$TOOLS"
    for w in "$TOOLS"/*.whl; do python3 -m zipfile -e "$w" "$TOOLS"; done
    chmod +x "$TOOLS"/nvidia/cu13/bin/*
  fi
  mkdir -p "$out/lib"
  # A copy of the library: the dump stays runnable after BUILD_DIR is rebuilt.
  cp -a "$build"/libnormjit.so* "$out/lib/"
  CUDA=${CUDA_HOME:-/usr/local/cuda}
  g++ -std=c++17 -O1 -Iinclude -I. -I"$CUDA/include" scripts/sass_dump.cpp -o "$out/sass_dump" \
    -L"$out/lib" -lnormjit -Wl,-rpath,"$(cd "$out/lib" && pwd)" -pthread
  "$out/sass_dump" "$out" $specs
  # One cuobjdump per cubin, as many at a time as there are cores (about 1 s each).
  export TOOLS
  find "$out" -maxdepth 1 -name '*.cubin' -print0 |
    xargs -0 -P "$(nproc)" -I{} sh -c 'NVDISASM_PATH="$TOOLS"/nvidia/cu13/bin "$TOOLS"/nvidia/cu13/bin/cuobjdump -sass "$1" > "${1%.cubin}.sass"' _ {}
  ;;
diff)
  base=$2 new=$3 same=0 differ=0 missing=0
  while read -r arch spec; do
    name=$spec.sm_$arch.sass
    if [[ ! -f $new/$name ]]; then
      echo "missing in $new: $name"; missing=$((missing + 1)); continue
    fi
    if cmp -s <(instructions "$base/$name") <(instructions "$new/$name"); then
      same=$((same + 1))
    else
      differ=$((differ + 1))
      echo "differs: $spec sm_$arch: $(instructions "$base/$name" | wc -l) -> $(instructions "$new/$name" | wc -l) instructions"
    fi
  done < "$base/specs.txt"
  echo "$((same + differ + missing)) kernels compared: $same identical, $differ differ, $missing missing"
  [[ $differ -eq 0 && $missing -eq 0 ]]
  ;;
*) usage ;;
esac
