#!/usr/bin/env python3
"""Per-call cost of normjit.torch against torch's own norms at a launch-bound shape.

Host time: wall time of issuing `--calls` calls in a loop with no synchronization inside (fewer
than the launch queue holds, so the host never waits for the GPU), synchronized between
samples; median of `--samples` samples, providers alternating so drift hits all alike.
Graph replay: `--calls` calls captured in one CUDA graph, the replay timed with CUDA events;
device time per call, to set next to `normjit-bench --graph` of the same spec.

    python3 bench/torch_host_time.py --rows 4096 --n 768 --json out.json
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from peers import graph_replay_us  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def python_path(fn):
    """fn through normjit.torch's Python autograd path instead of its C++ one."""
    from normjit.torch import _native

    def call(*args):
        native, _native.eager_norm = _native.eager_norm, None
        try:
            return fn(*args)
        finally:
            _native.eager_norm = native
    return call


def providers(norm, n, eps):
    import normjit.torch as njt
    from normjit.torch import _native
    if norm == "layernorm":
        out = {"torch": lambda x, w, b: F.layer_norm(x, (n,), w, b, eps),
               "normjit.torch": lambda x, w, b: njt.layer_norm(x, (n,), w, b, eps)}
    else:
        out = {"torch": lambda x, w, b: F.rms_norm(x, (n,), w, eps),
               "normjit.torch": lambda x, w, b: njt.rms_norm(x, (n,), w, eps)}
    if _native.eager_norm is not None:  # the C++ path is normjit.torch's; the Python one beside it
        out["normjit.torch (Python autograd)"] = python_path(out["normjit.torch"])
    return out


def host_us(step, calls, samples):
    """Median over samples of the wall time per call of `calls` unsynchronized calls of step()."""
    out = {}
    for _ in range(samples):
        for name, fn in step.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            out.setdefault(name, []).append((t1 - t0) * 1e6 / calls)
    torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--norms", default="layernorm,rmsnorm")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--samples", type=int, default=21)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    dtype, eps, results = DTYPES[args.dtype], 1e-5, []
    for norm in args.norms.split(","):
        fns = providers(norm, args.n, eps)
        x = torch.randn(args.rows, args.n, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        w = torch.randn(args.n, device="cuda", dtype=dtype) * 0.5 + 1
        b = torch.randn(args.n, device="cuda", dtype=dtype) if norm == "layernorm" else None
        xg = x.detach().requires_grad_()
        wg = w.detach().requires_grad_()
        bg = None if b is None else b.detach().requires_grad_()

        def infer(f):
            def call():
                with torch.no_grad():
                    f(x, w, b)
            return call

        def train(f):
            def call():
                f(xg, wg, bg).backward(dy)
            return call

        for f in fns.values():  # compile and load outside the timing
            infer(f)()
            train(f)()
        for what, make in (("forward (no grad)", infer), ("forward + backward (autograd)", train)):
            t = host_us({name: make(f) for name, f in fns.items()}, args.calls, args.samples)
            r = dict(norm=norm, rows=args.rows, n=args.n, dtype=args.dtype, what=what, mode="eager host",
                     us=t, ratio={name: v / t["torch"] for name, v in t.items() if name != "torch"})
            results.append(r)
            print(f"{norm:9s} {what:30s} eager host us/call: torch {t['torch']:7.2f}" +
                  "".join(f"  {name} {v:7.2f} ({v / t['torch']:.2f}x)" for name, v in t.items() if name != "torch"),
                  flush=True)
        g = {}
        for name, f in fns.items():
            g[name] = graph_replay_us(lambda i, call=infer(f): call(), 1, args.calls, reps=25)
        r = dict(norm=norm, rows=args.rows, n=args.n, dtype=args.dtype, what="forward (no grad)",
                 mode="graph replay device", us=g, ratio={name: v / g["torch"] for name, v in g.items() if name != "torch"})
        results.append(r)
        print(f"{norm:9s} {'forward (no grad)':30s} graph replay us/call: torch {g['torch']:7.2f}" +
              "".join(f"  {name} {v:7.2f}" for name, v in g.items() if name != "torch"), flush=True)
    with open(args.json, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=results), fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
