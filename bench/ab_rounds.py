#!/usr/bin/env python3
"""Side by side: the same specs benched as variant A and variant B in alternating processes, two
rounds each (normjit-bench --json files). One Markdown row per spec found in all four runs: µs of
each round, and % of the copy measured in the same process (round 1).

usage: ab_rounds.py LABEL_A LABEL_B A_R1 A_R2 B_R1 B_R2
Each run is one JSON file or several joined by commas (e.g. an M = 32768 and an M = 4096 list).
"""
import json
import sys


def load(files):
    results = {}
    for path in files.split(","):
        results.update({r["spec"]: r for r in json.load(open(path))["results"]})
    return results


def main(label_a, label_b, *runs):
    if len(runs) != 4:
        sys.exit(__doc__)
    a1, a2, b1, b2 = (load(r) for r in runs)
    print(f"| spec | {label_a} µs (r1 / r2) | {label_b} µs (r1 / r2) | % copy {label_a} / {label_b} (r1) |")
    print("|---|---|---|---|")
    for spec, a in a1.items():
        if spec in a2 and spec in b1 and spec in b2:
            print(f"| {spec} | {a['us']:.2f} / {a2[spec]['us']:.2f} | {b1[spec]['us']:.2f} / {b2[spec]['us']:.2f} | "
                  f"{a['pct_copy']:.1f} / {b1[spec]['pct_copy']:.1f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
