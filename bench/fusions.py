#!/usr/bin/env python3
"""The fused residual add + RMSNorm (h = x + residual, y = rms_norm(h)) against the same work unfused
and against the peers that fuse it, timed as bench/peers.py times the norms.

Per N (bf16 x, residual and weight, M rows), forward and backward:
  normjit          normjit.torch.add_rms_norm, one kernel each way
  normjit.unfused  torch's add, then normjit.torch.rms_norm (backward: autograd adds dh to dnorm)
  torch.eager      torch's add, then F.rms_norm
  torch.compile    the unfused composition, compiled (Inductor fuses what it can)
  liger            LigerFusedAddRMSNormFunction (liger-kernel; casting_mode="gemma": fp32 math,
                   y rounded once, as the others)
  quack            quack.rmsnorm.rmsnorm_fwd(residual=...) / rmsnorm_bwd(dresidual_out=...)
  flashinfer       flashinfer.norm.fused_add_rmsnorm, forward only (FlashInfer has no backward: n/a).
                   On sm_90 its CuTe-DSL kernel where nvidia-cutlass-dsl imports, else its CUDA one;
                   PDL on, as FlashInfer defaults. In place: y overwrites x, h overwrites residual, so
                   it runs on its own copies of the rotating sets (made once per N, outside timing)
                   and is checked on fresh copies of set 0.
  flashinfer.cuda  the same through FlashInfer's CUDA module (get_norm_module().fused_add_rmsnorm),
                   whichever kernel the public call picks
--residual-dtype f32: an fp32 residual stream (Megatron's fp32_residual_connection): the residual
float32 beside bf16 x and weight, h = x + residual summed in fp32 and kept float32, y from it in
bf16; gradients dx in bf16 and dresidual in fp32. Providers then:
  normjit          normjit.torch.add_rms_norm with the float32 residual (its .residual_f32 kernels)
  normjit.unfused  h = x + r (type promotion: x.float() + r in one kernel), then
                   normjit.torch.rms_norm(h) in fp32 and .to(bf16)
  torch.eager      h = x + r as above, F.rms_norm(h, w.float()).to(bf16), computed in fp32
  torch.compile    that composition, compiled
  quack            rmsnorm_fwd(residual=fp32 r): h (residual_out) float32; its backward takes the
                   fp32 h as its x, so it writes dx in fp32 and autograd casts x's gradient to bf16
                   (as QuACK's own RMSNormFunction does)
  liger            n/a: LigerFusedAddRMSNormFunction writes h in x's dtype
  flashinfer       n/a, and flashinfer.cuda: fused_add_rmsnorm reads the residual as x's dtype
                   (its CUDA entry casts the pointer) and writes h over it
Bytes, each input read once and each output written once: forward x, residual, weight read and
y, h written; backward dy, dh, h, weight read and dx (= dresidual), dweight written (the saved fp32
rstd is not counted). With --residual-dtype f32 the residual, h, dh and dresidual are 4 bytes an
element, and dx (bf16) and dresidual (fp32) are two outputs: forward 12 bytes an element, backward
16 (bf16: 8 each way). "% copy" divides by a device-to-device copy of M·N bf16 elements in the same
process. Backward times are of torch.autograd.grad over the graph one forward left (retained), so
each provider's backward runs as a model would run it. Outputs are checked against float64.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from peers import dist_version, load_flashinfer, median_us, read_cutlass_pth  # noqa: E402

EPS = 1e-6


def unfused_torch(x, r, w):
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w, EPS), h


def unfused_torch_f32(x, r, w):
    """The fp32 residual stream: h = x + r promoted to fp32 (x.float() + r in one kernel), y in fp32
    with the weight upcast (F.rms_norm's fused kernel wants one dtype), rounded once to x's dtype."""
    h = x + r
    return F.rms_norm(h, h.shape[-1:], w.float(), EPS).to(x.dtype), h


class InPlace:
    """A provider that writes y over x and h over the residual (FlashInfer's fused_add_rmsnorm):
    fn(x, r, w) returns nothing. Forward only."""

    def __init__(self, fn, impl):
        self.fn, self.impl = fn, impl

    def check(self, x, r, w):
        xc, rc = x.clone(), r.clone()
        self.fn(xc, rc, w)
        return xc, rc  # y, h


PEERS = ("liger", "quack", "flashinfer", "flashinfer.cuda", "torch.compile", "torch.eager")
NO_F32_RESIDUAL = ("liger", "flashinfer", "flashinfer.cuda")  # h (and FlashInfer's residual) in x's dtype only
NA = "n/a"  # a provider that cannot run this configuration


def providers(names, f32=False):
    """name -> fn(x, r, w) returning (y, h), "compile", an InPlace, or NA. f32: the fp32 residual stream."""
    out = {}
    if "normjit" in names or "normjit.unfused" in names:
        import normjit.torch as nt
        if "normjit" in names:
            out["normjit"] = lambda x, r, w: nt.add_rms_norm(x, r, w, EPS)
        if "normjit.unfused" in names:
            def normjit_unfused(x, r, w):
                h = x + r  # fp32 stream: promoted, x.float() + r in one kernel
                y = nt.rms_norm(h, h.shape[-1:], w, EPS)
                return (y.to(x.dtype) if y.dtype != x.dtype else y), h
            out["normjit.unfused"] = normjit_unfused
    if "torch.eager" in names:
        out["torch.eager"] = unfused_torch_f32 if f32 else unfused_torch
    if "torch.compile" in names:
        out["torch.compile"] = "compile"  # built per shape
    if f32:
        for name in NO_F32_RESIDUAL:
            if name in names:
                out[name] = NA
        names = [name for name in names if name not in NO_F32_RESIDUAL]
    if "liger" in names:
        try:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as Liger
            out["liger"] = lambda x, r, w: Liger.apply(x, r, w, EPS, 0.0, "gemma", False)
            print(f"liger {dist_version('liger_kernel')}")
        except Exception as e:  # noqa: BLE001
            print(f"skip liger: {type(e).__name__}: {e}"[:200])
    if "quack" in names:
        try:
            import importlib
            read_cutlass_pth()
            q = importlib.import_module("quack.rmsnorm")  # the package re-exports a function of that name

            class QuackAdd(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x, r, w):
                    y, h, rstd = q.rmsnorm_fwd(x, w, residual=r, eps=EPS, store_rstd=True)
                    ctx.save_for_backward(h, w, rstd)
                    return y, h

                @staticmethod
                def backward(ctx, dy, dh):
                    h, w, rstd = ctx.saved_tensors
                    dx, dw, _, dres = q.rmsnorm_bwd(h, w, dy, rstd, dresidual_out=dh, has_residual=True)
                    return dx, dres, dw

            out["quack"] = QuackAdd.apply
            print(f"quack {dist_version('quack-kernels')}")
        except Exception as e:  # noqa: BLE001
            print(f"skip quack: {type(e).__name__}: {e}"[:200])
    if "flashinfer" in names or "flashinfer.cuda" in names:
        try:
            fi = load_flashinfer()
            if "flashinfer" in names:
                out["flashinfer"] = InPlace(lambda x, r, w: fi.norm.fused_add_rmsnorm(x, r, w, EPS),
                                            f"flashinfer.norm.fused_add_rmsnorm ({fi.backend}, enable_pdl={fi.pdl})")
            if "flashinfer.cuda" in names:
                mod = fi.cuda()
                out["flashinfer.cuda"] = InPlace(lambda x, r, w: mod.fused_add_rmsnorm(x, r, w, EPS, fi.pdl),
                                                 f"get_norm_module().fused_add_rmsnorm (CUDA, enable_pdl={fi.pdl})")
            print(f"flashinfer {fi.version}; in place: y over x, h over residual")
        except Exception as e:  # noqa: BLE001
            print(f"skip flashinfer: {type(e).__name__}: {e}"[:200])
    return out


def reference(x, r, w):
    h = (x.float() + r.float()).to(r.dtype)  # x's dtype, or float32 (fp32 stream: not rounded)
    hd = h.double()
    y = hd * torch.rsqrt(hd.square().mean(-1, keepdim=True) + EPS) * w.double()
    return y, h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", default="1024,2880,4096,5120,7168,8192,12288,16384")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--providers",
                    default="normjit,normjit.unfused,torch.eager,torch.compile,liger,quack,flashinfer,flashinfer.cuda")
    ap.add_argument("--phases", default="fwd,bwd")
    ap.add_argument("--residual-dtype", choices=("bf16", "f32"), default="bf16",
                    help="f32: an fp32 residual stream (residual and h float32 beside bf16 x and weight); "
                         "liger and flashinfer n/a")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    f32 = args.residual_dtype == "f32"
    r_dtype, rb = (torch.float32, 4) if f32 else (torch.bfloat16, 2)
    what = "bf16 x and weight, fp32 residual stream (residual and h float32)" if f32 else "bf16 x, residual and weight"
    print(f"Device: {props.name}, torch {torch.__version__}; {what}; M={args.rows}")
    names = args.providers.split(",")
    provs = providers(names, f32)
    phases = args.phases.split(",")
    results = []
    for n in (int(v) for v in args.ns.split(",")):
        m = args.rows
        elem = m * n * 2
        # Enough buffer sets that one pass over them exceeds 4x L2 (the backward touches 4 M·N tensors).
        sets = max(2, math.ceil(4 * props.L2_cache_size / (4 * elem)))
        xs = [torch.randn(m, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        rs = [torch.randn(m, n, device=dev, dtype=r_dtype) for _ in range(sets)]
        w = (1 + 0.1 * torch.randn(n, device=dev)).to(torch.bfloat16)
        src = torch.empty(sets, m * n, device=dev, dtype=torch.bfloat16).normal_()
        dst = torch.empty_like(src)
        copy_us = median_us(lambda i: dst[i].copy_(src[i]), sets)
        copy_gbs = 2 * elem / copy_us / 1e3
        row = {"n": n, "rows": m, "copy_gbs": copy_gbs}
        if f32:
            row["residual_dtype"] = "f32"
        y_ref, h_ref = reference(xs[0], rs[0], w)
        # Bytes an element: x, y, dy, dx 2; residual, h, dh (and dresidual, f32 only) rb.
        fwd_bytes = m * n * (2 + rb + 2 + rb) + 2 * n
        bwd_bytes = m * n * (2 + rb + rb + 2 + (rb if f32 else 0)) + 2 * 2 * n
        for name, f in provs.items():
            if f is NA:
                row[name] = {ph: "n/a" for ph in phases}
                print(f"N={n} {name}: n/a (no fp32 residual stream)", flush=True)
                continue
            if f == "compile":
                torch._dynamo.reset()
                f = torch.compile(unfused_torch_f32 if f32 else unfused_torch, dynamic=False)
            inplace = isinstance(f, InPlace)
            try:
                with torch.no_grad():
                    y, h = f.check(xs[0], rs[0], w) if inplace else f(xs[0], rs[0], w)
                err_y = ((y.double() - y_ref).abs() / (1 + y_ref.abs())).max().item()
                h_exact = torch.equal(h, h_ref)
                entry = {"y_err": err_y, "h_exact": h_exact}
                if inplace:
                    entry["impl"] = f.impl
                del y, h
                if "fwd" in phases:
                    with torch.no_grad():
                        if inplace:
                            # Its own copies: its outputs overwrite its inputs (values drift from call
                            # to call, the work per call does not).
                            own = [(xi.clone(), ri.clone()) for xi, ri in zip(xs, rs)]
                            us = median_us(lambda i: f.fn(own[i][0], own[i][1], w), sets)
                            del own
                        else:
                            us = median_us(lambda i: f(xs[i], rs[i], w), sets)
                    gbs = fwd_bytes / us / 1e3
                    entry.update(fwd_us=us, fwd_gbs=gbs, fwd_pct=100 * gbs / copy_gbs)
                if "bwd" in phases and inplace:
                    entry["bwd"] = "n/a"  # inference only: no backward
                elif "bwd" in phases:
                    graphs = []
                    for i in range(sets):
                        xi, ri, wi = (t.detach().requires_grad_() for t in (xs[i], rs[i], w))
                        yi, hi = f(xi, ri, wi)
                        graphs.append(((yi, hi), (xi, ri, wi), (torch.randn_like(yi), torch.randn_like(hi))))

                    def bwd(i):
                        outs, ins, grads = graphs[i]
                        return torch.autograd.grad(outs, ins, grads, retain_graph=True)

                    us = median_us(bwd, sets)
                    gbs = bwd_bytes / us / 1e3
                    entry.update(bwd_us=us, bwd_gbs=gbs, bwd_pct=100 * gbs / copy_gbs)
                    del graphs
                row[name] = entry
                print(f"N={n} {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                    for k, v in entry.items()), flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"skip {name} N={n}: {type(e).__name__}: {e}"[:240], flush=True)
        results.append(row)
        if args.json:
            Path(args.json).write_text(json.dumps({"device": props.name, "torch": torch.__version__,
                                                   "results": results}, indent=1))
        del xs, rs, src, dst
        torch.cuda.empty_cache()
    # A table per phase: % of copy, and normjit's speed-up over the unfused normjit and over the best peer.
    for ph in phases:
        cols = [p for p in provs]
        print(f"\n{ph}: % of copy (GB/s)\n")
        print("| N | " + " | ".join(cols) + " | fused / unfused normjit | normjit / best peer |")
        print("|---" * (len(cols) + 3) + "|")
        for row in results:
            cells, peers = [], []
            for p in cols:
                e = row.get(p, {})
                if f"{ph}_pct" in e:
                    cells.append(f"{e[f'{ph}_pct']:.1f} ({e[f'{ph}_gbs']:.0f})")
                    if p in PEERS:
                        peers.append(e[f"{ph}_gbs"])
                else:
                    cells.append(e.get(ph, "–"))
            nj = row.get("normjit", {}).get(f"{ph}_gbs")
            un = row.get("normjit.unfused", {}).get(f"{ph}_gbs")
            speedup = f"{nj / un:.2f}x" if nj and un else "–"
            vs = f"{nj / max(peers):.2f}x" if nj and peers else "–"
            print(f"| {row['n']} | " + " | ".join(cells) + f" | {speedup} | {vs} |")


if __name__ == "__main__":
    main()
