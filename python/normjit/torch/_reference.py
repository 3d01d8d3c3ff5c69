"""The ops' implementation for tensors off the GPU, in plain torch (fp32 math): what the CUDA
kernels compute, with the same output layouts, so the ops run (and torch.library.opcheck checks
them) on CPU. Not a fast path."""
import torch
import torch.nn.functional as F

from . import _launch


def _batched(t, weight, norm):
    """t [..., n] as [B, rows / B, n] for the Ada norms' per-batch weight, else [1, rows, n]."""
    n = t.shape[-1]
    b = weight.shape[0] if norm in _launch.ADAPTIVE_NORMS else 1
    return t.reshape(b, -1, n)


def _stats(xf, norm, eps):
    if not _launch.subtracts_mean(norm):
        mean = None
        rstd = torch.rsqrt(xf.square().mean(-1) + eps)
        xhat = xf * rstd[..., None]
    else:
        mean = xf.mean(-1)
        rstd = torch.rsqrt((xf - mean[..., None]).square().mean(-1) + eps)
        xhat = (xf - mean[..., None]) * rstd[..., None]
    return mean, rstd, xhat


def pack_mask(keep):
    """bool [..., n] -> uint8 [..., ceil(n / 8)]; bit k of byte j is element 8j + k."""
    n = keep.shape[-1]
    pad = (-n) % 8
    if pad:
        keep = torch.cat([keep, keep.new_zeros(keep.shape[:-1] + (pad,))], -1)
    bits = keep.reshape(keep.shape[:-1] + (-1, 8)).to(torch.int32)
    weights = torch.tensor([1 << k for k in range(8)], dtype=torch.int32, device=keep.device)
    return (bits * weights).sum(-1).to(torch.uint8)


def unpack_mask(mask, n):
    """uint8 [..., ceil(n / 8)] -> bool [..., n]."""
    shifts = torch.arange(8, dtype=torch.int32, device=mask.device)
    bits = (mask.to(torch.int32)[..., None] >> shifts) & 1
    return bits.reshape(mask.shape[:-1] + (-1,))[..., :n].bool()


def forward(x, weight, bias, norm, eps, training, epilogue, clip_lower, clip_upper):
    """As _launch.forward."""
    y, _, mean, rstd, mask = forward_fused(x, None, weight, bias, norm, eps, training, False, epilogue, clip_lower,
                                           clip_upper)
    return y, mean, rstd, mask


def _scale(ref, zero_centered):
    return ref.float() + 1 if zero_centered else ref.float()


def _normalized(x, residual, weight, bias, norm, eps, zero_centered, bias_in=None):
    """(x or h, row stride, h, fp32 y, mean, rstd) of forward_fused before its epilogue."""
    h = None
    if residual is not None:
        x, residual, rs = _launch._shared_layout(x, residual)
        h = _launch.like_rows(x, rs, residual.dtype)
        s = x.float()
        if bias_in is not None:
            s = s + bias_in.to(weight.dtype if weight is not None else x.dtype).float()
        h.copy_(s + residual.float())  # summed in fp32, rounded once to the stream's dtype, as the kernel
        x = h
    else:
        x, rs = _launch.layout(x)
    n = x.shape[-1]
    ref = weight if weight is not None else x.new_ones(n)
    mean, rstd, xhat = _stats(x.float(), norm, eps)
    yf = _batched(xhat, ref, norm) * _batched(_scale(ref, zero_centered), ref, norm)
    if bias is not None:
        yf = yf + _batched(bias.float(), ref, norm)
    return x, rs, h, yf.reshape(x.shape), mean, rstd


def forward_fused(x, residual, weight, bias, norm, eps, training, zero_centered, epilogue, clip_lower, clip_upper,
                  bias_in=None):
    """As _launch.forward_fused."""
    y_dtype = x.dtype
    x, rs, h, yf, mean, rstd = _normalized(x, residual, weight, bias, norm, eps, zero_centered, bias_in)
    mask = None
    if epilogue != "none":
        mask = pack_mask((yf > clip_lower) & (yf < clip_upper))
        yf = yf.clamp(clip_lower, clip_upper)
    y = _launch.like_rows(x, rs, y_dtype)
    y.copy_(yf)
    if not training:
        mean = rstd = None
    return y, h, mean, rstd, mask


def backward(dy, x, weight, mean, rstd, mask, norm, epilogue, bias_grad):
    """As _launch.backward."""
    return backward_fused(dy, None, x, weight, mean, rstd, mask, norm, False, epilogue, bias_grad)[:3]


def backward_fused(dy, dh_out, x, weight, mean, rstd, mask, norm, zero_centered, epilogue, bias_grad, bias=None,
                   memory_efficient=False, stream_f32=False):
    """As _launch.backward_fused."""
    stream_f32 = stream_f32 and dh_out is not None
    x, dy, rs = _launch.backward_layout(x, dy)
    n = x.shape[-1]
    ref = weight if weight is not None else x.new_ones(n)
    xf = x.float()
    if memory_efficient:  # x is y: x̂ = (y - bias) / scale, per batch for the Ada norms
        b = ref.shape[0] if norm in _launch.ADAPTIVE_NORMS else 1
        shifted = _batched(xf, ref, norm) - (bias.float().reshape(b, 1, n) if bias is not None else 0)
        xhat = (shifted / _scale(ref, zero_centered).reshape(b, 1, n)).reshape(x.shape)
    elif not _launch.subtracts_mean(norm):
        xhat = xf * rstd[..., None]
    else:
        xhat = (xf - mean[..., None]) * rstd[..., None]
    g = dy.float()
    if epilogue != "none":
        g = g * unpack_mask(mask, n)
    gw = (_batched(g, ref, norm) * _batched(_scale(ref, zero_centered), ref, norm)).reshape(x.shape)
    proj = (gw * xhat).mean(-1, keepdim=True)
    if not _launch.subtracts_mean(norm):
        dxf = rstd[..., None] * (gw - xhat * proj)
    else:
        dxf = rstd[..., None] * (gw - gw.mean(-1, keepdim=True) - xhat * proj)
    if dh_out is not None:
        dxf = dxf + dh_out.float()
    dx = _launch.like_rows(x, rs, dy.dtype if stream_f32 else x.dtype)
    dx.copy_(dxf)
    dresidual = None
    if stream_f32:
        dresidual = _launch.like_rows(x, rs)
        dresidual.copy_(dxf)
    dweight = (_batched(g * xhat, ref, norm).sum(1).reshape(ref.shape).to(ref.dtype)) if weight is not None else None
    dbias = _batched(g, ref, norm).sum(1).reshape(ref.shape).to(ref.dtype) if bias_grad else None
    return dx, dweight, dbias, dresidual


# Quantized outputs: (code dtype, largest finite value) per format.
QUANT_FORMATS = {
    "fp8_e4m3": (torch.float8_e4m3fn, 448.0),
    "fp8_e5m2": (torch.float8_e5m2, 57344.0),
    "fp8_e4m3_row": (torch.float8_e4m3fn, 448.0),
    "fp8_e5m2_row": (torch.float8_e5m2, 57344.0),
    "int8_row": (torch.int8, 127.0),
    "mxfp8_e4m3": (torch.float8_e4m3fn, 448.0),
    "mxfp8_e5m2": (torch.float8_e5m2, 57344.0),
    "mxfp4": (_launch.FP4, 6.0),
    "nvfp4": (_launch.FP4, 6.0),
}
_MX_EMAX = {"mxfp8_e4m3": 8, "mxfp8_e5m2": 15, "mxfp4": 2}
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_codes(v):
    """uint8 e2m1 codes (low 4 bits) of v: the nearest of the eight magnitudes, ties to the even
    code, saturating at 6; the sign bit kept (-0.1 gives -0), NaN +0 (e2m1 has no NaN)."""
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float64, device=v.device)
    a = torch.nan_to_num(v.double().abs(), nan=0.0).clamp(max=6.0)
    d = (a.unsqueeze(-1) - table).abs()
    nearest = d == d.min(-1, keepdim=True).values
    even = nearest & (torch.arange(8, device=v.device) % 2 == 0)
    code = torch.where(even.any(-1), even.int().argmax(-1), nearest.int().argmax(-1)).to(torch.uint8)
    sign = (torch.signbit(v) & ~v.isnan()).to(torch.uint8) << 3
    return code | sign


def pack_e2m1(codes):
    """[..., n] codes (n even) -> [..., n / 2] bytes, element 2k in the low nibble, as _launch.FP4."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).view(_launch.FP4)


def swizzle_block_scales(scales):
    """[rows, cols] scales -> the GEMMs' layout: zero-padded to [roundup(rows, 128), roundup(cols, 4)],
    128x4 tiles of 512 bytes in row-major tile order, (r, c) of a tile at (r % 32) * 16 + (r / 32) * 4
    + c; returned as the padded matrix's shape."""
    rows, cols = scales.shape
    rp, cp = (rows + 127) // 128 * 128, (cols + 3) // 4 * 4
    raw = scales.view(torch.uint8)
    padded = raw.new_zeros((rp, cp))
    padded[:rows, :cols] = raw
    # [row tile, 4 quarters, 32 lines, col tile, 4] -> [row tile, col tile, 32 lines, 4 quarters, 4]
    tiles = padded.reshape(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rp, cp).view(scales.dtype)


def quantize(yf, quant, quant_scale):
    """(codes, row scales or None) of fp32 y, as the quantizing epilogues define them: per tensor,
    codes of y * quant_scale; per row, scale = amax(row) / qmax (1 for a zero row), codes of
    y * (1 / scale). FP8 saturates to its largest finite value (torch's cast does not), int8 rounds
    half to even and clamps to [-128, 127]."""
    dtype, qmax = QUANT_FORMATS[quant]
    if quant == "nvfp4":
        # NVFP4 (TransformerEngine's and FlashInfer's two-level form): per 16 values s =
        # e4m3_satfinite(amax / 6 * S_enc), codes e2m1(y * S_enc / s), 0 where s is 0.
        n = yf.shape[-1]
        pad = (-n) % 16
        s_enc = quant_scale.double().reshape(())
        blocks = F.pad(yf.double(), (0, pad)).reshape(yf.shape[:-1] + (-1, 16))
        amax = torch.nan_to_num(blocks, nan=0.0).abs().amax(-1)
        scales = (amax / 6 * s_enc).clamp(max=448.0).to(torch.float8_e4m3fn)
        s = scales.double()
        mult = torch.where(s > 0, s_enc / s, torch.zeros_like(s))
        v = (blocks * mult.unsqueeze(-1)).reshape(yf.shape[:-1] + (-1,))[..., :n]
        return pack_e2m1(e2m1_codes(v)), scales
    if quant.startswith("mx"):
        # OCP MX: per 32 values, X = 2^(floor(log2 amax) - emax), exponent in [-127, 127]; the
        # scales as their E8M0 codes (exponent + 127; amax 0 gives 0).
        n = yf.shape[-1]
        pad = (-n) % 32
        blocks = F.pad(yf, (0, pad)).reshape(yf.shape[:-1] + (-1, 32))
        amax = torch.nan_to_num(blocks, nan=0.0).abs().amax(-1)
        _, exp = torch.frexp(amax)  # amax = m * 2^exp, m in [0.5, 1): floor(log2 amax) = exp - 1
        e = torch.where(amax > 0, exp - 1 - _MX_EMAX[quant], torch.full_like(exp, -127)).clamp(-127, 127)
        v = (blocks * torch.exp2(-e.float()).unsqueeze(-1)).reshape(yf.shape[:-1] + (-1,))[..., :n]
        scales = (e + 127).to(torch.uint8).view(_launch.E8M0)
        if quant == "mxfp4":
            return pack_e2m1(e2m1_codes(v)), scales
        codes = torch.where(v.isnan(), v, v.clamp(-qmax, qmax)).to(dtype)
        return codes, scales
    if quant.endswith("_row"):
        amax = yf.abs().amax(-1, keepdim=True)
        scales = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        v = yf * (1.0 / scales)
    else:
        scales = None
        v = yf * quant_scale.float()
    if dtype == torch.int8:
        codes = torch.nan_to_num(v.round(), nan=0.0).clamp(-128, 127).to(torch.int8)
    else:
        codes = torch.where(v.isnan(), v, v.clamp(-qmax, qmax)).to(dtype)
    return codes, scales


def forward_quant(x, residual, weight, bias, norm, eps, zero_centered, quant, quant_scale, amax, want_y,
                  scale_layout="row_major"):
    """As _launch.forward_quant."""
    y_dtype = x.dtype  # x's, also where h (which x becomes) is an fp32 residual stream
    x, residual, _, _ = _launch.quant_layout(x, residual, quant)
    x, rs, h, yf, _, _ = _normalized(x, residual, weight, bias, norm, eps, zero_centered)
    codes, scales = quantize(yf, quant, quant_scale)
    if quant in _launch.FP4_QUANTS:
        y_quant = _launch.packed_rows(x, rs, codes.dtype)
        y_quant.view(torch.uint8).copy_(codes.view(torch.uint8))
    else:
        y_quant = _launch.like_rows(x, rs, codes.dtype)
        y_quant.copy_(codes)
    if scale_layout == "swizzled":
        scales = swizzle_block_scales(scales.reshape(-1, scales.shape[-1]))
    if amax is not None and yf.numel():
        amax.copy_(torch.maximum(amax, torch.nan_to_num(yf, nan=0.0).abs().amax().reshape(amax.shape)))
    y = None
    if want_y:
        y = _launch.like_rows(x, rs, y_dtype)
        y.copy_(yf)
    return y_quant, scales, y, h
