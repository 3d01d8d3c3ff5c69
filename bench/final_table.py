#!/usr/bin/env python3
"""% of copy per hidden size for the configs the current heuristic picks, looked up in bench JSON.

usage: final_table.py PICKS_CACHE_DIR JSON...   (later JSON files win for the same config)
PICKS_CACHE_DIR: a normjit-precompile cache of the unpinned specs (its entry names carry the
resolved cfg). Rows whose in-process copy came out implausibly low (> 110 % of copy) are skipped.
"""
import json
import os
import sys

picks_dir, files = sys.argv[1], sys.argv[2:]
picks = sorted({name.split(".sm_")[0] for name in os.listdir(picks_dir) if ".cfg_" in name})
measured = {}
for path in files:
    for r in json.load(open(path))["results"]:
        if r["pct_copy"] <= 110:
            measured[r["spec"]] = (r["pct_copy"], os.path.basename(path).split("_")[0], r["rows"])
newest = os.path.basename(files[-1]).split("_")[0]


def pick(prefix):
    found = [p for p in picks if p.startswith(prefix + ".cfg_")]
    return found[0] if len(found) == 1 else None


ns = sorted({int(p.split(".n")[1].split(".")[0]) for p in picks})
print("| N | M | LN fwd | RMS fwd | LN bwd | RMS bwd | config LN fwd / RMS fwd / LN bwd / RMS bwd |")
print("|---|---|---|---|---|---|---|")
for n in ns:
    cells, cfgs, rows = [], [], set()
    for prefix in (f"layernorm.fwd_train.bf16.w_bf16.n{n}.bias", f"rmsnorm.fwd_train.bf16.w_bf16.n{n}",
                   f"layernorm.bwd.bf16.w_f32.n{n}.bias", f"rmsnorm.bwd.bf16.w_f32.n{n}"):
        p = pick(prefix)
        if p is None:
            cells.append("-"), cfgs.append("-")
            continue
        cfgs.append(p.split(".cfg_")[1])
        if p in measured:
            pct, call, m = measured[p]
            rows.add(m)
            cells.append(f"{pct:.1f} %" + ("" if call == newest else f" ({call})"))
        else:
            cells.append("not measured")
    print(f"| {n} | {'/'.join(map(str, sorted(rows)))} | " + " | ".join(cells) + " | " + " / ".join(cfgs) + " |")
