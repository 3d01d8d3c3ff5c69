#!/usr/bin/env python3
"""Peer providers for normjit's norms, timed the way normjit-bench times normjit.

CUDA events around batches of launches, median over batches after a warm-up, rotating over
enough input/output sets to exceed 4x the L2, fresh random inputs, and a device-to-device copy
of the same bytes measured in the same process.

--phase fwd (default): y = norm(x). Bytes: x read once + y written once + weights.
--phase bwd: only the backward is timed: dx, dgamma (+ dbeta for LayerNorm, which has a bias)
from dy, x, the saved statistics and gamma. Defaults follow PyTorch genai_layers'
LayerNormBackward setting: bf16 x, fp32 weights, M = 32768.

Providers (--providers): torch.eager, torch.compile, normjit.torch (this project's PyTorch ops; in
the backward its op called with the saved statistics, as torch eager's aten backward and cuDNN's
graph are, else through autograd as a model calls it), and the peer libraries liger (liger-kernel's
Triton kernels), cudnn (nvidia-cudnn-frontend graph API), quack (quack-kernels, CuTe DSL) and
flashinfer (flashinfer.norm, forward only: FlashInfer has no norm backward). Every
provider sees the same buffers, byte counts, timing and fp64 error check. A peer whose import fails
is skipped once with the reason; a failure at one shape prints `skip <provider> <norm> N=<n>: <why>`
and the run goes on. Each result's `impl` field says which call was timed and any adaptation.
"""
import argparse
import functools
import json
import os
import statistics
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
PROVIDERS = ("torch.eager", "torch.compile", "normjit.torch", "liger", "cudnn", "quack", "quack.alloc", "flashinfer")


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


def graph_replay_us(fn, sets, calls=20, reps=15):
    """Device µs per call of a CUDA graph of `calls` calls fn(k % sets), median of reps replays:
    the calls without their host time. Each set runs once on a side stream first (kernels loaded
    and compiled outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for k in range(calls):
            fn(k % sets)
    graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(1000.0 * start.elapsed_time(stop) / calls)
    return statistics.median(times)


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


def torch_fwd_candidates(provider, norm, n, eps, xs, ys, w, b):
    name = "F.layer_norm" if norm == "layernorm" else "F.rms_norm"
    if provider == "torch.compile":
        name = f"torch.compile({name}, dynamic=False)"

    def build():
        f = make_fn(provider, norm, n, eps)
        return lambda i: f(xs[i], w, b)
    return [(name, build)]


def forward_error(norm, n, eps, x, y, w, b, chunk_elems=1 << 26):
    """Max |y - ref| against the float64 forward, in row chunks (a float64 copy of a 32768 x 65536
    problem is 16 GiB); the chunk maxima are reduced in torch so a NaN shows as NaN."""
    f = norm_fn(norm, n, eps)
    wd, bd = w.double(), None if b is None else b.double()
    rows = max(1, chunk_elems // n)
    worst = [(y[r0:r0 + rows].double() - f(x[r0:r0 + rows].double(), wd, bd)).abs().max()
             for r0 in range(0, x.shape[0], rows)]
    return torch.stack(worst).max().item()


def run_fwd(args):
    dtype = DTYPES[args.dtype]
    eps = 1e-5
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    results = []
    for norm in args.norms.split(","):
        for n in map(int, args.ns.split(",")):
            m, item = args.rows, torch.tensor([], dtype=dtype).element_size()
            x_bytes = m * n * item
            sets = max(1, min(64, (4 * l2) // (2 * x_bytes) + 1))
            try:
                xs = [torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.5 for _ in range(sets)]
                ys = [torch.empty_like(x) for x in xs]  # copy destinations; cudnn writes y here
            except torch.cuda.OutOfMemoryError as e:
                print(f"skip {norm} N={n}: inputs do not fit ({first_line(e)})", flush=True)
                xs = ys = None
                torch.cuda.empty_cache()
                continue
            w = torch.randn(n, device="cuda", dtype=dtype) * 0.5 + 1
            b = torch.randn(n, device="cuda", dtype=dtype) * 0.5 if norm == "layernorm" else None
            copy_us = median_us(lambda i: ys[i].copy_(xs[i]), sets)
            copy_gbps = 2 * x_bytes / copy_us * 1e-3
            nbytes = 2 * x_bytes + n * item * (2 if b is not None else 1)
            for provider in args.providers.split(","):
                if provider.startswith("torch."):
                    candidates = torch_fwd_candidates(provider, norm, n, eps, xs, ys, w, b)
                else:
                    api = peer_api(provider)
                    if api is None:
                        continue  # import failure, reported once
                    candidates = PEER_CANDIDATES[provider]["fwd"](api, norm, n, eps, xs, ys, w, b)
                got = measure(provider, norm, n, candidates, lambda y: forward_error(norm, n, eps, xs[0], y, w, b), sets)
                if got is None:
                    continue
                us, err, impl = got
                gbps = nbytes / us * 1e-3
                r = dict(provider=provider, norm=norm, n=n, rows=m, dtype=args.dtype, phase="fwd", us=us, gbps=gbps,
                         copy_gbps=copy_gbps, pct_copy=100 * gbps / copy_gbps, max_abs_err=err, impl=impl)
                results.append(r)
                print(f"{provider:14s} {norm:9s} N={n:6d} {us:9.2f} us {gbps:8.1f} GB/s {r['pct_copy']:5.1f}% of copy "
                      f"({copy_gbps:.0f}) err {err:.3g} [{impl}]", flush=True)
            del xs, ys
            torch.cuda.empty_cache()
            # Rewritten after every shape so a run cut short still leaves its figures.
            dump(args.json, results)
    dump(args.json, results)


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
    copies of a 32768 x 65536 problem fit next to the buffers; dgamma sums the chunks' shares.
    Chunk maxima are reduced in torch, so a NaN in dx shows as NaN (Python's max() would drop it)."""
    f = norm_fn(norm, n, eps)
    wd = w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    rows = max(1, chunk_elems // n)
    err_dx, dw_ref = [], torch.zeros_like(wd, requires_grad=False)
    for r0 in range(0, x.shape[0], rows):
        xd = x[r0:r0 + rows].double().requires_grad_()
        with torch.enable_grad():
            y = f(xd, wd, bd)
            gx, gw = torch.autograd.grad(y, (xd, wd), dy[r0:r0 + rows].double())
        err_dx.append((dx[r0:r0 + rows].double() - gx).abs().max())
        dw_ref += gw
        del xd, y, gx, gw
    return torch.stack(err_dx).max().item(), (dw.double() - dw_ref).abs().max().item()


def fp32_stats(norm, x, eps, chunk_elems=1 << 26):
    """The row statistics a training forward saves, computed once in fp32 for the peers whose
    backward takes them as inputs (cudnn, quack): (mean or None for RMSNorm, rstd), both (M,) fp32."""
    m, n = x.shape
    mean = torch.empty(m, device=x.device, dtype=torch.float32) if norm == "layernorm" else None
    rstd = torch.empty(m, device=x.device, dtype=torch.float32)
    rows = max(1, chunk_elems // n)
    for r0 in range(0, m, rows):
        xf = x[r0:r0 + rows].float()
        if mean is None:
            var = xf.square().mean(dim=1)  # RMSNorm: mean of squares, no centring
        else:
            mu = xf.mean(dim=1)
            var = (xf - mu[:, None]).square().mean(dim=1)
            mean[r0:r0 + rows] = mu
        rstd[r0:r0 + rows] = torch.rsqrt(var + eps)  # eps inside the root, as in every provider here
    return mean, rstd


# ----------------------------------------------------------------------------------------------
# Peer libraries: each loader imports once and returns a namespace with the calls used and a
# version string; each provider gives (name, builder) candidates per phase, like eager_candidates.
# Builders return fn(i): forward -> y of buffer set i; backward -> (dx, dgamma[, dbeta]).
# ----------------------------------------------------------------------------------------------

def dist_version(dist, module=None):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001 - --target installs may lack metadata; the module may know
        return getattr(module, "__version__", "?")


def load_liger():
    # The submodules hold liger's own Triton autograd Functions. The package-level names can be
    # swapped for another implementation through LIGER_KERNEL_IMPL; these never are.
    import triton
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    return SimpleNamespace(version=f"{dist_version('liger_kernel')} (triton {triton.__version__})",
                           LayerNorm=LigerLayerNormFunction, RMSNorm=LigerRMSNormFunction)


# Liger's RMSNorm has an offset (y = x*rstd*(offset + w)) and casting modes. offset=0 gives plain
# y = x*rstd*w. casting_mode="gemma" computes everything in fp32 and rounds y once, as F.rms_norm's
# fused CUDA kernel does; "llama" rounds x*rstd to x's dtype before the weight multiply and "none"
# reduces in x's dtype. in_place=False: in place, liger writes dx over dy, which the rotating sets
# and the reference check reuse; not in place it allocates dx with zeros_like (a fill it pays).
LIGER_RMS_ARGS = dict(offset=0.0, casting_mode="gemma", in_place=False, row_mode=None)
LIGER_RMS_DESC = "offset=0, casting_mode='gemma', in_place=False"


def liger_rms(api, eps):
    a = LIGER_RMS_ARGS
    return lambda x, w, b: api.RMSNorm.apply(x, w, eps, a["offset"], a["casting_mode"], a["in_place"], a["row_mode"])


def liger_ln(api, eps):
    return lambda x, w, b: api.LayerNorm.apply(x, w, b, eps)


def liger_fwd_candidates(api, norm, n, eps, xs, ys, w, b):
    if norm == "layernorm":
        f, name = liger_ln(api, eps), "LigerLayerNormFunction.apply"
    else:
        f, name = liger_rms(api, eps), f"LigerRMSNormFunction.apply({LIGER_RMS_DESC})"
    return [(name, lambda: lambda i: f(xs[i], w, b))]


def liger_bwd_candidates(api, norm, n, eps, xs, dys, ys, w, b):
    # Liger's kernels load the weights and upcast them to fp32, so bf16 x with fp32 weights runs
    # as is; dgamma/dbeta come back in the weights' dtype.
    if norm == "layernorm":
        f, name = liger_ln(api, eps), "autograd.grad(LigerLayerNormFunction)"
    else:
        f, name = liger_rms(api, eps), f"autograd.grad(LigerRMSNormFunction, {LIGER_RMS_DESC})"
    name += mixed_note(xs, w, "weights upcast to fp32 in the kernel")
    return [(name, lambda: autograd_grads(norm, f, xs, dys, w, b))]


def load_cudnn():
    import cudnn
    handle = cudnn.create_handle()
    # Launch on torch's stream, where the CUDA events are recorded.
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    dt = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF,
          torch.float32: cudnn.data_type.FLOAT}
    return SimpleNamespace(mod=cudnn, handle=handle, dt=dt,
                           version=f"{dist_version('nvidia-cudnn-frontend', cudnn)} (cuDNN {cudnn.backend_version()})")


# Fixed tensor uids: execute() then takes buffers in one fixed order per buffer set.
CUDNN_UID = dict(x=1, scale=2, bias=3, eps=4, y=5, mean=6, inv_var=7, dy=8, dx=9, dscale=10, dbias=11)


def cudnn_tensor(api, g, name, shape, dtype):
    """A graph input: dense row-major (norms in cuDNN are 4-D: rows, N, 1, 1)."""
    stride = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        stride[k] = stride[k + 1] * shape[k + 1]
    return g.tensor(name=name, dim=list(shape), stride=stride, data_type=api.dt[dtype], uid=CUDNN_UID[name])


def cudnn_output(api, t, name, dtype):
    t.set_uid(CUDNN_UID[name]).set_output(True).set_data_type(api.dt[dtype])


def cudnn_new_graph(api):
    c = api.mod
    return c.pygraph(handle=api.handle, intermediate_data_type=c.data_type.FLOAT, compute_data_type=c.data_type.FLOAT)


def cudnn_finish(api, g):
    """Validate, plan and build once; the workspace is allocated once and shared by all sets."""
    c = api.mod
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)


def cudnn_fwd_plan(api, norm, n, eps, xs, ys, w, b, phase):
    c, m, xdt = api.mod, xs[0].shape[0], xs[0].dtype
    training = phase == "TRAINING"
    g = cudnn_new_graph(api)
    x_t = cudnn_tensor(api, g, "x", (m, n, 1, 1), xdt)
    s_t = cudnn_tensor(api, g, "scale", (1, n, 1, 1), w.dtype)
    e_t = g.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=c.data_type.FLOAT,
                   is_pass_by_value=True, uid=CUDNN_UID["eps"])
    names = ["x", "scale", "eps", "y"]
    if norm == "layernorm":
        b_t = cudnn_tensor(api, g, "bias", (1, n, 1, 1), b.dtype)
        y_t, mean_t, iv_t = g.layernorm(name="ln", norm_forward_phase=getattr(c.norm_forward_phase, phase),
                                        input=x_t, scale=s_t, bias=b_t, epsilon=e_t)
        names.append("bias")
    else:
        y_t, iv_t = g.rmsnorm(name="rms", norm_forward_phase=getattr(c.norm_forward_phase, phase),
                              input=x_t, scale=s_t, epsilon=e_t)
        mean_t = None
    cudnn_output(api, y_t, "y", xdt)
    stats = [s for s, t in (("mean", mean_t), ("inv_var", iv_t)) if training and t is not None]
    for s, t in (("mean", mean_t), ("inv_var", iv_t)):
        if s in stats:
            cudnn_output(api, t, s, torch.float32)
    ws = cudnn_finish(api, g)
    uids = tuple(CUDNN_UID[k] for k in names + stats)
    eps_host = torch.full((1, 1, 1, 1), eps, dtype=torch.float32)  # pass-by-value scalar lives on the host
    packs = []
    for x, y in zip(xs, ys):
        bufs = {"x": x.view(m, n, 1, 1), "scale": w.view(1, n, 1, 1), "eps": eps_host, "y": y.view(m, n, 1, 1)}
        if b is not None:
            bufs["bias"] = b.view(1, n, 1, 1)
        for s in stats:
            bufs[s] = torch.empty(m, 1, 1, 1, device="cuda", dtype=torch.float32)
        packs.append(tuple(bufs[k] for k in names + stats))
    ys[0].fill_(float("nan"))  # the checked set: y must come from cuDNN, not from the copy baseline

    def run(i):
        g.execute(packs[i], ws, handle=api.handle, tensor_uids=uids)
        return ys[i]
    return run


def cudnn_fwd_candidates(api, norm, n, eps, xs, ys, w, b):
    # Inference first: torch's forward also writes y only. Training (mean and inv_variance also
    # written, not counted in the bytes) if cuDNN has no inference plan. Weights in their own dtype
    # first; an fp32 copy of them (exact, made once outside the timing) only if cuDNN rejects those.
    weight_sets = [(w, b, "")]
    if w.dtype != torch.float32:
        what = "scale" if b is None else "scale/bias"
        weight_sets.append((w.float(), None if b is None else b.float(),
                            f", fp32 weights ({what} upcast once outside timing)"))
    out = []
    for wc, bc, note in weight_sets:
        for phase in ("INFERENCE", "TRAINING"):
            out.append((f"cudnn {norm} {phase.lower()}{note}",
                        functools.partial(cudnn_fwd_plan, api, norm, n, eps, xs, ys, wc, bc, phase)))
    return out


def cudnn_bwd_plan(api, norm, n, eps, xs, dys, ys, w, b):
    m, xdt, ln = xs[0].shape[0], xs[0].dtype, norm == "layernorm"
    g = cudnn_new_graph(api)
    dy_t = cudnn_tensor(api, g, "dy", (m, n, 1, 1), xdt)
    x_t = cudnn_tensor(api, g, "x", (m, n, 1, 1), xdt)
    s_t = cudnn_tensor(api, g, "scale", (1, n, 1, 1), w.dtype)
    iv_t = cudnn_tensor(api, g, "inv_var", (m, 1, 1, 1), torch.float32)
    if ln:
        mean_t = cudnn_tensor(api, g, "mean", (m, 1, 1, 1), torch.float32)
        dx_t, ds_t, db_t = g.layernorm_backward(name="ln_bwd", grad=dy_t, input=x_t, scale=s_t, mean=mean_t,
                                                inv_variance=iv_t)
    else:
        dx_t, ds_t, db_t = g.rmsnorm_backward(name="rms_bwd", grad=dy_t, input=x_t, scale=s_t, inv_variance=iv_t,
                                              has_dbias=False)
    cudnn_output(api, dx_t, "dx", xdt)
    cudnn_output(api, ds_t, "dscale", w.dtype)
    if ln:
        cudnn_output(api, db_t, "dbias", w.dtype)
    ws = cudnn_finish(api, g)
    names = ["dy", "x", "scale", "inv_var", "dx", "dscale"] + (["mean", "dbias"] if ln else [])
    uids = tuple(CUDNN_UID[k] for k in names)
    dscale = torch.empty(n, device="cuda", dtype=w.dtype)  # shared by all sets, like normjit's dgamma
    dbias = torch.empty(n, device="cuda", dtype=w.dtype) if ln else None
    packs = []
    for x, dy, dx in zip(xs, dys, ys):
        mean, rstd = fp32_stats(norm, x, eps)
        bufs = {"dy": dy.view(m, n, 1, 1), "x": x.view(m, n, 1, 1), "scale": w.view(1, n, 1, 1),
                "inv_var": rstd.view(m, 1, 1, 1), "dx": dx.view(m, n, 1, 1), "dscale": dscale.view(1, n, 1, 1)}
        if ln:
            bufs.update(mean=mean.view(m, 1, 1, 1), dbias=dbias.view(1, n, 1, 1))
        packs.append(tuple(bufs[k] for k in names))
    grads = (dscale,) if dbias is None else (dscale, dbias)
    for t in (ys[0],) + grads:
        t.fill_(float("nan"))  # the checked outputs must come from cuDNN

    def run(i):
        g.execute(packs[i], ws, handle=api.handle, tensor_uids=uids)
        return (ys[i],) + grads
    return run


def cudnn_bwd_candidates(api, norm, n, eps, xs, dys, ys, w, b):
    # Mixed bf16 x / fp32 scale is declared as is; if cuDNN rejects it the shape is skipped with
    # cuDNN's reason (no silent same-dtype retry). Saved stats: fp32_stats, once per buffer set.
    op = "layernorm_backward" if norm == "layernorm" else "rmsnorm_backward"
    return [(f"cudnn {op} (stats from a one-time fp32 forward)" + mixed_note(xs, w, "scale declared in its own dtype"),
             functools.partial(cudnn_bwd_plan, api, norm, n, eps, xs, dys, ys, w, b))]


def read_cutlass_pth():
    """pip --target installs reach Python through PYTHONPATH, where .pth files are not read, and
    cutlass-dsl puts its `cutlass` package on sys.path through one; read that one here."""
    import site
    try:
        import cutlass.cutlass_dsl  # noqa: F401
        return
    except ImportError:
        pass
    # Another `cutlass` (the device image has one) may already be imported: drop it so the
    # DSL's package, which the .pth puts first on sys.path, is the one found.
    for name in [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]:
        del sys.modules[name]
    for d in list(sys.path):
        if d and os.path.isfile(os.path.join(d, "nvidia_cutlass_dsl_packages.pth")):
            site.addsitedir(d)


def load_quack():
    import importlib
    read_cutlass_pth()
    quack = importlib.import_module("quack")
    # Not `import quack.rmsnorm as ...`: the package re-exports the function rmsnorm under that name.
    return SimpleNamespace(version=dist_version("quack-kernels", quack), mod=importlib.import_module("quack.rmsnorm"))


def quack_op(api, name):
    f = getattr(api.mod, name, None)
    if f is None:
        raise NotImplementedError(f"quack {api.version} has no quack.rmsnorm.{name}")
    return f


def quack_fwd_candidates(api, norm, n, eps, xs, ys, w, b):
    """QuACK's forward writing into the rotating outputs, as every other provider that takes an
    output does: its public wrappers allocate y on each call, and the caching allocator hands back
    the same block, which at small sizes (N = 256: 16 MiB) stays in L2 between calls, so its writes
    partly never reach DRAM. quack.alloc times the wrappers as they are."""
    f = getattr(api.mod, "_rmsnorm_fwd", None)
    if f is None:
        return quack_alloc_fwd_candidates(api, norm, n, eps, xs, ys, w, b)
    if norm == "rmsnorm":
        return [("quack.rmsnorm._rmsnorm_fwd(out=rotating y)", lambda: lambda i: f(xs[i], w, ys[i], eps=eps) or ys[i])]
    wq, bq = w.float(), b.float()
    note = "" if w.dtype == torch.float32 else " (weight/bias upcast to fp32 once outside timing, as layernorm_fwd requires)"
    return [("quack.rmsnorm._rmsnorm_fwd(out=rotating y, is_layernorm)" + note,
             lambda: lambda i: f(xs[i], wq, ys[i], bq, eps=eps, is_layernorm=True) or ys[i])]


def quack_alloc_fwd_candidates(api, norm, n, eps, xs, ys, w, b):
    if norm == "rmsnorm":
        def rms():
            f = quack_op(api, "rmsnorm_fwd")
            return lambda i: f(xs[i], w, eps=eps)[0]  # (out, residual_out, rstd); no rstd stored
        return [("quack.rmsnorm.rmsnorm_fwd", rms)]

    def ln():
        f = quack_op(api, "layernorm_fwd")
        wq, bq = w.float(), b.float()  # exact; a no-op when they already are fp32
        return lambda i: f(xs[i], wq, bq, eps=eps)
    # layernorm_fwd asserts fp32 weight and bias.
    note = "" if w.dtype == torch.float32 else " (weight/bias upcast to fp32 once outside timing: it takes fp32 only)"
    return [("quack.rmsnorm.layernorm_fwd" + note, ln)]


def quack_bwd_candidates(api, norm, n, eps, xs, dys, ys, w, b):
    # quack compiles a kernel per (x, weight) dtype pair, so fp32 weights with bf16 x run as is.
    # Saved stats: fp32_stats, once per buffer set. dx and the fp32 dgamma partials are allocated
    # by quack on each call, as in its autograd Function.
    def build():
        stats = [fp32_stats(norm, x, eps) for x in xs]
        if norm == "rmsnorm":
            f = quack_op(api, "rmsnorm_bwd")
            return lambda i: f(xs[i], w, dys[i], stats[i][1])[:2]  # (dx, dw, db, dresidual)
        f = quack_op(api, "layernorm_bwd")
        return lambda i: f(xs[i], w, dys[i], stats[i][1], stats[i][0], has_bias=True)  # (dx, dw, db)
    op = "rmsnorm_bwd" if norm == "rmsnorm" else "layernorm_bwd"
    return [(f"quack.rmsnorm.{op} (stats from a one-time fp32 forward)"
             + mixed_note(xs, w, "kernel compiled for that dtype pair"), build)]


def load_flashinfer():
    """flashinfer.norm, from the carried slim package (scripts/flashinfer_slim.sh, .whl/fi/) or any
    install. Also used by bench/fusions.py and bench/quant.py. Its norm CUDA module comes prebuilt
    (data/aot/norm/norm.so) in the slim package; any module it still JIT-compiles (nvcc, on all
    cores) lands under FLASHINFER_WORKSPACE_BASE, kept between calls on a warm machine. On sm_90 its
    public calls run its CuTe-DSL kernels when nvidia-cutlass-dsl imports (the carried cu13 libs
    staged), else its CUDA kernels; `backend` says which, `cuda` is the CUDA module itself."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/flashinfer-ws")
    os.environ.setdefault("TVM_FFI_CACHE_DIR", "/tmp/tvm-ffi-cache")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    try:
        read_cutlass_pth()  # the DSL's `cutlass`, not the image's, for the CuTe-DSL kernels
    except Exception:  # noqa: BLE001 - no cutlass-dsl: FlashInfer falls back to its CUDA kernels
        pass
    import flashinfer
    import flashinfer.norm as fn
    dev = torch.device("cuda", torch.cuda.current_device())
    backend = "CUDA (nvcc JIT/AOT module)" if fn._use_cuda_norm(dev) else "CuTe DSL"
    pdl = fn.device_support_pdl(dev)
    return SimpleNamespace(norm=fn, backend=backend, pdl=pdl, cuda=fn.get_norm_module,
                           version=f"{dist_version('flashinfer-python', flashinfer)} (norm: {backend})")


def flashinfer_fwd_candidates(api, norm, n, eps, xs, ys, w, b):
    """FlashInfer's forward into the rotating outputs. RMSNorm: flashinfer.norm.rmsnorm(out=).
    LayerNorm: its public layernorm allocates y and takes bf16 x with fp32 gamma/beta only; the same
    dispatch it makes is called with out= first (CuTe-DSL layernorm_cute or the CUDA module's
    layernorm), the public call as is second. PDL is on where FlashInfer turns it on (sm_90+)."""
    fn, note = api.norm, f" [{api.backend}, enable_pdl={api.pdl}]"

    def rms():
        ys[0].fill_(float("nan"))  # the checked y must come from FlashInfer
        return lambda i: fn.rmsnorm(xs[i], w, eps, out=ys[i])
    if norm == "rmsnorm":
        return [("flashinfer.norm.rmsnorm(out=rotating y)" + note, rms)]
    wq, bq = w.float(), b.float()
    up = "" if w.dtype == torch.float32 else " (gamma/beta upcast to fp32 once outside timing: it takes fp32 only)"

    def ln_out():
        ys[0].fill_(float("nan"))
        if api.backend.startswith("CUDA"):
            mod = api.cuda()
            return lambda i: mod.layernorm(ys[i], xs[i], wq, bq, eps) or ys[i]
        from flashinfer.norm.kernels import layernorm_cute
        return lambda i: layernorm_cute(ys[i], xs[i], wq, bq, eps) or ys[i]

    def ln_public():
        return lambda i: fn.layernorm(xs[i], wq, bq, eps)
    return [("flashinfer layernorm (out=rotating y)" + up + note, ln_out),
            ("flashinfer.norm.layernorm (allocates y)" + up + note, ln_public)]


def load_normjit_torch():
    import normjit
    import normjit.torch as njt
    from normjit.torch import _native
    return SimpleNamespace(njt=njt, native=_native, version=normjit.version())


def normjit_fn(api, norm, n, eps):
    if norm == "layernorm":
        return lambda x, w, b: api.njt.layer_norm(x, (n,), w, b, eps)
    return lambda x, w, b: api.njt.rms_norm(x, (n,), w, eps)


def normjit_fwd_candidates(api, norm, n, eps, xs, ys, w, b):
    f = normjit_fn(api, norm, n, eps)

    def build():
        def call(i):
            with torch.no_grad():  # the inference forward: y only
                return f(xs[i], w, b)
        return call
    return [("normjit.torch (no grad)", build)]


def normjit_bwd_candidates(api, norm, n, eps, xs, dys, ys, w, b):
    """The backward op called directly with the statistics a training forward saved (as torch
    eager's aten backward and cuDNN's graph are timed), then through autograd as a model runs it."""
    ops = torch.ops.normjit

    def saved_stats():
        bias = b if norm == "layernorm" else None
        return bias, [ops.norm_fwd(x, w, bias, norm, eps, True, "none", 0.0, 0.0)[1:3] for x in xs]

    def native():
        # The C++ op behind normjit.torch's eager autograd node, as aten's backward is called.
        bias, stats = saved_stats()
        code = api.native.NORMS[norm]

        def call(i):
            dx, dw, db = ops.eager_norm_backward(dys[i], None, xs[i], w, stats[i][0], stats[i][1], None, code, False,
                                                 0, bias is not None)
            return (dx, dw, db) if bias is not None else (dx, dw)
        return call

    def custom_op():
        # The torch.library op a compiled graph calls (its CUDA implementation is Python).
        bias, stats = saved_stats()
        no_mask = xs[0].new_empty((0,), dtype=torch.uint8)

        def call(i):
            dx, dw, db = ops.norm_bwd(dys[i], xs[i], w, stats[i][0], stats[i][1], no_mask, norm, "none",
                                      bias is not None)
            return (dx, dw, db) if bias is not None else (dx, dw)
        return call
    out = []
    if api.native.eager_norm is not None and hasattr(ops, "eager_norm_backward"):
        out.append(("torch.ops.normjit.eager_norm_backward (C++, saved statistics)", native))
    return out + [("torch.ops.normjit.norm_bwd (saved statistics)", custom_op),
                  ("normjit.torch + autograd", lambda: autograd_grads(norm, normjit_fn(api, norm, n, eps), xs, dys, w, b))]


PEER_CANDIDATES = {
    "normjit.torch": dict(load=load_normjit_torch, fwd=normjit_fwd_candidates, bwd=normjit_bwd_candidates),
    "liger": dict(load=load_liger, fwd=liger_fwd_candidates, bwd=liger_bwd_candidates),
    "cudnn": dict(load=load_cudnn, fwd=cudnn_fwd_candidates, bwd=cudnn_bwd_candidates),
    "quack": dict(load=load_quack, fwd=quack_fwd_candidates, bwd=quack_bwd_candidates),
    "quack.alloc": dict(load=load_quack, fwd=quack_alloc_fwd_candidates, bwd=quack_bwd_candidates),
    "flashinfer": dict(load=load_flashinfer, fwd=flashinfer_fwd_candidates, bwd=None),  # no backward
}
_peer_apis = {}  # provider -> namespace, or None once its import failed


def peer_api(provider):
    """The peer's namespace, imported on first use; None (said once, with the reason) if it fails."""
    if provider not in _peer_apis:
        try:
            _peer_apis[provider] = PEER_CANDIDATES[provider]["load"]()
        except Exception as e:  # noqa: BLE001 - missing wheel, missing shared library, no GPU support...
            _peer_apis[provider] = None
            print(f"skip {provider} (every shape): import failed: {first_line(e)}", flush=True)
    return _peer_apis[provider]


# ----------------------------------------------------------------------------------------------
# Shared
# ----------------------------------------------------------------------------------------------

def first_line(e, limit=160):
    """Short reason for a skip: torch errors run to many lines (dispatch key lists and the like)."""
    text = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def mixed_note(xs, w, how):
    """For a peer's impl field: how it took x and weights of different dtypes (nothing if the same)."""
    name = {v: k for k, v in DTYPES.items()}
    if xs[0].dtype == w.dtype:
        return ""
    return f"; {name[xs[0].dtype]} x / {name[w.dtype]} weights as given, {how}"


def skip(provider, norm, n, reason):
    print(f"skip {provider} {norm} N={n}: {reason}", flush=True)


def first_working(candidates):
    """Builds (name, builder) candidates in order and calls the first call (it compiles, plans or
    autotunes); returns (fn, its outputs for set 0, name, why the earlier ones failed), or
    (None, None, None, why) when none works."""
    why = []
    for name, build in candidates:
        try:
            fn = build()
            out = fn(0)
            torch.cuda.synchronize()
            return fn, out, name, why
        except Exception as e:  # noqa: BLE001 - any failure means: try the next way
            why.append(f"{name.split(' (')[0].split(';')[0]}: {first_line(e)}")  # the name without its notes
            fn = out = None
            torch.cuda.empty_cache()
    return None, None, None, why


def measure(provider, norm, n, candidates, check, sets):
    """The first working candidate's reference errors (check(its outputs for set 0)) and median time:
    (us, errors, impl), or None after printing why it was skipped."""
    fn, out, impl, why = first_working(candidates)
    if fn is None:
        skip(provider, norm, n, "; ".join(why))
        return None
    if why:
        print(f"  {provider}: fell back to {impl} ({'; '.join(why)})", flush=True)
    try:
        errors = check(out)
        out = None
        return median_us(fn, sets), errors, impl
    except Exception as e:  # noqa: BLE001 - keep the other providers and shapes going
        skip(provider, norm, n, first_line(e))
        return None
    finally:
        fn = out = None  # drops the provider's graphs, plans or saved tensors before the next one
        torch.cuda.empty_cache()


def dump(path, results):
    doc = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=results)
    peers = {p: api.version for p, api in _peer_apis.items() if api is not None}
    if peers:
        doc["peers"] = peers
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)


def run_bwd(args):
    dtype, wdtype = DTYPES[args.dtype], DTYPES[args.wdtype]
    eps = 1e-5
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    m = args.rows
    item = torch.tensor([], dtype=dtype).element_size()
    witem = torch.tensor([], dtype=wdtype).element_size()
    results = []
    no_bwd = set()  # (provider, norm) already reported as having no backward
    for norm in args.norms.split(","):
        n_wgrads = 2 if norm == "layernorm" else 1  # dgamma, dbeta / dgamma
        for n in map(int, args.ns.split(",")):
            x_bytes = m * n * item
            # Each call reads x and dy: rotate until those inputs exceed 4x the L2.
            sets = max(1, min(64, (4 * l2) // (2 * x_bytes) + 1))
            try:
                xs = [torch.randn(m, n, device="cuda", dtype=dtype) * 2 + 0.5 for _ in range(sets)]
                dys = [torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(sets)]
                ys = [torch.empty_like(x) for x in xs]  # copy destinations; cudnn writes dx here
            except torch.cuda.OutOfMemoryError as e:
                print(f"skip {norm} N={n}: inputs do not fit ({first_line(e)})", flush=True)
                xs = dys = ys = None
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
                    if PEER_CANDIDATES[provider]["bwd"] is None:
                        if (provider, norm) not in no_bwd:
                            no_bwd.add((provider, norm))
                            print(f"skip {provider} {norm} (every shape): n/a, it has no backward", flush=True)
                        continue
                    api = peer_api(provider)
                    if api is None:
                        continue  # import failure, reported once
                    candidates = PEER_CANDIDATES[provider]["bwd"](api, norm, n, eps, xs, dys, ys, w, b)
                got = measure(provider, norm, n, candidates,
                              lambda g: reference_errors(norm, n, eps, xs[0], dys[0], w, b, g[0], g[1]), sets)
                if got is None:
                    continue
                us, (err, err_dw), impl = got
                gbps = nbytes / us * 1e-3
                r = dict(provider=provider, norm=norm, n=n, rows=m, dtype=args.dtype, wdtype=args.wdtype, phase="bwd",
                         us=us, gbps=gbps, copy_gbps=copy_gbps, pct_copy=100 * gbps / copy_gbps, max_abs_err=err,
                         max_abs_err_dw=err_dw, impl=impl)
                results.append(r)
                print(f"{provider:14s} {norm:9s} N={n:6d} {us:9.2f} us {gbps:8.1f} GB/s {r['pct_copy']:5.1f}% of copy "
                      f"({copy_gbps:.0f}) err dx {err:.3g} dgamma {err_dw:.3g} [{impl}]", flush=True)
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
    ap.add_argument("--providers", default=",".join(PROVIDERS),
                    help=f"comma-separated, from {', '.join(PROVIDERS)}")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    unknown = [p for p in args.providers.split(",") if p not in PROVIDERS]
    if unknown:
        ap.error(f"unknown provider(s) {', '.join(unknown)}; known: {', '.join(PROVIDERS)}")
    unknown = [x for x in args.norms.split(",") if x not in ("layernorm", "rmsnorm")]
    if unknown:
        ap.error(f"unknown norm(s) {', '.join(unknown)}; known: layernorm, rmsnorm")
    if args.phase == "fwd":
        if args.wdtype is not None:
            ap.error("--wdtype applies to --phase bwd only (the forward keeps weights in --dtype)")
        return run_fwd(args)
    if args.wdtype is None:
        args.wdtype = "f32"
    return run_bwd(args)


if __name__ == "__main__":
    sys.exit(main())
