#!/usr/bin/env python3
"""Draws GB/s against N for normjit and every peer provider, one panel per norm, into a PNG.

Usage: plot.py --out bench/fwd_h200.png --phase fwd --date YYYY-MM-DD normjit.json peers.json [peers2.json ...]

The inputs are the ones report.py reads (normjit-bench --json, bench/peers.py --json; several peers
files are merged the same way). The dashed grey line is the device-to-device copy measured in
normjit-bench's process, the ceiling its "% copy" divides by. --date is the day the figures were
taken (the plot cannot know it).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display on the machines this runs on
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import PHASES, load_peers, nj_dtypes, order_providers, spec_phase  # noqa: E402

NORMS = ("layernorm", "rmsnorm")
# Fixed per provider so the fwd and bwd plots read alike; normjit stands out in colour and weight.
STYLE = {
    "normjit": dict(color="#d62728", marker="o", lw=2.8, ms=7, zorder=5),
    "normjit.torch": dict(color="#e377c2", marker="o", ls="--", lw=1.8, ms=5, zorder=4),
    "torch.eager": dict(color="#1f77b4", marker="s"),
    "torch.compile": dict(color="#ff7f0e", marker="^"),
    "liger": dict(color="#2ca02c", marker="D"),
    "cudnn": dict(color="#9467bd", marker="v"),
    "quack": dict(color="#8c564b", marker="P"),
}
OTHER = dict(color="#17becf", marker="x")
PEER_LINE = dict(lw=1.4, ms=5, zorder=3)


def n_label(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def describe(values):
    values = sorted({str(v) for v in values if v is not None})
    return "/".join(values) or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--phase", choices=PHASES, default="fwd")
    ap.add_argument("--date", required=True, help="when the figures were measured, for the title")
    ap.add_argument("normjit", help="normjit-bench --json output")
    ap.add_argument("peers", nargs="+", help="bench/peers.py --json output(s), merged in order")
    args = ap.parse_args()

    with open(args.normjit) as fh:
        nj = json.load(fh)
    nj_results = [r for r in nj["results"] if spec_phase(r["spec"]) == args.phase]
    peer_results, _, _ = load_peers(args.peers, args.phase)
    if not nj_results and not peer_results:
        sys.exit(f"plot.py: no {args.phase} results in the inputs")

    # provider -> norm -> {N: GB/s}; copy: norm -> {N: GB/s} from normjit's process.
    series, copy = {}, {}
    for r in nj_results:
        norm = r["spec"].split(".")[0]
        series.setdefault("normjit", {}).setdefault(norm, {})[r["n"]] = r["gbps"]
        copy.setdefault(norm, {})[r["n"]] = r["copy_gbps"]
    for r in peer_results:
        series.setdefault(r["provider"], {}).setdefault(r["norm"], {})[r["n"]] = r["gbps"]
    providers = ["normjit"] + order_providers(p for p in series if p != "normjit")
    present = {norm for s in series.values() for norm in s}
    norms = [nm for nm in NORMS if nm in present] + sorted(present - set(NORMS))

    fig, axes = plt.subplots(1, len(norms), figsize=(6.4 * len(norms), 4.8), sharey=True, squeeze=False)
    for ax, norm in zip(axes[0], norms):
        ns = sorted({n for s in series.values() for n in s.get(norm, {})} | set(copy.get(norm, {})))
        if norm in copy:
            pts = sorted(copy[norm].items())
            ax.plot([n for n, _ in pts], [g for _, g in pts], ls="--", color="grey", lw=1.3, zorder=2,
                    label="copy (normjit process)")
        # Peers first, normjit last, so normjit's line is drawn on top.
        for p in providers[1:] + providers[:1]:
            pts = sorted(series.get(p, {}).get(norm, {}).items())
            if not pts:
                continue
            style = STYLE.get(p, OTHER) if p == "normjit" else {**PEER_LINE, **STYLE.get(p, OTHER)}
            ax.plot([n for n, _ in pts], [g for _, g in pts], label=p, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([n_label(n) for n in ns])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("N (elements per row)")
        ax.set_title(norm)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("GB/s")
    # One legend for all panels, below them so it hides no point: normjit first, the copy line last.
    legend = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, h)
    labels = [p for p in providers if p in legend] + [lb for lb in legend if lb not in providers]
    fig.legend([legend[lb] for lb in labels], labels, loc="lower center", ncol=min(len(labels), 8), fontsize=9,
               frameon=False)

    dtypes = {nj_dtypes(r["spec"]) for r in nj_results}
    if args.phase == "bwd":
        what = "Backward: dx, dgamma (+ dbeta)"
        dts = f"x {describe(x for x, _ in dtypes)}, weights {describe(w for _, w in dtypes)}"
    else:
        what = "Forward: y = norm(x)"
        dts = describe(x for x, _ in dtypes)
    rows = describe([r.get("rows") for r in nj_results] + [r.get("rows") for r in peer_results])
    fig.suptitle(f"{what} · {nj.get('device', '?')} · {dts} · M = {rows} rows · {args.date}")
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend row
    fig.savefig(args.out, dpi=150)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
