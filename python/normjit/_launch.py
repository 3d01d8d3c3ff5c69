"""launch(): Kernel.launch over array objects instead of raw pointers."""
import math

from . import _normjit

_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}
# LaunchArgs::block_scale_layout by name (normjit::BlockScaleLayout).
BLOCK_SCALE_LAYOUTS = {"row_major": 0, "swizzled": 1}


def _array_info(obj, name):
    """(pointer, shape, strides in elements, itemsize) of a torch tensor, a
    ``__cuda_array_interface__`` array or a DLPack array; shape and strides are None for an int."""
    if obj is None:
        return 0, None, None, None
    if isinstance(obj, int):
        return obj, None, None, None
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride"):  # torch.Tensor
        return obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), obj.element_size()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        itemsize = int(cai["typestr"][2:])
        if cai.get("strides") is None:  # C-contiguous
            strides, step = [], 1
            for extent in reversed(shape):
                strides.append(step)
                step *= extent
            strides = tuple(reversed(strides))
        else:
            strides = tuple(s // itemsize for s in cai["strides"])
        return cai["data"][0], shape, strides, itemsize
    if hasattr(obj, "__dlpack__"):
        ptr, shape, strides, itemsize = _normjit._dlpack_info(obj)
        return ptr, shape, strides, itemsize
    raise _normjit.InvalidArgumentError(
        f"{name}={type(obj).__name__} is not an int pointer, a torch tensor, a __cuda_array_interface__ "
        "array or a DLPack array"
    )


def _rows_of(spec, shape, strides):
    """rows and row_stride of x [..., n] whose leading dimensions flatten into evenly strided rows."""
    if not shape or shape[-1] != spec.n:
        raise _normjit.InvalidArgumentError(f"x has shape {list(shape)}; {spec} needs [..., {spec.n}]")
    if shape[-1] > 1 and strides[-1] != 1:
        raise _normjit.InvalidArgumentError(f"x has strides {list(strides)}: its last dimension must be contiguous")
    rows = math.prod(shape[:-1])
    row_stride = strides[-2] if len(shape) > 1 and shape[-2] > 1 else spec.n
    for i in range(len(shape) - 2):
        if shape[i] > 1 and strides[i] != strides[i + 1] * shape[i + 1]:
            raise _normjit.InvalidArgumentError(
                f"x has shape {list(shape)} and strides {list(strides)}: its leading dimensions do not flatten "
                "into rows of one stride; pass rows= and row_stride=, or a contiguous copy"
            )
    return rows, row_stride


def _stream_handle(stream, x):
    if stream is None:
        # The current torch stream for torch tensors, else the legacy default stream.
        if hasattr(x, "data_ptr") and getattr(x, "is_cuda", False):
            import torch

            return torch.cuda.current_stream(x.device).cuda_stream
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return stream.__cuda_stream__()[1]
    if hasattr(stream, "cuda_stream"):
        return stream.cuda_stream
    raise _normjit.InvalidArgumentError(
        f"stream={stream!r} is not an int handle or an object with __cuda_stream__ or cuda_stream"
    )


def launch(runtime, spec, *, x=None, gamma=None, beta=None, mean=None, rstd=None, y=None, dy=None, dx=None,
           dgamma=None, dbeta=None, workspace=None, workspace_bytes=None, mask=None, clip_lower=0.0,
           clip_upper=math.inf, rows=None, row_stride=None, rows_per_batch=None, eps=1e-5, stream=None,
           residual=None, h=None, dh_out=None, y_quant=None, quant_scale=None, amax=None, row_scales=None, block_scales=None,
           block_scale_layout="row_major", dresidual=None, bias_in=None):
    """Launches the kernel of ``spec`` (a Spec or spec string) on ``runtime``'s GPU.

    Arrays: torch tensors, ``__cuda_array_interface__`` or DLPack arrays, int pointers, or None
    where the spec uses none (see LaunchArgs in include/normjit/runtime.hpp for shapes and dtypes).
    rows and row_stride default to x's: x is [..., n] with a contiguous last dimension.
    rows_per_batch (AdaLayerNorm) defaults to S of x [B, S, n]. A backward without ``workspace``
    gets one from torch when x is a torch tensor. stream: an int handle, an object with
    ``__cuda_stream__`` or ``cuda_stream``, or None for torch's current stream (torch tensors)
    or the legacy default stream. block_scale_layout: "row_major" or "swizzled" (the GEMMs' 128x4
    tiles; block-scaled specs only). An fp32 residual stream (``.residual_f32``): residual, h,
    dh_out and dresidual are float32, and the backward's x is h. Returns the Kernel it launched (sync mode), or
    the ModeLauncher that launched it (async and generic modes: Runtime.compile_mode).
    """
    if block_scale_layout not in BLOCK_SCALE_LAYOUTS:
        raise _normjit.InvalidArgumentError(
            f"block_scale_layout={block_scale_layout!r} is not one of {', '.join(map(repr, BLOCK_SCALE_LAYOUTS))}")
    if not isinstance(spec, _normjit.Spec):
        spec = _normjit.Spec(spec)
    anchor = x if x is not None else dy
    ptr = {}
    shape = strides = itemsize = None
    for name, obj in (("x", x), ("gamma", gamma), ("beta", beta), ("mean", mean), ("rstd", rstd), ("y", y),
                      ("dy", dy), ("dx", dx), ("dgamma", dgamma), ("dbeta", dbeta), ("mask", mask),
                      ("residual", residual), ("h", h), ("dh_out", dh_out), ("y_quant", y_quant),
                      ("quant_scale", quant_scale), ("amax", amax), ("row_scales", row_scales),
                      ("block_scales", block_scales), ("dresidual", dresidual), ("bias_in", bias_in)):
        p, s, st, size = _array_info(obj, name)
        ptr[name] = p
        if obj is anchor:
            shape, strides, itemsize = s, st, size
    # An fp32 residual stream's backward reads h (float32) as its x.
    x_dtype = "f32" if spec.residual_f32 and spec.phase == "bwd" and anchor is x else spec.x_dtype
    if itemsize is not None and itemsize != _ITEMSIZE[x_dtype]:
        raise _normjit.InvalidArgumentError(
            f"{'x' if anchor is x else 'dy'} has {itemsize}-byte elements; {spec} takes {x_dtype} "
            f"({_ITEMSIZE[x_dtype]} bytes)"
        )
    if rows is None or row_stride is None:
        if shape is None:
            raise _normjit.InvalidArgumentError("rows= and row_stride= are needed when x is a raw pointer")
        inferred_rows, inferred_stride = _rows_of(spec, shape, strides)
        rows = inferred_rows if rows is None else rows
        row_stride = inferred_stride if row_stride is None else row_stride
    if rows_per_batch is None:
        rows_per_batch = shape[-2] if spec.norm in ("adalayernorm", "adarmsnorm") and shape is not None and len(shape) == 3 else 0

    max_vec = _normjit.max_vec_for(spec, ptr["x"], ptr["gamma"], ptr["beta"], ptr["y"], ptr["dy"], ptr["dx"],
                                   ptr["dgamma"], ptr["dbeta"], ptr["mask"], row_stride, ptr["residual"], ptr["h"],
                                   ptr["dh_out"], ptr["y_quant"], ptr["dresidual"], ptr["bias_in"])
    # Sync mode: the specialized kernel (compiled or loaded here); async and generic modes: launches
    # through the runtime, which runs the generic kernel until the specialized one is ready.
    kernel = runtime.kernel(spec, max_vec) if runtime.compile_mode == "sync" else runtime.launcher(spec, max_vec)
    needed = kernel.workspace_bytes(rows, rows_per_batch)
    if workspace is None and needed > 0 and hasattr(anchor, "data_ptr") and hasattr(anchor, "device"):
        import torch

        workspace = torch.empty(needed, dtype=torch.uint8, device=anchor.device)
    ws_ptr, ws_shape, _, ws_itemsize = _array_info(workspace, "workspace")
    if workspace_bytes is None:
        workspace_bytes = math.prod(ws_shape) * ws_itemsize if ws_shape is not None else (needed if ws_ptr else 0)
    kernel.launch(ptr["x"], ptr["gamma"], ptr["beta"], ptr["mean"], ptr["rstd"], ptr["y"], ptr["dy"], ptr["dx"],
                  ptr["dgamma"], ptr["dbeta"], ws_ptr, workspace_bytes, ptr["mask"], clip_lower, clip_upper, rows,
                  row_stride, rows_per_batch, eps, _stream_handle(stream, anchor), ptr["residual"], ptr["h"],
                  ptr["dh_out"], ptr["y_quant"], ptr["quant_scale"], ptr["amax"], ptr["row_scales"], ptr["block_scales"],
                  BLOCK_SCALE_LAYOUTS[block_scale_layout], ptr["dresidual"], ptr["bias_in"])
    return kernel
