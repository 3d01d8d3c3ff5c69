"""The low-level API without a GPU: specs, errors, precompile, bundles."""
import math
import os
import pickle

import pytest

import normjit


def test_package_imports_and_reports_versions():
    assert normjit.__version__ == normjit.version()
    assert normjit.version().count(".") == 2
    assert normjit.nvrtc_version() >= 12000
    assert normjit.default_cache_dir()


def test_spec_round_trip_and_fields():
    s = normjit.Spec("layernorm.fwd_train.bf16.w_f32.n4096.bias")
    assert str(s) == "layernorm.fwd_train.bf16.w_f32.n4096.bias"
    assert normjit.Spec(str(s)) == s
    assert (s.norm, s.phase, s.x_dtype, s.w_dtype, s.epilogue) == ("layernorm", "fwd_train", "bf16", "f32", "none")
    assert (s.n, s.has_bias, s.block) == (4096, True, None)
    assert repr(s) == "normjit.Spec('layernorm.fwd_train.bf16.w_f32.n4096.bias')"
    # The weight dtype defaults to x's; the canonical string spells it out.
    r = normjit.Spec("rmsnorm.bwd.f16.n7.relu_bitmask")
    assert str(r) == "rmsnorm.bwd.f16.w_f16.n7.relu_bitmask"
    assert (r.norm, r.phase, r.w_dtype, r.epilogue, r.has_bias) == ("rmsnorm", "bwd", "f16", "relu_bitmask", False)
    assert normjit.Spec("adalayernorm.fwd_infer.f32.n1").norm == "adalayernorm"


def test_spec_equality_hash_and_pickle():
    a = normjit.Spec("rmsnorm.fwd_infer.f16.n768")
    b = normjit.Spec("rmsnorm.fwd_infer.f16.w_f16.n768")
    c = normjit.Spec("rmsnorm.fwd_infer.f16.n769")
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert a != "rmsnorm.fwd_infer.f16.n768"  # a Spec is not its string
    assert len({a, b, c}) == 2
    assert pickle.loads(pickle.dumps(a)) == a


def test_resolve_fills_a_block_config():
    s = normjit.Spec("layernorm.fwd_train.bf16.n4096.bias")
    r = s.resolve()
    assert s.block is None
    assert r.block is not None and r.block.startswith("cfg_t")
    assert str(r) == f"{s}.{r.block}"
    assert r.resolve() == r  # a pinned spec stays as it is
    # Vectors of one element when the pointers allow no more.
    assert "_v1_" in s.resolve(max_vec=1).block
    pinned = normjit.Spec("rmsnorm.fwd_infer.f16.n7.cfg_t1_r256_v1_reg")
    assert pinned.block == "cfg_t1_r256_v1_reg"


@pytest.mark.parametrize(
    "text, token",
    [
        ("layernorm.fwd_trian.bf16.n4096", "fwd_trian"),
        ("groupnorm.fwd_train.bf16.n4096", "groupnorm"),
        ("layernorm.fwd_train.bf17.n4096", "bf17"),
        ("layernorm.fwd_train.bf16.n4096.biass", "biass"),
        ("layernorm.fwd_train.bf16.n999999999", "999999999"),
    ],
)
def test_bad_spec_raises_naming_the_token(text, token):
    with pytest.raises(normjit.InvalidSpecError) as info:
        normjit.Spec(text)
    assert token in str(info.value)
    assert str(info.value).startswith("invalid spec: ")
    assert isinstance(info.value, normjit.Error) and isinstance(info.value, ValueError)


def test_exception_classes():
    for name in ("InvalidArgumentError", "InvalidSpecError", "NotSupportedError", "CompileError",
                 "DriverUnavailableError", "CudaError", "CacheError"):
        cls = getattr(normjit, name)
        assert issubclass(cls, normjit.Error) and cls.__module__ == "normjit"
    assert issubclass(normjit.Error, RuntimeError)


def _has_gpu():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: Runtime() succeeds")
def test_runtime_without_gpu_says_so():
    with pytest.raises(normjit.DriverUnavailableError) as info:
        normjit.Runtime()
    message = str(info.value)
    assert "needs a GPU" in message
    assert "precompiling kernels work without one" in message


def _entries(cache_dir):
    return sorted(f for f in os.listdir(cache_dir) if f.endswith(".kernel"))


SPECS = ["rmsnorm.fwd_infer.f32.n1", "rmsnorm.fwd_infer.f16.n8", "layernorm.fwd_train.bf16.n64.bias"]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache directory holding SPECS for sm_90, and what the first precompile returned."""
    cache_dir = str(tmp_path_factory.mktemp("cache"))
    calls = []
    result = normjit.precompile(SPECS, arch="sm_90", cache_dir=cache_dir, jobs=2,
                                progress=lambda done, total: calls.append((done, total)))
    return cache_dir, result, calls


def test_precompile_compiles_then_hits(warm_cache):
    cache_dir, first, calls = warm_cache
    assert (first["compiled"], first["cached"], first["failed"], first["errors"]) == (3, 0, 0, [])
    assert os.path.samefile(first["cache_dir"], cache_dir)
    entries = _entries(cache_dir)
    assert len(entries) == 3 and all(".sm_90." in e for e in entries)
    # The generated source sits beside each entry.
    assert len([f for f in os.listdir(cache_dir) if f.endswith(".cu")]) == 3
    assert calls and calls[-1] == (3, 3) and all(t == 3 for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    # Specs as Spec objects, one thread, no progress: all hits.
    again = normjit.precompile([normjit.Spec(s) for s in SPECS], cache_dir=cache_dir, jobs=1, progress=False)
    assert (again["compiled"], again["cached"], again["failed"]) == (0, 3, 0)
    assert _entries(cache_dir) == entries


def test_precompile_reports_bad_specs_and_compiles_the_rest(tmp_path):
    with pytest.warns(UserWarning, match="1 of 2 spec"):
        result = normjit.precompile(["layernorm.fwd_train.bf16.nope", "rmsnorm.fwd_infer.f32.n1"],
                                    cache_dir=str(tmp_path), jobs=1)
    assert (result["compiled"], result["failed"]) == (1, 1)
    [(spec, message)] = result["errors"]
    assert spec == "layernorm.fwd_train.bf16.nope"
    assert message.startswith("invalid spec: ") and "nope" in message
    assert len(_entries(tmp_path)) == 1


def test_precompile_in_batches_gives_the_same_entries(warm_cache, tmp_path):
    # Two forwards and a backward (batched apart by phase), and a bad spec that fails alone.
    cache_dir, _, _ = warm_cache
    specs = SPECS + ["rmsnorm.bwd.f16.n8", "layernorm.fwd_train.bf16.nope"]
    calls = []
    with pytest.warns(UserWarning, match="1 of 5 spec"):
        result = normjit.precompile(specs, cache_dir=str(tmp_path), jobs=2, batch=3,
                                    progress=lambda done, total: calls.append((done, total)))
    assert (result["compiled"], result["cached"], result["failed"]) == (4, 0, 1)
    assert result["errors"][0][0] == "layernorm.fwd_train.bf16.nope"
    # The same entry files (name and key) as one-at-a-time compiles of the same sources.
    assert set(_entries(cache_dir)) < set(_entries(tmp_path)) and len(_entries(tmp_path)) == 4
    assert calls[-1] == (5, 5)
    again = normjit.precompile(specs[:4], cache_dir=str(tmp_path), batch=4, progress=False)
    assert (again["compiled"], again["cached"]) == (0, 4)
    for bad in (0, 65):
        with pytest.raises(normjit.InvalidArgumentError, match=f"batch={bad} is not in"):
            normjit.precompile(SPECS, cache_dir=str(tmp_path), batch=bad)


def test_precompile_rejects_a_bad_arch(tmp_path):
    with pytest.raises(normjit.InvalidArgumentError, match="sm_7"):
        normjit.precompile(SPECS, arch="sm_7", cache_dir=str(tmp_path))
    assert not os.listdir(tmp_path)


def test_precompile_progress_errors_propagate(tmp_path):
    def progress(done, total):
        raise KeyError("stop")

    with pytest.raises(KeyError):
        normjit.precompile(SPECS[:1], cache_dir=str(tmp_path), progress=progress)


def test_precompile_fails_when_nothing_can_be_stored(tmp_path):
    # A cache directory others can write is not trusted: kernels would be compiled into memory only.
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(normjit.CacheError, match=r"1 of 1 kernel\(s\) could not be stored in cache .*open"):
        normjit.precompile(SPECS[:1], cache_dir=str(open_dir), progress=False)
    assert not any(name.endswith(".kernel") for name in os.listdir(open_dir))


def test_bundle_round_trip(warm_cache, tmp_path):
    cache_dir, _, _ = warm_cache
    bundle = str(tmp_path / "kernels.njb")
    assert normjit.export_bundle(cache_dir, bundle) == 3
    fresh = tmp_path / "fresh"
    assert normjit.import_bundle(bundle, str(fresh)) == 3
    assert _entries(fresh) == _entries(cache_dir)
    result = normjit.precompile(SPECS, cache_dir=str(fresh), progress=False)
    assert (result["compiled"], result["cached"]) == (0, 3)
    # A bundle of chosen specs.
    one = str(tmp_path / "one.njb")
    assert normjit.export_bundle(cache_dir, one, specs=[SPECS[0]]) == 1
    assert normjit.import_bundle(one, str(tmp_path / "one")) == 1


def test_bundle_errors(tmp_path):
    bad = tmp_path / "bad.njb"
    bad.write_bytes(b"not a bundle")
    with pytest.raises(normjit.CacheError):
        normjit.import_bundle(str(bad), str(tmp_path / "cache"))
    with pytest.raises(normjit.CacheError):
        normjit.export_bundle(str(tmp_path), str(tmp_path / "out.njb"), specs=["rmsnorm.fwd_infer.f32.n3"])


def test_tuning_mode_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("NORMJIT_TUNING", raising=False)
    monkeypatch.delenv("NORMJIT_TUNING_DB", raising=False)
    assert normjit.tuning_db_path(str(tmp_path)) == str(tmp_path / "tuning.json")
    assert normjit.tuning_mode(str(tmp_path)) == "heuristic"
    (tmp_path / "tuning.json").write_text("{}")
    assert normjit.tuning_mode(str(tmp_path)) == "db"  # the default once a database exists
    monkeypatch.setenv("NORMJIT_TUNING", "tune")
    assert normjit.tuning_mode(str(tmp_path)) == "tune"
    monkeypatch.setenv("NORMJIT_TUNING_DB", str(tmp_path / "elsewhere.json"))
    assert normjit.tuning_db_path(str(tmp_path)) == str(tmp_path / "elsewhere.json")
    monkeypatch.setenv("NORMJIT_TUNING", "fastest")
    with pytest.raises(normjit.InvalidArgumentError, match="NORMJIT_TUNING='fastest'"):
        normjit.tuning_mode(str(tmp_path))


def test_compile_mode_from_the_environment(monkeypatch):
    monkeypatch.delenv("NORMJIT_COMPILE_MODE", raising=False)
    assert normjit.compile_mode() == "sync"
    monkeypatch.setenv("NORMJIT_COMPILE_MODE", "async")
    assert normjit.compile_mode() == "async"
    monkeypatch.setenv("NORMJIT_COMPILE_MODE", "eager")
    with pytest.raises(normjit.InvalidArgumentError, match="NORMJIT_COMPILE_MODE='eager'"):
        normjit.compile_mode()


def test_generic_kernels_ship_in_the_package():
    images = normjit.generic_images()
    assert {(x, program, arch) for x, program, arch, _, _ in images} == {
        (x, program, arch)
        for x in ("f32", "f16", "bf16")
        for program, archs in (("norm", ("sm_80", "sm_90", "compute_90")), ("quant", ("sm_90", "compute_90")))
        for arch in archs
    }
    assert all(size > 100_000 and is_ptx == arch.startswith("compute_") for _, _, arch, is_ptx, size in images)
    # Every epilogue and fusion has a generic kernel.
    for spec in (
        "rmsnorm.bwd.bf16.n50000.residual",
        "rmsnorm.fwd_infer.bf16.n4096.fp8_e4m3",
        "layernorm.fwd_train.bf16.n4098.bias.residual_f32.bias_in.nvfp4",
        "layernorm.bwd.bf16.n4096.bias.memory_efficient",
    ):
        assert normjit.generic_unsupported_why(spec) == "", spec


def test_max_vec_for_follows_alignment_and_stride():
    s = normjit.Spec("layernorm.fwd_train.bf16.n4096.bias")
    base = 1 << 20  # pointer values only; nothing is dereferenced
    args = dict(x=base, gamma=base, beta=base, y=base, row_stride=4096)

    def vec(**kw):
        a = {**args, **kw}
        return normjit.max_vec_for(s, a["x"], a["gamma"], a["beta"], a["y"], 0, 0, 0, 0, 0, a["row_stride"])

    assert vec() == 8
    assert vec(x=base + 4) == 2
    assert vec(y=base + 2) == 1
    assert vec(row_stride=4100) == 4
    # fp8_* specs: the one-byte codes (y_quant) need vec-byte alignment.
    q = normjit.Spec("layernorm.fwd_infer.bf16.n4096.bias.fp8_e4m3")
    assert normjit.max_vec_for(q, base, base, base, 0, 0, 0, 0, 0, 0, 4096, y_quant=base) == 8
    assert normjit.max_vec_for(q, base, base, base, 0, 0, 0, 0, 0, 0, 4096, y_quant=base + 4) == 4
    assert normjit.max_vec_for(q, base, base, base, 0, 0, 0, 0, 0, 0, 4096, y_quant=base + 1) == 1


def test_launch_argument_errors_need_no_gpu():
    # Checked before any GPU work: a raw pointer needs rows and row_stride, arrays must match n.
    with pytest.raises(normjit.InvalidArgumentError, match="rows="):
        normjit.launch(None, "rmsnorm.fwd_infer.f32.n8", x=1 << 20, y=1 << 20)
    with pytest.raises(normjit.InvalidArgumentError, match="stream="):
        normjit._launch._stream_handle("s", None)


def test_array_pointers_shapes_and_strides_of_each_protocol():
    from normjit._launch import _array_info, _rows_of

    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    spec = normjit.Spec("rmsnorm.fwd_infer.f16.n32")
    # torch: a strided view of wider rows.
    t = torch.empty(5, 40, dtype=torch.float16)[:, :32]
    ptr, shape, strides, itemsize = _array_info(t, "x")
    assert (ptr, shape, strides, itemsize) == (t.data_ptr(), (5, 32), (40, 1), 2)
    assert _rows_of(spec, shape, strides) == (5, 40)
    # DLPack (numpy): leading dimensions flatten into rows.
    a = np.zeros((2, 3, 40), dtype=np.float16)[:, :, :32]
    ptr, shape, strides, itemsize = _array_info(a, "x")
    assert (ptr, shape, strides, itemsize) == (a.ctypes.data, (2, 3, 32), (120, 40, 1), 2)
    assert _rows_of(spec, shape, strides) == (6, 40)

    # __cuda_array_interface__: strides in bytes, or None when C-contiguous.
    class Cai:
        def __init__(self, strides):
            self.__cuda_array_interface__ = {"shape": (4, 32), "typestr": "<f2", "data": (0x7000, False),
                                             "strides": strides, "version": 3}

    assert _array_info(Cai(None), "x") == (0x7000, (4, 32), (32, 1), 2)
    assert _rows_of(spec, *_array_info(Cai((128, 2)), "x")[1:3]) == (4, 64)
    assert _array_info(None, "gamma") == (0, None, None, None)
    assert _array_info(1234, "gamma")[0] == 1234
    with pytest.raises(normjit.InvalidArgumentError, match="gamma=list"):
        _array_info([1, 2], "gamma")


def test_rows_that_do_not_flatten_are_refused():
    from normjit._launch import _rows_of

    torch = pytest.importorskip("torch")
    spec = normjit.Spec("rmsnorm.fwd_infer.f32.n32")
    x = torch.empty(4, 6, 32).transpose(0, 1)  # [6, 4, 32], strides (32, 192, 1)
    with pytest.raises(normjit.InvalidArgumentError, match="do not flatten"):
        _rows_of(spec, tuple(x.shape), x.stride())
    with pytest.raises(normjit.InvalidArgumentError, match="last dimension"):
        _rows_of(spec, (32, 32), (1, 32))
    with pytest.raises(normjit.InvalidArgumentError, match=r"needs \[\.\.\., 32\]"):
        _rows_of(spec, (4, 31), (31, 1))
    assert _rows_of(spec, (32,), (1,)) == (1, 32)  # one row


@pytest.mark.parametrize("fmt,dtype_name,max_finite", [("e4m3", "float8_e4m3fn", 448.0), ("e5m2", "float8_e5m2", 57344.0)])
def test_fp8_reference_matches_torch(fmt, dtype_name, max_finite):
    """normjit's FP8 reference (round to nearest even) against torch's own conversion, an
    independent implementation, over random fp32 values in range and every code's midpoints."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(3)
    mags = torch.exp2(torch.empty(50000).uniform_(-22, math.log2(max_finite), generator=gen))
    signs = torch.where(torch.rand(50000, generator=gen) < 0.5, -1.0, 1.0)
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    finite = codes[torch.isfinite(codes)].unique()
    mids = (finite[:-1] + finite[1:]) / 2  # exact in fp32
    values = torch.cat([mags * signs, finite, mids]).float()
    values = values[values.abs() <= max_finite]
    want = values.to(dtype).view(torch.uint8).tolist()
    got = list(normjit._normjit._reference_encode(fmt, values.double().tolist()))
    bad = [(v, g, w) for v, g, w in zip(values.tolist(), got, want) if g != w]
    assert not bad, f"{len(bad)} of {len(want)} differ, first: value, normjit, torch = {bad[:5]}"
    # Saturation, where torch's conversion gives NaN / infinity instead.
    assert list(normjit._normjit._reference_encode(fmt, [1e9, -1e9])) == [
        torch.tensor([max_finite]).to(dtype).view(torch.uint8).item(),
        torch.tensor([-max_finite]).to(dtype).view(torch.uint8).item()]
    with pytest.raises(normjit.InvalidArgumentError, match="format='e3m4' is not"):
        normjit._normjit._reference_encode("e3m4", [1.0])
