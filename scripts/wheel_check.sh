#!/usr/bin/env bash
# Builds the wheel (with build isolation), installs it into a fresh venv and runs it from outside the
# source tree with no toolkit NVRTC in reach, so that only what the wheel and its dependency
# nvidia-cuda-nvrtc ship is used: Spec parsing, precompile, bundle export/import, and Runtime(0)
# raising normjit.Error without a GPU. WHEEL_CHECK_TORCH=1 also installs torch (PyPI, ~3 GB) and
# imports normjit.torch. Needs network access to PyPI. Exits non-zero on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PATH=/usr/local/cuda/bin:$PATH  # CMake's FindCUDAToolkit looks for nvcc
pipq=(-q --disable-pip-version-check)

# 1. The wheel. Its own build dir: the project's build-python/ is shared with test.sh's
# non-isolated build, and switching between the two rebuilds everything.
# NORMJIT_GENERIC_PREBUILT (scripts/test.sh sets it): embed that build's generic kernels.
python3 -m pip wheel "${pipq[@]}" --no-deps -w "$tmp/wh" -C build-dir="$tmp/build" \
  ${NORMJIT_GENERIC_PREBUILT:+-C cmake.define.NORMJIT_GENERIC_PREBUILT=$NORMJIT_GENERIC_PREBUILT} "$root"
whl=$(echo "$tmp"/wh/normjit-*.whl)
unzip -l "$whl"
# Only the package: no headers, CMake config, tools or a second (symlinked) libnormjit.
bad=$(unzip -Z1 "$whl" | grep -vE '^normjit/(torch/)?[a-z_]+\.py$|^normjit/_normjit\..*\.so$|^normjit/libnormjit\.so$|^normjit-[^/]+\.dist-info/' || true)
[[ -z $bad ]] || { echo "unexpected files in wheel: $bad" >&2; exit 1; }
unzip -q "$whl" 'normjit/*.so' -d "$tmp/x"
for so in "$tmp"/x/normjit/*.so; do echo "== ${so##*/}"; readelf -d "$so" | grep -E 'NEEDED|RUNPATH'; done
readelf -d "$tmp/x/normjit/libnormjit.so" | grep RUNPATH | grep -qF '$ORIGIN/../nvidia/cu13/lib' \
  || { echo "libnormjit.so: RUNPATH lacks the nvidia-cuda-nvrtc wheel's directory" >&2; exit 1; }
# Not in the wheel and not on a bare system: spdlog/fmt (header-only here), cudart, libcuda (dlopen'd).
if readelf -d "$tmp"/x/normjit/*.so | grep NEEDED | grep -E 'spdlog|fmt|cudart|libcuda\.'; then
  echo "wheel needs libraries it does not ship" >&2; exit 1
fi

# 2. A bare venv: the wheel and what it depends on (nvidia-cuda-nvrtc from PyPI), nothing else.
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install "${pipq[@]}" "$whl"
if [[ ${WHEEL_CHECK_TORCH:-0} == 1 ]]; then "$tmp/venv/bin/pip" install "${pipq[@]}" torch; fi

# 3. The checks, from $tmp. The last line printed is the summary's payload.
cat >"$tmp/check.py" <<'EOF'
import os, re, sys, tempfile, normjit
assert "site-packages" in normjit.__file__, normjit.__file__
print("Spec:", repr(normjit.Spec("layernorm.fwd_train.bf16.n4096.bias")))
specs = ["layernorm.fwd_train.bf16.n4096.bias", "rmsnorm.fwd_train.bf16.w_bf16.n1024",
         "layernorm.bwd.bf16.w_bf16.n4096.bias"]
cache = tempfile.mkdtemp()
r = normjit.precompile(specs, arch="sm_90", cache_dir=cache, jobs=2, progress=False)
print("precompile:", r)
assert r["compiled"] == len(specs) and r["failed"] == 0
bundle = os.path.join(cache, "specs.bundle")
assert normjit.export_bundle(cache, bundle, specs, "sm_90") == len(specs)
assert normjit.import_bundle(bundle, tempfile.mkdtemp()) == len(specs)
try:
    normjit.Runtime(0)
    sys.exit("normjit.Runtime(0) did not raise without a GPU")
except normjit.Error as e:
    assert "GPU" in str(e), e
    err = type(e).__name__
    print(f"Runtime(0): {err}: {e}")
if os.environ.get("WHEEL_CHECK_TORCH") == "1":
    import normjit.torch  # noqa: F401
    print("import normjit.torch: ok")
nvrtc = sorted({l.split()[-1] for l in open("/proc/self/maps") if re.search(r"/libnvrtc\.so", l)})
if os.environ.get("EXPECT_WHEEL_NVRTC") == "1":
    assert len(nvrtc) == 1 and "/site-packages/nvidia/" in nvrtc[0], nvrtc
print(f"{len(specs)} specs precompiled and bundled, Runtime(0) -> {err}, "
      f"NVRTC {normjit.nvrtc_version()} from {' '.join(nvrtc)}")
EOF
cd "$tmp"
run=("$tmp/venv/bin/python" "$tmp/check.py")
if unshare -rm true 2>/dev/null; then
  # Every directory that holds a libnvrtc the loader could find (the toolkit's, the ldconfig cache's),
  # and the source tree, replaced by empty ones in a private mount namespace.
  hide=$({ realpath -e /usr/local/cuda/lib64 2>/dev/null || true
           ldconfig -p | awk '/libnvrtc/ {print $NF}' | xargs -r -n1 realpath | xargs -r -n1 dirname; } | sort -u)
  hidden="hidden: $(echo $hide) $root"
  out=$(EXPECT_WHEEL_NVRTC=1 unshare -rm sh -c 'py=$1 chk=$2; shift 2; for d; do mount -t tmpfs none "$d"; done; exec "$py" "$chk"' \
        sh "${run[@]}" $hide "$root")
else
  hidden="NOT hidden (unshare not permitted), source tree visible"
  out=$("${run[@]}")
fi
echo "$out"
echo "wheel_check: OK: ${whl##*/} ($(stat -c %s "$whl") bytes); $(tail -1 <<<"$out"); toolkit libs $hidden"
