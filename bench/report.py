#!/usr/bin/env python3
"""Merges normjit-bench --json and bench/peers.py --json into a markdown table (GB/s and % of copy)."""
import json
import sys


def main(normjit_json, peers_json):
    nj = json.load(open(normjit_json))
    peers = json.load(open(peers_json))
    rows = {}
    for r in nj["results"]:
        norm = r["spec"].split(".")[0]
        rows.setdefault((norm, r["n"]), {})["normjit"] = (r["gbps"], r["pct_copy"], r["us"])
        rows[(norm, r["n"])]["copy_nj"] = r["copy_gbps"]
    for r in peers["results"]:
        rows.setdefault((r["norm"], r["n"]), {})[r["provider"]] = (r["gbps"], r["pct_copy"], r["us"])
        rows[(r["norm"], r["n"])]["copy_torch"] = r["copy_gbps"]
    providers = ["normjit", "torch.eager", "torch.compile"]
    print(f"Device: {nj['device']} ({nj['sm']}, {nj['sm_count']} SMs), driver {nj['driver']}, NVRTC {nj['nvrtc']}, "
          f"torch {peers['torch']}\n")
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


if __name__ == "__main__":
    main(*sys.argv[1:3])
