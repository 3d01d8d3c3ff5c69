#!/usr/bin/env python3
"""Per-N tables of the heuristic's picks on two GPUs, as in bench/RESULTS.md:
% of copy, GPU A / GPU B, and the pick's cfg (GPU A).

usage: pern_table.py LABEL_A LABEL_B A.json[,A2.json...] B.json[,B2.json...]
Each side's files are the unpinned runs of `device_run.sh perf` (normjit_perf*.json).
"""
import json
import sys


def load(paths):
    rows, worst, verified = {}, 0.0, True
    for path in paths.split(","):
        for r in json.load(open(path))["results"]:
            spec = r["spec"].split(".cfg_")[0]
            rows[spec] = (r["pct_copy"], r["spec"].split(".cfg_")[1])
            worst = max(worst, r.get("max_err_over_tol", 0.0))
            verified &= r.get("verified", True)
    return rows, worst, verified


label_a, label_b, a_paths, b_paths = sys.argv[1:5]
a, worst_a, ok_a = load(a_paths)
b, worst_b, ok_b = load(b_paths)
print(f"max err/tol over every row: {max(worst_a, worst_b):.3f}; all verified: {ok_a and ok_b}\n")
for phase, ln, rms in (("fwd", "layernorm.fwd_train.bf16.w_bf16", "rmsnorm.fwd_train.bf16.w_bf16"),
                       ("bwd", "layernorm.bwd.bf16.w_f32", "rmsnorm.bwd.bf16.w_f32")):
    ns = sorted({int(s.split(".n")[1].split(".")[0]) for s in a if s.startswith(ln)})
    print(f"{phase}: % of copy, {label_a} / {label_b}; pick ({label_a})\n")
    print("| N | LN | RMS | LN pick | RMS pick |")
    print("|---|---|---|---|---|")
    for n in ns:
        lk, rk = f"{ln}.n{n}.bias", f"{rms}.n{n}"
        cell = lambda d, k: f"{d[k][0]:.1f}" if k in d else "–"
        print(f"| {n} | {cell(a, lk)} / {cell(b, lk)} | {cell(a, rk)} / {cell(b, rk)} | "
              f"{a.get(lk, ('', '–'))[1]} | {a.get(rk, ('', '–'))[1]} |")
    print()
