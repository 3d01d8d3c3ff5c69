#!/usr/bin/env python3
"""Tabulates `ncu --csv --metrics ...` output: one Markdown row per profiled kernel launch."""
import csv
import os
import sys

COLUMNS = [
    ("gpu__time_duration.sum", "µs", 1e-3),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", 1),
    ("launch__grid_size", "grid", 1),
    ("launch__block_size", "block", 1),
    ("launch__cluster_dim_x", "cluster", 1),
    ("launch__registers_per_thread", "regs", 1),
    ("launch__shared_mem_per_block_dynamic", "dyn smem", 1),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps active %", 1),
    ("dram__bytes_read.sum", "MB read", 1e-6),
    ("dram__bytes_write.sum", "MB written", 1e-6),
]


def launches(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = {}
    for r in csv.DictReader(lines):
        key = r["ID"]
        entry = rows.setdefault(key, {"kernel": r["Kernel Name"]})
        value = r["Metric Value"].replace(",", "")
        unit = r.get("Metric Unit", "")
        try:
            v = float(value)
        except ValueError:
            continue
        # ncu picks the unit per value: bring time to ns and bytes to bytes before scaling.
        scale = {"usecond": 1e3, "msecond": 1e6, "nsecond": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
                 "byte": 1}.get(unit, 1)
        entry[r["Metric Name"]] = v * scale
    return list(rows.values())


def main():
    print("| file | kernel | " + " | ".join(c[1] for c in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for path in sys.argv[1:]:
        for e in launches(path):
            name = e["kernel"]
            if any(s in name for s in ("distribution", "elementwise", "fill_", "copy", "Memcpy")):
                continue  # inputs being drawn, not the timed work
            cells = []
            for metric, _, scale in COLUMNS:
                v = e.get(metric)
                cells.append("" if v is None else f"{v * scale:.4g}")
            print(f"| {os.path.basename(path)} | {name[:70]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
