"""normjit: run-time compiled CUDA normalization kernels (LayerNorm, RMSNorm, AdaLayerNorm).

The low-level API mirrors the C++ one (include/normjit/): ``Spec`` names a kernel, ``Runtime(device)``
loads kernels for one GPU, ``Kernel.launch`` runs one on raw pointers, ``launch`` does the same on
arrays (torch tensors, ``__cuda_array_interface__`` or DLPack). Without a GPU the package still
parses specs, precompiles kernels into the disk cache and writes bundles; GPU work raises
``DriverUnavailableError``. ``normjit.torch`` holds the PyTorch functions and modules.
"""
from ._normjit import (
    CacheError,
    CompileError,
    CudaError,
    DriverUnavailableError,
    Error,
    InvalidArgumentError,
    InvalidSpecError,
    Kernel,
    ModeLauncher,
    NotSupportedError,
    Runtime,
    Spec,
    compile_mode,
    default_cache_dir,
    export_bundle,
    generic_images,
    generic_unsupported_why,
    import_bundle,
    max_vec_for,
    nvrtc_version,
    tuning_db_path,
    tuning_mode,
    version,
)
from ._launch import launch
from ._precompile import precompile

__version__ = version()

__all__ = [
    "CacheError",
    "CompileError",
    "CudaError",
    "DriverUnavailableError",
    "Error",
    "InvalidArgumentError",
    "InvalidSpecError",
    "Kernel",
    "ModeLauncher",
    "NotSupportedError",
    "Runtime",
    "Spec",
    "compile_mode",
    "default_cache_dir",
    "export_bundle",
    "generic_images",
    "generic_unsupported_why",
    "import_bundle",
    "launch",
    "max_vec_for",
    "nvrtc_version",
    "precompile",
    "tuning_db_path",
    "tuning_mode",
    "version",
]
