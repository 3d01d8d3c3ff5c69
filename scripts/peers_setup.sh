#!/usr/bin/env bash
# Installs the carried peer wheels (liger-kernel, nvidia-cudnn-frontend, quack-kernels and their
# cutlass-dsl runtime, FlashInfer) into .peers/site on the device machine; `scripts/device.sh peers`
# and `fusions` run it.
# The cutlass-dsl cu13 libraries are larger than one call's 64 MiB carry, so they travel as an xz
# archive split in two parts (cu13.tar.xz.part_aa, part_ab) over two calls: each call stages what
# it brings (.whl/*.whl, .whl/pack*/) into .peers/ (git-ignored, kept on a warm machine), and the
# archive is unpacked once both parts are there. FlashInfer travels in .whl/fi/ (about 12 MB, one
# call beside .deps): scripts/flashinfer_slim.sh's archive of its Python package with only the norm
# module's JIT sources and that module prebuilt for sm_90a (data/aot/norm/norm.so, so nothing is
# compiled there), plus apache-tvm-ffi. Its CuTe-DSL norm kernels (its default on sm_90) also need
# the cutlass-dsl wheels and both cu13 parts; without them FlashInfer runs its CUDA kernels.
# Prints PYTHONPATH for the peers on its last line.
set -uo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 1
STAGE=.peers/stage SITE=.peers/site
mkdir -p "$STAGE" "$SITE"
for f in .whl/*.whl .whl/pack*/*.whl .whl/pack*/*.part_* .whl/fi/*.whl .whl/fi/flashinfer-*.tar.xz; do
  [[ -e $STAGE/$(basename "$f") ]] || cp "$f" "$STAGE"/  # kept: the same name is the same file
done
for w in "$STAGE"/*.whl; do
  name=$(basename "$w")
  [[ -e $SITE/.installed.$name ]] && continue
  # Unzipped, not `pip install --target`: pip --target skips a top-level folder that already
  # exists, and the cutlass-dsl wheels share nvidia_cutlass_dsl/.
  python3 -m zipfile -e "$w" "$SITE"/ && touch "$SITE/.installed.$name" || echo "peers_setup: $name did not unpack" >&2
done
parts=("$STAGE"/cu13.tar.xz.part_*)
if [[ ! -e $SITE/.installed.cu13 ]]; then
  if [[ -e $STAGE/cu13.tar.xz.part_aa && -e $STAGE/cu13.tar.xz.part_ab ]]; then
    cat "${parts[@]}" | xz -d | tar x -C "$SITE" && touch "$SITE/.installed.cu13"
  else
    echo "peers_setup: cutlass-dsl cu13 libs incomplete (${#parts[@]} of 2 parts here): QuACK will be skipped, FlashInfer runs its CUDA kernels" >&2
  fi
fi
for a in "$STAGE"/flashinfer-*.tar.xz; do
  name=$(basename "$a")
  [[ -e $SITE/.installed.$name ]] && continue
  rm -rf "$SITE/flashinfer" "$SITE"/flashinfer_python-*.dist-info
  tar xJf "$a" -C "$SITE" && touch "$SITE/.installed.$name" || echo "peers_setup: $name did not unpack" >&2
done
echo "PYTHONPATH=$PWD/$SITE"
