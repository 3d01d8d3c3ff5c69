"""``torch.nn`` norm modules that run normjit's kernels, and swap_norms() to put them into a model."""
import torch.nn as nn

from .functional import layer_norm, rms_norm


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (same constructor, parameters and state-dict keys) whose forward is
    normjit's layer_norm: normjit's kernels on CUDA tensors, torch's on CPU. memory_efficient
    (keyword, also an attribute): autograd keeps y instead of x (normjit.torch.layer_norm)."""

    def __init__(self, *args, memory_efficient=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory_efficient = memory_efficient

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps,
                          memory_efficient=getattr(self, "memory_efficient", False))


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` (same constructor, parameters and state-dict keys) whose forward is
    normjit's rms_norm: normjit's kernels on CUDA tensors, torch's on CPU. memory_efficient: as
    LayerNorm's."""

    def __init__(self, *args, memory_efficient=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory_efficient = memory_efficient

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps,
                        memory_efficient=getattr(self, "memory_efficient", False))


_SWAPS = {nn.LayerNorm: LayerNorm, nn.RMSNorm: RMSNorm}


def swap_norms(model, memory_efficient=False):
    """Makes every ``nn.LayerNorm`` / ``nn.RMSNorm`` in ``model`` (itself included) that normalizes
    one dimension run normjit's kernels; returns how many it swapped. memory_efficient: the swapped
    norms keep y instead of x for their backward.

    The modules are changed in place (their class becomes normjit's subclass), so parameters,
    buffers, hooks and references to them stay as they were. Subclasses of the torch modules (which
    may have their own forward) and norms over several dimensions are left alone.
    """
    count = 0
    for module in model.modules():
        target = _SWAPS.get(type(module))
        if target is not None and len(module.normalized_shape) == 1:
            module.__class__ = target
            module.memory_efficient = memory_efficient
            count += 1
    return count
