"""normjit's norms as functions with torch's signatures.

CUDA tensors run normjit's kernels. CPU tensors go to torch's own ``F.layer_norm`` / ``F.rms_norm``
unchanged, with torch's checks and dtypes, so a swapped model still runs on CPU; ada_layer_norm and
the *_relu functions, which torch lacks, run the ops' plain-torch reference on CPU. x is f32, f16 or bf16 with any leading dimensions; weight and bias share one float dtype,
which may differ from x's (bf16 x with fp32 weights); y is in x's dtype. The normalized size N (the
product of normalized_shape) is 1 to 262144. x whose rows are evenly strided with a contiguous last
dimension (``x[:, :N]`` of a wider tensor) is read in place and y gets x's strides; any other layout
is copied to a contiguous one first.
"""
import math

import torch
import torch.nn.functional as F

from . import _launch, ops


def _shape_tuple(normalized_shape):
    if isinstance(normalized_shape, int):
        return (normalized_shape,)
    try:
        return tuple(normalized_shape)
    except TypeError:
        raise TypeError(f"normalized_shape={normalized_shape!r} is not an int or a sequence of ints") from None


def _check_param(name, t, x, shape):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} is a {type(t).__name__}, not a torch.Tensor")
    if t.shape != shape:
        raise ValueError(f"{name} has shape {list(t.shape)}; expected {list(shape)}")
    if t.dtype not in _launch.DTYPE_NAMES:
        raise TypeError(f"{name}.dtype={t.dtype} is not supported; use float32, float16 or bfloat16")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _check_x(x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x is a {type(x).__name__}, not a torch.Tensor")
    if x.dtype not in _launch.DTYPE_NAMES:
        raise TypeError(f"x.dtype={x.dtype} is not supported; use float32, float16 or bfloat16")


def _check_eps(eps):
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps={eps} must be finite and > 0")


def _prepare(x, normalized_shape, weight, bias, zero_centered=False):
    """Checks the arguments; returns (x, weight, bias, shape to restore or None), x as [..., N] with
    the normalized dimensions flattened and a ones weight where only a bias is given."""
    _check_x(x)
    ns = _shape_tuple(normalized_shape)
    k = len(ns)
    if k == 1:
        bad = x.dim() == 0 or x.shape[-1] != ns[0]
    else:
        bad = k == 0 or x.dim() < k or x.shape[x.dim() - k:] != ns
    if bad:
        raise ValueError(f"normalized_shape={list(ns)} does not match the last dimensions of x with shape "
                         f"{list(x.shape)}")
    n = ns[0] if k == 1 else math.prod(ns)
    if not 1 <= n <= _launch.MAX_N:
        raise ValueError(f"normalized_shape={list(ns)} normalizes {n} elements; normjit takes 1 to {_launch.MAX_N}")
    if weight is not None:
        _check_param("weight", weight, x, ns)
    if bias is not None:
        _check_param("bias", bias, x, ns)
        if weight is not None and weight.dtype != bias.dtype:
            raise TypeError(f"weight.dtype={weight.dtype} and bias.dtype={bias.dtype} differ; normjit takes one "
                            "parameter dtype")
    restore = None
    if k > 1:
        restore = x.shape
        x = x.reshape(x.shape[:-k] + (n,))
        weight = weight.reshape(n) if weight is not None else None
        bias = bias.reshape(n) if bias is not None else None
    _check_zero_centered(weight, zero_centered)
    if weight is None and bias is not None:
        # The cached ones eagerly; a traced graph makes its own.
        eager = x.is_cuda and not torch.compiler.is_compiling()
        weight = _launch.ones_weight(x.device, bias.dtype, n) if eager else bias.new_ones(n)
    return x, weight, bias, restore


def _restore(out, restore):
    if restore is None:
        return out
    if isinstance(out, tuple):
        return (out[0].reshape(restore),) + out[1:]
    return out.reshape(restore)


def _rms_eps(x, eps):
    return torch.finfo(x.dtype).eps if eps is None else eps


def _check_zero_centered(weight, zero_centered):
    if zero_centered and weight is None:
        raise ValueError("zero_centered=True needs a weight: the scale is 1 + weight")


def _zero_centered_weight(weight, zero_centered):
    _check_zero_centered(weight, zero_centered)
    return weight + 1 if zero_centered else weight


# memory_efficient=True: the backward recovers x̂ = (y - bias) / scale from the output y (scale =
# weight, or 1 + weight zero-centred) instead of keeping x. y's rounding (u: half an ulp of its dtype,
# relative) then puts an error of u * (|x̂| + |bias / scale|) on x̂: refused where a column has
# scale = 0 or |bias| > MEMORY_EFFICIENT_MAX_BIAS_RATIO * |scale| (docs/fusions.md).
MEMORY_EFFICIENT_MAX_BIAS_RATIO = 8.0
_checked_weights = {}


def _use_memory_efficient(name, memory_efficient, inputs, weight, bias, zero_centered):
    """Whether a call keeps y for its backward: memory_efficient asked for and a gradient needed
    (without one nothing is kept); the weights are checked first."""
    if not (memory_efficient and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)):
        return False
    _check_memory_efficient_weights(name, weight, bias, zero_centered)
    return True


def _check_memory_efficient_weights(name, weight, bias, zero_centered):
    """Raises ValueError naming the first column where x̂ cannot be recovered from y. One device
    reduction and host sync per new weight version (an optimizer step makes a new one); skipped
    while torch.compile traces or a CUDA graph captures, where the caller vouches for the weights."""
    if weight is None and bias is None:
        return
    if torch.compiler.is_compiling() or (weight is not None and weight.is_cuda and
                                         torch.cuda.is_current_stream_capturing()):
        return
    key = tuple((t.data_ptr(), t._version) if t is not None else None for t in (weight, bias)) + (zero_centered,)
    if key in _checked_weights:
        return
    with torch.no_grad():
        scale = (weight.float() + 1 if zero_centered else weight.float()) if weight is not None else None
        shift = bias.float().abs() if bias is not None else None
        if scale is None:  # a ones scale: only the bias can exceed it
            bad = shift > MEMORY_EFFICIENT_MAX_BIAS_RATIO
        else:
            bad = scale == 0
            if shift is not None:
                bad |= shift > MEMORY_EFFICIENT_MAX_BIAS_RATIO * scale.abs()
        flat = bad.reshape(-1)
        if bool(flat.any()):
            j = int(flat.nonzero()[0])
            s = float(scale.reshape(-1)[j]) if scale is not None else 1.0
            b = float(bias.reshape(-1)[j]) if bias is not None else 0.0
            where = "1 + weight" if zero_centered else "weight"
            raise ValueError(f"{name}: memory_efficient=True recovers x from y as (y - bias) / ({where}), which loses "
                             f"x at element {j} of the weights: {where}={s:g}, bias={b:g} (needs {where} != 0 and "
                             f"|bias| <= {MEMORY_EFFICIENT_MAX_BIAS_RATIO:g} * |{where}|); use "
                             "memory_efficient=False")
    if len(_checked_weights) > 256:
        _checked_weights.clear()
    _checked_weights[key] = True


def _norm_call(x, weight, bias, norm, eps, zero_centered, memory_efficient=False, name=None):
    """The plain op, or the fused one for zero-centred weights or memory_efficient; arguments already
    checked."""
    if _use_memory_efficient(name or norm, memory_efficient, (x, weight, bias), weight, bias, zero_centered):
        return ops.call_fused(x, None, weight, bias, norm, float(eps), zero_centered, memory_efficient=True)
    if zero_centered:
        return ops.call_fused(x, None, weight, bias, norm, float(eps), True)
    return ops.call(x, weight, bias, norm, float(eps), "none")


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, zero_centered=False,
               memory_efficient=False):
    """LayerNorm over the last dimensions: y = (x - mean) / sqrt(var + eps) * weight + bias, with var
    the biased variance; as ``torch.nn.functional.layer_norm``. zero_centered: the scale is
    1 + weight (Gemma, TransformerEngine's zero_centered_gamma); weight's gradient keeps its meaning.
    memory_efficient: autograd keeps y instead of x, and the backward recovers x̂ from it (Apex's
    memory_efficient; refused for weights where that loses x̂, see MEMORY_EFFICIENT_MAX_BIAS_RATIO;
    CUDA only: CPU tensors keep torch's own backward)."""
    if isinstance(x, torch.Tensor) and x.is_cpu:
        return F.layer_norm(x, _shape_tuple(normalized_shape), _zero_centered_weight(weight, zero_centered), bias, eps)
    x2, w, b, restore = _prepare(x, normalized_shape, weight, bias, zero_centered)
    _check_eps(eps)
    return _restore(_norm_call(x2, w, b, "layernorm", eps, zero_centered, memory_efficient, "layer_norm"), restore)


def rms_norm(x, normalized_shape, weight=None, eps=None, bias=None, *, zero_centered=False, memory_efficient=False):
    """RMSNorm over the last dimensions: y = x / sqrt(mean(x^2) + eps) * weight (+ bias, normjit's
    addition); as ``torch.nn.functional.rms_norm``: eps=None means ``torch.finfo(x.dtype).eps``.
    zero_centered: the scale is 1 + weight (Gemma). memory_efficient: as layer_norm's."""
    if isinstance(x, torch.Tensor) and x.is_cpu:
        y = F.rms_norm(x, _shape_tuple(normalized_shape), _zero_centered_weight(weight, zero_centered), eps)
        return y if bias is None else y + bias
    x2, w, b, restore = _prepare(x, normalized_shape, weight, bias, zero_centered)
    eps = _rms_eps(x, eps)
    _check_eps(eps)
    return _restore(_norm_call(x2, w, b, "rmsnorm", eps, zero_centered, memory_efficient, "rms_norm"), restore)


def _check_residual(x, residual, stream_f32_ok=False):
    """residual matches x; with stream_f32_ok, a float32 residual beside a bf16 / f16 x too (an
    fp32 residual stream)."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual is a {type(residual).__name__}, not a torch.Tensor")
    dtype_ok = residual.dtype == x.dtype or (stream_f32_ok and _launch.is_f32_stream(x.dtype, residual.dtype))
    if residual.shape != x.shape or not dtype_ok or residual.device != x.device:
        also = " (or float32: an fp32 residual stream)" if stream_f32_ok and x.dtype != torch.float32 else ""
        raise ValueError(f"residual ({list(residual.shape)}, {residual.dtype}, {residual.device}) must match x "
                         f"({list(x.shape)}, {x.dtype}{also}, {x.device})")


def _check_bias_in(x, residual, bias_in, memory_efficient):
    if bias_in is None:
        return
    if not isinstance(bias_in, torch.Tensor):
        raise TypeError(f"bias_in is a {type(bias_in).__name__}, not a torch.Tensor")
    if bias_in.shape != x.shape[-1:] or bias_in.device != x.device or not bias_in.is_floating_point():
        raise ValueError(f"bias_in ({list(bias_in.shape)}, {bias_in.dtype}, {bias_in.device}) must be a floating "
                         f"[{x.shape[-1]}] tensor on {x.device}")


def _check_stream_memory_efficient(name, x, residual, memory_efficient):
    if memory_efficient and _launch.is_f32_stream(x.dtype, residual.dtype):
        raise ValueError(f"{name}: memory_efficient=True with a float32 residual stream is not supported (the "
                         "backward would recover fp32 rows from y in x's dtype); keep h, or pass a residual in "
                         f"{x.dtype}")


def _add_norm(x, residual, weight, bias, eps, zero_centered, norm, memory_efficient=False, bias_in=None):
    name = "add_" + ("rms_norm" if norm == "rmsnorm" else "layer_norm")
    _check_x(x)
    _check_residual(x, residual, stream_f32_ok=True)
    _check_bias_in(x, residual, bias_in, memory_efficient)
    _check_stream_memory_efficient(name, x, residual, memory_efficient)
    x2, w, b, _ = _prepare(x, x.shape[-1:] if x.dim() else (), weight, bias, zero_centered)
    if norm == "rmsnorm":
        eps = _rms_eps(x, eps)
    _check_eps(eps)
    memory_efficient = _use_memory_efficient(name, memory_efficient, (x, residual, weight, bias), w, b, zero_centered)
    # Off the GPU, call_fused runs the op's plain-torch reference, with its autograd.
    return ops.call_fused(x2, residual, w, b, norm, float(eps), zero_centered, memory_efficient=memory_efficient,
                          bias_in=bias_in)


def add_rms_norm(x, residual, weight=None, eps=None, bias=None, *, zero_centered=False, memory_efficient=False,
                 bias_in=None):
    """The pre-norm block's residual add and RMSNorm in one kernel: h = x (+ bias_in) + residual,
    y = rms_norm(h, weight, eps) over the last dimension. Returns (y, h): h is the new residual
    stream. Gradients: dx = dresidual = dnorm(dy) + dh, the weight's (bias's) and bias_in's (the
    column sum of dx). residual in x's dtype rounds h to it; a float32 residual beside a bf16 / f16
    x keeps an fp32 residual stream (h float32, not rounded; dresidual float32). bias_in ([N], e.g.
    the bias of the linear layer before) is summed with x and residual in fp32, rounded once.
    memory_efficient: autograd keeps y rather than h (as layer_norm's)."""
    return _add_norm(x, residual, weight, bias, eps, zero_centered, "rmsnorm", memory_efficient, bias_in)


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5, *, zero_centered=False, memory_efficient=False,
                   bias_in=None):
    """add_rms_norm's LayerNorm: h = x (+ bias_in) + residual, y = layer_norm(h, weight, bias, eps);
    returns (y, h). Residual dtypes and bias_in as add_rms_norm's."""
    return _add_norm(x, residual, weight, bias, eps, zero_centered, "layernorm", memory_efficient, bias_in)


def _ada(x, weight, bias, eps, norm, zero_centered, residual=None, memory_efficient=False, bias_in=None):
    name = "ada_layer_norm" if norm == "adalayernorm" else "ada_rms_norm"
    if residual is not None:
        name = "add_" + name
    _check_x(x)
    if residual is not None:
        _check_residual(x, residual, stream_f32_ok=True)
        _check_bias_in(x, residual, bias_in, memory_efficient)
        _check_stream_memory_efficient(name, x, residual, memory_efficient)
    if x.dim() != 3:
        raise ValueError(f"x has shape {list(x.shape)}; {name} takes x [B, S, N]")
    if weight is None:
        raise ValueError(f"weight=None: {name} takes a weight [B, N]")
    shape = (x.shape[0], x.shape[2])
    _check_param("weight", weight, x, shape)
    if bias is not None:
        _check_param("bias", bias, x, shape)
    if bias is not None and weight.dtype != bias.dtype:
        raise TypeError(f"weight.dtype={weight.dtype} and bias.dtype={bias.dtype} differ; normjit takes one "
                        "parameter dtype")
    if not 1 <= x.shape[2] <= _launch.MAX_N:
        raise ValueError(f"x has N={x.shape[2]}; normjit takes 1 to {_launch.MAX_N}")
    if norm == "adarmsnorm":
        eps = _rms_eps(x, eps)
    _check_eps(eps)
    if residual is not None:
        memory_efficient = _use_memory_efficient(name, memory_efficient, (x, residual, weight, bias), weight, bias,
                                                 zero_centered)
        return ops.call_fused(x, residual, weight, bias, norm, float(eps), zero_centered,
                              memory_efficient=memory_efficient, bias_in=bias_in)
    return _norm_call(x, weight, bias, norm, eps, zero_centered, memory_efficient, name)


def ada_layer_norm(x, weight, bias=None, eps=1e-5, *, zero_centered=False, memory_efficient=False):
    """Adaptive LayerNorm: x [B, S, N], weight and bias [B, N] (one scale and shift per batch item):
    y[b, s] = (x[b, s] - mean) / sqrt(var + eps) * weight[b] + bias[b]. zero_centered: DiT's
    modulate form, y = x_hat * (1 + weight[b]) + bias[b] (weight the scale, bias the shift).
    memory_efficient: as layer_norm's."""
    return _ada(x, weight, bias, eps, "adalayernorm", zero_centered, memory_efficient=memory_efficient)


def ada_rms_norm(x, weight, bias=None, eps=None, *, zero_centered=False, memory_efficient=False):
    """Adaptive RMSNorm: x [B, S, N], weight (and bias) [B, N]: y[b, s] = x[b, s] / sqrt(mean(x^2) +
    eps) * weight[b] (+ bias[b]); eps=None means torch.finfo(x.dtype).eps, as rms_norm.
    zero_centered: the scale is 1 + weight[b]."""
    return _ada(x, weight, bias, eps, "adarmsnorm", zero_centered, memory_efficient=memory_efficient)


def add_ada_layer_norm(x, residual, weight, bias=None, eps=1e-5, *, zero_centered=False, memory_efficient=False,
                       bias_in=None):
    """The residual add and ada_layer_norm in one kernel: h = x (+ bias_in) + residual (x and
    residual [B, S, N]), y = ada_layer_norm(h, weight, bias, eps, zero_centered=...). Returns
    (y, h); residual dtypes, bias_in and gradients as add_layer_norm's (dx = dresidual = dnorm(dy) + dh)."""
    return _ada(x, weight, bias, eps, "adalayernorm", zero_centered, residual, memory_efficient, bias_in)


def add_ada_rms_norm(x, residual, weight, bias=None, eps=None, *, zero_centered=False, memory_efficient=False,
                     bias_in=None):
    """add_ada_layer_norm's RMSNorm: h = x (+ bias_in) + residual, y = ada_rms_norm(h, ...); returns (y, h)."""
    return _ada(x, weight, bias, eps, "adarmsnorm", zero_centered, residual, memory_efficient, bias_in)


def _relu(x, normalized_shape, weight, bias, eps, clip_lower, clip_upper, norm):
    x2, w, b, restore = _prepare(x, normalized_shape, weight, bias)
    if norm == "rmsnorm":
        eps = _rms_eps(x, eps)
    _check_eps(eps)
    clip_lower, clip_upper = float(clip_lower), float(clip_upper)
    if not clip_lower < clip_upper:
        raise ValueError(f"clip_lower={clip_lower} must be below clip_upper={clip_upper}")
    y, mask = ops.call(x2, w, b, norm, float(eps), "relu_bitmask", clip_lower, clip_upper)
    if restore is not None:
        y = y.reshape(restore)
        mask = mask.reshape(restore[:x.dim() - len(_shape_tuple(normalized_shape))] + mask.shape[-1:])
    return y, mask


def layer_norm_relu(x, normalized_shape, weight=None, bias=None, eps=1e-5, clip_lower=0.0, clip_upper=math.inf):
    """layer_norm followed by a clamp to [clip_lower, clip_upper] (a ReLU by default), returning
    (y, mask): mask is uint8 [..., ceil(N / 8)], bit k of byte j set where element 8j + k of the
    unclamped output lay strictly inside the range. The backward passes gradients only there."""
    return _relu(x, normalized_shape, weight, bias, eps, clip_lower, clip_upper, "layernorm")


def rms_norm_relu(x, normalized_shape, weight=None, eps=None, bias=None, clip_lower=0.0, clip_upper=math.inf):
    """rms_norm followed by a clamp to [clip_lower, clip_upper], returning (y, mask); see layer_norm_relu."""
    return _relu(x, normalized_shape, weight, bias, eps, clip_lower, clip_upper, "rmsnorm")


def _quant_norm(name, x, residual, normalized_shape, weight, bias, eps, zero_centered, quant, quant_scale, amax,
                return_y, norm, scale_layout="row_major"):
    """The quantized-output functions below; returns (codes, scales[, y][, h]). residual: x's
    dtype, or float32 beside a bf16 / f16 x (an fp32 residual stream: h float32)."""
    _check_x(x)
    if scale_layout not in _launch.SCALE_LAYOUTS:
        raise ValueError(f"{name}: scale_layout={scale_layout!r} is not 'row_major' or 'swizzled'")
    if residual is not None:
        _check_residual(x, residual, stream_f32_ok=True)
    x2, w, b, restore = _prepare(x, normalized_shape, weight, bias, zero_centered)
    if norm == "rmsnorm":
        eps = _rms_eps(x, eps)
    _check_eps(eps)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias)):
        raise RuntimeError(f"{name} is inference only (no autograd): run it under torch.no_grad() or "
                           "torch.inference_mode(), or use the unquantized norm where gradients are needed")
    per_row = quant.endswith("_row")
    per_block = quant in _launch.BLOCK_SIZES
    if quant in _launch.FP4_QUANTS and x2.shape[-1] % 2:
        raise ValueError(f"{name}: the normalized size {x2.shape[-1]} must be even (two e2m1 codes share a byte)")
    if quant == "nvfp4":
        t = quant_scale
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1 or t.device != x.device:
            got = (f"{type(t).__name__}" if not isinstance(t, torch.Tensor)
                   else f"{t.dtype} with {t.numel()} elements on {t.device}")
            raise ValueError(f"{name}: global_scale must be a float32 tensor of one element on {x.device}; got {got}")
    elif per_block or per_row:
        if quant_scale is not None or amax is not None:
            own = "MX formats scale each block of 32 values themselves" if per_block else \
                "with quant_scale=None each row gets its own scale"
            raise ValueError(f"{name}: quant_scale and amax are for per-tensor scaling; {own}")
    else:
        for arg, t in (("quant_scale", quant_scale), ("amax", amax)):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1 or t.device != x.device:
                got = (f"{type(t).__name__}" if not isinstance(t, torch.Tensor)
                       else f"{t.dtype} with {t.numel()} elements on {t.device}")
                raise ValueError(f"{name}: {arg} must be a float32 tensor of one element on {x.device}; got {got}")
        if quant_scale is None:
            raise ValueError(f"{name}: per-tensor scaling needs quant_scale")
    if residual is not None and restore is not None:
        residual = residual.reshape(x2.shape)
    if not torch.compiler.is_compiling() and x2.is_cuda and type(x2) is torch.Tensor:
        # Eagerly the launch path directly: the custom op's dispatch would cost more host time
        # than a small kernel takes.
        y_quant, scales, y, h = _launch.forward_quant(x2, residual, w, b, norm, float(eps), zero_centered, quant,
                                                      quant_scale, amax, return_y, scale_layout)
    else:
        y_quant, scales, y, h = torch.ops.normjit.quant_norm_fwd(x2, residual, w, b, norm, float(eps), zero_centered,
                                                                 quant, quant_scale, amax, return_y, scale_layout)
        if _launch.block_scales_dtype(quant) == _launch.E8M0 and quant in _launch.BLOCK_SIZES:
            scales = scales.view(_launch.E8M0)  # the op's uint8 codes (ops._op_scales_dtype)
    if restore is not None:
        # e2m1 codes: the normalized dimensions flattened to [..., N / 2] (two codes a byte).
        lead = restore[:x.dim() - len(_shape_tuple(normalized_shape))]
        y_quant = y_quant.reshape(lead + y_quant.shape[-1:] if quant in _launch.FP4_QUANTS else restore)
        if per_row or (per_block and scale_layout == "row_major"):
            scales = scales.reshape(lead + scales.shape[-1:])
        if return_y:
            y = y.reshape(restore)
        if residual is not None:
            h = h.reshape(restore)
    out = (y_quant, scales if per_row or per_block else quant_scale)  # nvfp4: its block scales
    if return_y:
        out += (y,)
    if residual is not None:
        out += (h,)
    return out


_FP8 = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def _fp8_quant(name, fp8_dtype, quant_scale):
    if fp8_dtype not in _FP8:
        raise ValueError(f"{name}: fp8_dtype={fp8_dtype} is not torch.float8_e4m3fn or torch.float8_e5m2")
    return _FP8[fp8_dtype] + ("" if quant_scale is not None else "_row")


def rms_norm_fp8(x, normalized_shape, weight=None, eps=None, bias=None, *, quant_scale=None, amax=None,
                 fp8_dtype=torch.float8_e4m3fn, zero_centered=False, return_y=False):
    """rms_norm with its output quantized to FP8 in the same kernel, for an FP8 GEMM after the norm.
    Inference only. Returns (y_fp8, scale), plus y in x's dtype when return_y.

    quant_scale=None: dynamic per-row scaling (vLLM's per-token): scale is float32 [..., 1], each
    row's amax / fp8_max, and y ~ y_fp8.float() * scale. quant_scale (a float32 CUDA tensor of one
    element): per-tensor scaling (TransformerEngine's delayed scaling), y_fp8 = y * quant_scale,
    and the scale returned is quant_scale itself; amax (float32, one element) gets max |y| folded in
    (in place). Rounding to nearest even, saturating at the format's largest finite value."""
    quant = _fp8_quant("rms_norm_fp8", fp8_dtype, quant_scale)
    return _quant_norm("rms_norm_fp8", x, None, normalized_shape, weight, bias, eps, zero_centered, quant,
                       quant_scale, amax, return_y, "rmsnorm")


def layer_norm_fp8(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, quant_scale=None, amax=None,
                   fp8_dtype=torch.float8_e4m3fn, zero_centered=False, return_y=False):
    """layer_norm with an FP8 output; scaling and returns as rms_norm_fp8."""
    quant = _fp8_quant("layer_norm_fp8", fp8_dtype, quant_scale)
    return _quant_norm("layer_norm_fp8", x, None, normalized_shape, weight, bias, eps, zero_centered, quant,
                       quant_scale, amax, return_y, "layernorm")


def add_rms_norm_fp8(x, residual, weight=None, eps=None, bias=None, *, quant_scale=None, amax=None,
                     fp8_dtype=torch.float8_e4m3fn, zero_centered=False, return_y=False):
    """add_rms_norm with an FP8 output (vLLM's fused add + RMSNorm + quant): h = x + residual,
    y = rms_norm(h). Returns (y_fp8, scale[, y], h); scaling as rms_norm_fp8. residual as
    add_rms_norm's: in x's dtype, or float32 beside a bf16 / f16 x, an fp32 residual stream (h
    float32, summed in fp32 and not rounded; y and the codes from it). The other add_*_{int8,
    mxfp8, mxfp4, nvfp4} functions take the residual alike."""
    quant = _fp8_quant("add_rms_norm_fp8", fp8_dtype, quant_scale)
    return _quant_norm("add_rms_norm_fp8", x, residual, x.shape[-1:] if isinstance(x, torch.Tensor) and x.dim() else (),
                       weight, bias, eps, zero_centered, quant, quant_scale, amax, return_y, "rmsnorm")


def rms_norm_int8(x, normalized_shape, weight=None, eps=None, bias=None, *, zero_centered=False, return_y=False):
    """rms_norm with a dynamic per-row int8 output (vLLM's per-token int8): returns (y_int8, scale),
    scale float32 [..., 1] = amax(row) / 127, y ~ y_int8.float() * scale; codes round half to even.
    Inference only; y in x's dtype too when return_y."""
    return _quant_norm("rms_norm_int8", x, None, normalized_shape, weight, bias, eps, zero_centered, "int8_row", None,
                       None, return_y, "rmsnorm")


def add_rms_norm_int8(x, residual, weight=None, eps=None, bias=None, *, zero_centered=False, return_y=False):
    """add_rms_norm with a per-row int8 output: returns (y_int8, scale[, y], h); a float32 residual
    beside a bf16 / f16 x as add_rms_norm_fp8's."""
    return _quant_norm("add_rms_norm_int8", x, residual, x.shape[-1:] if isinstance(x, torch.Tensor) and x.dim() else (),
                       weight, bias, eps, zero_centered, "int8_row", None, None, return_y, "rmsnorm")


_MX = {torch.float8_e4m3fn: "mxfp8_e4m3", torch.float8_e5m2: "mxfp8_e5m2"}


def _mx_quant(name, fp8_dtype):
    if fp8_dtype not in _MX:
        raise ValueError(f"{name}: fp8_dtype={fp8_dtype} is not torch.float8_e4m3fn or torch.float8_e5m2")
    return _MX[fp8_dtype]


def rms_norm_mxfp8(x, normalized_shape, weight=None, eps=None, bias=None, *, fp8_dtype=torch.float8_e4m3fn,
                   zero_centered=False, return_y=False, scale_layout="row_major"):
    """rms_norm with an OCP MXFP8 output: every 32 consecutive values of a row share a power-of-two
    scale X = 2^(floor(log2 amax) - emax) (emax 8 for e4m3, 15 for e5m2). Returns (y_fp8, scales):
    scales [..., ceil(N / 32)] in torch.float8_e8m0fnu (E8M0 codes: X = 2^(code - 127)), row-major;
    with scale_layout="swizzled", the padded [roundup(rows, 128), roundup(ceil(N / 32), 4)] matrix
    of 128x4 tiles cuBLASLt and CUTLASS read (padding zero). y ~ y_fp8.float() * X blockwise.
    Inference only; y in x's dtype too when return_y."""
    return _quant_norm("rms_norm_mxfp8", x, None, normalized_shape, weight, bias, eps, zero_centered,
                       _mx_quant("rms_norm_mxfp8", fp8_dtype), None, None, return_y, "rmsnorm", scale_layout)


def layer_norm_mxfp8(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, fp8_dtype=torch.float8_e4m3fn,
                     zero_centered=False, return_y=False, scale_layout="row_major"):
    """layer_norm with an MXFP8 output; as rms_norm_mxfp8."""
    return _quant_norm("layer_norm_mxfp8", x, None, normalized_shape, weight, bias, eps, zero_centered,
                       _mx_quant("layer_norm_mxfp8", fp8_dtype), None, None, return_y, "layernorm", scale_layout)


def add_rms_norm_mxfp8(x, residual, weight=None, eps=None, bias=None, *, fp8_dtype=torch.float8_e4m3fn,
                       zero_centered=False, return_y=False, scale_layout="row_major"):
    """add_rms_norm with an MXFP8 output: returns (y_fp8, scales[, y], h); as rms_norm_mxfp8, a
    float32 residual beside a bf16 / f16 x as add_rms_norm_fp8's."""
    return _quant_norm("add_rms_norm_mxfp8", x, residual, x.shape[-1:] if isinstance(x, torch.Tensor) and x.dim()
                       else (), weight, bias, eps, zero_centered, _mx_quant("add_rms_norm_mxfp8", fp8_dtype), None,
                       None, return_y, "rmsnorm", scale_layout)


def rms_norm_mxfp4(x, normalized_shape, weight=None, eps=None, bias=None, *, zero_centered=False, return_y=False,
                   scale_layout="row_major"):
    """rms_norm with an OCP MXFP4 output: every 32 consecutive values of a row share X =
    2^(floor(log2 amax) - 2) (e2m1's emax), the codes are e2m1(y / X) (round to nearest even,
    saturating at 6). Returns (y_fp4, scales): y_fp4 [..., N / 2] in torch.float4_e2m1fn_x2
    (torch.uint8 where torch lacks it), two codes a byte, the first element in the low nibble;
    scales in torch.float8_e8m0fnu, [..., ceil(N / 32)] with scale_layout="row_major", or the
    padded [roundup(rows, 128), roundup(ceil(N / 32), 4)] matrix of 128x4 tiles cuBLASLt and
    CUTLASS read with scale_layout="swizzled" (padding zero). N even. Inference only; y in x's
    dtype too when return_y."""
    return _quant_norm("rms_norm_mxfp4", x, None, normalized_shape, weight, bias, eps, zero_centered, "mxfp4", None,
                       None, return_y, "rmsnorm", scale_layout)


def layer_norm_mxfp4(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, zero_centered=False, return_y=False,
                     scale_layout="row_major"):
    """layer_norm with an MXFP4 output; as rms_norm_mxfp4."""
    return _quant_norm("layer_norm_mxfp4", x, None, normalized_shape, weight, bias, eps, zero_centered, "mxfp4", None,
                       None, return_y, "layernorm", scale_layout)


def add_rms_norm_mxfp4(x, residual, weight=None, eps=None, bias=None, *, zero_centered=False, return_y=False,
                       scale_layout="row_major"):
    """add_rms_norm with an MXFP4 output: returns (y_fp4, scales[, y], h); as rms_norm_mxfp4, a
    float32 residual beside a bf16 / f16 x as add_rms_norm_fp8's."""
    return _quant_norm("add_rms_norm_mxfp4", x, residual, x.shape[-1:] if isinstance(x, torch.Tensor) and x.dim()
                       else (), weight, bias, eps, zero_centered, "mxfp4", None, None, return_y, "rmsnorm",
                       scale_layout)


def rms_norm_nvfp4(x, normalized_shape, weight=None, eps=None, bias=None, *, global_scale, zero_centered=False,
                   return_y=False, scale_layout="row_major"):
    """rms_norm with an NVIDIA NVFP4 output, quantized as TransformerEngine and FlashInfer do:
    global_scale (S_enc, a float32 tensor of one element on x's device) is 448 * 6 / amax of the
    tensor; every 16 values of a row share s = e4m3(amax(block) / 6 * S_enc) (saturating), and the
    codes are e2m1(y * S_enc / s) (0 where s is 0). Returns (y_fp4, scales): y_fp4 as
    rms_norm_mxfp4's, scales in torch.float8_e4m3fn ([..., ceil(N / 16)], or swizzled as
    rms_norm_mxfp4's); y ~ y_fp4 * s / S_enc. Inference only."""
    return _quant_norm("rms_norm_nvfp4", x, None, normalized_shape, weight, bias, eps, zero_centered, "nvfp4",
                       global_scale, None, return_y, "rmsnorm", scale_layout)


def layer_norm_nvfp4(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, global_scale, zero_centered=False,
                     return_y=False, scale_layout="row_major"):
    """layer_norm with an NVFP4 output; as rms_norm_nvfp4."""
    return _quant_norm("layer_norm_nvfp4", x, None, normalized_shape, weight, bias, eps, zero_centered, "nvfp4",
                       global_scale, None, return_y, "layernorm", scale_layout)


def add_rms_norm_nvfp4(x, residual, weight=None, eps=None, bias=None, *, global_scale, zero_centered=False,
                       return_y=False, scale_layout="row_major"):
    """add_rms_norm with an NVFP4 output: returns (y_fp4, scales[, y], h); as rms_norm_nvfp4, a
    float32 residual beside a bf16 / f16 x as add_rms_norm_fp8's."""
    return _quant_norm("add_rms_norm_nvfp4", x, residual, x.shape[-1:] if isinstance(x, torch.Tensor) and x.dim()
                       else (), weight, bias, eps, zero_centered, "nvfp4", global_scale, None, return_y, "rmsnorm",
                       scale_layout)
