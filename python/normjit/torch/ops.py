"""normjit's torch custom ops, ``torch.ops.normjit.norm_fwd`` and ``norm_bwd``, with fake (meta)
implementations and autograd, for torch.compile and torch.library.opcheck. Eager calls on CUDA
tensors take ``torch.ops.normjit.eager_norm`` instead, the same kernels with a C++ autograd node
(``_native``), or, in a package built without it, the autograd Functions below.

    norm_fwd(x, weight?, bias?, norm, eps, training, epilogue, clip_lower, clip_upper)
        -> (y, mean, rstd, mask)
    norm_bwd(dy, x, weight?, mean, rstd, mask, norm, epilogue, bias_grad) -> (dx, dweight, dbias)

norm: "layernorm", "rmsnorm", "adalayernorm" or "adarmsnorm" (the Ada norms: x [B, S, n], weight / bias [B, n]); epilogue: "none"
or "relu_bitmask" (y clamped to [clip_lower, clip_upper], mask bit set where strictly inside).
x [..., n] f32 / f16 / bf16; weight [n] (or None: ones) and bias in one float dtype, not
necessarily x's. y has x's shape and dtype, and x's strides when its rows are evenly strided with a
contiguous last dimension (e.g. ``x[:, :n]`` of a wider tensor), else contiguous strides. mean /
rstd: fp32 [...] when training (mean is empty for rmsnorm); mask: uint8 [..., ceil(n / 8)] for
relu_bitmask. An output that is not produced is an empty [0] tensor. norm_bwd's dx follows the
same layout rule (x's strides when dy shares them), dweight / dbias are weight-shaped (empty
without a weight, or without bias_grad).
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _launch, _native, _reference

_NORMS = ("layernorm", "rmsnorm", "adalayernorm", "adarmsnorm")
_EPILOGUES = ("none", "relu_bitmask")


def _check_names(norm, epilogue):
    if norm not in _NORMS:
        raise ValueError(f"norm={norm!r} is not one of {', '.join(_NORMS)}")
    if epilogue not in _EPILOGUES:
        raise ValueError(f"epilogue={epilogue!r} is not one of {', '.join(_EPILOGUES)}")


def _check_memory_efficient(memory_efficient, epilogue):
    if memory_efficient and epilogue != "none":
        raise ValueError(f"memory_efficient=True recovers x from y, which epilogue={epilogue!r} does not leave "
                         "invertible")


def _or_empty(t, like, dtype):
    return t if t is not None else like.new_empty((0,), dtype=dtype)


@torch.library.custom_op("normjit::norm_fwd", mutates_args=())
def norm_fwd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], norm: str, eps: float, training: bool,
             epilogue: str, clip_lower: float, clip_upper: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_names(norm, epilogue)
    impl = _launch.forward if x.is_cuda else _reference.forward
    y, mean, rstd, mask = impl(x, weight, bias, norm, eps, training, epilogue, clip_lower, clip_upper)
    lead = x.shape[:-1]
    mean = mean.view(lead) if mean is not None else x.new_empty((0,), dtype=torch.float32)
    rstd = rstd.view(lead) if rstd is not None else x.new_empty((0,), dtype=torch.float32)
    mask = mask.view(lead + mask.shape[-1:]) if mask is not None else x.new_empty((0,), dtype=torch.uint8)
    return y, mean, rstd, mask


@norm_fwd.register_fake
def _norm_fwd_fake(x, weight, bias, norm, eps, training, epilogue, clip_lower, clip_upper):
    _check_names(norm, epilogue)
    x, rs = _launch.layout(x)
    lead = x.shape[:-1]
    y = _launch.like_rows(x, rs)
    stat = x.new_empty(lead if training else (0,), dtype=torch.float32)
    mean = x.new_empty(lead if training and _launch.subtracts_mean(norm) else (0,), dtype=torch.float32)
    mask = x.new_empty(lead + ((x.shape[-1] + 7) // 8,) if epilogue != "none" else (0,), dtype=torch.uint8)
    return y, mean, stat, mask


@torch.library.custom_op("normjit::norm_bwd", mutates_args=())
def norm_bwd(dy: Tensor, x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor, mask: Tensor, norm: str,
             epilogue: str, bias_grad: bool) -> Tuple[Tensor, Tensor, Tensor]:
    _check_names(norm, epilogue)
    if bias_grad and weight is None:
        raise ValueError("bias_grad=True needs the weight (pass ones for a norm without one)")
    impl = _launch.backward if x.is_cuda else _reference.backward
    dx, dweight, dbias = impl(dy, x, weight, mean if _launch.subtracts_mean(norm) else None, rstd,
                              mask if epilogue != "none" else None, norm, epilogue, bias_grad)
    return dx, _or_empty(dweight, x, x.dtype), _or_empty(dbias, x, x.dtype)


@norm_bwd.register_fake
def _norm_bwd_fake(dy, x, weight, mean, rstd, mask, norm, epilogue, bias_grad):
    _check_names(norm, epilogue)
    x, dy, rs = _launch.backward_layout(x, dy)
    dx = _launch.like_rows(x, rs)
    dweight = torch.empty_like(weight, memory_format=torch.contiguous_format) if weight is not None else x.new_empty((0,))
    dbias = (torch.empty_like(weight, memory_format=torch.contiguous_format) if bias_grad and weight is not None
             else x.new_empty((0,)))
    return dx, dweight, dbias


def _setup_fwd(ctx, inputs, output):
    x, weight, bias, norm, eps, training, epilogue, clip_lower, clip_upper = inputs
    y, mean, rstd, mask = output
    ctx.norm = norm
    ctx.epilogue = epilogue
    ctx.training = training
    ctx.save_for_backward(x, weight, mean, rstd, mask)
    ctx.mark_non_differentiable(mean, rstd, mask)


def _backward_fwd(ctx, dy, dmean, drstd, dmask):
    if not ctx.training:
        raise RuntimeError("normjit::norm_fwd ran with training=False, which keeps no statistics for a backward; "
                           "call it with training=True where gradients are needed")
    x, weight, mean, rstd, mask = ctx.saved_tensors
    want_dx, want_dw, want_db = ctx.needs_input_grad[:3]
    dx, dw, db = torch.ops.normjit.norm_bwd(dy, x, weight, mean, rstd, mask, ctx.norm, ctx.epilogue, want_db)
    return (dx if want_dx else None, dw if want_dw else None, db if want_db else None,
            None, None, None, None, None, None)


norm_fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)


class NormFunction(torch.autograd.Function):
    """Eager autograd for CUDA tensors: _launch.forward / backward called directly.
    Returns y, or (y, mask) for relu_bitmask."""

    @staticmethod
    def forward(ctx, x, weight, bias, norm, eps, epilogue, clip_lower, clip_upper):
        y, mean, rstd, mask = _launch.forward(x, weight, bias, norm, eps, True, epilogue, clip_lower, clip_upper)
        ctx.norm = norm
        ctx.epilogue = epilogue
        # mean / rstd never reach the caller, so nothing can modify them in place: attributes skip
        # save_for_backward's per-tensor bookkeeping (16 us of a 270 us forward + backward on the device host).
        ctx.stats = (mean, rstd)
        ctx.save_for_backward(x, weight, mask)
        if mask is None:
            return y
        ctx.mark_non_differentiable(mask)
        return y, mask

    @staticmethod
    def backward(ctx, dy, *unused):
        x, weight, mask = ctx.saved_tensors
        mean, rstd = ctx.stats
        want_dx, want_dw, want_db = ctx.needs_input_grad[:3]
        dx, dw, db = _launch.backward(dy, x, weight, mean, rstd, mask, ctx.norm, ctx.epilogue, want_db)
        return (dx if want_dx else None, dw if want_dw else None, db if want_db else None,
                None, None, None, None, None)


def call(x, weight, bias, norm, eps, epilogue, clip_lower=0.0, clip_upper=math.inf):
    """Runs a norm whose arguments are checked: eagerly on plain CUDA tensors, else through
    torch.ops.normjit.norm_fwd (compiling, fake / meta tensors, tensor subclasses, CPU).
    Returns y, or (y, mask) for relu_bitmask."""
    eager = not torch.compiler.is_compiling() and x.is_cuda and type(x) is Tensor
    if eager and _native.eager_norm is not None:
        out = _native.eager_norm(x, None, weight, bias, _native.NORMS[norm], eps, False, _native.EPILOGUES[epilogue],
                                 clip_lower, clip_upper)
        return out[0] if len(out) == 1 else tuple(out)
    grad = torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad) or
                                        (bias is not None and bias.requires_grad))
    if eager:
        if grad:
            return NormFunction.apply(x, weight, bias, norm, eps, epilogue, clip_lower, clip_upper)
        y, _, _, mask = _launch.forward(x, weight, bias, norm, eps, False, epilogue, clip_lower, clip_upper)
        return y if mask is None else (y, mask)
    y, _, _, mask = torch.ops.normjit.norm_fwd(x, weight, bias, norm, eps, grad, epilogue, clip_lower, clip_upper)
    return y if epilogue == "none" else (y, mask)


# The fusions: a residual add before the norm (h = x + residual, written out and normalized) and
# zero-centred weights (scale 1 + weight). Separate ops, so the plain ones keep their schema.
#
#     fused_norm_fwd(x, residual?, weight?, bias?, norm, eps, training, zero_centered, epilogue,
#                    clip_lower, clip_upper, memory_efficient, bias_in?) -> (y, h, mean, rstd, mask)
#     fused_norm_bwd(dy, dh_out?, x, weight?, mean, rstd, mask, norm, zero_centered, epilogue,
#                    bias_grad, bias?, memory_efficient, stream_f32) -> (dx, dweight, dbias, dresidual)
#
# h is x's shape and layout in the residual's dtype (x's, or float32 for an fp32 residual stream
# beside a bf16 / f16 x), empty [0] without a residual. The backward's x is the forward's h, and its
# dx (dnorm(dy) + dh_out) is the gradient of both x and residual; with stream_f32, dx comes in dy's
# dtype (x's gradient) and dresidual in float32 (the residual's), else dresidual is empty [0].
# bias_in ([n]) is added with the residual; its gradient is the column sum of dh.


@torch.library.custom_op("normjit::fused_norm_fwd", mutates_args=())
def fused_norm_fwd(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor], norm: str,
                   eps: float, training: bool, zero_centered: bool, epilogue: str, clip_lower: float,
                   clip_upper: float, memory_efficient: bool = False,
                   bias_in: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    _check_names(norm, epilogue)
    _check_memory_efficient(memory_efficient, epilogue)
    if bias_in is not None and residual is None:
        raise ValueError("bias_in is added with the residual; it needs a residual")
    impl = _launch.forward_fused if x.is_cuda else _reference.forward_fused
    y, h, mean, rstd, mask = impl(x, residual, weight, bias, norm, eps, training, zero_centered, epilogue, clip_lower,
                                  clip_upper, bias_in)
    lead = x.shape[:-1]
    h = h if h is not None else x.new_empty((0,))
    mean = mean.view(lead) if mean is not None else x.new_empty((0,), dtype=torch.float32)
    rstd = rstd.view(lead) if rstd is not None else x.new_empty((0,), dtype=torch.float32)
    mask = mask.view(lead + mask.shape[-1:]) if mask is not None else x.new_empty((0,), dtype=torch.uint8)
    return y, h, mean, rstd, mask


@fused_norm_fwd.register_fake
def _fused_norm_fwd_fake(x, residual, weight, bias, norm, eps, training, zero_centered, epilogue, clip_lower,
                         clip_upper, memory_efficient=False, bias_in=None):
    _check_memory_efficient(memory_efficient, epilogue)
    # With a residual, x and h take the layout x and residual share (contiguous where they differ).
    if residual is not None:
        x, residual, rs = _launch._shared_layout(x, residual)
    y, mean, rstd, mask = _norm_fwd_fake(x, weight, bias, norm, eps, training, epilogue, clip_lower, clip_upper)
    h = _launch.like_rows(x, rs, residual.dtype) if residual is not None else x.new_empty((0,))
    return y, h, mean, rstd, mask


@torch.library.custom_op("normjit::fused_norm_bwd", mutates_args=())
def fused_norm_bwd(dy: Tensor, dh_out: Optional[Tensor], x: Tensor, weight: Optional[Tensor], mean: Tensor,
                   rstd: Tensor, mask: Tensor, norm: str, zero_centered: bool, epilogue: str,
                   bias_grad: bool, bias: Optional[Tensor] = None, memory_efficient: bool = False,
                   stream_f32: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_names(norm, epilogue)
    _check_memory_efficient(memory_efficient, epilogue)
    if bias_grad and weight is None:
        raise ValueError("bias_grad=True needs the weight (pass ones for a norm without one)")
    _check_stream(stream_f32, dh_out, x, dy)
    impl = _launch.backward_fused if x.is_cuda else _reference.backward_fused
    dx, dweight, dbias, dresidual = impl(dy, dh_out, x, weight, mean if _launch.subtracts_mean(norm) else None, rstd,
                                         mask if epilogue != "none" else None, norm, zero_centered, epilogue,
                                         bias_grad, bias, memory_efficient, stream_f32)
    return dx, _or_empty(dweight, x, x.dtype), _or_empty(dbias, x, x.dtype), _or_empty(dresidual, x, x.dtype)


def _check_stream(stream_f32, dh_out, x, dy):
    if stream_f32 and (dh_out is None or x.dtype != torch.float32 or dh_out.dtype != torch.float32
                       or dy.dtype not in (torch.bfloat16, torch.float16)):
        raise ValueError(f"stream_f32=True takes x (h) and dh_out float32 beside dy bfloat16 / float16; got x "
                         f"{x.dtype}, dh_out {None if dh_out is None else dh_out.dtype}, dy {dy.dtype}")


@fused_norm_bwd.register_fake
def _fused_norm_bwd_fake(dy, dh_out, x, weight, mean, rstd, mask, norm, zero_centered, epilogue, bias_grad, bias=None,
                         memory_efficient=False, stream_f32=False):
    _check_stream(stream_f32, dh_out, x, dy)
    dx, dweight, dbias = _norm_bwd_fake(dy, x, weight, mean, rstd, mask, norm, epilogue, bias_grad)
    if dh_out is not None:
        x, dy, rs = _launch.backward_layout(x, dy)
        if _launch.rows_apart(dh_out) != rs:
            dx = _launch.like_rows(x, x.shape[-1])
    dresidual = x.new_empty((0,))
    if stream_f32:
        dresidual = dx
        dx = torch.empty_like(dx, dtype=dy.dtype)
    return dx, dweight, dbias, dresidual


def _residual_grads(ctx, dx, dresidual, want_dx, want_dres, want_dbias_in):
    """The gradients of x, residual and bias_in from the backward's dx (and dresidual): one
    gradient dh for both inputs, rounded to x's dtype for x where the stream is fp32; bias_in's is
    dh summed over the rows. A stream without dh_out ran the plain fp32 backward: dx is dh."""
    dh = dresidual if dresidual is not None else dx
    gx = dx.to(ctx.x_dtype) if want_dx else None
    gb = None
    if want_dbias_in:
        gb = dh.float().reshape(-1, dh.shape[-1]).sum(0).to(ctx.bias_in_dtype)
    return gx, (dh if want_dres else None), gb


def _remember_fusion(ctx, x, residual, y, h, norm, epilogue, zero_centered, memory_efficient, bias_in):
    """What a fused forward's backward needs besides its saved tensors (on ctx); returns the row
    tensor to save: y for memory_efficient (x̂ is recovered from it), else h with a residual, else x."""
    ctx.norm = norm
    ctx.epilogue = epilogue
    ctx.zero_centered = zero_centered
    ctx.residual = residual is not None
    ctx.stream_f32 = residual is not None and _launch.is_f32_stream(x.dtype, residual.dtype)
    ctx.x_dtype = x.dtype
    ctx.bias_in_dtype = None if bias_in is None else bias_in.dtype
    ctx.memory_efficient = memory_efficient
    return y if memory_efficient else h if residual is not None else x


def _setup_fused_fwd(ctx, inputs, output):
    x, residual, weight, bias, norm, eps, training, zero_centered, epilogue, clip_lower, clip_upper = inputs[:11]
    memory_efficient = len(inputs) > 11 and inputs[11]
    bias_in = inputs[12] if len(inputs) > 12 else None
    y, h, mean, rstd, mask = output
    ctx.training = training
    kept = _remember_fusion(ctx, x, residual, y, h, norm, epilogue, zero_centered, memory_efficient, bias_in)
    ctx.save_for_backward(kept, weight, mean, rstd, mask, bias if memory_efficient else None)
    ctx.mark_non_differentiable(mean, rstd, mask)


def _backward_fused_fwd(ctx, dy, dh, dmean, drstd, dmask):
    if not ctx.training:
        raise RuntimeError("normjit::fused_norm_fwd ran with training=False, which keeps no statistics for a "
                           "backward; call it with training=True where gradients are needed")
    x, weight, mean, rstd, mask, bias = ctx.saved_tensors
    want_dx, want_dres, want_dw, want_db = ctx.needs_input_grad[:4]
    want_dbias_in = len(ctx.needs_input_grad) > 12 and ctx.needs_input_grad[12]
    dh_out = dh if ctx.residual else None
    stream_f32 = ctx.stream_f32 and dh_out is not None
    dx, dw, db, dres = torch.ops.normjit.fused_norm_bwd(dy, dh_out, x, weight, mean, rstd, mask, ctx.norm,
                                                         ctx.zero_centered, ctx.epilogue, want_db, bias,
                                                         ctx.memory_efficient, stream_f32)
    gx, gres, gbias_in = _residual_grads(ctx, dx, dres if stream_f32 else None, want_dx, want_dres, want_dbias_in)
    return (gx, gres, dw if want_dw else None, db if want_db else None,
            None, None, None, None, None, None, None, None, gbias_in)


fused_norm_fwd.register_autograd(_backward_fused_fwd, setup_context=_setup_fused_fwd)


class FusedNormFunction(torch.autograd.Function):
    """Eager autograd of the fusions on CUDA tensors. Returns (y, h) with a residual, else y; and
    the mask last for relu_bitmask."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, norm, eps, zero_centered, epilogue, clip_lower, clip_upper,
                memory_efficient=False, bias_in=None):
        y, h, mean, rstd, mask = _launch.forward_fused(x, residual, weight, bias, norm, eps, True, zero_centered,
                                                       epilogue, clip_lower, clip_upper, bias_in)
        kept = _remember_fusion(ctx, x, residual, y, h, norm, epilogue, zero_centered, memory_efficient, bias_in)
        ctx.stats = (mean, rstd)  # see NormFunction
        ctx.save_for_backward(kept, weight, mask, bias if memory_efficient else None)
        out = (y,) if residual is None else (y, h)
        if mask is not None:
            ctx.mark_non_differentiable(mask)
            out += (mask,)
        return out if len(out) > 1 else y

    @staticmethod
    def backward(ctx, dy, *rest):
        x, weight, mask, bias = ctx.saved_tensors
        mean, rstd = ctx.stats
        want_dx, want_dres, want_dw, want_db = ctx.needs_input_grad[:4]
        want_dbias_in = ctx.needs_input_grad[11]
        dh_out = rest[0] if ctx.residual else None
        stream_f32 = ctx.stream_f32 and dh_out is not None
        dx, dw, db, dres = _launch.backward_fused(dy, dh_out, x, weight, mean, rstd, mask, ctx.norm,
                                                  ctx.zero_centered, ctx.epilogue, want_db, bias,
                                                  ctx.memory_efficient, stream_f32)
        gx, gres, gbias_in = _residual_grads(ctx, dx, dres, want_dx, want_dres, want_dbias_in)
        return (gx, gres, dw if want_dw else None, db if want_db else None, None, None, None, None, None, None, None,
                gbias_in)


def call_fused(x, residual, weight, bias, norm, eps, zero_centered, epilogue="none", clip_lower=0.0,
               clip_upper=math.inf, memory_efficient=False, bias_in=None):
    """call() with the fusions. Returns (y, h) with a residual, else y; the mask last for relu_bitmask.
    memory_efficient: the backward keeps y instead of x (check_memory_efficient_weights first).
    A float32 residual beside a bf16 / f16 x is an fp32 residual stream (h float32); bias_in ([n])
    is added with the residual."""
    eager = not torch.compiler.is_compiling() and x.is_cuda and type(x) is Tensor
    # The C++ eager path covers the residual in x's dtype without bias_in.
    native = (not memory_efficient and bias_in is None and (residual is None or residual.dtype == x.dtype))
    if eager and _native.eager_norm is not None and native:
        out = _native.eager_norm(x, residual, weight, bias, _native.NORMS[norm], eps, zero_centered,
                                 _native.EPILOGUES[epilogue], clip_lower, clip_upper)
        return out[0] if len(out) == 1 else tuple(out)
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, residual, weight, bias, bias_in))
    if eager:
        if grad:
            return FusedNormFunction.apply(x, residual, weight, bias, norm, eps, zero_centered, epilogue, clip_lower,
                                           clip_upper, memory_efficient, bias_in)
        y, h, _, _, mask = _launch.forward_fused(x, residual, weight, bias, norm, eps, False, zero_centered, epilogue,
                                                 clip_lower, clip_upper, bias_in)
    else:
        y, h, _, _, mask = torch.ops.normjit.fused_norm_fwd(x, residual, weight, bias, norm, eps, grad, zero_centered,
                                                            epilogue, clip_lower, clip_upper, memory_efficient,
                                                            bias_in)
        if residual is None:
            h = None
        if epilogue == "none":
            mask = None
    out = tuple(t for t in (y, h, mask) if t is not None)
    return out if len(out) > 1 else y


# Quantized outputs, inference only (no autograd: the gradient of a quantized output is the plain
# norm's, which layer_norm / rms_norm give):
#
#     quant_norm_fwd(x, residual?, weight?, bias?, norm, eps, zero_centered, quant, quant_scale?,
#                    amax?, want_y, scale_layout="row_major") -> (y_quant, scales, y, h)
#
# quant: "fp8_e4m3" / "fp8_e5m2" (per tensor: codes of y * quant_scale, max |y| folded into amax in
# place where given), "fp8_e4m3_row" / "fp8_e5m2_row" / "int8_row" (per row: scales [..., 1] fp32,
# y ~ codes * scale), "mxfp8_e4m3" / "mxfp8_e5m2" / "mxfp4" (OCP MX: E8M0 scales, one per 32
# values) or "nvfp4" (e4m3 scales, one per 16 values; quant_scale the fp32 tensor scale S_enc).
# y_quant has x's shape and row layout in float8_e4m3fn / float8_e5m2 / int8; e2m1 codes (mxfp4,
# nvfp4) [..., n / 2] in float4_e2m1fn_x2 (uint8 on a torch without it), two a byte, the first
# element in the low nibble. Block scales are [..., ceil(n / block)] with scale_layout "row_major",
# or the GEMMs' 128x4 tiles with "swizzled": [roundup(rows, 128), roundup(cols, 4)], padding zero.
# Outputs not produced (scales per tensor, y without want_y, h without residual) are empty [0].
# residual (x's shape) is in x's dtype, or float32 beside a bf16 / f16 x: an fp32 residual stream
# (.residual_f32), where h = x + residual is summed in fp32 and kept float32, and y and the codes
# come from it; h is in the residual's dtype.
_QUANTS = tuple(_launch.QUANT_DTYPES)


def _check_quant(norm, quant, scale_layout="row_major", x=None, residual=None):
    _check_names(norm, "none")
    if residual is not None and residual.dtype != x.dtype and not _launch.is_f32_stream(x.dtype, residual.dtype):
        also = " or float32 (an fp32 residual stream)" if x.dtype != torch.float32 else ""
        raise ValueError(f"residual.dtype={residual.dtype}: the residual must be in x's dtype ({x.dtype}){also}")
    if quant not in _QUANTS:
        raise ValueError(f"quant={quant!r} is not one of {', '.join(_QUANTS)}")
    if scale_layout not in _launch.SCALE_LAYOUTS:
        raise ValueError(f"scale_layout={scale_layout!r} is not one of {', '.join(map(repr, _launch.SCALE_LAYOUTS))}")
    if scale_layout != "row_major" and quant not in _launch.BLOCK_SIZES:
        raise ValueError(f"scale_layout={scale_layout!r}: quant={quant!r} has no block scales")


def _op_scales_dtype(quant):
    """The op's block-scale dtype: MX scales leave it as uint8 E8M0 codes, which the functions view
    as torch.float8_e8m0fnu. With float8_e8m0fnu outputs, inductor failed to compile the op
    ("auto_functionalized_v2 was not removed"; torch 2.11 and 2.15)."""
    dtype = _launch.block_scales_dtype(quant)
    return torch.uint8 if dtype == _launch.E8M0 else dtype


@torch.library.custom_op("normjit::quant_norm_fwd", mutates_args=("amax",))
def quant_norm_fwd(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor], norm: str,
                   eps: float, zero_centered: bool, quant: str, quant_scale: Optional[Tensor], amax: Optional[Tensor],
                   want_y: bool, scale_layout: str = "row_major") -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    _check_quant(norm, quant, scale_layout, x, residual)
    impl = _launch.forward_quant if x.is_cuda else _reference.forward_quant
    y_quant, scales, y, h = impl(x, residual, weight, bias, norm, eps, zero_centered, quant, quant_scale, amax, want_y,
                                 scale_layout)
    if scales is not None and scales.dtype == _launch.E8M0:
        scales = scales.view(torch.uint8)  # see _op_scales_dtype
    # A fresh empty tensor for each output not produced: outputs may not alias each other.
    return (y_quant, scales if scales is not None else x.new_empty((0,), dtype=torch.float32),
            y if y is not None else x.new_empty((0,)), h if h is not None else x.new_empty((0,)))


@quant_norm_fwd.register_fake
def _quant_norm_fwd_fake(x, residual, weight, bias, norm, eps, zero_centered, quant, quant_scale, amax, want_y,
                         scale_layout="row_major"):
    _check_quant(norm, quant, scale_layout, x, residual)
    x, residual, rs, h = _launch.quant_layout(x, residual, quant)
    if quant in _launch.FP4_QUANTS:
        y_quant = _launch.packed_rows(x, rs, _launch.QUANT_DTYPES[quant])
    else:
        y_quant = _launch.like_rows(x, rs, _launch.QUANT_DTYPES[quant])
    if quant.endswith("_row"):
        scales = x.new_empty(x.shape[:-1] + (1,), dtype=torch.float32)
    elif quant in _launch.BLOCK_SIZES:
        scales = x.new_empty(_launch.block_scales_shape(x, quant, scale_layout), dtype=_op_scales_dtype(quant))
    else:
        scales = x.new_empty((0,), dtype=torch.float32)
    y = _launch.like_rows(x, rs) if want_y else x.new_empty((0,))
    h = h if h is not None else x.new_empty((0,))  # the residual's dtype
    return y_quant, scales, y, h
