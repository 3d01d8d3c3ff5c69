"""Shared pytest setup for normjit's Python tests.

GPU tests take the `gpu` fixture (or the `gpu` marker): without a usable GPU they are skipped
with the reason, so `pytest -ra` lists them; they never pass without running.
"""
import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason():
    """None when a CUDA GPU is usable from both torch and normjit, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    import normjit

    try:
        normjit.Runtime(0)
    except normjit.Error as e:
        return f"normjit cannot use the GPU: {e}"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with the reason without one")


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def gpu():
    """Skips the test (visibly) without a GPU; returns the torch device cuda:0."""
    reason = gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)
    import torch

    return torch.device("cuda", 0)
