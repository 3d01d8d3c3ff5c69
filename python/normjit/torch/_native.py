"""normjit.torch's eager path in C++ (python/src/torch_ops.cpp), when the package was built with it.

``eager_norm`` is the raw ``torch.ops.normjit.eager_norm`` callable, or None when the package has
no C++ ops (built without a CUDA torch), they were built for another torch version, or
NORMJIT_TORCH_NATIVE=0. Then normjit.torch runs the same kernels through its Python autograd.
"""
import os
import warnings

import torch

NORMS = {"layernorm": 0, "rmsnorm": 1, "adalayernorm": 2, "adarmsnorm": 3}  # normjit::Norm
EPILOGUES = {"none": 0, "relu_bitmask": 1}  # normjit::Epilogue

why_not = None  # why eager_norm is None


def _load():
    global why_not
    if os.environ.get("NORMJIT_TORCH_NATIVE", "1") == "0":
        why_not = "NORMJIT_TORCH_NATIVE=0"
        return None
    try:
        from .. import _torch_build
    except ImportError:
        why_not = "the package was built without a CUDA torch"
        return None
    if _torch_build.TORCH_VERSION != torch.__version__:
        why_not = f"its C++ ops were built for torch {_torch_build.TORCH_VERSION}, not {torch.__version__}"
        warnings.warn(f"normjit.torch: {why_not}; running the Python autograd path (reinstall normjit to rebuild "
                      "them)", RuntimeWarning, stacklevel=3)
        return None
    torch.ops.load_library(os.path.join(os.path.dirname(_torch_build.__file__), _torch_build.LIBRARY))
    op = torch.ops.normjit.eager_norm.default
    # The overload's C++ callable: skips one Python frame per call.
    return getattr(op, "_op", op)


eager_norm = _load()
