#!/usr/bin/env python3
"""Markdown tables from normjit-bench --json and normjit-precompile --json files (scripts/device.sh
writes them; each table can also be rebuilt from a job's tarball).

  tables.py pern FILE... [--vs FILE...] [--labels A B] [--lowest K]
      % of copy per hidden size: LayerNorm / RMSNorm, forward / backward, and the picks' configs.
      --vs: a second run (another GPU, another commit) shown as "A / B" in each cell.
  tables.py specs FILE...
      one row per spec in run order; specs that differ only in `.cfg_…` are compared with the
      first of them timed (an A/B of pinned configs against the heuristic's pick).
  tables.py ab --base FILE... --new FILE... [--again FILE...]
      one row per spec: % of copy on the base tree, the new one and the base again (the spread
      between the two base runs bounds what the change's figure means), and new over base.
  tables.py launch FILE...
      CUDA-graph replay (--graph) and host launch cost (--launch-overhead) rows.
  tables.py load FILE...
      first get() of each kernel that came from the disk cache, and the in-process hit.
  tables.py compile LABEL=PRECOMPILE.json...
      NVRTC compile times per normjit-precompile run.
"""
import argparse
import json
import statistics
import sys


def results(paths):
    out = []
    for path in paths:
        with open(path) as fh:
            out.extend(json.load(fh)["results"])
    return out


def device_line(paths):
    with open(paths[0]) as fh:
        doc = json.load(fh)
    return (f"{doc.get('device', '?')} ({doc.get('sm', '?')}, {doc.get('sm_count', '?')} SMs), "
            f"driver {doc.get('driver', '?')}, NVRTC {doc.get('nvrtc', '?')}")


def base_of(spec):
    return spec.split(".cfg_")[0]


def cfg_of(spec):
    return spec.split(".cfg_")[1] if ".cfg_" in spec else "-"


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def pern(args):
    # (norm, phase) -> column; the standard runs time LayerNorm with a bias and RMSNorm without.
    columns = (("layernorm", "fwd", "LN fwd"), ("rmsnorm", "fwd", "RMS fwd"),
               ("layernorm", "bwd", "LN bwd"), ("rmsnorm", "bwd", "RMS bwd"))

    def table(paths):
        rows = {}
        for r in results(paths):
            norm, phase = r["spec"].split(".")[:2]
            phase = "bwd" if phase == "bwd" else "fwd"
            rows[(r["n"], norm, phase)] = r
        return rows

    a = table(args.files)
    b = table(args.vs) if args.vs else {}
    every = list(a.values()) + list(b.values())
    labels = args.labels or ["A", "B"]
    print(f"{device_line(args.files)}" + (f"; --vs: {device_line(args.vs)}" if args.vs else ""))
    print(f"max err/tol over every row: {max((r.get('max_err_over_tol', 0) for r in every), default=0):.3f}; "
          f"all verified: {all(r.get('verified', False) for r in every)}\n")
    what = f"% of copy, {labels[0]} / {labels[1]}" if args.vs else "% of copy"
    print("| N | M | " + " | ".join(f"{c[2]} ({what})" for c in columns) +
          f" | picks {' / '.join(c[2] for c in columns)} |")
    print("|---|---|" + "---|" * len(columns) + "---|")
    for n in sorted({k[0] for k in a}):
        cells, picks, ms = [], [], set()
        for norm, phase, _ in columns:
            ra, rb = a.get((n, norm, phase)), b.get((n, norm, phase))
            if ra:
                ms.add(ra["rows"])
            cell = f"{ra['pct_copy']:.1f}" if ra else "-"
            if args.vs:
                cell += f" / {rb['pct_copy']:.1f}" if rb else " / -"
            cells.append(cell)
            picks.append(cfg_of(ra["spec"]) if ra else "-")
        print(f"| {n} | {'/'.join(map(str, sorted(ms)))} | " + " | ".join(cells) + " | " + " / ".join(picks) + " |")
    if args.lowest:
        print(f"\nLowest {args.lowest}" + (f" ({labels[0]})" if args.vs else "") + ":\n")
        print("| spec | M | % of copy |")
        print("|---|---|---|")
        for r in sorted(a.values(), key=lambda r: r["pct_copy"])[:args.lowest]:
            print(f"| {r['spec']} | {r['rows']} | {r['pct_copy']:.1f} |")


def specs(args):
    rs = results(args.files)
    print(device_line(args.files) + "\n")
    print("| spec | M | µs | GB/s | % of copy | max err/tol | vs first of its base |")
    print("|---|---|---|---|---|---|---|")
    first = {}
    for r in rs:
        base = base_of(r.get("requested", r["spec"]))
        ref = first.setdefault(base, r)
        ratio = "-" if ref is r else f"{ref['us'] / r['us']:.3f}x"
        err = r.get("max_err_over_tol")
        err = "FAILED (NaN)" if err is None and r.get("verified") else "-" if err is None else f"{err:.3f}"
        print(f"| {r['spec']} | {r['rows']} | {r['us']:.2f} | {r['gbps']:.0f} | {r['pct_copy']:.1f} | {err} | {ratio} |")
    print("\nvs first of its base: the first timed spec's µs over this one's (> 1: this one is faster).")


def ab(args):
    runs = [("base", args.base), ("new", args.new)] + ([("base again", args.again)] if args.again else [])
    # Keyed by the spec as asked: the two trees may pick different configs for it.
    by_run = [{r.get("requested", r["spec"]): r for r in results(files)} for _, files in runs]
    print(device_line(args.base) + "\n")
    print("| spec | M | " + " | ".join(f"{label} % of copy" for label, _ in runs) + " | new / base |")
    print("|---|---|" + "---|" * len(runs) + "---|")
    for key, r in by_run[0].items():
        cells = [f"{run[key]['pct_copy']:.1f}" if key in run else "n/a" for run in by_run]
        new = by_run[1].get(key)
        ratio = f"{r['us'] / new['us']:.3f}x" if new else "n/a"
        name = r["spec"] if not new or new["spec"] == r["spec"] else f"{r['spec']} → {cfg_of(new['spec'])}"
        print(f"| {name} | {r['rows']} | " + " | ".join(cells) + f" | {ratio} |")
    print("\nnew / base: the base's µs over the new tree's (> 1: the change is faster).")


def launch(args):
    rs = results(args.files)
    print(device_line(args.files) + "\n")
    graph = [r for r in rs if "graph_us" in r]
    if graph:
        print("| spec | M | graph µs per launch | copy µs (M·N) | ratio | ratio to a copy of its own bytes |")
        print("|---|---|---|---|---|---|")
        for r in graph:
            print(f"| {r['spec']} | {r['rows']} | {r['graph_us']:.2f} | {r['copy_graph_us']:.2f} | "
                  f"{r['graph_ratio']:.3f} | {r['graph_ratio_same_bytes']:.3f} |")
    host = [r for r in rs if "host_launch_us" in r]
    if host:
        print("\n| spec | host µs per Kernel::launch | raw cuLaunchKernel µs | ratio | in-process get ns |")
        print("|---|---|---|---|---|")
        for r in host:
            print(f"| {r['spec']} | {r['host_launch_us']:.3f} | {r['raw_launch_us']:.3f} | "
                  f"{r['host_launch_ratio']:.2f} | {r['in_process_hit_ns']:.0f} |")


def load(args):
    # Per file (one process each): its first disk hit also pays for the process's first module load.
    first, rest, hits = [], [], []
    for path in args.files:
        rs = results([path])
        disk = [r for r in rs if r.get("first_get") == "disk hit"]
        first.extend(disk[:1])
        rest.extend(disk[1:])
        hits.extend(r["in_process_hit_ns"] for r in rs if "in_process_hit_ns" in r)
    print("| what | kernels | median | p90 | max |")
    print("|---|---|---|---|---|")
    for label, rows in (("disk hit", rest), ("disk hit, first in its process", first)):
        for what, key in (("whole get", "first_get_ms"), ("image: read, verify", "first_get_image_ms"),
                          ("module load", "first_get_module_ms")):
            vals = [r[key] for r in rows if key in r]
            if vals:
                print(f"| {label}: {what} (ms) | {len(vals)} | {statistics.median(vals):.3f} | "
                      f"{pct(vals, 0.9):.3f} | {max(vals):.3f} |")
    if hits:
        print(f"| in-process hit (ns) | {len(hits)} | {statistics.median(hits):.0f} | {pct(hits, 0.9):.0f} | "
              f"{max(hits):.0f} |")
    if not rest and not first:
        print("\n(no disk hits: were the specs precompiled into the bench's cache first?)")


def compile_times(args):
    runs = [item.partition("=") for item in args.runs]
    for item, (_, sep, _) in zip(args.runs, runs):
        if not sep:
            sys.exit(f"tables.py compile: expected LABEL=FILE.json, got {item!r}")
    print("| run | kernels compiled | threads | wall s | median ms | min-max ms | ms per kernel (wall) |")
    print("|---|---|---|---|---|---|---|")
    for label, _, path in runs:
        with open(path) as fh:
            doc = json.load(fh)
        ms = doc["compile_ms"]
        if not ms:
            print(f"| {label} | 0 (all {doc['cached']} cached) | {doc['jobs']} | {doc['seconds']:.2f} | - | - | - |")
            continue
        print(f"| {label} | {len(ms)} | {doc['jobs']} | {doc['seconds']:.2f} | {doc['median_compile_ms']:.1f} | "
              f"{min(ms):.0f}-{max(ms):.0f} | {1e3 * doc['seconds'] / len(ms):.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="table", required=True)
    p = sub.add_parser("pern", help="%% of copy per hidden size, with the picks")
    p.add_argument("files", nargs="+")
    p.add_argument("--vs", nargs="+", help="a second run to show beside the first")
    p.add_argument("--labels", nargs=2, metavar=("A", "B"))
    p.add_argument("--lowest", type=int, default=0, metavar="K", help="also list the K lowest rows")
    p.set_defaults(run=pern)
    for name, fn, what in (("specs", specs, "one row per spec, A/B against the first of its base"),
                           ("launch", launch, "graph replay and host launch rows"),
                           ("load", load, "disk-hit and in-process-hit times")):
        p = sub.add_parser(name, help=what)
        p.add_argument("files", nargs="+")
        p.set_defaults(run=fn)
    p = sub.add_parser("ab", help="one row per spec: base, new and base again")
    p.add_argument("--base", nargs="+", required=True)
    p.add_argument("--new", nargs="+", required=True)
    p.add_argument("--again", nargs="+")
    p.set_defaults(run=ab)
    p = sub.add_parser("compile", help="compile times per normjit-precompile --json run")
    p.add_argument("runs", nargs="+", metavar="LABEL=FILE.json")
    p.set_defaults(run=compile_times)
    args = ap.parse_args()
    try:
        args.run(args)
    except FileNotFoundError as e:
        sys.exit(f"tables.py {args.table}: {e.filename}: no such file")


if __name__ == "__main__":
    main()
