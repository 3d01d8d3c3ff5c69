"""Two ranks started by torchrun, sharing one cold cache directory: both succeed, each on its own
GPU where there are two, and each kernel is compiled once between them. Skipped without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def test_two_ranks_share_a_cold_cache(gpu, tmp_path):
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, NORMJIT_CACHE_DIR=str(cache), NORMJIT_TUNING="heuristic")
    env.pop("NORMJIT_BUNDLE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(Path(__file__).parent / "ranks_worker.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    two_gpus = torch.cuda.device_count() >= 2
    assert [r["device"] for r in ranks] == ([0, 1] if two_gpus else [0, 0])
    for r in ranks:
        assert r["cache_dir"] == str(cache)
        assert r["worst_abs_error"] < 0.1, r  # bf16 output of unit-scale values
    entries = sorted(p.name for p in cache.glob("*.kernel"))
    # 3 sizes x 2 norms x (forward, backward), one block config each.
    assert len(entries) == 12, entries
    compiles = sum(r["counters"]["compiles"] for r in ranks)
    assert compiles == len(entries), ranks  # each kernel compiled once between the ranks
    for r in ranks:
        # Every kernel reached each rank: compiled by it, or read from the disk cache.
        assert r["counters"]["compiles"] + r["counters"]["disk_hits"] == len(entries), r
