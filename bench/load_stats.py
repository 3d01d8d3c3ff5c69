#!/usr/bin/env python3
"""First Runtime::get of each kernel that came from the disk cache (normjit-bench --json files):
median, 90th percentile and max of the whole get, of getting the image (read and checksum) and of
the driver's module load, in ms. The first kernel of each process is listed apart: it also pays
for the process's first module load.

usage: load_stats.py RESULTS.json...
"""
import json
import statistics
import sys


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main(paths):
    if not paths:
        sys.exit(__doc__)
    rest, first = [], []
    for path in paths:
        hits = [r for r in json.load(open(path))["results"] if r.get("first_get") == "disk hit"]
        if hits:
            first.append(hits[0])
            rest.extend(hits[1:])
    print("| kernels | what | median ms | p90 ms | max ms |")
    print("|---|---|---|---|---|")
    for label, rows in (("not first in process", rest), ("first in process", first)):
        if not rows:
            continue
        for what, key in (("whole get", "first_get_ms"), ("image (read, verify)", "first_get_image_ms"),
                          ("module load", "first_get_module_ms")):
            vals = [r[key] for r in rows if key in r]
            if vals:
                print(f"| {label} ({len(vals)}) | {what} | {statistics.median(vals):.3f} | {pct(vals, 0.9):.3f} | "
                      f"{max(vals):.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
