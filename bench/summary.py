#!/usr/bin/env python3
"""One line per normjit-bench --json result: spec, µs, GB/s, % of the copy measured in-process."""
import json
import sys

for path in sys.argv[1:]:
    for r in json.load(open(path))["results"]:
        print(f"{r['spec']:64s} {r['us']:9.2f} us {r['gbps']:7.0f} GB/s {r['pct_copy']:6.1f} % copy")
