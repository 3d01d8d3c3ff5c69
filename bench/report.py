#!/usr/bin/env python3
"""Merges normjit-bench --json and bench/peers.py --json into a markdown table (GB/s and % of copy).

Usage: report.py normjit.json peers.json [peers2.json ...] [fwd|bwd]   (default fwd)
Columns: normjit (and "normjit inference" where fwd_infer specs ran beside fwd_train ones), then
every peer provider present, in the order torch.eager, torch.compile, liger,
cudnn, quack, then any other by name; "n/a" where a provider has no figure for a row. Several peers
files are merged: a later file's result replaces an earlier one for the same provider, norm and N,
so a rerun of some providers can be laid over a full run.
The phase picks normjit specs by their second token (`bwd` vs the forward ones) and peer results by
their `phase` field (forward peer files written before that field existed count as fwd).
"""
import json
import os
import sys

PROVIDER_ORDER = ("normjit.torch", "torch.eager", "torch.compile", "liger", "cudnn", "quack")
PHASES = ("fwd", "bwd")
INFER_COLUMN = "normjit inference"


def spec_phase(spec):
    return "bwd" if spec.split(".")[1] == "bwd" else "fwd"


def order_providers(names):
    """Peer providers in table order: the known ones first, in PROVIDER_ORDER, then the rest by name."""
    names = set(names)
    return [p for p in PROVIDER_ORDER if p in names] + sorted(names - set(PROVIDER_ORDER))


def load_peers(paths, phase):
    """One phase's peer results from several peers.py files, a later file's result replacing an
    earlier one per (provider, norm, N). Also returns the files' torch versions and the peer
    library versions they recorded."""
    merged, torch_versions, libs = {}, [], {}
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        if doc.get("torch") and doc["torch"] not in torch_versions:
            torch_versions.append(doc["torch"])
        libs.update(doc.get("peers", {}))
        for r in doc.get("results", []):
            if r.get("phase", "fwd") == phase:
                merged[(r["provider"], r["norm"], r["n"])] = r
    return list(merged.values()), torch_versions, libs


def parse_args(argv):
    """[normjit.json, peers.json, ..., fwd|bwd] -> (normjit path, [peers paths], phase)."""
    phase = "fwd"
    if argv and argv[-1] in PHASES:
        phase, argv = argv[-1], argv[:-1]
    elif len(argv) >= 3 and not os.path.exists(argv[-1]) and not argv[-1].endswith(".json"):
        sys.exit(f"report.py: phase must be fwd or bwd, not {argv[-1]!r}")
    if len(argv) < 2:
        sys.exit("usage: report.py normjit.json peers.json [peers2.json ...] [fwd|bwd]")
    return argv[0], argv[1:], phase


def copy_cell(values):
    """The peers' copy bandwidth for a row: one figure, or a range when merged runs measured different ones."""
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}"


def main(normjit_json, peers_jsons, phase="fwd"):
    if phase not in PHASES:
        sys.exit(f"report.py: phase must be fwd or bwd, not {phase!r}")
    with open(normjit_json) as fh:
        nj = json.load(fh)
    nj_results = [r for r in nj["results"] if spec_phase(r["spec"]) == phase]
    peer_results, torch_versions, libs = load_peers(peers_jsons, phase)
    rows = {}
    # Inference forwards beside training ones get their own column (normjit.torch's no-grad call
    # runs the inference kernel); alone, they are normjit's figure.
    train_too = any(r["spec"].split(".")[1] != "fwd_infer" for r in nj_results)
    nj_columns = ["normjit"]
    for r in nj_results:
        norm, phase_token = r["spec"].split(".")[:2]
        column = INFER_COLUMN if phase_token == "fwd_infer" and train_too else "normjit"
        if column not in nj_columns:
            nj_columns.append(column)
        rows.setdefault((norm, r["n"]), {})[column] = (r["gbps"], r["pct_copy"], r["us"])
        rows[(norm, r["n"])]["copy_nj"] = r["copy_gbps"]
    for r in peer_results:
        d = rows.setdefault((r["norm"], r["n"]), {})
        d[r["provider"]] = (r["gbps"], r["pct_copy"], r["us"])
        d.setdefault("copy_torch", []).append(r["copy_gbps"])
    peers = order_providers(r["provider"] for r in peer_results)
    providers = nj_columns + peers
    device = (f"Device: {nj['device']} ({nj['sm']}, {nj['sm_count']} SMs), driver {nj['driver']}, NVRTC {nj['nvrtc']}, "
              f"torch {' / '.join(torch_versions) or '?'}")
    if phase == "fwd":
        print(device)  # unchanged forward title
    else:
        print(f"Phase bwd (dx, dgamma, + dbeta for LayerNorm; bytes = 3·M·N·x + N·w·(1 + weight grads)). "
              f"{device}")
    if libs:
        print("Peers: " + ", ".join(f"{p} {libs[p]}" for p in order_providers(libs)))
    print()
    if phase == "bwd":
        # A row only compares like with like if both sides ran the same dtypes and row count.
        peer_cfg = sorted({(r.get("dtype"), r.get("wdtype"), r.get("rows")) for r in peer_results}, key=str)
        nj_cfg = sorted({nj_dtypes(r["spec"]) + (r.get("rows"),) for r in nj_results}, key=str)
        print(f"x/weight dtypes, rows: normjit {fmt_cfg(nj_cfg)}; peers {fmt_cfg(peer_cfg)}\n")
    print("| norm | N | " + " | ".join(f"{p} GB/s (% copy)" for p in providers) +
          " | copy GB/s (normjit proc / torch proc) | normjit vs best peer |")
    print("|---|---|" + "---|" * len(providers) + "---|---|")
    for (norm, n) in sorted(rows):
        d = rows[(norm, n)]
        cells = []
        for p in providers:
            cells.append(f"{d[p][0]:.0f} ({d[p][1]:.1f} %)" if p in d else "n/a")
        # normjit.torch is normjit through its PyTorch ops, not a peer.
        best_peer = max((d[p][0] for p in peers if p in d and p != "normjit.torch"), default=None)
        ratio = f"{d['normjit'][0] / best_peer:.2f}x" if best_peer and "normjit" in d else "n/a"
        copy_nj = f"{d['copy_nj']:.0f}" if "copy_nj" in d else "n/a"
        print(f"| {norm} | {n} | " + " | ".join(cells) +
              f" | {copy_nj} / {copy_cell(d.get('copy_torch', []))} | {ratio} |")


def nj_dtypes(spec):
    """(x dtype, weight dtype) of a spec; `w_` defaults to the x dtype when the spec omits it."""
    tokens = spec.split(".")
    w = next((t[2:] for t in tokens[3:] if t.startswith("w_")), tokens[2])
    return (tokens[2], w)


def fmt_cfg(cfgs):
    return ", ".join(f"{x}/{w}, M={rows if rows is not None else '?'}" for x, w, rows in cfgs) or "none"


if __name__ == "__main__":
    main(*parse_args(sys.argv[1:]))
