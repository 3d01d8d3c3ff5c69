#!/usr/bin/env python3
"""Peer providers for normjit's norms, timed the way normjit-bench times normjit.

CUDA events around batches of launches, median over batches after a warm-up, rotating over
enough input/output sets to exceed 4x the L2, fresh random inputs, and a device-to-device copy
of the same bytes measured in the same process.

--phase fwd (default): y = norm(x). Bytes: x read once + y written once + weights.
--phase bwd: only the backward is timed: dx, dgamma (+ dbeta for LayerNorm, which has a bias)
from dy, x, the saved statistics and gamma. Defaults follow PyTorch genai_layers'
LayerNormBackward setting: bf16 x, fp32 weights, M = 32768.
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
        # Every shape recompiles the same lambda; past Dynamo's recompile limit (8) it would
        # silently fall back to eager, so start each shape from a clean Dynamo state.
        torch._dynamo.reset()
        f = torch.compile(f, dynamic=False)
    return f


def run_fwd(args):
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


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------

def norm_fn(norm, n, eps):
    """The forward whose gradients are wanted; b is ignored for RMSNorm (it has no bias)."""
    if norm == "layernorm":
        return lambda x, w, b: F.layer_norm(x, (n,), w, b, eps)
    return lambda x, w, b: F.rms_norm(x, (n,), w, eps)


def upcast_fn(norm, n, eps):
    """genai_layers' reference forward: x upcast to fp32 (so mixed bf16 x / fp32 weights run), y cast back."""
    f = norm_fn(norm, n, eps)
    return lambda x, w, b: f(x.float(), w, b).to(x.dtype)


def autograd_grads(norm, f, xs, dys, w, b):
    """Per buffer set, one forward graph built up front; each call then runs only its backward.

    retain_graph=True keeps the saved tensors so the same graph can be differentiated again."""
    wl = w.detach().requires_grad_()
    bl = b.detach().requires_grad_() if norm == "layernorm" else None
    xls = [x.detach().requires_grad_() for x in xs]
    with torch.enable_grad():
        outs = [f(xl, wl, bl) for xl in xls]
    if outs[0].dtype != dys[0].dtype:
        # autograd casts dy to y's dtype inside the timed call; say so rather than hide it.
        print(f"  note: y is {outs[0].dtype}, dy is {dys[0].dtype}: the timed backward includes a cast", flush=True)
    params = (wl,) if bl is None else (wl, bl)
    return lambda i: torch.autograd.grad(outs[i], (xls[i],) + params, dys[i], retain_graph=True)


def eager_candidates(norm, n, eps, xs, dys, w, b):
    """(name, builder) pairs, most direct first; builders return fn(i) -> (dx, dgamma[, dbeta])."""
    aten = torch.ops.aten

    def ln_native():
        # Statistics computed once up front, as a training forward would have saved them.
        stats = [aten.native_layer_norm(x, [n], w, b, eps)[1:] for x in xs]
        return lambda i: aten.native_layer_norm_backward(dys[i], xs[i], [n], stats[i][0], stats[i][1], w, b,
                                                         [True, True, True])

    def rms_fused():
        # With fp32 weights its dgamma may come back in x's dtype (torch 2.15's meta kernel says so);
        # max_abs_err_dw then shows what that costs.
        rstds = [aten._fused_rms_norm(x, [n], w, eps)[1] for x in xs]
        return lambda i: aten._fused_rms_norm_backward(dys[i], xs[i], [n], rstds[i], w, [True, True])

    out = []
    if norm == "layernorm":
        out.append(("aten.native_layer_norm_backward", ln_native))
    elif hasattr(aten, "_fused_rms_norm_backward") and hasattr(aten, "_fused_rms_norm"):
        out.append(("aten._fused_rms_norm_backward", rms_fused))
    if xs[0].dtype != w.dtype:
        # Eager kernels reject mixed dtypes; genai_layers' eager backend upcasts x instead.
        out.append(("autograd(x upcast, genai_layers)", lambda: autograd_grads(norm, upcast_fn(norm, n, eps), xs, dys, w, b)))
    out.append(("autograd", lambda: autograd_grads(norm, norm_fn(norm, n, eps), xs, dys, w, b)))
    return out


def compile_candidates(norm, n, eps, xs, dys, w, b):
    f = norm_fn(norm, n, eps)

    def vjp():
        # The whole (dy, x, w, b) -> grads function is one graph: forward statistics are recomputed
        # inside it (Inductor fuses them into the backward's row reduction; y itself is dead code).
        def grads(dy, x, w, b):
            if b is None:
                _, pull = torch.func.vjp(lambda x, w: f(x, w, None), x, w)
            else:
                _, pull = torch.func.vjp(f, x, w, b)
            return pull(dy)
        cf = torch.compile(grads, dynamic=False, fullgraph=True)
        return lambda i: cf(dys[i], xs[i], w, b)

    def fwd_then_autograd():
        # Fallback: compiled forward, its AOT-compiled backward run by autograd (the training path).
        return autograd_grads(norm, torch.compile(f, dynamic=False), xs, dys, w, b)

    def genai_layers():
        # genai_layers' "compiled" backend: the compiled upcast forward, then autograd runs its
        # AOT-compiled backward; only the backward is timed.
        return autograd_grads(norm, torch.compile(upcast_fn(norm, n, eps), dynamic=False, fullgraph=True), xs, dys, w, b)

    return [("compile(fwd, genai_layers)+autograd", genai_layers), ("compile(func.vjp)", vjp),
            ("compile(fwd)+autograd", fwd_then_autograd)]


def reference_errors(norm, n, eps, x, dy, w, b, dx, dw, chunk_elems=1 << 26):
    """Max |dx - ref| and |dgamma - ref| against float64 autograd, in row chunks so the float64
    copies of a 32768 x 65536 problem fit next to the buffers; dgamma sums the chunks' shares."""
    f = norm_fn(norm, n, eps)
    wd = w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    rows = max(1, chunk_elems // n)
    err_dx, dw_ref = 0.0, torch.zeros_like(wd, requires_grad=False)
    for r0 in range(0, x.shape[0], rows):
        xd = x[r0:r0 + rows].double().requires_grad_()
        with torch.enable_grad():
            y = f(xd, wd, bd)
            gx, gw = torch.autograd.grad(y, (xd, wd), dy[r0:r0 + rows].double())
        err_dx = max(err_dx, (dx[r0:r0 + rows].double() - gx).abs().max().item())
        dw_ref += gw
        del xd, y, gx, gw
    return err_dx, (dw.double() - dw_ref).abs().max().item()


def first_line(e, limit=160):
    """Short reason for a skip: torch errors run to many lines (dispatch key lists and the like)."""
    text = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def dump(path, results):
    with open(path, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=results), fh, indent=1)


def run_bwd(args):
    dtype, wdtype = DTYPES[args.dtype], DTYPES[args.wdtype]
    eps = 1e-5
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    m = args.rows
    item = torch.tensor([], dtype=dtype).element_size()
    witem = torch.tensor([], dtype=wdtype).element_size()
    results = []
    for norm in args.norms.split(","):
        n_wgrads = 2 if norm == "layernorm" else 1  # dgamma, dbeta / dgamma
        for n in map(int, args.ns.split(",")):
            x_bytes = m * n * item
            # Each call reads x and dy: rotate until those inputs exceed 4x the L2.
            sets = max(1, min(64, (4 * l2) // (2 * x_bytes) + 1))
            try:
                xs = [torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.5 for _ in range(sets)]
                dys = [torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(sets)]
                ys = [torch.empty_like(x) for x in xs]  # copy destinations only
            except torch.cuda.OutOfMemoryError as e:
                print(f"skip {norm} N={n}: inputs do not fit ({first_line(e)})", flush=True)
                torch.cuda.empty_cache()
                continue
            w = torch.randn(n, device="cuda", dtype=wdtype) * 0.5 + 1
            b = torch.randn(n, device="cuda", dtype=wdtype) * 0.5 if norm == "layernorm" else None
            copy_us = median_us(lambda i: ys[i].copy_(xs[i]), sets)
            copy_gbps = 2 * x_bytes / copy_us * 1e-3
            # genai_layers' backward count: x, dy read and dx written (3*M*N*itemsize(x)), gamma read and
            # each weight gradient written once (dgamma; + dbeta for LayerNorm). Saved stats (8*M bytes at
            # most) are left out, as there.
            #   bytes = 3*M*N*x_itemsize + N*w_itemsize*(1 + number of weight grads written)
            nbytes = 3 * x_bytes + n * witem * (1 + n_wgrads)
            for provider in args.providers.split(","):
                if provider == "torch.eager":
                    candidates = eager_candidates(norm, n, eps, xs, dys, w, b)
                elif provider == "torch.compile":
                    # Fresh Dynamo caches per shape: with dynamic=False each N is a recompile, and the
                    # recompile limit (8 per function) would otherwise drop the 9th N to eager silently.
                    torch._dynamo.reset()
                    candidates = compile_candidates(norm, n, eps, xs, dys, w, b)
                else:
                    print(f"skip {provider}: unknown provider", flush=True)
                    continue
                fn, impl, why = None, None, []
                for name, build in candidates:
                    try:
                        fn = build()
                        grads = fn(0)  # compiles (torch.compile) and gives the outputs to check
                        torch.cuda.synchronize()
                        impl = name
                        break
                    except Exception as e:  # noqa: BLE001 - any failure means: try the next way
                        why.append(f"{name}: {first_line(e)}")
                        fn = None
                        torch.cuda.empty_cache()
                if fn is None:
                    print(f"skip {provider:14s} {norm:9s} N={n:6d}: " + "; ".join(why), flush=True)
                    continue
                if why:
                    print(f"  {provider}: fell back to {impl} ({'; '.join(why)})", flush=True)
                try:
                    err, err_dw = reference_errors(norm, n, eps, xs[0], dys[0], w, b, grads[0], grads[1])
                    del grads
                    us = median_us(fn, sets)
                except Exception as e:  # noqa: BLE001 - keep the other providers and shapes going
                    print(f"skip {provider:14s} {norm:9s} N={n:6d}: {first_line(e)}", flush=True)
                    grads = fn = None
                    torch.cuda.empty_cache()
                    continue
                gbps = nbytes / us * 1e-3
                r = dict(provider=provider, norm=norm, n=n, rows=m, dtype=args.dtype, wdtype=args.wdtype, phase="bwd",
                         us=us, gbps=gbps, copy_gbps=copy_gbps, pct_copy=100 * gbps / copy_gbps, max_abs_err=err,
                         max_abs_err_dw=err_dw, impl=impl)
                results.append(r)
                print(f"{provider:14s} {norm:9s} N={n:6d} {us:9.2f} us {gbps:8.1f} GB/s {r['pct_copy']:5.1f}% of copy "
                      f"({copy_gbps:.0f}) err dx {err:.3g} dgamma {err_dw:.3g} [{impl}]", flush=True)
                fn = None  # drops the provider's graphs / saved tensors before the next one
                torch.cuda.empty_cache()
            del xs, dys, ys
            torch.cuda.empty_cache()
            # Rewritten after every shape so a run cut short still leaves its figures.
            dump(args.json, results)
    dump(args.json, results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--norms", default="layernorm,rmsnorm")
    ap.add_argument("--ns", default="256,512,1024,2048,4096,8192,16384,32768,65536")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--wdtype", default=None, choices=sorted(DTYPES),
                    help="gamma/beta dtype, --phase bwd only (default f32); fwd uses --dtype")
    ap.add_argument("--providers", default="torch.eager,torch.compile")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    if args.phase == "fwd":
        if args.wdtype is not None:
            ap.error("--wdtype applies to --phase bwd only (the forward keeps weights in --dtype)")
        return run_fwd(args)
    if args.wdtype is None:
        args.wdtype = "f32"
    return run_bwd(args)


if __name__ == "__main__":
    sys.exit(main())
