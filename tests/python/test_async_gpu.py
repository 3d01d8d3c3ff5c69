"""normjit.torch in async compile mode (NORMJIT_COMPILE_MODE=async), in a fresh process over an
empty cache, through the C++ ops and through the Python autograd: the first calls of a new shape
run the generic kernels (nothing compiles on the calling thread) and match float64 torch; once
the background compiles are done the specialized kernels take over; a CUDA graph captured before
its spec ever ran holds the generic kernel and replays correctly. Skipped without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

BF16_TOL = 1.6e-2  # two ulps of bf16, relative to the output's magnitude


@pytest.mark.parametrize("native", ["1", "0"])
def test_async_mode_generic_first_then_specialized(gpu, tmp_path, native):
    out = tmp_path / "seen.json"
    env = dict(os.environ, NORMJIT_CACHE_DIR=str(tmp_path / "cache"), NORMJIT_COMPILE_MODE="async",
               NORMJIT_TORCH_NATIVE=native, NORMJIT_TUNING="heuristic")
    env.pop("NORMJIT_BUNDLE", None)
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "async_worker.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["mode"] == "async"
    if native == "1" and not seen["native"]:
        pytest.skip("this package has no C++ ops (built without a CUDA torch)")
    assert seen["native"] == (native == "1")
    # The C++ autograd node is normjit::NormFunction; the Python Function's node is NormFunctionBackward.
    assert ("::NormFunction" in seen["first"]["grad_fn"]) == (native == "1"), seen["first"]["grad_fn"]
    first, second = seen["after_first"], seen["after_second"]
    # The forward and the backward (its row kernel and reduction counted as one launch) ran generic.
    assert first["generic_launches"] >= 2, first
    assert first["compiles"] == 0 and first["disk_hits"] == 0, first  # nothing compiled on this thread
    # After the background compiles, the specialized kernels ran: no generic launch more.
    assert second["generic_launches"] == first["generic_launches"], (first, second)
    assert second["background_compiles"] >= 2, second
    for run in ("first", "second"):
        for what in ("y", "dx", "dw"):
            assert seen[run][what] <= BF16_TOL * (4 if what != "y" else 1), (run, what, seen[run])
    # The captured cold spec ran its generic kernel, correctly.
    assert seen["after_graph"]["generic_launches"] > second["generic_launches"]
    assert seen["graph"] <= 2e-3, seen["graph"]  # f16
