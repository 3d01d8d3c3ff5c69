"""normjit for PyTorch: drop-in norm functions and modules running normjit's kernels.

    import normjit.torch as nt
    y = nt.layer_norm(x, (4096,), weight, bias)       # as torch.nn.functional.layer_norm
    nt.swap_norms(model)                              # nn.LayerNorm / nn.RMSNorm -> normjit's
    y, h = nt.add_rms_norm(x, residual, weight)       # h = x + residual; y = rms_norm(h)
    q, scale = nt.rms_norm_fp8(x, (4096,), weight)    # FP8 codes and per-row scales (inference)

Functions and modules take torch's arguments and run normjit's kernels on CUDA tensors (compiled on
first use per shape and dtype, then cached on disk), torch's functional ops on CPU tensors. The ops
behind them, ``torch.ops.normjit.norm_fwd`` / ``norm_bwd`` (see ``normjit.torch.ops``), have fake
implementations and autograd, so ``torch.compile(fullgraph=True)`` traces them. Under CUDA-graph
capture no kernel is compiled: run each call once before capturing.
"""
from ._launch import loaded_kernels, runtime
from .functional import (ada_layer_norm, ada_rms_norm, add_ada_layer_norm, add_ada_rms_norm, add_layer_norm,
                         add_rms_norm, add_rms_norm_fp8, add_rms_norm_int8, add_rms_norm_mxfp4, add_rms_norm_mxfp8,
                         add_rms_norm_nvfp4, layer_norm, layer_norm_fp8, layer_norm_mxfp4, layer_norm_mxfp8,
                         layer_norm_nvfp4, layer_norm_relu, rms_norm, rms_norm_fp8, rms_norm_int8, rms_norm_mxfp4,
                         rms_norm_mxfp8, rms_norm_nvfp4, rms_norm_relu)
from .modules import LayerNorm, RMSNorm, swap_norms

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "ada_layer_norm",
    "ada_rms_norm",
    "add_ada_layer_norm",
    "add_ada_rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "add_rms_norm_fp8",
    "add_rms_norm_int8",
    "add_rms_norm_mxfp4",
    "add_rms_norm_mxfp8",
    "add_rms_norm_nvfp4",
    "layer_norm",
    "layer_norm_fp8",
    "layer_norm_mxfp4",
    "layer_norm_mxfp8",
    "layer_norm_nvfp4",
    "layer_norm_relu",
    "loaded_kernels",
    "rms_norm",
    "rms_norm_fp8",
    "rms_norm_int8",
    "rms_norm_mxfp4",
    "rms_norm_mxfp8",
    "rms_norm_nvfp4",
    "rms_norm_relu",
    "runtime",
    "swap_norms",
]
