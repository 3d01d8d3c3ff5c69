#!/usr/bin/env python3
"""Merges normjit-bench --json and bench/peers.py --json into a markdown table (GB/s and % of copy).

Usage: report.py normjit.json peers.json [fwd|bwd]   (default fwd)
The phase picks normjit specs by their second token (`bwd` vs the forward ones) and peer results by
their `phase` field (forward peer files written before that field existed count as fwd).
"""
import json
import sys


def spec_phase(spec):
    return "bwd" if spec.split(".")[1] == "bwd" else "fwd"


def main(normjit_json, peers_json, phase="fwd"):
    if phase not in ("fwd", "bwd"):
        sys.exit(f"report.py: phase must be fwd or bwd, not {phase!r}")
    nj = json.load(open(normjit_json))
    peers = json.load(open(peers_json))
    nj_results = [r for r in nj["results"] if spec_phase(r["spec"]) == phase]
    peer_results = [r for r in peers["results"] if r.get("phase", "fwd") == phase]
    rows = {}
    for r in nj_results:
        norm = r["spec"].split(".")[0]
        rows.setdefault((norm, r["n"]), {})["normjit"] = (r["gbps"], r["pct_copy"], r["us"])
        rows[(norm, r["n"])]["copy_nj"] = r["copy_gbps"]
    for r in peer_results:
        rows.setdefault((r["norm"], r["n"]), {})[r["provider"]] = (r["gbps"], r["pct_copy"], r["us"])
        rows[(r["norm"], r["n"])]["copy_torch"] = r["copy_gbps"]
    providers = ["normjit", "torch.eager", "torch.compile"]
    device = (f"Device: {nj['device']} ({nj['sm']}, {nj['sm_count']} SMs), driver {nj['driver']}, NVRTC {nj['nvrtc']}, "
              f"torch {peers['torch']}")
    if phase == "fwd":
        print(device + "\n")  # unchanged forward title
    else:
        print(f"Phase bwd (dx, dgamma, + dbeta for LayerNorm; bytes = 3·M·N·x + N·w·(1 + weight grads)). "
              f"{device}\n")
        # A row only compares like with like if both sides ran the same dtypes and row count.
        peer_cfg = sorted({(r.get("dtype"), r.get("wdtype"), r.get("rows")) for r in peer_results}, key=str)
        nj_cfg = sorted({nj_dtypes(r["spec"]) + (r.get("rows"),) for r in nj_results}, key=str)
        print(f"x/weight dtypes, rows: normjit {fmt_cfg(nj_cfg)}; torch {fmt_cfg(peer_cfg)}\n")
    print("| norm | N | " + " | ".join(f"{p} GB/s (% copy)" for p in providers) +
          " | copy GB/s (normjit proc / torch proc) | normjit vs best peer |")
    print("|---|---|" + "---|" * len(providers) + "---|---|")
    for (norm, n) in sorted(rows):
        d = rows[(norm, n)]
        cells = []
        for p in providers:
            cells.append(f"{d[p][0]:.0f} ({d[p][1]:.1f} %)" if p in d else "n/a")
        best_peer = max((d[p][0] for p in providers[1:] if p in d), default=None)
        ratio = f"{d['normjit'][0] / best_peer:.2f}x" if best_peer and "normjit" in d else "n/a"
        print(f"| {norm} | {n} | " + " | ".join(cells) +
              f" | {d.get('copy_nj', 0):.0f} / {d.get('copy_torch', 0):.0f} | {ratio} |")


def nj_dtypes(spec):
    """(x dtype, weight dtype) of a spec; `w_` defaults to the x dtype when the spec omits it."""
    tokens = spec.split(".")
    w = next((t[2:] for t in tokens[3:] if t.startswith("w_")), tokens[2])
    return (tokens[2], w)


def fmt_cfg(cfgs):
    return ", ".join(f"{x}/{w}, M={rows if rows is not None else '?'}" for x, w, rows in cfgs) or "none"


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: report.py normjit.json peers.json [fwd|bwd]")
    main(*sys.argv[1:4])
