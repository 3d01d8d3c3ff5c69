"""A fresh process whose normjit runtime starts in async mode (NORMJIT_COMPILE_MODE=async) over an
empty cache: normjit.torch's first calls of new shapes run the generic kernels while the
specialized ones compile in the background, later calls the specialized ones; a CUDA graph
captured before a spec was ever run captures its generic kernel. Writes what it saw as JSON to
argv[1] (test_async_gpu.py checks it)."""
import json
import sys

import torch
import torch.nn.functional as F

import normjit
import normjit.torch as nt
from normjit.torch import _native


def worst_error(got, want):
    """max |got - want| / max |want|, want in float64."""
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def run(x, w, dy):
    """y = rms_norm(x) * w and its gradients through normjit, and their errors against float64 torch."""
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    y = nt.rms_norm(x, (x.shape[-1],), w, eps=1e-6)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64 = x.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    y64 = F.rms_norm(x64, (x.shape[-1],), w64, eps=1e-6)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    return {"y": worst_error(y, y64), "dx": worst_error(dx, dx64), "dw": worst_error(dw, dw64),
            "grad_fn": y.grad_fn.name()}


def main(out):
    torch.manual_seed(0)
    rt = normjit._normjit.shared_runtime(0)
    seen = {"mode": rt.compile_mode, "native": _native.eager_norm is not None}
    x = torch.randn(301, 3000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    seen["first"] = run(x, w, dy)
    torch.cuda.synchronize()
    seen["after_first"] = rt.counters()
    rt.wait_for_background_compiles()
    seen["second"] = run(x, w, dy)
    torch.cuda.synchronize()
    seen["after_second"] = rt.counters()
    # A spec never run before, captured: its generic kernel goes into the graph.
    xg = torch.randn(64, 3001, device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = nt.rms_norm(xg, (3001,))
    xg.copy_(torch.randn_like(xg))
    graph.replay()
    torch.cuda.synchronize()
    seen["graph"] = worst_error(yg, F.rms_norm(xg.double(), (3001,)))
    seen["after_graph"] = rt.counters()
    with open(out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(sys.argv[1])
