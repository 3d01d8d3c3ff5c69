"""The low-level API on a GPU: launches of torch tensors against torch in float64."""
import gc

import pytest

import normjit

torch = pytest.importorskip("torch")

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOL = {"f32": dict(rtol=1e-4, atol=1e-4), "f16": dict(rtol=2e-3, atol=2e-3), "bf16": dict(rtol=1.6e-2, atol=1.6e-2)}
EPS = 1e-5


@pytest.fixture(scope="module")
def runtime(gpu, tmp_path_factory):
    return normjit.Runtime(0, str(tmp_path_factory.mktemp("cache")))


def reference_forward(norm, x, gamma, beta):
    """y, mean, rstd in float64 of x [rows, n]."""
    x = x.double()
    mean = x.mean(-1) if norm == "layernorm" else torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    centered = x - mean[:, None]
    rstd = torch.rsqrt(centered.square().mean(-1) + EPS)
    y = centered * rstd[:, None]
    if gamma is not None:
        y = y * gamma.double()
    if beta is not None:
        y = y + beta.double()
    return y, mean, rstd


def test_runtime_describes_its_device(runtime):
    assert runtime.device_ordinal == 0
    assert runtime.device_name == torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    assert runtime.sm == major * 10 + minor
    assert runtime.tuning_mode in ("heuristic", "db", "tune")
    spec = normjit.Spec("rmsnorm.fwd_infer.bf16.n1024")
    assert runtime.choose(spec).block is not None
    assert "_v1_" in runtime.choose(spec, 1).block


@pytest.mark.parametrize(
    "text, rows, pad",
    [
        ("layernorm.fwd_train.bf16.n4096.bias", 333, 0),
        ("layernorm.fwd_train.f16.w_f32.n1000.bias", 64, 24),  # strided rows, fp32 weights
        ("rmsnorm.fwd_train.bf16.n768", 1000, 0),
        ("rmsnorm.fwd_train.f32.n111", 7, 3),  # odd N and row stride
    ],
)
def test_forward_matches_torch_in_float64(runtime, text, rows, pad):
    spec = normjit.Spec(text)
    dev, xt, wt = "cuda", DTYPES[spec.x_dtype], DTYPES[spec.w_dtype]
    torch.manual_seed(0)
    full = torch.randn(rows, spec.n + pad, device=dev).mul_(2).add_(0.5).to(xt)
    x = full[:, : spec.n]
    y_full = torch.full_like(full, float("nan"))
    y = y_full[:, : spec.n]  # y shares x's row stride
    gamma = torch.randn(spec.n, device=dev).to(wt)
    beta = torch.randn(spec.n, device=dev).to(wt) if spec.has_bias else None
    layernorm = spec.norm == "layernorm"
    mean = torch.empty(rows, device=dev) if layernorm else None
    rstd = torch.empty(rows, device=dev)
    kernel = normjit.launch(runtime, spec, x=x, gamma=gamma, beta=beta, mean=mean, rstd=rstd, y=y, eps=EPS)
    assert kernel.spec.block is not None and str(kernel.spec).startswith(str(spec))
    ref_y, ref_mean, ref_rstd = reference_forward(spec.norm, x, gamma, beta)
    torch.testing.assert_close(y.double(), ref_y, **TOL[spec.x_dtype])
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-4, atol=1e-5)
    if layernorm:
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-4, atol=1e-5)
    assert y_full[:, spec.n :].isnan().all()  # the padding between rows is not written


def test_backward_with_workspace_matches_torch_in_float64(runtime):
    spec = normjit.Spec("layernorm.bwd.bf16.w_f32.n1000.bias")
    rows, dev = 257, "cuda"
    torch.manual_seed(1)
    x = torch.randn(rows, spec.n, device=dev).to(torch.bfloat16)
    dy = torch.randn(rows, spec.n, device=dev).to(torch.bfloat16)
    gamma = torch.randn(spec.n, device=dev)
    _, mean64, rstd64 = reference_forward("layernorm", x, None, None)
    mean, rstd = mean64.float(), rstd64.float()
    dx = torch.empty_like(x)
    dgamma = torch.empty(spec.n, device=dev)
    dbeta = torch.empty(spec.n, device=dev)
    max_vec = normjit.max_vec_for(spec, x.data_ptr(), gamma.data_ptr(), 0, 0, dy.data_ptr(), dx.data_ptr(),
                                  dgamma.data_ptr(), dbeta.data_ptr(), 0, spec.n)
    kernel = runtime.kernel(spec, max_vec)
    needed = kernel.workspace_bytes(rows)
    assert needed > 0
    workspace = torch.empty(needed, dtype=torch.uint8, device=dev)
    stream = torch.cuda.current_stream().cuda_stream
    kernel.launch(x.data_ptr(), gamma.data_ptr(), 0, mean.data_ptr(), rstd.data_ptr(), 0, dy.data_ptr(),
                  dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), workspace.data_ptr(), needed, 0, 0.0,
                  float("inf"), rows, spec.n, 0, EPS, stream)

    # Reference from the same saved statistics, in float64.
    xhat = (x.double() - mean.double()[:, None]) * rstd.double()[:, None]
    g = dy.double() * gamma.double()
    ref_dx = rstd.double()[:, None] * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    torch.testing.assert_close(dx.double(), ref_dx, **TOL["bf16"])
    torch.testing.assert_close(dgamma.double(), (dy.double() * xhat).sum(0), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(dbeta.double(), dy.double().sum(0), rtol=1e-4, atol=1e-3)

    # Too small a workspace is refused, naming it.
    with pytest.raises(normjit.InvalidArgumentError, match="workspace"):
        kernel.launch(x.data_ptr(), gamma.data_ptr(), 0, mean.data_ptr(), rstd.data_ptr(), 0, dy.data_ptr(),
                      dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), workspace.data_ptr(), needed - 16, 0, 0.0,
                      float("inf"), rows, spec.n, 0, EPS, stream)


def test_launch_errors_name_the_argument(runtime):
    spec = normjit.Spec("rmsnorm.fwd_infer.bf16.n256")
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(normjit.InvalidArgumentError, match="y is null"):
        normjit.launch(runtime, spec, x=x, gamma=torch.ones(256, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(normjit.InvalidArgumentError, match="shape"):
        normjit.launch(runtime, spec, x=x[:, :128], y=x[:, :128])
    with pytest.raises(normjit.InvalidArgumentError, match="2-byte|4-byte"):
        normjit.launch(runtime, spec, x=x.float(), y=x.float())


def test_kernel_keeps_its_runtime_alive_and_counts(gpu, tmp_path):
    rt = normjit.Runtime(0, str(tmp_path))
    spec = normjit.Spec("rmsnorm.fwd_infer.f16.n128")
    kernel = rt.kernel(spec)
    assert rt.counters()["compiles"] == 1
    assert rt.kernel(spec) is not None and rt.counters()["memory_hits"] >= 1
    del rt
    gc.collect()
    x = torch.randn(9, 128, device="cuda", dtype=torch.float16)
    gamma = torch.randn(128, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    kernel.launch(x.data_ptr(), gamma.data_ptr(), 0, 0, 0, y.data_ptr(), 0, 0, 0, 0, 0, 0, 0, 0.0, float("inf"), 9,
                  128, 0, EPS, stream)
    ref, _, _ = reference_forward("rmsnorm", x, gamma, None)
    torch.testing.assert_close(y.double(), ref, **TOL["f16"])
    # A second runtime over the same directory loads it from disk.
    rt2 = normjit.Runtime(0, str(tmp_path))
    rt2.kernel(spec)
    assert rt2.counters()["disk_hits"] == 1 and rt2.counters()["compiles"] == 0
