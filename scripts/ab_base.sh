#!/usr/bin/env bash
# Stages a commit's tree (default HEAD) in .ab-base/ (git-ignored) for `scripts/device.sh ab`, which
# times the same specs on it and on the working tree in one call. The device machine's copy of the
# repository may hold an older .git, so the base travels as files: pass carry [".deps", ".ab-base"].
# usage: scripts/ab_base.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$(git rev-parse --verify "${1:-HEAD}^{commit}")
rm -rf .ab-base && mkdir .ab-base
git archive "$rev" -- CMakeLists.txt cmake generator templates runtime tools include tests python pyproject.toml \
  manifests scripts bench/tables.py | tar -x -C .ab-base
echo "$rev" >.ab-base/REVISION
echo ".ab-base: $rev ($(du -sh .ab-base | cut -f1))"
