"""precompile(): the binding's parallel compile, with a progress bar on a terminal."""
import sys
import warnings

from . import _normjit


class _Bar:
    """A one-line progress bar on stderr, for when tqdm is not installed."""

    def __init__(self, total):
        self.total = total

    def __call__(self, done, total):
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\rnormjit precompile [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def close(self):
        pass


def _progress_bar(total):
    try:
        from tqdm import tqdm
    except ImportError:
        return _Bar(total)
    bar = tqdm(total=total, desc="normjit precompile", unit="kernel")

    def update(done, _total):
        bar.update(done - bar.n)

    update.close = bar.close
    return update


def precompile(specs, arch="sm_90", cache_dir=None, jobs=0, progress=None, batch=1):
    """Compiles kernels into the disk cache (no GPU needed).

    specs: spec strings or ``Spec`` objects, each resolved for ``arch`` as ``normjit-precompile``
    resolves it. jobs: compile threads (0: one per core). cache_dir: None for
    ``default_cache_dir()``. progress: None for a bar on stderr when it is a terminal (tqdm when
    installed), False for none, or a callable(done, total). batch: up to this many specs of one
    phase compiled in one NVRTC program (1-64; ``normjit-precompile --batch``: fewer, larger
    compiles, each cache entry holding its batch's image; docs/cache.md).

    Returns ``{"compiled", "cached", "failed": counts, "errors": [(spec, message)], "cache_dir"}``.
    A spec that does not parse or resolve, or fails to compile, is counted in "failed" with its
    message in "errors" (and a warning); the other specs are still compiled. A bad ``arch``,
    ``jobs`` or ``batch`` raises ``InvalidArgumentError``.
    """
    specs = [specs] if isinstance(specs, (str, _normjit.Spec)) else list(specs)
    bar = None
    if progress is None and sys.stderr is not None and sys.stderr.isatty() and specs:
        progress = bar = _progress_bar(len(specs))
    try:
        result = _normjit._precompile(specs, arch, cache_dir, jobs, progress or None, batch)
    finally:
        if bar is not None:
            bar.close()
    if result["failed"]:
        first_spec, first_error = result["errors"][0]
        warnings.warn(
            f"normjit.precompile: {result['failed']} of {len(specs)} spec(s) failed; first: {first_spec}: {first_error}",
            stacklevel=2,
        )
    return result
