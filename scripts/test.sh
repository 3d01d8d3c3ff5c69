#!/usr/bin/env bash
# Installs what the build needs (Debian/Ubuntu, as root), builds normjit and its tests, runs ctest,
# and beside it installs the Python package (pip install . into $BUILD_DIR/venv, with torch and
# pytest, which download while the C++ side builds) and runs scripts/wheel_check.sh (WHEEL_CHECK=0:
# not); then the package's tests. GPU tests are reported as skipped when no GPU is present.
# PYTHON_TESTS=0: C++ only.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
need=()
PYTHON_TESTS=${PYTHON_TESTS:-1}
pkgs=(cmake ninja-build g++ clang libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev doctest-dev)
[[ $PYTHON_TESTS == 1 ]] && pkgs+=(python3-dev python3-venv)
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing packages (install as root): ${need[*]}" >&2; exit 1
  fi
fi
export PATH=/usr/local/cuda/bin:$PATH
python_tests=0
[[ $PYTHON_TESTS == 1 && "$*" != "-N" ]] && python_tests=1
if [[ $python_tests == 1 ]]; then
  # The Python side's packages download while the C++ side builds and tests (about two minutes
  # of mostly network time); installed once, a reused venv keeps them. The build's own
  # requirements go in too, so that --no-build-isolation reuses the build directory
  # (pyproject.toml's build-dir) between runs.
  root=$PWD venv=$BUILD_DIR/venv
  mkdir -p "$BUILD_DIR"
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  pip_log=$BUILD_DIR/pip-install.log
  if ! "$venv/bin/python" -c "import torch, numpy, pytest, nanobind, scikit_build_core" 2>/dev/null; then
    rm -f "$pip_log.rc"
    { "$venv/bin/pip" install -q --disable-pip-version-check torch numpy pytest nanobind scikit-build-core \
        >"$pip_log" 2>&1; echo $? >"$pip_log.rc"; } &
    pip_pid=$!
    trap 'kill "$pip_pid" 2>/dev/null || true' EXIT  # a failed C++ step leaves no download behind
  fi
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
cd "$BUILD_DIR"
# ctest lists a skipped test without its output; say up front why the GPU tests will be skipped.
if [ "$*" != "-N" ] && ! tests/normjit_gpu_tests --list-test-cases >/dev/null 2>&1; then
  tests/normjit_gpu_tests | head -1 || true  # exits 77 by design
fi
cd - >/dev/null

# The Python builds (the package into the venv, and scripts/wheel_check.sh's isolated wheel) run
# beside ctest at low priority, on the cycles its serial cases leave idle. They embed the generic
# kernels the C++ build just compiled (about 5 minutes each otherwise): same tree, same images.
if [[ $python_tests == 1 ]]; then
  generic_cpp=$(cd "$BUILD_DIR" && pwd)/generated/generic_images.cpp
  if [[ -f $generic_cpp ]]; then export NORMJIT_GENERIC_PREBUILT=$generic_cpp; fi
  py_install_log=$BUILD_DIR/python-install.log wheel_log=$BUILD_DIR/wheel-check.log
  (
    if [[ -n ${pip_pid:-} ]]; then  # a sibling, not a child: its status comes through a file
      while kill -0 "$pip_pid" 2>/dev/null; do sleep 2; done
      if [[ $(cat "$pip_log.rc" 2>/dev/null) != 0 ]]; then
        cat "$pip_log"; echo "pip install of the Python tests' packages failed (above)"; exit 1
      fi
    fi
    nice -n 10 "$venv/bin/pip" install -q --disable-pip-version-check \
      --no-build-isolation ${NORMJIT_GENERIC_PREBUILT:+-C cmake.define.NORMJIT_GENERIC_PREBUILT=$NORMJIT_GENERIC_PREBUILT} .
  ) >"$py_install_log" 2>&1 &
  py_install_pid=$!
  if [[ ${WHEEL_CHECK:-1} == 1 ]]; then
    nice -n 10 bash scripts/wheel_check.sh >"$wheel_log" 2>&1 &
    wheel_pid=$!
  fi
  trap 'kill ${pip_pid:-} ${py_install_pid:-} ${wheel_pid:-} 2>/dev/null || true' EXIT
fi

# In parallel: the fuzz test's clang builds fill the cores that normjit_tests' serial cases leave idle.
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" "$@")

if [[ $python_tests == 1 ]]; then
  if ! wait "$py_install_pid"; then
    cat "$py_install_log" >&2; echo "installing the Python package failed (above)" >&2; exit 1
  fi
  # From outside the source tree, so the tests import the installed package.
  (cd "$BUILD_DIR" && venv/bin/python -m pytest -ra -q -p no:cacheprovider "$root/tests/python")
  # The wheel as a user gets it: built in isolation, installed into a bare venv, run without the tree.
  if [[ -n ${wheel_pid:-} ]]; then
    if ! wait "$wheel_pid"; then cat "$wheel_log" >&2; echo "scripts/wheel_check.sh failed (above)" >&2; exit 1; fi
    tail -1 "$wheel_log"
  fi
fi
