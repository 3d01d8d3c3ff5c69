"""The CUDA path of normjit.torch: one Runtime per device, kernels cached per spec and vector width,
launches on torch's current stream with torch-allocated outputs and workspace.

This is the hot path of every eager call: no spec parsing, no string building, one dict lookup and
one ``max_vec_for`` call before the launch. The cache of loaded kernels is also the set of warmed
specs: inside CUDA-graph capture a miss is an error instead of a compile.
"""
import math

import torch

from .. import _normjit
from . import _native

DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# The Ada norms take weight / bias per batch item ([B, n], x [B, S, n]); LayerNorm math subtracts
# the mean (and saves it), RMSNorm math does not.
ADAPTIVE_NORMS = ("adalayernorm", "adarmsnorm")


def subtracts_mean(norm):
    return norm in ("layernorm", "adalayernorm")


MAX_N = 262144

# Module-level so tests can stand in for the GPU; absent from CPU-only torch builds, which never
# reach the CUDA path.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_is_capturing = torch.cuda.is_current_stream_capturing

_runtimes = {}  # device index -> the process's normjit Runtime (shared with the C++ path)
# (device, norm, phase, x dtype, w dtype, n, has_bias, epilogue, zero_centered, residual)
#   -> (Spec, {max_vec: Kernel})
_entries = {}
_ones = {}  # (device, dtype, n) -> ones weight for norms called without one


def runtime(device):
    """The normjit Runtime of a CUDA device index, created on first use."""
    rt = _runtimes.get(device)
    if rt is None:
        # Creating it makes its device's context current: keep torch's current device.
        with torch.cuda.device(device):
            rt = _runtimes.setdefault(device, _normjit.shared_runtime(device))
    return rt


def loaded_kernels():
    """Names of the kernels loaded so far (the specs warmed for CUDA-graph capture), per device."""
    out = {}
    for key, (_, by_vec) in _entries.items():
        out.setdefault(key[0], []).extend(k.name for k in by_vec.values())
    if _native.eager_norm is not None:
        for device in range(torch.cuda.device_count()):
            names = torch.ops.normjit.eager_kernels(device)
            have = out.setdefault(device, []) if names else []
            have.extend(n for n in names if n not in have)
    return out


def _spec_of(key):
    # residual: False, True, or "f32" (an fp32 residual stream). An 11th field, where present, is
    # memory_efficient (backward keys), a 12th bias_in (forward keys).
    device, norm, phase, x_dtype, w_dtype, n, has_bias, epilogue, zero_centered, residual = key[:10]
    text = f"{norm}.{phase}.{DTYPE_NAMES[x_dtype]}.w_{DTYPE_NAMES[w_dtype]}.n{n}"
    if has_bias:
        text += ".bias"
    if zero_centered:
        text += ".zero_centered"
    if residual:
        text += ".residual_f32" if residual == "f32" else ".residual"
    if len(key) > 11 and key[11]:
        text += ".bias_in"
    if len(key) > 10 and key[10]:
        text += ".memory_efficient"
    if epilogue != "none":
        text += "." + epilogue
    return _normjit.Spec(text)


def _load(device, spec, max_vec, by_vec):
    rt = runtime(device)
    if rt.compile_mode != "sync":
        # Async and generic modes: each launch goes through the runtime, which runs the generic kernel
        # until the specialized one is compiled in the background (async), captured graphs included.
        kernel = by_vec[max_vec] = rt.launcher(spec, max_vec)
        return kernel
    if _is_capturing():
        raise RuntimeError(
            f"normjit: kernel {spec} (max_vec={max_vec}) is not loaded, and a CUDA graph is being captured, "
            "where it cannot be compiled; run the op once with the same shapes, dtypes and alignment before "
            "capturing (or set NORMJIT_COMPILE_MODE=async: a generic kernel is captured instead)"
        )
    with torch.cuda.device(device):
        kernel = rt.kernel(spec, max_vec)
    by_vec[max_vec] = kernel
    return kernel


def _kernel(key, x, gamma, beta, y, dy, dx, dgamma, dbeta, mask, row_stride, *, residual=0, h=0, dh_out=0, y_quant=0,
            dresidual=0, bias_in=0):
    entry = _entries.get(key)
    if entry is None:
        entry = _entries.setdefault(key, (_spec_of(key), {}))
    spec, by_vec = entry
    vec = _normjit.max_vec_for(spec, x, gamma, beta, y, dy, dx, dgamma, dbeta, mask, row_stride, residual=residual, h=h,
                               dh_out=dh_out, y_quant=y_quant, dresidual=dresidual, bias_in=bias_in)
    kernel = by_vec.get(vec)
    if kernel is None:
        kernel = _load(key[0], spec, vec, by_vec)
    return kernel


def ones_weight(device, dtype, n):
    """A cached ones [n] weight: the kernels always read a gamma."""
    key = (device.index, dtype, n)
    w = _ones.get(key)
    if w is None:
        w = torch.ones(n, dtype=dtype, device=device)
        # Inside capture the fill is only recorded, not run: keep it out of the cache.
        if device.type != "cuda" or not _is_capturing():
            _ones[key] = w
    return w


def row_stride(shape, stride, n):
    """The stride between rows of x [..., n] whose leading dimensions flatten into evenly strided rows
    with a contiguous last dimension; 0 when they do not (x must then be made contiguous)."""
    if n > 1 and stride[-1] != 1:
        return 0
    rs = None
    count = 1
    for i in range(len(shape) - 2, -1, -1):
        size = shape[i]
        if size == 1:
            continue
        if rs is None:
            rs = stride[i]
        elif stride[i] != rs * count:
            return 0
        count *= size
    if rs is None:
        return n
    return rs if rs >= n else 0  # overlapping rows (an expanded x) take a copy


def row_strides(shape, rs):
    """Strides of a fresh [..., n] tensor whose rows lie rs elements apart (row-major leading dims)."""
    strides = [1] * len(shape)
    step = rs
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = step
        step *= shape[i]
    return strides


def layout(x):
    """(x, row stride): x itself when its rows are evenly strided, else a contiguous copy."""
    n = x.shape[-1]
    if x.is_contiguous():
        return x, n
    rs = row_stride(x.shape, x.stride(), n)
    if rs == 0:
        return x.contiguous(), n
    return x, rs


def rows_apart(t):
    """t's row stride as it is (0: not evenly strided), without copying."""
    return t.shape[-1] if t.is_contiguous() else row_stride(t.shape, t.stride(), t.shape[-1])


def backward_layout(x, dy):
    """(x, dy, row stride) for a backward: x, dy and dx share one row stride, so both are made
    contiguous unless dy's rows are strided like x's."""
    x, rs = layout(x)
    if rows_apart(dy) != rs:
        return x.contiguous(), dy.contiguous(), x.shape[-1]
    return x, dy, rs


def like_rows(x, rs, dtype=None):
    """An uninitialized tensor of x's shape (and dtype, unless given) whose rows lie rs elements apart."""
    dtype = x.dtype if dtype is None else dtype
    if rs == x.shape[-1]:
        return torch.empty(x.shape, dtype=dtype, device=x.device)
    return torch.empty_strided(x.shape, row_strides(x.shape, rs), dtype=dtype, device=x.device)


def _launch(device, kernel, args, fused):
    """Kernel.launch with its 20 leading arguments (args, the stream last) and the fused ones by
    name (residual=, h=, dh_out=, y_quant=, ..., dresidual=, bias_in=: the binding's keywords; those
    not given are 0)."""
    if device != _current_device():
        # The runtime launches in the current context: make it the tensor's device.
        with torch.cuda.device(device):
            kernel.launch(*args[:-1], _raw_stream(device), **fused)
    else:
        kernel.launch(*args, **fused)


def _kernel_params(weight, bias, dev, dtype, n):
    """weight and bias as the kernels read them: contiguous, a ones weight where there is none."""
    if weight is None:
        weight = ones_weight(dev, dtype, n)
    elif not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    return weight, bias


def forward(x, weight, bias, norm, eps, training, epilogue, clip_lower, clip_upper):
    """Launches the forward of x [..., n] (CUDA; rows evenly strided or made contiguous).

    weight: [n], adalayernorm [B, n] (x [B, S, n]), or None (ones); bias like weight or None.
    Returns (y, mean, rstd, mask): y with x's shape and row stride in x's dtype; fp32 mean / rstd
    [rows] when training (mean: not for rmsnorm); uint8 mask [..., ceil(n / 8)] for relu_bitmask;
    None for those not produced.
    """
    y, _, mean, rstd, mask = forward_fused(x, None, weight, bias, norm, eps, training, False, epilogue, clip_lower,
                                           clip_upper)
    return y, mean, rstd, mask


def _shared_layout(x, other):
    """(x, other, row stride): both as they are when their rows are strided alike, else contiguous."""
    x, rs = layout(x)
    other, ors = layout(other)
    if ors != rs:
        return x.contiguous(), other.contiguous(), x.shape[-1]
    return x, other, rs


def is_f32_stream(x_dtype, residual_dtype):
    """Whether a residual of this dtype beside x of that one is an fp32 residual stream (.residual_f32)."""
    return residual_dtype == torch.float32 and x_dtype != torch.float32


def residual_key(x_dtype, residual):
    """A forward's kernel-key residual field: False (none), True, or "f32" (an fp32 residual stream)."""
    if residual is None:
        return False
    return "f32" if is_f32_stream(x_dtype, residual.dtype) else True


def forward_fused(x, residual, weight, bias, norm, eps, training, zero_centered, epilogue, clip_lower, clip_upper,
                  bias_in=None):
    """forward with the fusions: residual (x's shape; x's dtype, or float32 for an fp32 residual
    stream beside a bf16 / f16 x) and bias_in ([n], or None) are added to x first, and the sum h
    (the residual's dtype) is written out and normalized; zero_centered scales by 1 + weight.
    Returns (y, h, mean, rstd, mask); h is None without a residual."""
    # Allocations take most of this function's host time: empty_like and int sizes are the cheap forms.
    n = x.shape[-1]
    h = None
    stream = residual_key(x.dtype, residual)
    if residual is not None:
        x, residual, rs = _shared_layout(x, residual)
        y = like_rows(x, rs)
        h = like_rows(x, rs, residual.dtype)
    elif x.is_contiguous():
        rs = n
        y = torch.empty_like(x)
    else:
        x, rs = layout(x)
        y = torch.empty_like(x) if rs == n else like_rows(x, rs)
    dev = x.device
    rows = x.numel() // n
    mean = rstd = mask = None
    if training:
        rstd = torch.empty(rows, dtype=torch.float32, device=dev)
        if subtracts_mean(norm):
            mean = torch.empty(rows, dtype=torch.float32, device=dev)
    if epilogue != "none":
        mask = torch.empty(x.shape[:-1] + ((n + 7) // 8,), dtype=torch.uint8, device=dev)
    weight, bias = _kernel_params(weight, bias, dev, x.dtype, n)
    if rows == 0:
        return y, h, mean, rstd, mask
    rpb = rows // weight.shape[0] if norm in ADAPTIVE_NORMS else 0
    device = dev.index
    if bias_in is not None:
        bias_in = bias_in.to(weight.dtype).contiguous()  # read in the weights' dtype
    key = (device, norm, "fwd_train" if training else "fwd_infer", x.dtype, weight.dtype, n, bias is not None, epilogue,
           zero_centered, stream, False, bias_in is not None)
    xp = x.data_ptr()
    yp = y.data_ptr()
    gp = weight.data_ptr()
    bp = 0 if bias is None else bias.data_ptr()
    mp = 0 if mask is None else mask.data_ptr()
    fused = {}
    if residual is not None:
        fused["residual"] = residual.data_ptr()
        fused["h"] = h.data_ptr()
    if bias_in is not None:
        fused["bias_in"] = bias_in.data_ptr()
    kernel = _kernel(key, xp, gp, bp, yp, 0, 0, 0, 0, mp, rs, **fused)
    _launch(device, kernel, (
        xp, gp, bp, 0 if mean is None else mean.data_ptr(), 0 if rstd is None else rstd.data_ptr(), yp,
        0, 0, 0, 0, 0, 0, mp, clip_lower, clip_upper, rows, rs, rpb, eps, _raw_stream(device)), fused)
    return y, h, mean, rstd, mask


def backward(dy, x, weight, mean, rstd, mask, norm, epilogue, bias_grad):
    """Launches the backward: (dx, dweight, dbias). x, weight, mean, rstd, mask as the forward saved
    them (weight None: ones; mean None for rmsnorm); dx has x's shape, in x's row stride when dy
    shares it, else contiguous; dweight like weight (None without one); dbias like weight when
    bias_grad, else None."""
    return backward_fused(dy, None, x, weight, mean, rstd, mask, norm, False, epilogue, bias_grad)[:3]


def backward_fused(dy, dh_out, x, weight, mean, rstd, mask, norm, zero_centered, epilogue, bias_grad, bias=None,
                   memory_efficient=False, stream_f32=False):
    """backward with the fusions: x is the forward's h when it had a residual, and dh_out (the
    gradient arriving on h, or None) is added to dx, which is then the gradient of both x and the
    residual; zero_centered as the forward. memory_efficient: x is the forward's output y instead
    (x̂ = (y - bias) / weight'), mean is not read, and bias (the forward's, or None) is.
    stream_f32 (with dh_out): an fp32 residual stream, x (h) and dh_out float32 beside dy in the
    model's dtype; dx comes in dy's dtype and dresidual, the same gradient unrounded, in float32.
    Returns (dx, dweight, dbias, dresidual); dresidual is None unless stream_f32."""
    stream_f32 = stream_f32 and dh_out is not None
    x, dy, rs = backward_layout(x, dy)
    if dy.dtype != x.dtype and not stream_f32:
        dy = dy.to(x.dtype)
    if dh_out is not None:
        if dh_out.dtype != x.dtype:
            dh_out = dh_out.to(x.dtype)
        if rows_apart(dh_out) != rs:
            x, dy, dh_out, rs = x.contiguous(), dy.contiguous(), dh_out.contiguous(), x.shape[-1]
    n = x.shape[-1]
    dev = x.device
    dx = torch.empty_like(x, dtype=dy.dtype) if rs == n else like_rows(x, rs, dy.dtype)
    dresidual = (torch.empty_like(x) if rs == n else like_rows(x, rs)) if stream_f32 else None
    gamma = ones_weight(dev, x.dtype, n) if weight is None else weight.contiguous()
    dgamma = torch.empty_like(gamma)
    dbeta = torch.empty_like(gamma) if bias_grad else None
    rows = x.numel() // n
    if rows == 0:
        dgamma.zero_()
        if dbeta is not None:
            dbeta.zero_()
    else:
        rpb = rows // gamma.shape[0] if norm in ADAPTIVE_NORMS else 0
        device = dev.index
        # memory_efficient: the spec has the bias whenever the forward had one (x̂ needs it), and
        # computes dbias even where only the caller does not want it.
        has_bias = bias_grad or (memory_efficient and bias is not None)
        scratch_dbeta = dbeta if dbeta is not None or not has_bias else torch.empty_like(gamma)
        residual = "f32" if stream_f32 else dh_out is not None
        key = (device, norm, "bwd", dy.dtype, gamma.dtype, n, has_bias, epilogue, zero_centered, residual,
               memory_efficient)
        xp = x.data_ptr()
        gp = gamma.data_ptr()
        read_bias = bias.contiguous() if memory_efficient and bias is not None else None  # alive until the launch
        bp = 0 if read_bias is None else read_bias.data_ptr()
        dyp = dy.data_ptr()
        dxp = dx.data_ptr()
        dgp = dgamma.data_ptr()
        dbp = 0 if scratch_dbeta is None else scratch_dbeta.data_ptr()
        mp = 0 if mask is None else mask.data_ptr()
        fused = {}
        if dh_out is not None:
            fused["dh_out"] = dh_out.data_ptr()
        if stream_f32:
            fused["dresidual"] = dresidual.data_ptr()
        # The kernel's input x is y for memory_efficient: it goes in y's place.
        x_arg, y_arg = (0, xp) if memory_efficient else (xp, 0)
        kernel = _kernel(key, x_arg, gp, bp, y_arg, dyp, dxp, dgp, dbp, mp, rs, **fused)
        ws_bytes = kernel.workspace_bytes(rows, rpb)
        workspace = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=dev)
        _launch(device, kernel, (
            x_arg, gp, bp, 0 if mean is None or memory_efficient else mean.data_ptr(), rstd.data_ptr(), y_arg, dyp,
            dxp, dgp, dbp, workspace.data_ptr(), ws_bytes, mp, 0.0, math.inf, rows, rs, rpb, 0.0,
            _raw_stream(device)), fused)
    return dx, (dgamma if weight is not None else None), dbeta, dresidual


# e2m1 codes two a byte (the first element in the low nibble), as torch's own dtype where it has one.
FP4 = getattr(torch, "float4_e2m1fn_x2", torch.uint8)
# Quantized outputs: the code dtype of each quantizing epilogue.
QUANT_DTYPES = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "fp8_e4m3_row": torch.float8_e4m3fn,
    "fp8_e5m2_row": torch.float8_e5m2,
    "int8_row": torch.int8,
    "mxfp8_e4m3": torch.float8_e4m3fn,
    "mxfp8_e5m2": torch.float8_e5m2,
    "mxfp4": FP4,
    "nvfp4": FP4,
}
# Values per block scale of the block-scaled formats.
BLOCK_SIZES = {"mxfp8_e4m3": 32, "mxfp8_e5m2": 32, "mxfp4": 32, "nvfp4": 16}
FP4_QUANTS = ("mxfp4", "nvfp4")
# E8M0 block scales as torch's own dtype where it has one; NVFP4's are e4m3.
E8M0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
# LaunchArgs::block_scale_layout by name: row-major [..., ceil(n / block)], or the 128x4 tiles of
# the GEMM libraries (cuBLASLt, CUTLASS) as a [roundup(rows, 128), roundup(cols, 4)] matrix.
SCALE_LAYOUTS = {"row_major": 0, "swizzled": 1}


def block_scales_dtype(quant):
    return torch.float8_e4m3fn if quant == "nvfp4" else E8M0


def block_scales_shape(x, quant="mxfp8_e4m3", scale_layout="row_major"):
    """The shape of x's block scales: one per 32 values of a row (NVFP4: 16), [..., cols]
    row-major; swizzled, the padded [roundup(rows, 128), roundup(cols, 4)] matrix of the 128x4
    tiles (rows: x's leading dimensions flattened)."""
    block = BLOCK_SIZES[quant]
    cols = (x.shape[-1] + block - 1) // block
    if scale_layout == "row_major":
        return x.shape[:-1] + (cols,)
    rows = math.prod(x.shape[:-1])
    return ((rows + 127) // 128 * 128, (cols + 3) // 4 * 4)


def new_block_scales(x, quant, scale_layout):
    """x's block scales, uninitialized; swizzled with padding, zero-filled: the kernels write only
    the real scales, and a GEMM reads the padding too."""
    shape = block_scales_shape(x, quant, scale_layout)
    dtype = block_scales_dtype(quant)
    cols = (x.shape[-1] + BLOCK_SIZES[quant] - 1) // BLOCK_SIZES[quant]
    if scale_layout == "row_major" or (math.prod(x.shape[:-1]) % 128 == 0 and cols % 4 == 0):
        return x.new_empty(shape, dtype=dtype)
    return x.new_zeros(shape, dtype=torch.uint8).view(dtype)


def packed_rows(x, rs, dtype):
    """e2m1 codes of x [..., n] (n even), two a byte: [..., n / 2], rows rs / 2 bytes apart."""
    shape = x.shape[:-1] + (x.shape[-1] // 2,)
    if rs == x.shape[-1]:
        return torch.empty(shape, dtype=dtype, device=x.device)
    return torch.empty_strided(shape, row_strides(shape, rs // 2), dtype=dtype, device=x.device)


def quant_layout(x, residual, quant):
    """(x, residual, row stride, h) as forward_quant lays them out: e2m1 codes take an even row
    stride (their rows lie rs / 2 bytes apart), else x (and residual) are made contiguous. h (x's
    layout) is in the residual's dtype: x's, or float32 for an fp32 residual stream."""
    h = None
    if residual is not None:
        x, residual, rs = _shared_layout(x, residual)
    else:
        x, rs = layout(x)
    if quant in FP4_QUANTS and rs % 2:
        x, rs = x.contiguous(), x.shape[-1]
        residual = residual.contiguous() if residual is not None else None
    if residual is not None:
        h = like_rows(x, rs, residual.dtype)
    return x, residual, rs, h


def forward_quant(x, residual, weight, bias, norm, eps, zero_centered, quant, quant_scale, amax, want_y,
                  scale_layout="row_major"):
    """The inference forward with a quantized output: (y_quant, scales, y, h). y_quant has x's
    shape and row stride in the format's dtype (e2m1: [..., n / 2], two codes a byte, rows
    rs / 2 bytes apart); per-tensor formats (fp8_e4m3 / fp8_e5m2) quantize y * quant_scale (fp32,
    one element) and fold max |y| into amax (fp32, one element) where given; per-row formats
    (*_row) return fp32 scales [..., 1], y ~ y_quant * scale; MX (mxfp8_*, mxfp4) return E8M0 block
    scales (torch.float8_e8m0fnu), y ~ y_quant * 2^(code - 127) per 32 values; nvfp4 e4m3 scales s
    per 16 values, quant_scale its fp32 S_enc, y ~ y_quant * s / S_enc. Block scales are
    [..., ceil(n / block)] (scale_layout "row_major") or the GEMMs' swizzled 128x4 tiles
    ("swizzled": [roundup(rows, 128), roundup(cols, 4)], padding zero). y (x's dtype) only when
    want_y; h (x + residual) only with a residual, in the residual's dtype: x's, or float32 beside
    a bf16 / f16 x (an fp32 residual stream, .residual_f32: h summed in fp32 and not rounded, y and
    the codes from it)."""
    n = x.shape[-1]
    x, residual, rs, h = quant_layout(x, residual, quant)
    fp4 = quant in FP4_QUANTS
    y_quant = packed_rows(x, rs, QUANT_DTYPES[quant]) if fp4 else like_rows(x, rs, QUANT_DTYPES[quant])
    y = like_rows(x, rs) if want_y else None
    dev = x.device
    rows = x.numel() // n
    per_row = quant.endswith("_row")
    per_block = quant in BLOCK_SIZES
    scales = None
    if per_row:
        scales = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32, device=dev)
    elif per_block:
        scales = new_block_scales(x, quant, scale_layout)
    weight, bias = _kernel_params(weight, bias, dev, x.dtype, n)
    if rows == 0:
        return y_quant, scales, y, h
    rpb = rows // weight.shape[0] if norm in ADAPTIVE_NORMS else 0
    device = dev.index
    stream = residual_key(x.dtype, residual)
    key = (device, norm, "fwd_infer", x.dtype, weight.dtype, n, bias is not None, quant, zero_centered, stream)
    xp = x.data_ptr()
    yp = 0 if y is None else y.data_ptr()
    qp = y_quant.data_ptr()
    gp = weight.data_ptr()
    bp = 0 if bias is None else bias.data_ptr()
    fused = {"y_quant": qp}
    if residual is not None:
        fused["residual"] = residual.data_ptr()
        fused["h"] = h.data_ptr()
    kernel = _kernel(key, xp, gp, bp, yp, 0, 0, 0, 0, 0, rs, **fused)
    if not per_row and (not per_block or quant == "nvfp4"):
        fused["quant_scale"] = quant_scale.data_ptr()
    if amax is not None:
        fused["amax"] = amax.data_ptr()
    if per_row:
        fused["row_scales"] = scales.data_ptr()
    if per_block:
        fused["block_scales"] = scales.data_ptr()
        fused["block_scale_layout"] = SCALE_LAYOUTS[scale_layout]
    _launch(device, kernel, (xp, gp, bp, 0, 0, yp, 0, 0, 0, 0, 0, 0, 0, 0.0, math.inf, rows, rs, rpb, eps,
                             _raw_stream(device)), fused)
    return y_quant, scales, y, h
