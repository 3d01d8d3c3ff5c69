#!/usr/bin/env python3
"""Peer providers for normjit's forward norms, timed the way normjit-bench times normjit.

CUDA events around batches of launches, median over batches after a warm-up, rotating over
enough input/output sets to exceed 4x the L2, fresh random inputs, and a device-to-device copy
of the same bytes measured in the same process. Bytes: x read once + y written once + weights.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def median_us(fn, sets, warmup=5, reps=25, batch=10):
    for i in range(warmup):
        fn(i % sets)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call, k = [], 0
    for _ in range(reps):
        start.record()
        for _ in range(batch):
            fn(k % sets)
            k += 1
        stop.record()
        stop.synchronize()
        per_call.append(1000.0 * start.elapsed_time(stop) / batch)
    return statistics.median(per_call)


def make_fn(provider, norm, n, eps):
    if norm == "layernorm":
        f = lambda x, w, b: F.layer_norm(x, (n,), w, b, eps)
    else:
        f = lambda x, w, b: F.rms_norm(x, (n,), w, eps)
    if provider == "torch.compile":
        f = torch.compile(f, dynamic=False)
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--norms", default="layernorm,rmsnorm")
    ap.add_argument("--ns", default="256,512,1024,2048,4096,8192,16384,32768,65536")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--providers", default="torch.eager,torch.compile")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    results = []
    for norm in args.norms.split(","):
        for n in map(int, args.ns.split(",")):
            m, item = args.rows, torch.tensor([], dtype=dtype).element_size()
            x_bytes = m * n * item
            sets = max(1, min(64, (4 * l2) // (2 * x_bytes) + 1))
            xs = [torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.5 for _ in range(sets)]
            ys = [torch.empty_like(x) for x in xs]
            w = torch.randn(n, device="cuda", dtype=dtype) * 0.5 + 1
            b = torch.randn(n, device="cuda", dtype=dtype) * 0.5 if norm == "layernorm" else None
            copy_us = median_us(lambda i: ys[i].copy_(xs[i]), sets)
            copy_gbps = 2 * x_bytes / copy_us * 1e-3
            nbytes = 2 * x_bytes + n * item * (2 if b is not None else 1)
            for provider in args.providers.split(","):
                fn = make_fn(provider, norm, n, 1e-5)
                ref = F.layer_norm(xs[0].double(), (n,), w.double(), None if b is None else b.double(), 1e-5) \
                    if norm == "layernorm" else F.rms_norm(xs[0].double(), (n,), w.double(), 1e-5)
                err = (fn(xs[0], w, b).double() - ref).abs().max().item()
                us = median_us(lambda i: fn(xs[i], w, b), sets)
                gbps = nbytes / us * 1e-3
                r = dict(provider=provider, norm=norm, n=n, rows=m, dtype=args.dtype, us=us, gbps=gbps,
                         copy_gbps=copy_gbps, pct_copy=100 * gbps / copy_gbps, max_abs_err=err)
                results.append(r)
                print(f"{provider:14s} {norm:9s} N={n:6d} {us:9.2f} us {gbps:8.1f} GB/s {r['pct_copy']:5.1f}% of copy "
                      f"({copy_gbps:.0f}) err {err:.3g}", flush=True)
            del xs, ys
            torch.cuda.empty_cache()
            # Rewritten after every shape so a run cut short still leaves its figures.
            json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=results),
                      open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
