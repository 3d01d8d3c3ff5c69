#!/usr/bin/env bash
# Builds .whl/fi/, the FlashInfer carry for the fusion benches on the device machine (no network
# there; 64 MiB a call). Run here, with network, nvcc 13 at /usr/local/cuda and a Python that has
# torch (no GPU needed):
#   scripts/flashinfer_slim.sh            # PYTHON=build/venv/bin/python, FI_VERSION=0.7.2.post1
# The flashinfer-python wheel is 62 MB; flashinfer.norm needs its Python package (every .py is kept:
# `import flashinfer` imports some 330 modules across the package) and, of its 332 MB data/, only
# the norm JIT module's sources and the headers they include (ninja's dependency list of an actual
# build: csrc/norm.cu, csrc/flashinfer_norm_binding.cu, csrc/tvm_ffi_utils.h, 14 flashinfer headers,
# the bundled CCCL's used headers; no CUTLASS, no spdlog). The norm module is built here for sm_90a
# (H100 and H200) and placed where FlashInfer looks for an AOT build (data/aot/norm/norm.so), so the
# device compiles nothing. The .so is a tvm-ffi module: no Python symbols (any CPython), it needs
# apache-tvm-ffi's libtvm_ffi (0.1.x, the same 0.1.15.post2 as .whl/pack1) and libcudart.so.13.
# Output: .whl/fi/flashinfer-$FI_VERSION-slim.tar.xz (~8.6 MB) and the cp312 apache-tvm-ffi wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/build/venv/bin/python}
FI_VERSION=${FI_VERSION:-0.7.2.post1}
TVM_FFI_VERSION=${TVM_FFI_VERSION:-0.1.15.post2}
W=${WORK_DIR:-/tmp/flashinfer-slim}
OUT=$ROOT/.whl/fi
rm -rf "$W" && mkdir -p "$W"/{wheel,x,site,slim,ws} "$OUT"
pip_get() { python3 -m pip download -q --no-deps --only-binary=:all: "$@"; }
pip_get -d "$W/wheel" "flashinfer-python==$FI_VERSION"
# tvm-ffi for the device (cp312) and for this build's Python (headers and libtvm_ffi for the import).
pip_get -d "$OUT" --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_24_x86_64 "apache-tvm-ffi==$TVM_FFI_VERSION"
pip_get -d "$W/wheel" "apache-tvm-ffi==$TVM_FFI_VERSION"
# flashinfer's import needs these (the device image has them); --target keeps them out of $PYTHON's env.
"$PYTHON" -m pip install -q --target "$W/site" requests tabulate tqdm click einops nvidia-ml-py ninja
(cd "$W/x" && unzip -q "$W"/wheel/flashinfer_python-*.whl)
for w in "$W"/wheel/apache_tvm_ffi-*.whl; do (cd "$W/site" && unzip -qo "$w"); done
export PYTHONPATH=$W/x:$W/site PATH=$W/site/bin:/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
# FLASHINFER_JIT_VERBOSE=1 would also switch the build to -O0 -G: leave it unset.
MAX_JOBS=$(nproc)
export FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=$W/ws MAX_JOBS
so=$("$PYTHON" -c "
from flashinfer.jit.norm import gen_norm_module
s = gen_norm_module(); s.build(verbose=False); print(s.jit_library_path)" | tail -1)
[[ -s $so ]] || { echo "flashinfer_slim: no $so" >&2; exit 1; }
if nm -D --undefined-only "$so" | grep -q ' U Py'; then echo "flashinfer_slim: $so uses the Python C API" >&2; exit 1; fi
(cd "$(dirname "$so")" && ninja -t deps) | sed -n "s#^ *$W/x/##p" | sort -u >"$W/deps.txt"
cd "$W/x"
{ find flashinfer b12x -path flashinfer/data -prune -o -name __pycache__ -prune -o -type f -print
  find flashinfer_python-*.dist-info -type f ! -name RECORD
  cat "$W/deps.txt"; } | tar cf - -T - | tar xf - -C "$W/slim"
mkdir -p "$W/slim/flashinfer/data/aot/norm" && cp "$so" "$W/slim/flashinfer/data/aot/norm/norm.so"
cd "$W/slim"
tar cf - --owner=0 --group=0 --sort=name ./* | xz -T0 -9 >"$OUT/flashinfer-$FI_VERSION-slim.tar.xz"
echo "flashinfer_slim: $(wc -l <"$W/deps.txt") JIT source files; $(du -sh "$OUT" | cut -f1) in $OUT:"
ls -l "$OUT"
