#!/usr/bin/env python3
"""The residual add + RMSNorm with a quantized output (vLLM's inference path before an FP8 or int8
GEMM) against the same work unfused, timed as bench/fusions.py times the fusions. Inference only.

Per N (bf16 x, residual and weight, M rows) and format (per-row fp8_e4m3, per-row int8, per-tensor
fp8_e4m3 with a given scale and an amax):
  normjit          normjit.torch.add_rms_norm_fp8 / add_rms_norm_int8: one kernel
  normjit.graph    the same call captured in a CUDA graph per buffer set and replayed: the
                   kernel without the eager call's host time
  normjit.unfused  normjit.torch.add_rms_norm, then the quantization in torch ops
  torch.eager      torch's add, F.rms_norm, then the quantization in torch ops
  torch.compile    that composition, compiled (Inductor fuses what it can)
  flashinfer       flashinfer.norm.fused_add_rmsnorm_quant, per-tensor fp8_e4m3 only (it has no fused
                   per-row fp8 or int8: n/a there): a static scale, codes of y / s (its scale is the
                   dequantization scale, so s = 1 / normjit's quant_scale), saturated to ±448; no
                   amax. On sm_90 its CuTe-DSL kernel where nvidia-cutlass-dsl imports, else its CUDA
                   one; PDL on, as FlashInfer defaults. h overwrites the residual in place, so it runs
                   on its own copies of the residuals and its own preallocated fp8 outputs, rotated as
                   the inputs are; checked on a fresh copy of set 0
  flashinfer.cuda  the same through FlashInfer's CUDA module (get_norm_module().fused_add_rmsnorm_quant)
The quantization: per row, scale = amax(row) / qmax and codes of y / scale (FP8 saturating, int8
rounded half to even); per tensor, codes of y * scale and amax = max |y|.
Bytes, each input read once and each output written once: x, residual, weight read; h (bf16), the
codes (one byte an element) and the per-row fp32 scales written. "% copy" divides by a
device-to-device copy of M·N bf16 elements in the same process. Every provider's codes are checked
against normjit's: within one step (the unfused ones quantize y after rounding it to bf16, so a
few per cent of codes land one step away); the fraction of equal codes is reported.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from peers import load_flashinfer, median_us  # noqa: E402

EPS = 1e-6
FP8_MAX = 448.0


def quantize(y, fmt, scale, amax):
    if fmt == "fp8_tensor":
        amax.copy_(torch.maximum(amax, y.abs().amax().float().reshape(1)))
        return (y.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale
    qmax = FP8_MAX if fmt == "fp8_row" else 127.0
    row_amax = y.abs().amax(-1, keepdim=True).float()
    s = torch.where(row_amax > 0, row_amax / qmax, torch.ones_like(row_amax))
    v = y.float() * (1.0 / s)
    if fmt == "int8_row":
        return v.round().clamp(-128, 127).to(torch.int8), s
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s


def composed(norm):
    def run(x, r, w, fmt, scale, amax):
        h, y = norm(x, r, w)
        q, s = quantize(y, fmt, scale, amax)
        return q, s, h
    return run


def torch_add_norm(x, r, w):
    h = x + r
    return h, F.rms_norm(h, h.shape[-1:], w, EPS)


def providers(names):
    import normjit.torch as nt

    def fused(x, r, w, fmt, scale, amax):
        if fmt == "int8_row":
            return nt.add_rms_norm_int8(x, r, w, EPS)
        if fmt == "fp8_row":
            return nt.add_rms_norm_fp8(x, r, w, EPS)
        return nt.add_rms_norm_fp8(x, r, w, EPS, quant_scale=scale, amax=amax)

    def normjit_add_norm(x, r, w):
        y, h = nt.add_rms_norm(x, r, w, EPS)
        return h, y

    table = {"normjit": fused, "normjit.graph": "graph", "normjit.unfused": composed(normjit_add_norm),
             "torch.eager": composed(torch_add_norm), "torch.compile": "compile"}
    out = {k: v for k, v in table.items() if k in names}
    if "flashinfer" in names or "flashinfer.cuda" in names:
        try:
            fi = load_flashinfer()
            if "flashinfer" in names:
                out["flashinfer"] = FlashInferQuant(
                    lambda q, x, r, w, s: fi.norm.fused_add_rmsnorm_quant(q, x, r, w, s, EPS))
            if "flashinfer.cuda" in names:
                mod = fi.cuda()
                out["flashinfer.cuda"] = FlashInferQuant(
                    lambda q, x, r, w, s: mod.fused_add_rmsnorm_quant(q, x, r, w, s, EPS, fi.pdl))
            print(f"flashinfer {fi.version}, enable_pdl={fi.pdl}; h over the residual in place")
        except Exception as e:  # noqa: BLE001
            print(f"skip flashinfer: {type(e).__name__}: {e}"[:200])
    return out


class FlashInferQuant:
    """fused_add_rmsnorm_quant(out, x, residual, weight, scale): fp8 codes of y / scale into out,
    h into residual; per-tensor static scale only."""
    FORMATS = ("fp8_tensor",)

    def __init__(self, fn):
        self.fn = fn

    def setup(self, xs, rs, w, fmt, scale):
        """Its buffers for one (N, format): (output for set 0, timed fn(i)); they live as long as fn."""
        s = torch.reciprocal(scale)  # FlashInfer divides by its scale; normjit multiplies by quant_scale
        r0, q0 = rs[0].clone(), torch.empty_like(xs[0], dtype=torch.float8_e4m3fn)
        self.fn(q0, xs[0], r0, w, s)
        own_r = [r.clone() for r in rs]
        qs = [torch.empty_like(x, dtype=torch.float8_e4m3fn) for x in xs]
        return (q0, s, r0), lambda i: self.fn(qs[i], xs[i], own_r[i], w, s)


def codes_agree(got, want, fmt):
    """Fraction of codes equal, and whether every code is within one step of the other's."""
    if fmt == "int8_row":
        g, w = got.int(), want.int()
        return (g == w).float().mean().item(), bool(((g - w).abs() <= 1).all())
    g, w = got.float(), want.float()
    return (g == w).float().mean().item(), bool(((g - w).abs() <= 0.125 * w.abs() + 2.0 ** -9).all())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[2880, 4096, 5120, 7168, 8192, 14336])
    ap.add_argument("--rows", type=int, default=0, help="M; default: 2^24 / N rounded up, at least 4096")
    ap.add_argument("--formats", nargs="+", default=["fp8_row", "int8_row", "fp8_tensor"])
    ap.add_argument("--providers", nargs="+",
                    default=["normjit", "normjit.graph", "normjit.unfused", "torch.eager", "torch.compile",
                             "flashinfer", "flashinfer.cuda"])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"{props.name}, torch {torch.__version__}")
    provs = providers(args.providers)
    rows_out = []
    for n in args.ns:
        m = args.rows or max(4096, math.ceil(2 ** 24 / n))
        elem = m * n * 2
        sets = max(2, math.ceil(4 * props.L2_cache_size / (2 * elem)))
        xs = [torch.randn(m, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        rs = [torch.randn(m, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        src = torch.empty(sets, m * n, device=dev, dtype=torch.bfloat16).normal_()
        dst = torch.empty_like(src)
        copy_us = median_us(lambda i: dst[i].copy_(src[i]), sets)
        copy_gbs = 2 * elem / copy_us / 1e3
        for fmt in args.formats:
            scale = torch.tensor([FP8_MAX / 8], device=dev)
            amax = torch.zeros(1, device=dev)
            nbytes = elem * 2 + n * 2 + elem + m * n + (m * 4 if fmt != "fp8_tensor" else 0)
            row = {"n": n, "rows": m, "format": fmt, "copy_gbs": copy_gbs, "bytes": nbytes}
            with torch.inference_mode():
                want = provs["normjit"](xs[0], rs[0], w, fmt, scale, amax) if "normjit" in provs else None
                for name, f in provs.items():
                    if isinstance(f, FlashInferQuant) and fmt not in f.FORMATS:
                        row[name] = {"na": True}
                        continue
                    if f == "compile":
                        torch._dynamo.reset()
                        f = torch.compile(composed(torch_add_norm), dynamic=False)
                    if f == "graph":
                        graphs, outs = [], []
                        for i in range(sets):
                            g = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(g):
                                outs.append(provs["normjit"](xs[i], rs[i], w, fmt, scale, amax))
                            graphs.append(g)
                        graphs[0].replay()
                        out = outs[0]
                        timed = lambda i, graphs=graphs: graphs[i].replay()  # noqa: E731
                    elif isinstance(f, FlashInferQuant):
                        try:
                            out, timed = f.setup(xs, rs, w, fmt, scale)
                        except Exception as e:  # noqa: BLE001 - a peer's failure skips it, not the run
                            print(f"skip {name} N={n} {fmt}: {type(e).__name__}: {e}"[:240], flush=True)
                            row[name] = {"skipped": f"{type(e).__name__}"}
                            continue
                    else:
                        out = f(xs[0], rs[0], w, fmt, scale, amax)
                        timed = lambda i, f=f: f(xs[i], rs[i], w, fmt, scale, amax)  # noqa: E731
                    entry = {}
                    if want is not None and name != "normjit":
                        equal, within_step = codes_agree(out[0], want[0], fmt)
                        entry.update(codes_equal=equal, within_one_step=within_step,
                                     h_exact=torch.equal(out[-1], want[-1]))
                    out = None
                    us = median_us(timed, sets)
                    gbs = nbytes / us / 1e3
                    entry.update(us=us, gbs=gbs, pct=100 * gbs / copy_gbs)
                    row[name] = entry
            rows_out.append(row)
            print(json.dumps(row))
    names = list(provs)
    print("\n| N | M | format | " + " | ".join(f"{p} % copy (µs)" for p in names) + " | normjit vs best other |")
    print("|---|---|---|" + "---|" * (len(names) + 1))
    for r in rows_out:
        cells = [f"{r[p]['pct']:.1f} ({r[p]['us']:.1f})" if "us" in r.get(p, {}) else "n/a" for p in names]
        others = [r[p]["us"] for p in names if not p.startswith("normjit") and "us" in r.get(p, {})]
        speedup = f"{min(others) / r['normjit']['us']:.2f}x" if others and "normjit" in r else "-"
        print(f"| {r['n']} | {r['rows']} | {r['format']} | " + " | ".join(cells) + f" | {speedup} |")
    bad = [(r["n"], r["format"], p) for r in rows_out for p in names
           if "within_one_step" in r.get(p, {}) and not r[p]["within_one_step"]]
    if bad:
        print(f"codes disagree with normjit's: {bad}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
