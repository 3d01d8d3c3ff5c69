#!/usr/bin/env bash
# Installs the carried peer wheels (liger-kernel, nvidia-cudnn-frontend, quack-kernels and their
# cutlass-dsl runtime) into .peers/site on the device machine; `scripts/device.sh peers` runs it.
# The cutlass-dsl cu13 libraries are larger than one call's 64 MiB carry, so they travel as an xz
# archive split in two parts (cu13.tar.xz.part_aa, part_ab) over two calls: each call stages what
# it brings (.whl/*.whl, .whl/pack*/) into .peers/ (git-ignored, kept on a warm machine), and the
# archive is unpacked once both parts are there. Prints PYTHONPATH for the peers on its last line.
set -uo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 1
STAGE=.peers/stage SITE=.peers/site
mkdir -p "$STAGE" "$SITE"
for d in .whl .whl/pack*; do
  [[ -d $d ]] && find "$d" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.part_*' \) -exec cp --update=none {} "$STAGE"/ \;
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
    echo "peers_setup: cutlass-dsl cu13 libs incomplete (${#parts[@]} of 2 parts here): QuACK will be skipped" >&2
  fi
fi
echo "PYTHONPATH=$PWD/$SITE"
