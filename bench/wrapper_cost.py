#!/usr/bin/env python3
"""What normjit.torch adds to normjit's kernels: the same kernel launched raw (the binding's
Kernel.launch on preallocated tensors, as a C++ host does) and through normjit.torch (forward under
no_grad; backward through autograd, as a model runs it), with the same buffers in one process.

Eager: CUDA events around batches of calls, median; where the host cannot keep up with the GPU
(small N, or autograd's engine) the time is the host's. Graph: the same calls captured in a CUDA
graph and replayed (the backward: what normjit.torch's autograd node runs): device time only, so a
ratio above 1 there would be device work the wrapper adds. Buffers rotate over sets that together exceed twice the L2; inputs are fresh random values.

    python3 bench/wrapper_cost.py --ns 768,4096 --rows 32768 --json out.json [--bench normjit-bench.json...]
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch

import normjit.torch as njt
from normjit.torch import _launch

sys.path.insert(0, str(Path(__file__).parent))
from peers import graph_replay_us, median_us  # noqa: E402

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def case(norm, phase, n, rows, dtype, wdtype, eps=1e-5):
    dev = torch.device("cuda", 0)
    x_bytes = rows * n * dtype.itemsize
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sets = max(2, min(32, (4 * l2) // (2 * x_bytes) + 1))
    xs = [torch.randn(rows, n, device=dev).to(dtype) for _ in range(sets)]
    w = (1 + 0.1 * torch.randn(n, device=dev)).to(wdtype)
    b = torch.randn(n, device=dev).to(wdtype) if norm == "layernorm" else None
    bp = 0 if b is None else b.data_ptr()
    current_stream = torch._C._cuda_getCurrentRawStream  # read per launch: a capture runs on its own stream
    if norm == "layernorm":
        f = lambda x, w, b: njt.layer_norm(x, (n,), w, b, eps)  # noqa: E731
    else:
        f = lambda x, w, b: njt.rms_norm(x, (n,), w, eps)  # noqa: E731
    if phase == "fwd":
        ys = [torch.empty_like(x) for x in xs]
        key = (0, norm, "fwd_infer", dtype, wdtype, n, b is not None, "none", False, False)
        kernel = _launch._kernel(key, xs[0].data_ptr(), w.data_ptr(), bp, ys[0].data_ptr(), 0, 0, 0, 0, 0, n)

        def raw(i):
            kernel.launch(xs[i].data_ptr(), w.data_ptr(), bp, 0, 0, ys[i].data_ptr(), 0, 0, 0, 0, 0, 0, 0,
                          0.0, math.inf, rows, n, 0, eps, current_stream(0))

        def wrapped(i):
            with torch.no_grad():
                f(xs[i], w, b)
    else:
        dys = [torch.randn(rows, n, device=dev).to(dtype) for _ in range(sets)]
        means = [torch.empty(rows, device=dev) for _ in range(sets)]
        rstds = [torch.empty(rows, device=dev) for _ in range(sets)]
        for x, m, r in zip(xs, means, rstds):  # the saved statistics, as a training forward leaves them
            m.copy_(x.float().mean(-1) if norm == "layernorm" else torch.zeros(rows, device=dev))
            xc = x.float() - m[:, None] if norm == "layernorm" else x.float()
            r.copy_(torch.rsqrt(xc.square().mean(-1) + eps))
        dxs = [torch.empty_like(x) for x in xs]
        dg = torch.empty_like(w)
        db = torch.empty_like(w) if b is not None else None
        dbp = 0 if db is None else db.data_ptr()
        key = (0, norm, "bwd", dtype, wdtype, n, b is not None, "none", False, False)
        kernel = _launch._kernel(key, xs[0].data_ptr(), w.data_ptr(), 0, 0, dys[0].data_ptr(), dxs[0].data_ptr(),
                                 dg.data_ptr(), dbp, 0, n)
        ws_bytes = kernel.workspace_bytes(rows, 0)
        ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=dev)

        def raw(i):
            kernel.launch(xs[i].data_ptr(), w.data_ptr(), 0, means[i].data_ptr() if norm == "layernorm" else 0,
                          rstds[i].data_ptr(), 0, dys[i].data_ptr(), dxs[i].data_ptr(), dg.data_ptr(), dbp,
                          ws.data_ptr(), ws_bytes, 0, 0.0, math.inf, rows, n, 0, 0.0, current_stream(0))

        wl = w.detach().requires_grad_()
        bl = None if b is None else b.detach().requires_grad_()
        xls = [x.detach().requires_grad_() for x in xs]
        outs = [f(xl, wl, bl) for xl in xls]
        params = (wl,) if bl is None else (wl, bl)

        def wrapped(i):
            torch.autograd.grad(outs[i], (xls[i],) + params, dys[i], retain_graph=True)

        # A capture of the backward alone cannot go through autograd (its engine runs the backward on
        # the forward's stream): the graph holds what the autograd node runs, normjit.torch's backward.
        def wrapped_graph(i):
            _launch.backward(dys[i], xs[i], w, means[i] if norm == "layernorm" else None, rstds[i], None, norm,
                             "none", b is not None)
    if phase == "fwd":
        wrapped_graph = wrapped
    r = dict(norm=norm, phase=phase, n=n, rows=rows, spec=str(kernel.spec), sets=sets)
    r["eager_raw_us"] = median_us(raw, sets, warmup=3)
    r["eager_torch_us"] = median_us(wrapped, sets, warmup=3)
    r["graph_raw_us"] = graph_replay_us(raw, sets)
    r["graph_torch_us"] = graph_replay_us(wrapped_graph, sets)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="768,2880,4096,7168,12288,18432,32768")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--phases", default="fwd,bwd")
    ap.add_argument("--json", required=True)
    ap.add_argument("--bench", nargs="*", default=[], help="normjit-bench --json files to set beside")
    args = ap.parse_args()
    bench = {}
    for path in args.bench:
        for r in json.load(open(path))["results"]:
            bench[r["spec"]] = r["us"]
    results = []
    print("| norm | phase | N | kernel | normjit-bench µs | eager raw µs | eager normjit.torch µs | ratio "
          "| graph raw µs | graph normjit.torch µs | ratio |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for phase in args.phases.split(","):
        for norm in ("layernorm", "rmsnorm"):
            for n in map(int, args.ns.split(",")):
                wdtype = torch.bfloat16 if phase == "fwd" else torch.float32
                r = case(norm, phase, n, args.rows, torch.bfloat16, wdtype)
                r["bench_us"] = bench.get(r["spec"])
                results.append(r)
                cfg = r["spec"].split(".cfg_")[-1]
                nb = f"{r['bench_us']:.1f}" if r["bench_us"] else "n/a"
                print(f"| {norm} | {phase} | {n} | {cfg} | {nb} | {r['eager_raw_us']:.1f} | {r['eager_torch_us']:.1f} "
                      f"| {r['eager_torch_us'] / r['eager_raw_us']:.3f} | {r['graph_raw_us']:.1f} "
                      f"| {r['graph_torch_us']:.1f} | {r['graph_torch_us'] / r['graph_raw_us']:.3f} |", flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=results),
              open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
