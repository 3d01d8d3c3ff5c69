"""normjit.torch without a GPU: fake implementations, torch.compile tracing, opcheck on the CPU
reference, modules, swap_norms, the CPU fallback, argument errors, and the launch arguments the
CUDA path builds (against a stub kernel)."""
import contextlib
import math
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import normjit  # noqa: E402
import normjit.torch as nt  # noqa: E402
from normjit.torch import _launch, _reference  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import blocks  # noqa: E402

inf = math.inf
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def fwd(x, w=None, b=None, norm="layernorm", training=True, epilogue="none", lo=0.0, hi=inf, eps=1e-5):
    return torch.ops.normjit.norm_fwd(x, w, b, norm, eps, training, epilogue, lo, hi)


# ---- fake implementations ----------------------------------------------------------------------

@pytest.mark.parametrize("device", ["meta", "fake-cuda"])
def test_fake_forward_shapes_strides_dtypes(device):
    ctx = FakeTensorMode() if device == "fake-cuda" else contextlib.nullcontext()
    dev = "cuda" if device == "fake-cuda" else "meta"
    with ctx:
        x = torch.empty(2, 3, 768, dtype=BF16, device=dev)
        w = torch.empty(768, dtype=F32, device=dev)
        y, mean, rstd, mask = fwd(x, w, w)
        assert (y.shape, y.stride(), y.dtype) == ((2, 3, 768), (2304, 768, 1), BF16)
        assert (mean.shape, mean.dtype, rstd.shape, rstd.dtype) == ((2, 3), F32, (2, 3), F32)
        assert mask.shape == (0,) and mask.dtype == torch.uint8
        # rmsnorm keeps no mean; inference keeps no statistics.
        _, mean, rstd, _ = fwd(x, w, norm="rmsnorm")
        assert mean.shape == (0,) and rstd.shape == (2, 3)
        _, mean, rstd, _ = fwd(x, w, training=False)
        assert mean.shape == (0,) and rstd.shape == (0,)
        # The mask packs 8 features a byte, rounded up.
        x7 = torch.empty(5, 7, dtype=F16, device=dev)
        y, _, _, mask = fwd(x7, None, None, "rmsnorm", epilogue="relu_bitmask")
        assert (y.dtype, mask.shape, mask.dtype, mask.stride()) == (F16, (5, 1), torch.uint8, (1, 1))
        # Rows strided evenly: y takes x's row stride; other layouts give contiguous y.
        wide = torch.empty(4, 6, 1000, dtype=BF16, device=dev)
        y, mean, _, _ = fwd(wide[..., :768], w)
        assert (y.shape, y.stride(), mean.shape) == ((4, 6, 768), (6000, 1000, 1), (4, 6))
        y, _, _, _ = fwd(torch.empty(768, 8, dtype=BF16, device=dev).t(), w)
        assert y.stride() == (768, 1)


def test_fake_backward_shapes():
    with FakeTensorMode():
        x = torch.empty(3, 5, 64, dtype=BF16, device="cuda")
        w = torch.empty(64, dtype=F32, device="cuda")
        stats = torch.empty(3, 5, device="cuda")
        empty_mask = torch.empty(0, dtype=torch.uint8, device="cuda")
        dx, dw, db = torch.ops.normjit.norm_bwd(torch.empty_like(x), x, w, stats, stats, empty_mask,
                                                "layernorm", "none", True)
        assert (dx.shape, dx.dtype, dw.shape, dw.dtype, db.shape, db.dtype) == ((3, 5, 64), BF16, (64,), F32,
                                                                                 (64,), F32)
        dx, dw, db = torch.ops.normjit.norm_bwd(torch.empty_like(x), x, None, stats, stats, empty_mask,
                                                "rmsnorm", "none", False)
        assert dw.shape == (0,) and db.shape == (0,)


# ---- torch.compile -----------------------------------------------------------------------------

def _two_norms(x, w, b):
    y = nt.layer_norm(x, (x.shape[-1],), w, b)
    z, mask = nt.rms_norm_relu(y[..., :32], (32,), None)
    return z.float().sum() + nt.rms_norm(y, x.shape[-1:], w).float().sum() + mask.sum()


def _inputs(device, s=7):
    x = torch.randn(4, s, 64, dtype=BF16, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    b = torch.randn(64, device=device, requires_grad=True)
    return x, w, b


def test_compile_traces_fake_cuda_inputs_without_graph_breaks():
    with FakeTensorMode():
        args = _inputs("cuda")
    explained = torch._dynamo.explain(_two_norms)(*args)
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1
    code = explained.graphs[0].code
    assert code.count("torch.ops.normjit.norm_fwd") == 3, code


def test_compile_fullgraph_meta_forward_backward_no_recompile():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_two_norms, backend=counter, fullgraph=True)
    for _ in range(2):
        x, w, b = _inputs("meta")
        compiled(x, w, b).backward()
        assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape
    assert counter.frame_count == 1


def test_compile_eager_backend_on_cpu_matches_eager():
    torch._dynamo.reset()
    x = torch.randn(3, 5, 48)

    def f(x):
        y, mask = nt.layer_norm_relu(x, 48)
        return nt.ada_layer_norm(y, torch.ones(3, 48), torch.zeros(3, 48)), mask

    want = f(x)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])


# ---- opcheck on the CPU reference ------------------------------------------------------------

def _grad(*ts):
    return [t.requires_grad_() if t is not None else None for t in ts]


FWD_CASES = {
    "layernorm": lambda: (*_grad(torch.randn(3, 5, 16), torch.randn(16), torch.randn(16)), "layernorm", 1e-5, True,
                          "none", 0.0, inf),
    "rmsnorm_no_bias": lambda: (*_grad(torch.randn(4, 16), torch.randn(16)), None, "rmsnorm", 1e-6, True, "none",
                                0.0, inf),
    "no_weight_relu": lambda: (*_grad(torch.randn(2, 2, 13)), None, None, "layernorm", 1e-5, True, "relu_bitmask",
                               -0.5, 1.0),
    "adalayernorm": lambda: (*_grad(torch.randn(3, 5, 16), torch.randn(3, 16), torch.randn(3, 16)), "adalayernorm",
                             1e-5, True, "none", 0.0, inf),
    "adarmsnorm": lambda: (*_grad(torch.randn(3, 5, 16), torch.randn(3, 16)), None, "adarmsnorm", 1e-5, True, "none",
                           0.0, inf),
    "strided_rows": lambda: (torch.randn(6, 40)[:, :16].requires_grad_(), *_grad(torch.randn(16), torch.randn(16)),
                             "layernorm", 1e-5, True, "none", 0.0, inf),
    "inference": lambda: (torch.randn(3, 16), torch.randn(16), None, "rmsnorm", 1e-5, False, "none", 0.0, inf),
}


@pytest.mark.parametrize("case", FWD_CASES)
def test_opcheck_norm_fwd_cpu(case):
    torch.library.opcheck(torch.ops.normjit.norm_fwd.default, FWD_CASES[case]())


def test_opcheck_norm_bwd_cpu():
    x = torch.randn(3, 5, 16)
    w = torch.randn(16)
    _, mean, rstd, mask = fwd(x, w, w)
    torch.library.opcheck(torch.ops.normjit.norm_bwd.default,
                          (torch.randn(3, 5, 16), x, w, mean, rstd, mask, "layernorm", "none", True))


# ---- the CPU reference against float64 --------------------------------------------------------

def ref64(x, w, b, norm, eps, lo=None, hi=None):
    """The norm in float64 by plain torch ops (autograd-able); w, b [N] or, for the Ada norms, [B, N]."""
    x = x.double()
    if norm in ("rmsnorm", "adarmsnorm"):
        xhat = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    else:
        mu = x.mean(-1, keepdim=True)
        xhat = (x - mu) * torch.rsqrt((x - mu).square().mean(-1, keepdim=True) + eps)
    if norm in ("adalayernorm", "adarmsnorm"):
        w = w[:, None, :] if w is not None else None
        b = b[:, None, :] if b is not None else None
    y = xhat * w.double() if w is not None else xhat
    y = y + b.double() if b is not None else y
    return y if lo is None else y.clamp(lo, hi)


@pytest.mark.parametrize("norm,relu", [("layernorm", False), ("rmsnorm", False), ("adalayernorm", False),
                                       ("adarmsnorm", False), ("layernorm", True), ("rmsnorm", True)])
def test_reference_matches_float64(norm, relu):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 19, dtype=torch.float64).float().requires_grad_()
    shape = (3, 19) if norm in ("adalayernorm", "adarmsnorm") else (19,)
    w = torch.randn(shape).requires_grad_()
    b = torch.randn(shape).requires_grad_()
    lo, hi = (-0.3, 0.8) if relu else (None, None)
    if relu:
        fn = nt.layer_norm_relu if norm == "layernorm" else nt.rms_norm_relu
        y, mask = fn(x, 19, w, bias=b, eps=1e-5, clip_lower=lo, clip_upper=hi)
        keep = _reference.unpack_mask(mask, 19)
        pre = ref64(x, w, b, norm, 1e-5).detach()
        assert torch.equal(keep, (pre > lo) & (pre < hi))
    elif norm == "adalayernorm":
        y = nt.ada_layer_norm(x, w, b)
    elif norm == "adarmsnorm":
        y = nt.ada_rms_norm(x, w, b, 1e-5)
    else:
        y = (nt.layer_norm if norm == "layernorm" else nt.rms_norm)(x, 19, w, bias=b, eps=1e-5)
    want = ref64(x, w, b, norm, 1e-5, lo, hi)
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    if norm in ("adalayernorm", "adarmsnorm") or relu:  # backward of the reference op (CPU fallbacks run torch's own)
        dy = torch.randn_like(want)
        got = torch.autograd.grad(y, (x, w, b), dy.float())
        exp = torch.autograd.grad(want, (x, w, b), dy)
        for g, e in zip(got, exp):
            torch.testing.assert_close(g.double(), e.double(), atol=1e-4, rtol=1e-4)


def test_mask_pack_round_trip():
    keep = torch.rand(3, 21) > 0.5
    packed = _reference.pack_mask(keep)
    assert packed.shape == (3, 3) and packed.dtype == torch.uint8
    assert torch.equal(_reference.unpack_mask(packed, 21), keep)
    assert _reference.pack_mask(torch.tensor([[True] + [False] * 7 + [False, True]]))[0].tolist() == [1, 2]


# ---- CPU fallback, modules, swap_norms --------------------------------------------------------

def test_cpu_functions_equal_torch():
    x = torch.randn(2, 3, 10, 12)
    w, b = torch.randn(10, 12), torch.randn(10, 12)
    assert torch.equal(nt.layer_norm(x, (10, 12), w, b, 1e-3), F.layer_norm(x, (10, 12), w, b, 1e-3))
    assert torch.equal(nt.layer_norm(x, 12), F.layer_norm(x, (12,)))
    assert torch.equal(nt.rms_norm(x, [12], w[0]), F.rms_norm(x, [12], w[0]))
    assert torch.equal(nt.rms_norm(x, [12], w[0], 1e-3, bias=b[0]), F.rms_norm(x, [12], w[0], 1e-3) + b[0])
    # CPU tensors get torch's dtypes too.
    assert torch.equal(nt.layer_norm(x.double(), 12), F.layer_norm(x.double(), (12,)))


@pytest.mark.parametrize("kind", ["layernorm", "layernorm_no_bias", "layernorm_no_affine", "rmsnorm",
                                  "rmsnorm_no_affine"])
def test_module_state_dict_matches_torch(kind):
    make = {
        "layernorm": (lambda m: m.LayerNorm(24, eps=1e-6)),
        "layernorm_no_bias": (lambda m: m.LayerNorm([24], bias=False)),
        "layernorm_no_affine": (lambda m: m.LayerNorm(24, elementwise_affine=False)),
        "rmsnorm": (lambda m: m.RMSNorm(24, dtype=torch.float64)),
        "rmsnorm_no_affine": (lambda m: m.RMSNorm(24, eps=1e-3, elementwise_affine=False)),
    }[kind]
    ours, theirs = make(nt), make(nn)
    assert isinstance(ours, type(theirs))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for k, v in theirs.state_dict().items():
        assert ours.state_dict()[k].dtype == v.dtype and ours.state_dict()[k].shape == v.shape
    with torch.no_grad():
        for p in theirs.parameters():
            p.uniform_(-1, 1)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 24, dtype=ours.weight.dtype if ours.weight is not None else F32)
    assert torch.equal(ours(x), theirs(x))
    theirs.load_state_dict(ours.state_dict())
    assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1]


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_swap_norms_in_place(norm):
    torch.manual_seed(0)
    model = blocks.TinyLM(layers=3, norm=norm)
    model.extra = nn.LayerNorm((4, 8))  # two dimensions: left alone

    class Custom(nn.LayerNorm):
        pass

    model.custom = Custom(8)  # a subclass with perhaps its own forward: left alone
    tokens = torch.randint(0, 256, (2, 9))
    before = model(tokens)
    first = model.layers[0].input_layernorm
    params = {id(p) for p in model.parameters()}
    assert nt.swap_norms(model) == 7
    assert model.layers[0].input_layernorm is first
    assert type(first) is (nt.LayerNorm if norm == "layernorm" else nt.RMSNorm)
    assert type(model.extra) is nn.LayerNorm and type(model.custom) is Custom
    assert {id(p) for p in model.parameters()} == params
    assert torch.equal(model(tokens), before)
    assert nt.swap_norms(model) == 0
    assert nt.swap_norms(nn.LayerNorm(8)) == 1


# ---- errors ------------------------------------------------------------------------------------

def meta(*shape, dtype=F32):
    return torch.empty(*shape, dtype=dtype, device="meta")


ERRORS = [
    (lambda: nt.layer_norm(meta(2, 8), (9,)), ValueError, r"normalized_shape=\[9\].*\[2, 8\]"),
    (lambda: nt.layer_norm(meta(8), (2, 8)), ValueError, r"normalized_shape=\[2, 8\]"),
    (lambda: nt.layer_norm(meta(2, 8), 8.5), TypeError, r"normalized_shape=8.5"),
    (lambda: nt.layer_norm(meta(2, 8), None), TypeError, "normalized_shape=None"),
    (lambda: nt.layer_norm(meta(2, 8), 8, meta(7)), ValueError, r"weight has shape \[7\]"),
    (lambda: nt.layer_norm(meta(2, 8), 8, meta(8), meta(2, 8)), ValueError,
     r"bias has shape \[2, 8\]"),
    (lambda: nt.layer_norm(meta(2, 8).double(), 8), TypeError, "x.dtype=torch.float64"),
    (lambda: nt.layer_norm(meta(2, 8, dtype=torch.int32), 8), TypeError, "x.dtype=torch.int32"),
    (lambda: nt.rms_norm(meta(2, 8), 8, meta(8).double()), TypeError, "weight.dtype=torch.float64"),
    (lambda: nt.layer_norm(meta(2, 8), 8, meta(8), meta(8, dtype=BF16)), TypeError,
     "bias.dtype=torch.bfloat16"),
    (lambda: nt.layer_norm(meta(1, 262145), 262145), ValueError, "262145"),
    (lambda: nt.layer_norm(meta(2, 0), 0), ValueError, "normalizes 0 elements"),
    (lambda: nt.layer_norm(meta(2, 8), 8, eps=0.0), ValueError, "eps=0.0"),
    (lambda: nt.rms_norm(meta(2, 8), 8, eps=-1.0), ValueError, "eps=-1.0"),
    (lambda: nt.layer_norm([1.0, 2.0], 2), TypeError, "x is a list"),
    (lambda: nt.layer_norm(meta(2, 8), 8, torch.randn(8)), ValueError, "weight is on cpu but x is on meta"),
    (lambda: nt.ada_layer_norm(meta(2, 8), meta(2, 8)), ValueError, r"x has shape \[2, 8\]"),
    (lambda: nt.ada_layer_norm(meta(2, 3, 8), meta(3, 8)), ValueError, r"weight has shape \[3, 8\]"),
    (lambda: nt.layer_norm_relu(meta(2, 8), 8, clip_lower=1.0, clip_upper=1.0), ValueError,
     "clip_lower=1.0 must be below clip_upper=1.0"),
    (lambda: fwd(meta(2, 8), norm="groupnorm"), ValueError, "norm='groupnorm'"),
    (lambda: fwd(meta(2, 8), epilogue="gelu"), ValueError, "epilogue='gelu'"),
]


@pytest.mark.parametrize("call,error,match", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_argument_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- the CUDA path's launch arguments, against a stub GPU -------------------------------------

class StubKernel:
    def __init__(self, spec, max_vec):
        self.spec = spec.resolve(max_vec)
        self.name = str(self.spec)
        self.launches = []
        self.keywords = []

    def workspace_bytes(self, rows, rows_per_batch=0):
        return 4096

    def launch(self, *args, **fused):
        # As the binding: 20 positional arguments (x ... stream), then residual, h, dh_out for
        # residual specs, y_quant, quant_scale, amax, row_scales, block_scales, block_scale_layout
        # for the quantizing ones, dresidual (residual_f32 backward) and bias_in (bias_in forward),
        # each 0 unless given. _launch passes those by name: recorded as all 31 in FIELDS' order,
        # the names it gave in self.keywords.
        assert len(args) == 20 and set(fused) <= set(FIELDS[20:]), (len(args), sorted(fused))
        full = args + tuple(fused.get(name, 0) for name in FIELDS[20:])
        assert all(isinstance(a, (int, float)) for a in full)
        self.launches.append(full)
        self.keywords.append(fused)


class StubRuntime:
    def __init__(self):
        self.kernels = []
        self.launchers = []
        self.compile_mode = "sync"

    def kernel(self, spec, max_vec):
        assert self.compile_mode == "sync", "Runtime.kernel() in a mode that launches through the runtime"
        k = StubKernel(spec, max_vec)
        self.kernels.append(k)
        return k

    def launcher(self, spec, max_vec):
        # A ModeLauncher takes Kernel.launch's arguments; it launches through the runtime's mode.
        k = StubKernel(spec, max_vec)
        self.launchers.append(k)
        return k


@pytest.fixture
def stub_gpu(monkeypatch):
    """_launch with CPU tensors standing in for CUDA ones and a runtime that records launches."""
    rt = StubRuntime()
    state = {"capturing": False}
    monkeypatch.setattr(_launch, "runtime", lambda device: rt)
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 1234)
    monkeypatch.setattr(_launch, "_current_device", lambda: None)
    monkeypatch.setattr(_launch, "_is_capturing", lambda: state["capturing"])
    monkeypatch.setattr(_launch, "_entries", {})
    monkeypatch.setattr(_launch, "_ones", {})
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    rt.state = state
    return rt


FIELDS = ("x gamma beta mean rstd y dy dx dgamma dbeta workspace workspace_bytes mask clip_lower clip_upper rows "
          "row_stride rows_per_batch eps stream residual h dh_out y_quant quant_scale amax row_scales block_scales "
          "block_scale_layout dresidual bias_in").split()


def _args(kernel, i=-1):
    return dict(zip(FIELDS, kernel.launches[i]))


def test_launch_forward_arguments(stub_gpu):
    x = torch.randn(4, 6, 1000, dtype=BF16)[..., :768]  # rows 1000 elements apart
    w = torch.randn(768)
    y, mean, rstd, mask = _launch.forward(x, w, None, "layernorm", 1e-5, True, "none", 0.0, inf)
    (k,) = stub_gpu.kernels
    assert k.name.startswith("layernorm.fwd_train.bf16.w_f32.n768.cfg_")
    a = _args(k)
    assert (a["x"], a["gamma"], a["beta"], a["y"]) == (x.data_ptr(), w.data_ptr(), 0, y.data_ptr())
    assert (a["mean"], a["rstd"], a["mask"]) == (mean.data_ptr(), rstd.data_ptr(), 0)
    assert (a["rows"], a["row_stride"], a["rows_per_batch"], a["stream"]) == (24, 1000, 0, 1234)
    assert a["eps"] == 1e-5 and (a["dy"], a["dx"], a["dgamma"], a["workspace"]) == (0, 0, 0, 0)
    assert y.stride() == (6000, 1000, 1) and mean.shape == (24,)
    # The same call again hits the kernel cache.
    _launch.forward(x, w, None, "layernorm", 1e-5, True, "none", 0.0, inf)
    assert len(stub_gpu.kernels) == 1 and len(k.launches) == 2


def test_launch_follows_the_compile_mode(stub_gpu):
    # Async (and generic) mode: a ModeLauncher, which also captures a cold spec (its generic kernel).
    stub_gpu.compile_mode = "async"
    stub_gpu.state["capturing"] = True
    x = torch.randn(5, 640, dtype=BF16)
    y, _, _, _ = _launch.forward(x, None, None, "rmsnorm", 1e-6, False, "none", 0.0, inf)
    (k,) = stub_gpu.launchers
    assert not stub_gpu.kernels and len(k.launches) == 1 and _args(k)["y"] == y.data_ptr()
    # Sync mode refuses to compile inside a capture, naming async mode as the way out.
    stub_gpu.compile_mode = "sync"
    with pytest.raises(RuntimeError, match="run the op once.*NORMJIT_COMPILE_MODE=async"):
        _launch.forward(torch.randn(5, 648, dtype=BF16), None, None, "rmsnorm", 1e-6, False, "none", 0.0, inf)


def test_launch_forward_without_weight_and_with_mask(stub_gpu):
    x = torch.randn(3, 5, 7, dtype=F16).transpose(0, 1)  # leading dims do not flatten: copied
    y, mean, rstd, mask = _launch.forward(x, None, None, "rmsnorm", 1e-6, True, "relu_bitmask", 0.0, inf)
    (k,) = stub_gpu.kernels
    assert k.name.startswith("rmsnorm.fwd_train.f16.w_f16.n7.relu_bitmask.")
    a = _args(k)
    ones = _launch._ones[(None, F16, 7)]
    assert torch.equal(ones, torch.ones(7, dtype=F16)) and a["gamma"] == ones.data_ptr()
    assert (a["mean"], a["row_stride"], a["rows"]) == (0, 7, 15) and mean is None
    assert mask.shape == (5, 3, 1) and a["mask"] == mask.data_ptr()
    assert y.shape == (5, 3, 7) and y.is_contiguous() and a["x"] != x.data_ptr()


def test_launch_ada_and_backward_arguments(stub_gpu):
    x = torch.randn(2, 3, 16)
    w, b = torch.randn(2, 16, dtype=BF16), torch.randn(2, 16, dtype=BF16)
    _, mean, rstd, _ = _launch.forward(x, w, b, "adalayernorm", 1e-5, True, "none", 0.0, inf)
    assert _args(stub_gpu.kernels[0])["rows_per_batch"] == 3
    dy = torch.randn(2, 3, 16)
    dx, dw, db = _launch.backward(dy, x, w, mean, rstd, None, "adalayernorm", "none", False)
    k = stub_gpu.kernels[1]
    assert k.name.startswith("adalayernorm.bwd.f32.w_bf16.n16.cfg_")  # no dbias wanted: no .bias
    a = _args(k)
    assert (a["dy"], a["dx"], a["dgamma"], a["dbeta"], a["beta"], a["y"]) == (
        dy.data_ptr(), dx.data_ptr(), dw.data_ptr(), 0, 0, 0)
    assert a["workspace"] != 0 and a["workspace_bytes"] == 4096 and a["rows_per_batch"] == 3
    assert db is None and dw.shape == (2, 16) and dw.dtype == BF16


def test_launch_backward_strided_layouts(stub_gpu):
    base = torch.randn(8, 40)
    x = base[:, :32]
    w = torch.randn(32)
    _, mean, rstd, _ = _launch.forward(x, w, w, "layernorm", 1e-5, True, "none", 0.0, inf)
    # dy strided like x: all three share x's row stride.
    dy = torch.randn(8, 40)[:, :32]
    dx, dw, db = _launch.backward(dy, x, w, mean, rstd, None, "layernorm", "none", True)
    a = _args(stub_gpu.kernels[-1])
    assert (a["row_stride"], a["x"], a["dy"]) == (40, x.data_ptr(), dy.data_ptr()) and dx.stride() == (40, 1)
    assert stub_gpu.kernels[-1].name.startswith("layernorm.bwd.f32.w_f32.n32.bias.")
    # A contiguous dy: x and dy are made contiguous, dx too.
    dx, _, _ = _launch.backward(torch.randn(8, 32), x, w, mean, rstd, None, "layernorm", "none", True)
    assert _args(stub_gpu.kernels[-1])["row_stride"] == 32 and dx.is_contiguous()
    # An expanded dy (y.sum().backward()) has overlapping rows: copied.
    _launch.backward(torch.ones(1, 32).expand(8, 32), x, w, mean, rstd, None, "layernorm", "none", True)
    assert _args(stub_gpu.kernels[-1])["row_stride"] == 32


def test_misaligned_pointers_pick_a_narrower_kernel(stub_gpu):
    w = torch.randn(64, dtype=BF16)
    _launch.forward(torch.randn(4, 64, dtype=BF16), w, None, "rmsnorm", 1e-5, False, "none", 0.0, inf)
    _launch.forward(torch.randn(4 * 64 + 1, dtype=BF16)[1:].view(4, 64), w, None, "rmsnorm", 1e-5, False, "none",
                    0.0, inf)
    vecs = [k.spec.block for k in stub_gpu.kernels]
    assert len(vecs) == 2 and "_v8_" in vecs[0] and "_v1_" in vecs[1]


def test_capture_with_a_cold_kernel_names_the_spec(stub_gpu):
    x, w = torch.randn(4, 96), torch.randn(96)
    _launch.forward(x, w, None, "layernorm", 1e-5, False, "none", 0.0, inf)
    stub_gpu.state["capturing"] = True
    _launch.forward(x, w, None, "layernorm", 1e-5, False, "none", 0.0, inf)  # warmed: fine
    with pytest.raises(RuntimeError, match=r"layernorm\.fwd_train\.f32\.w_f32\.n96 .*run the op once"):
        _launch.forward(x, w, None, "layernorm", 1e-5, True, "none", 0.0, inf)


def test_runtime_without_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(normjit.DriverUnavailableError):
        normjit.Runtime(0)


# ---- the fusions: residual add and zero-centred weights ----------------------------------------

def _add_norm_composed(x, residual, w, b, eps, norm, zero_centered):
    """The unfused composition in torch: h rounded to x's dtype, then the norm."""
    h = x + residual
    scale = w + 1 if zero_centered else w
    if norm == "rmsnorm":
        y = F.rms_norm(h.float(), h.shape[-1:], scale.float(), eps)
        y = y + b.float() if b is not None else y
    else:
        y = F.layer_norm(h.float(), h.shape[-1:], scale.float(), b.float() if b is not None else None, eps)
    return y.to(x.dtype), h


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_add_norm_cpu_matches_the_composition_with_gradients(norm, zero_centered):
    torch.manual_seed(0)
    x, r = torch.randn(3, 5, 24), torch.randn(3, 5, 24)
    w, b = torch.randn(24) * 0.1, torch.randn(24)
    args = [t.clone().requires_grad_() for t in (x, r, w, b)]
    ref_args = [t.clone().requires_grad_() for t in (x, r, w, b)]
    if norm == "rmsnorm":
        y, h = nt.add_rms_norm(args[0], args[1], args[2], 1e-6, args[3], zero_centered=zero_centered)
    else:
        y, h = nt.add_layer_norm(args[0], args[1], args[2], args[3], 1e-6, zero_centered=zero_centered)
    y_ref, h_ref = _add_norm_composed(*ref_args, 1e-6, norm, zero_centered)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    (y * dy + h * dh).sum().backward()
    (y_ref * dy + h_ref * dh).sum().backward()
    for got, want, name in zip(args, ref_args, ("x", "residual", "weight", "bias")):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    # dx and dresidual are one gradient.
    assert torch.equal(args[0].grad, args[1].grad)


def test_zero_centered_norms_cpu():
    x, w, b = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    torch.testing.assert_close(nt.layer_norm(x, 16, w, b, zero_centered=True), F.layer_norm(x, (16,), w + 1, b))
    torch.testing.assert_close(nt.rms_norm(x, 16, w, 1e-6, zero_centered=True), F.rms_norm(x, (16,), w + 1, 1e-6))
    with pytest.raises(ValueError, match="zero_centered=True needs a weight"):
        nt.rms_norm(x, 16, None, zero_centered=True)


def test_fused_ops_fake_shapes_and_layouts():
    with FakeTensorMode():
        x = torch.empty(4, 6, 1000, dtype=BF16, device="cuda")[..., :768]  # rows 1000 apart
        r = torch.empty(4, 6, 1000, dtype=BF16, device="cuda")[..., :768]
        w = torch.empty(768, dtype=F32, device="cuda")
        y, h, mean, rstd, mask = torch.ops.normjit.fused_norm_fwd(x, r, w, w, "layernorm", 1e-5, True, True, "none",
                                                                  0.0, inf)
        assert y.stride() == h.stride() == (6000, 1000, 1) and y.dtype == h.dtype == BF16
        assert mean.shape == rstd.shape == (4, 6) and mask.shape == (0,)
        # A residual strided unlike x: both made contiguous.
        y, h, _, rstd, _ = torch.ops.normjit.fused_norm_fwd(x, r.contiguous(), w, None, "rmsnorm", 1e-5, True, False,
                                                            "none", 0.0, inf)
        assert y.is_contiguous() and h.is_contiguous() and rstd.shape == (4, 6)
        # Without a residual, h is empty.
        _, h, _, _, _ = torch.ops.normjit.fused_norm_fwd(x, None, w, None, "rmsnorm", 1e-5, False, True, "none", 0.0,
                                                         inf)
        assert h.shape == (0,)
        dx, dw, db, dres = torch.ops.normjit.fused_norm_bwd(torch.empty_like(y), torch.empty_like(y), y, w, mean,
                                                            rstd, mask, "layernorm", True, "none", True)
        assert dx.shape == y.shape and dw.shape == db.shape == (768,) and dres.shape == (0,)
        # An fp32 residual stream: h float32 beside x bf16; the backward's dx in dy's dtype, dresidual fp32.
        y, h, mean, rstd, _ = torch.ops.normjit.fused_norm_fwd(x, r.float(), w, None, "rmsnorm", 1e-5, True, False,
                                                               "none", 0.0, inf, False, torch.empty(768, device="cuda"))
        assert y.dtype == BF16 and h.dtype == F32 and h.shape == x.shape
        dx, _, _, dres = torch.ops.normjit.fused_norm_bwd(torch.empty_like(y), torch.empty_like(h), h, w, mean, rstd,
                                                          mask, "rmsnorm", False, "none", False, None, False, True)
        assert dx.dtype == BF16 and dres.dtype == F32 and dx.shape == dres.shape == x.shape


FUSED_FWD_CASES = {
    "add_rms": lambda: (*_grad(torch.randn(3, 5, 16), torch.randn(3, 5, 16), torch.randn(16)), None, "rmsnorm", 1e-6,
                        True, False, "none", 0.0, inf),
    "add_ln_zero_centered": lambda: (*_grad(torch.randn(4, 16), torch.randn(4, 16), torch.randn(16),
                                            torch.randn(16)), "layernorm", 1e-5, True, True, "none", 0.0, inf),
    "zero_centered_only": lambda: (torch.randn(4, 16, requires_grad=True), None, *_grad(torch.randn(16)), None,
                                   "rmsnorm", 1e-5, True, True, "none", 0.0, inf),
    "add_relu": lambda: (*_grad(torch.randn(2, 13), torch.randn(2, 13)), None, None, "layernorm", 1e-5, True, False,
                         "relu_bitmask", -0.5, 1.0),
    "f32_stream_bias_in": lambda: (*_grad(torch.randn(3, 16, dtype=BF16), torch.randn(3, 16), torch.randn(16)), None,
                                   "rmsnorm", 1e-6, True, False, "none", 0.0, inf, False,
                                   torch.randn(16, requires_grad=True)),
}


@pytest.mark.parametrize("case", FUSED_FWD_CASES)
def test_opcheck_fused_norm_fwd_cpu(case):
    torch.library.opcheck(torch.ops.normjit.fused_norm_fwd.default, FUSED_FWD_CASES[case]())


def test_opcheck_fused_norm_bwd_cpu():
    x, r, w = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    _, h, mean, rstd, mask = torch.ops.normjit.fused_norm_fwd(x, r, w, w, "layernorm", 1e-5, True, True, "none", 0.0,
                                                              inf)
    torch.library.opcheck(torch.ops.normjit.fused_norm_bwd.default,
                          (torch.randn(3, 16), torch.randn(3, 16), h, w, mean, rstd, mask, "layernorm", True, "none",
                           True))
    # An fp32 residual stream: h and dh_out float32, dy bf16.
    x = torch.randn(3, 16, dtype=BF16)
    _, h, mean, rstd, mask = torch.ops.normjit.fused_norm_fwd(x, r, w, w, "layernorm", 1e-5, True, False, "none", 0.0,
                                                              inf)
    assert h.dtype == F32
    torch.library.opcheck(torch.ops.normjit.fused_norm_bwd.default,
                          (torch.randn(3, 16, dtype=BF16), torch.randn(3, 16), h, w, mean, rstd, mask, "layernorm",
                           False, "none", True, None, False, True))


def _block_with_add(x, r, w):
    y, h = nt.add_rms_norm(x, r, w, 1e-6)
    z, h2 = nt.add_layer_norm(y, h, w, None, 1e-5, zero_centered=True)
    return z.float().sum() + h2.float().sum()


def test_compile_fullgraph_traces_the_fused_ops():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_block_with_add, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, 7, 64, dtype=BF16, device="meta", requires_grad=True)
        r = torch.randn(4, 7, 64, dtype=BF16, device="meta", requires_grad=True)
        w = torch.randn(64, device="meta", requires_grad=True)
        compiled(x, r, w).backward()
        assert x.grad.shape == r.grad.shape == x.shape and w.grad.shape == w.shape
    assert counter.frame_count == 1
    with FakeTensorMode():
        args = (torch.empty(2, 64, dtype=BF16, device="cuda"), torch.empty(2, 64, dtype=BF16, device="cuda"),
                torch.empty(64, device="cuda"))
    explained = torch._dynamo.explain(_block_with_add)(*args)
    assert explained.graph_break_count == 0
    assert explained.graphs[0].code.count("torch.ops.normjit.fused_norm_fwd") == 2


def test_add_norm_argument_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"residual \(\[2, 4\]"):
        nt.add_rms_norm(x, torch.randn(2, 4))
    with pytest.raises(ValueError, match="must match x"):
        nt.add_layer_norm(x, x.double())
    with pytest.raises(TypeError, match="residual is a list"):
        nt.add_rms_norm(x, [1.0])
    xb = x.to(BF16)
    with pytest.raises(ValueError, match=r"or float32: an fp32 residual stream"):
        nt.add_rms_norm(xb, x.half())
    with pytest.raises(ValueError, match=r"bias_in \(\[4\], torch.float32, cpu\) must be a floating \[8\] tensor"):
        nt.add_rms_norm(x, x, bias_in=torch.randn(4))
    with pytest.raises(TypeError, match="bias_in is a float"):
        nt.add_layer_norm(x, x, bias_in=1.0)
    w = torch.ones(8, requires_grad=True)
    with pytest.raises(ValueError, match="memory_efficient=True with a float32 residual stream is not supported"):
        nt.add_rms_norm(xb, x, w, memory_efficient=True)
    with pytest.raises(ValueError, match="stream_f32=True takes x \\(h\\) and dh_out float32"):
        torch.ops.normjit.fused_norm_bwd(xb, None, x, None, x[:, 0], x[:, 0], x, "rmsnorm", False, "none", False,
                                         None, False, True)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_add_norm_f32_stream_and_bias_in_cpu(norm):
    """A float32 residual beside a bf16 x: h = x + bias_in + residual in fp32, not rounded to bf16;
    the gradients: x's in bf16, residual's in fp32 (the same dh), bias_in's the column sum of dh."""
    torch.manual_seed(3)
    x = torch.randn(3, 5, 24).to(BF16)
    r, w, b, bias_in = torch.randn(3, 5, 24), torch.randn(24), torch.randn(24), torch.randn(24)
    args = [t.clone().requires_grad_() for t in (x, r, w, b, bias_in)]
    if norm == "rmsnorm":
        y, h = nt.add_rms_norm(args[0], args[1], args[2], 1e-6, args[3], bias_in=args[4])
    else:
        y, h = nt.add_layer_norm(args[0], args[1], args[2], args[3], 1e-6, bias_in=args[4])
    assert y.dtype == BF16 and h.dtype == F32
    assert torch.equal(h, (x.float() + bias_in) + r)  # one fp32 sum, no rounding to bf16
    want = ref64(h.detach(), w, b, norm, 1e-6)
    torch.testing.assert_close(y.double(), want, atol=1e-2, rtol=1e-2)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    (y.float() * dy.float() + h * dh).sum().backward()
    # The reference: the same composition in fp64 from x, residual and bias_in.
    ref = [t.double().requires_grad_() for t in (x, r, w, b, bias_in)]
    h_ref = ref[0] + ref[4] + ref[1]
    y_ref = ref64(h_ref, ref[2], ref[3], norm, 1e-6)
    (y_ref * dy.double() + h_ref * dh.double()).sum().backward()
    assert args[0].grad.dtype == BF16 and args[1].grad.dtype == F32 and args[4].grad.dtype == F32
    torch.testing.assert_close(args[1].grad.double(), ref[1].grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(args[0].grad.double(), ref[0].grad, atol=2e-2, rtol=2e-2)
    assert torch.equal(args[0].grad, args[1].grad.to(BF16))  # one gradient, rounded for x
    torch.testing.assert_close(args[4].grad.double(), ref[4].grad, atol=1e-3, rtol=1e-4)
    for i, name in ((2, "weight"), (3, "bias")):
        torch.testing.assert_close(args[i].grad.double(), ref[i].grad, atol=1e-3, rtol=1e-3,
                                   msg=lambda m: f"{name}: {m}")


def test_add_ada_norm_f32_stream_cpu():
    torch.manual_seed(4)
    x = torch.randn(2, 5, 16).to(torch.float16).requires_grad_()
    r = torch.randn(2, 5, 16, requires_grad=True)
    w, b = torch.randn(2, 16), torch.randn(2, 16)
    y, h = nt.add_ada_layer_norm(x, r, w, b, 1e-5, bias_in=torch.ones(16))
    assert y.dtype == torch.float16 and h.dtype == F32
    assert torch.equal(h, (x.float() + 1) + r)
    y.float().sum().backward()
    assert x.grad.dtype == torch.float16 and r.grad.dtype == F32


def test_launch_fused_arguments(stub_gpu):
    x = torch.randn(4, 6, 1000, dtype=BF16)[..., :768]
    r = torch.randn(4, 6, 1000, dtype=BF16)[..., :768]
    w = torch.randn(768)
    y, h, mean, rstd, mask = _launch.forward_fused(x, r, w, None, "rmsnorm", 1e-6, True, True, "none", 0.0, inf)
    (k,) = stub_gpu.kernels
    assert k.name.startswith("rmsnorm.fwd_train.bf16.w_f32.n768.zero_centered.residual.cfg_")
    a = _args(k)
    assert (a["x"], a["residual"], a["h"], a["y"], a["dh_out"]) == (x.data_ptr(), r.data_ptr(), h.data_ptr(),
                                                                    y.data_ptr(), 0)
    assert a["row_stride"] == 1000 and h.stride() == y.stride() == (6000, 1000, 1) and mean is None
    dy, dh = torch.randn(4, 6, 768, dtype=BF16), torch.randn(4, 6, 768, dtype=BF16)
    dx, dw, db, dres = _launch.backward_fused(dy, dh, h, w, None, rstd, None, "rmsnorm", True, "none", False)
    assert dres is None
    k = stub_gpu.kernels[-1]
    assert k.name.startswith("rmsnorm.bwd.bf16.w_f32.n768.zero_centered.residual.cfg_")
    a = _args(k)
    # dy and dh_out are contiguous, h is not: all three taken contiguous, as dx.
    assert a["row_stride"] == 768 and dx.is_contiguous() and a["dh_out"] == dh.data_ptr() and a["h"] == 0
    # Without dh_out (h unused downstream), the plain backward kernel.
    _launch.backward_fused(dy, None, h, w, None, rstd, None, "rmsnorm", True, "none", False)
    assert stub_gpu.kernels[-1].name.startswith("rmsnorm.bwd.bf16.w_f32.n768.zero_centered.cfg_")
    assert stub_gpu.kernels[-1].keywords[-1] == {}  # no fused arguments


def test_launch_f32_stream_and_bias_in_arguments(stub_gpu):
    x = torch.randn(4, 768, dtype=BF16)
    r = torch.randn(4, 768)
    w, bias_in = torch.randn(768), torch.randn(768, dtype=BF16)
    y, h, mean, rstd, _ = _launch.forward_fused(x, r, w, None, "rmsnorm", 1e-6, True, False, "none", 0.0, inf,
                                                bias_in)
    k = stub_gpu.kernels[-1]
    # Rows held in fp32: the f32 picks (vec 4).
    assert k.name.startswith("rmsnorm.fwd_train.bf16.w_f32.n768.residual_f32.bias_in.cfg_") and "_v4_" in k.name
    a = _args(k)
    assert y.dtype == BF16 and h.dtype == F32
    assert (a["residual"], a["h"], a["dresidual"]) == (r.data_ptr(), h.data_ptr(), 0)
    assert a["bias_in"] != 0 and a["bias_in"] != bias_in.data_ptr()  # bias_in taken in the weight's dtype (f32)
    dy, dh = torch.randn(4, 768, dtype=BF16), torch.randn(4, 768)
    dx, dw, db, dres = _launch.backward_fused(dy, dh, h, w, None, rstd, None, "rmsnorm", False, "none", False,
                                              stream_f32=True)
    k = stub_gpu.kernels[-1]
    assert k.name.startswith("rmsnorm.bwd.bf16.w_f32.n768.residual_f32.cfg_")
    a = _args(k)
    assert dx.dtype == BF16 and dres.dtype == F32
    assert (a["x"], a["dy"], a["dh_out"], a["dx"], a["dresidual"]) == (h.data_ptr(), dy.data_ptr(), dh.data_ptr(),
                                                                      dx.data_ptr(), dres.data_ptr())


@pytest.mark.parametrize("norm", ["adalayernorm", "adarmsnorm"])
def test_ada_modulate_form_cpu(norm):
    """zero_centered on the Ada norms: x_hat * (1 + scale[b]) + shift[b], with gradients."""
    torch.manual_seed(1)
    x = torch.randn(2, 5, 24, requires_grad=True)
    scale = (0.1 * torch.randn(2, 24)).requires_grad_()
    shift = torch.randn(2, 24, requires_grad=True)
    fn = nt.ada_layer_norm if norm == "adalayernorm" else nt.ada_rms_norm
    y = fn(x, scale, shift, 1e-6, zero_centered=True)
    want = ref64(x, scale + 1, shift, norm, 1e-6)
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, scale, shift), dy)
    exp = torch.autograd.grad(want, (x, scale, shift), dy.double())
    for g, e, name in zip(got, exp, ("x", "scale", "shift")):
        torch.testing.assert_close(g.double(), e.double(), atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_ada_rms_norm_errors():
    with pytest.raises(ValueError, match=r"ada_rms_norm takes x \[B, S, N\]"):
        nt.ada_rms_norm(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="weight=None: ada_rms_norm"):
        nt.ada_rms_norm(torch.randn(2, 3, 8), None)


# ---- the C++ eager path (torch.ops.normjit.eager_norm) -----------------------------------------

def test_native_ops_load_when_built_with_a_cuda_torch():
    from normjit.torch import _native
    try:
        from normjit import _torch_build
    except ImportError:
        assert _native.eager_norm is None and "without a CUDA torch" in _native.why_not
        pytest.skip("the package was built without a CUDA torch: no C++ ops to check")
    assert _torch_build.TORCH_VERSION == torch.__version__
    assert _native.eager_norm is not None, _native.why_not
    schema = str(torch.ops.normjit.eager_norm.default._schema)
    assert "Tensor? residual" in schema and "-> Tensor[]" in schema
    assert torch.ops.normjit.eager_kernels(0) == []
    with pytest.raises(RuntimeError, match="x is on cpu; it takes CUDA tensors"):
        _native.eager_norm(torch.randn(2, 4), None, None, None, 0, 1e-5, False, 0, 0.0, inf)
    with pytest.raises(RuntimeError, match=r"norm=2 \(adaptive\) needs a weight \[B, N\]"):
        _native.eager_norm(torch.randn(2, 3, 4), None, torch.randn(4), None, 2, 1e-5, False, 0, 0.0, inf)
    with pytest.raises(RuntimeError, match=r"epilogue=5 is not none \(0\) or relu_bitmask \(1\)"):
        _native.eager_norm(torch.randn(2, 4), None, None, None, 1, 1e-5, False, 5, 0.0, inf)
    backward = torch.ops.normjit.eager_norm_backward
    assert "Tensor? mean" in str(backward.default._schema)
    with pytest.raises(RuntimeError, match="eager_norm_backward: x is on cpu; it takes CUDA tensors"):
        backward(torch.randn(2, 4), None, torch.randn(2, 4), None, None, torch.ones(2), None, 1, False, 0, False)
    with pytest.raises(RuntimeError, match=r"eager_norm_backward: norm=7 is not a normjit::Norm \(0-3\)"):
        backward(torch.randn(2, 4), None, torch.randn(2, 4), None, None, torch.ones(2), None, 7, False, 0, False)


def test_native_ops_switch_and_version_guard(monkeypatch):
    import importlib
    import subprocess
    from normjit.torch import _native
    code = "from normjit.torch import _native; print(_native.eager_norm is None, _native.why_not)"
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "NORMJIT_TORCH_NATIVE": "0"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True NORMJIT_TORCH_NATIVE=0"
    try:
        from normjit import _torch_build
    except ImportError:
        pytest.skip("the package was built without a CUDA torch")
    monkeypatch.setattr(_torch_build, "TORCH_VERSION", "0.0.0")
    with pytest.warns(RuntimeWarning, match=r"built for torch 0\.0\.0, not .*Python autograd path"):
        importlib.reload(_native)
    assert _native.eager_norm is None
    monkeypatch.undo()
    importlib.reload(_native)
    assert _native.eager_norm is not None


@pytest.mark.parametrize("norm", ["adalayernorm", "adarmsnorm"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "modulate"])
def test_add_ada_norm_cpu_matches_the_composition_with_gradients(norm, zero_centered):
    torch.manual_seed(2)
    x, r = torch.randn(3, 5, 24), torch.randn(3, 5, 24)
    w, b = torch.randn(3, 24) * 0.2, torch.randn(3, 24)
    args = [t.clone().requires_grad_() for t in (x, r, w, b)]
    fn = nt.add_ada_layer_norm if norm == "adalayernorm" else nt.add_ada_rms_norm
    y, h = fn(*args, 1e-6, zero_centered=zero_centered)
    assert torch.equal(h, x + r)
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, w, b))
    want = ref64(h64, w64 + 1 if zero_centered else w64, b64, norm, 1e-6)
    torch.testing.assert_close(y.double(), want, atol=1e-5, rtol=1e-5)
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    got = torch.autograd.grad((y, h), args, (dy, dh))
    exp = torch.autograd.grad(want, (h64, w64, b64), dy.double())
    torch.testing.assert_close(got[0].double(), exp[0] + dh.double(), atol=1e-4, rtol=1e-4)
    assert torch.equal(got[0], got[1])  # dx and dresidual are one gradient
    torch.testing.assert_close(got[2].double(), exp[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[3].double(), exp[2], atol=1e-4, rtol=1e-4)


def test_add_ada_norm_argument_errors():
    x, w = torch.randn(2, 3, 8), torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"residual \(\[2, 3, 4\]"):
        nt.add_ada_layer_norm(x, torch.randn(2, 3, 4), w)
    with pytest.raises(ValueError, match=r"weight=None: add_ada_rms_norm takes a weight \[B, N\]"):
        nt.add_ada_rms_norm(x, torch.randn(2, 3, 8), None)
    with pytest.raises(ValueError, match=r"add_ada_layer_norm takes x \[B, S, N\]"):
        nt.add_ada_layer_norm(x[0], torch.randn(3, 8), w)


# ---- quantized outputs ------------------------------------------------------------------------

def _quant64(x, w, b, norm, eps, quant, quant_scale=None):
    """(codes as float64 values, row scales or None) from a float64 norm, by the formats' rules."""
    y = ref64(x, w, b, norm, eps)
    qmax = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "int8": 127.0}[quant.replace("_row", "").replace("mx", "")]
    if quant.startswith("mx"):
        # OCP MX: X = 2^(floor(log2 amax) - emax) per 32 values; scale returned as X (float64).
        n = y.shape[-1]
        blocks = F.pad(y, (0, (-n) % 32)).reshape(y.shape[:-1] + (-1, 32))
        amax = blocks.abs().amax(-1)
        emax = 8 if "e4m3" in quant else 15
        e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - emax, torch.full_like(amax, -127)).clamp(-127, 127)
        scale = torch.exp2(e)
        v = (blocks / scale.unsqueeze(-1)).reshape(y.shape[:-1] + (-1,))[..., :n]
        return v.clamp(-qmax, qmax), scale
    if quant.endswith("_row"):
        amax = y.abs().amax(-1, keepdim=True)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
        v = y / scale
    else:
        scale = None
        v = y * quant_scale
    return v.clamp(-qmax, qmax), scale


@pytest.mark.parametrize("quant", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_row", "fp8_e5m2_row", "int8_row", "mxfp8_e4m3",
                                   "mxfp8_e5m2"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_quantized_reference_matches_float64(quant, norm):
    torch.manual_seed(0)
    x = torch.randn(6, 5, 96) * 3
    x[0, 0] = 0  # a zero row: scale 1, codes 0 (no bias here, so its y is 0)
    w, b = torch.randn(96), None
    scale = torch.tensor([448.0 / 8], dtype=F32)
    amax = torch.zeros(1)
    per_tensor = not quant.endswith("_row") and not quant.startswith("mx")
    y_q, scales, y, _ = torch.ops.normjit.quant_norm_fwd(x, None, w, b, norm, 1e-5, False, quant,
                                                         scale if per_tensor else None,
                                                         amax if per_tensor else None, True)
    want, want_scale = _quant64(x.double(), w.double(), None, norm, 1e-5, quant, 448.0 / 8)
    assert y_q.dtype == _launch.QUANT_DTYPES[quant] and y_q.shape == x.shape
    got = y_q.double()
    if quant == "int8_row":
        assert (got - want).abs().max() <= 0.5 + 1e-4  # round half to even: within half a code
    else:
        # Within half a step of the format (relative 2^-4 e4m3, 2^-3 e5m2) or its subnormal spacing.
        rel = 2.0 ** -4 if "e4m3" in quant else 2.0 ** -3
        assert ((got - want).abs() <= rel * want.abs() + 2.0 ** -10).all()
    if quant.startswith("mx"):
        assert scales.shape == (6, 5, 3) and scales.dtype == torch.uint8  # the op's E8M0 codes
        x_scale = torch.exp2(scales.view(torch.uint8).double() - 127)
        torch.testing.assert_close(x_scale, want_scale, rtol=0, atol=0)
        assert scales.view(torch.uint8)[0, 0, 0] == 0 and (y_q[0, 0].double() == 0).all()  # zero row: X = 2^-127
    elif want_scale is not None:
        torch.testing.assert_close(scales.double(), want_scale, rtol=1e-6, atol=0)
        assert scales[0, 0, 0] == 1.0 and (y_q[0, 0].double() == 0).all()
    else:
        assert scales.numel() == 0
        torch.testing.assert_close(amax.double(), ref64(x.double(), w.double(), None, norm, 1e-5).abs().max()
                                   .reshape(1), rtol=1e-6, atol=0)
    assert y.shape == x.shape and y.dtype == x.dtype


def test_quantized_formats_saturate_and_round_half_to_even():
    yf = torch.tensor([[1000.0, -1000.0, 0.0, 2.5, -2.5, 1.5]])
    codes, _ = _reference.quantize(yf, "fp8_e4m3", torch.tensor([1.0]))
    assert codes.float().tolist() == [[448.0, -448.0, 0.0, 2.5, -2.5, 1.5]]  # saturated, not NaN
    codes, scales = _reference.quantize(torch.tensor([[127.0, 2.5, -2.5, 0.5, 1.5]]), "int8_row", None)
    assert scales.item() == 1.0 and codes.tolist() == [[127, 2, -2, 0, 2]]


def test_quantized_functions_on_cpu_and_their_return_shapes():
    torch.manual_seed(1)
    x, r, w = torch.randn(2, 3, 64), torch.randn(2, 3, 64), torch.randn(64)
    with torch.no_grad():
        q, s = nt.rms_norm_fp8(x, (64,), w)
        assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and s.shape == (2, 3, 1)
        y = nt.rms_norm(x, (64,), w)
        torch.testing.assert_close(q.float() * s, y, rtol=2.0 ** -4, atol=1e-3)
        scale, amax = torch.tensor([16.0]), torch.zeros(1)
        q, s2, y2 = nt.layer_norm_fp8(x, 64, w, quant_scale=scale, amax=amax, fp8_dtype=torch.float8_e5m2,
                                      return_y=True)
        assert q.dtype == torch.float8_e5m2 and s2 is scale and y2.dtype == x.dtype
        assert amax.item() == pytest.approx(F.layer_norm(x, (64,), w).abs().max().item(), rel=1e-6)
        q, s, h = nt.add_rms_norm_fp8(x, r, w)
        torch.testing.assert_close(h, x + r)
        q8, s8 = nt.rms_norm_int8(x, (64,), w)
        assert q8.dtype == torch.int8 and q8.abs().max() == 127
        q8, s8, y8, h8 = nt.add_rms_norm_int8(x, r, w, return_y=True)
        torch.testing.assert_close(q8.float() * s8, y8, rtol=0, atol=float(s8.max()) * 0.5 + 1e-6)
        q, s = nt.rms_norm_fp8(x.reshape(2, 3, 8, 8), (8, 8), w.reshape(8, 8))  # two normalized dims
        assert q.shape == (2, 3, 8, 8) and s.shape == (2, 3, 1)
        q, s = nt.rms_norm_mxfp8(x, 64, w)
        assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3, 2) and s.dtype == _launch.E8M0
        x_scale = torch.exp2(s.view(torch.uint8).float() - 127).unsqueeze(-1)
        deq = q.float().reshape(2, 3, 2, 32) * x_scale
        # A block's amax / X reaches up to 2^9, past e4m3's 448: the largest values saturate.
        want = nt.rms_norm(x, (64,), w).reshape(2, 3, 2, 32)
        want = torch.maximum(torch.minimum(want, 448 * x_scale), -448 * x_scale)
        torch.testing.assert_close(deq, want, rtol=2.0 ** -4, atol=1e-6)
        q, s, h = nt.add_rms_norm_mxfp8(x, r, w, fp8_dtype=torch.float8_e5m2)
        assert q.dtype == torch.float8_e5m2 and h.shape == x.shape
        q, s = nt.layer_norm_mxfp8(x.reshape(2, 3, 8, 8), (8, 8))
        assert s.shape == (2, 3, 2)


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _e2m1_values(y_q):
    """float64 values of packed e2m1 codes [..., n / 2] -> [..., n] (the first element low)."""
    b = y_q.view(torch.uint8).long()
    codes = torch.stack([b & 0xF, b >> 4], -1).reshape(b.shape[:-1] + (-1,))
    v = _E2M1[codes & 7]
    return torch.where(codes >= 8, -v, v)


def test_e2m1_reference_encoder_matches_the_cpp_reference():
    # Every midpoint and its neighbours, both signs, zeros, saturation, NaN: the same codes as the
    # C++ host reference (normjit::reference::encode_satfinite) gives.
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 1e30], dtype=F32)
    v = torch.cat([mids, torch.nextafter(mids, torch.zeros_like(mids)), torch.nextafter(mids, torch.full_like(mids, inf)),
                   _E2M1.float(), torch.randn(5000) * 3])
    v = torch.cat([v, -v, torch.tensor([float("nan"), -float("nan"), -0.0, inf, -inf])])
    got = _reference.e2m1_codes(v)
    want = torch.frombuffer(bytearray(normjit._normjit._reference_encode("e2m1", v.double().tolist())), dtype=torch.uint8)
    assert torch.equal(got, want)
    assert _reference.pack_e2m1(torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)).view(torch.uint8).tolist() == \
        [[0x21, 0x8F]]


def test_swizzled_scales_are_the_gemms_128x4_tiles():
    rows, cols = 200, 6
    scales = (torch.arange(rows * cols) % 250 + 1).to(torch.uint8).reshape(rows, cols)
    out = _reference.swizzle_block_scales(scales)
    assert out.shape == (256, 8)
    flat = out.reshape(-1)
    for r, c in [(0, 0), (0, 3), (1, 0), (32, 0), (127, 3), (0, 4), (5, 5), (128, 0), (199, 5)]:
        tile = (r // 128) * 2 + c // 4
        at = tile * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4
        assert flat[at] == scales[r, c], (r, c)
    assert int((flat != 0).sum()) == rows * cols  # the padding is zero


@pytest.mark.parametrize("quant", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_fp4_reference_matches_float64(quant, norm):
    torch.manual_seed(0)
    x = torch.randn(6, 5, 96) * 3
    x[0, 0] = 0  # a zero row: scale code 0, codes 0
    w = torch.randn(96)
    y64 = ref64(x.double(), w.double(), None, norm, 1e-5)
    s_enc = torch.tensor([448.0 * 6 / float(y64.abs().max())], dtype=F32)
    y_q, scales, y, _ = torch.ops.normjit.quant_norm_fwd(x, None, w, None, norm, 1e-5, False, quant,
                                                         s_enc if quant == "nvfp4" else None, None, True)
    block = 16 if quant == "nvfp4" else 32
    assert y_q.dtype == _launch.FP4 and y_q.shape == (6, 5, 48)
    assert scales.shape == (6, 5, 96 // block)
    blocks = y64.reshape(6, 5, -1, block)
    amax = blocks.abs().amax(-1)
    if quant == "mxfp4":
        assert scales.dtype == torch.uint8  # the op's E8M0 codes
        e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.full_like(amax, -127))
        torch.testing.assert_close(scales.view(torch.uint8).double(), e + 127, rtol=0, atol=0)
        dequant = torch.exp2(e)
    else:
        assert scales.dtype == torch.float8_e4m3fn
        want = (amax / 6 * float(s_enc)).clamp(max=448.0)
        s = scales.double()
        assert ((s - want).abs() <= want * 2.0 ** -4 + 2.0 ** -10).all()  # e4m3: within half a step
        dequant = s / float(s_enc)
    got = _e2m1_values(y_q).reshape(6, 5, -1, block) * dequant.unsqueeze(-1)
    lim = 6 * dequant.unsqueeze(-1)
    want = torch.maximum(torch.minimum(blocks, lim), -lim)
    # e2m1: within half a step (relative 2^-2, or 0.25 of the scale near zero).
    assert ((got - want).abs() <= 0.25 * want.abs() + 0.25 * dequant.unsqueeze(-1) + 1e-6).all()
    assert (_e2m1_values(y_q[0, 0]) == 0).all()  # ±0: the sign of y = 0 · w is kept
    assert y.shape == x.shape and y.dtype == x.dtype


def test_fp4_functions_on_cpu_shapes_layouts_and_dequantization():
    torch.manual_seed(2)
    x, r, w = torch.randn(2, 3, 64), torch.randn(2, 3, 64), torch.randn(64)
    with torch.no_grad():
        y = nt.rms_norm(x, (64,), w)
        q, s = nt.rms_norm_mxfp4(x, (64,), w)
        assert q.dtype == _launch.FP4 and q.shape == (2, 3, 32) and s.shape == (2, 3, 2) and s.dtype == _launch.E8M0
        deq = _e2m1_values(q).reshape(2, 3, 2, 32) * torch.exp2(s.view(torch.uint8).double() - 127).unsqueeze(-1)
        lim = 6 * torch.exp2(s.view(torch.uint8).double() - 127).unsqueeze(-1)
        want = y.double().reshape(2, 3, 2, 32)
        want = torch.maximum(torch.minimum(want, lim), -lim)
        assert ((deq - want).abs() <= 0.25 * want.abs() + lim / 24 + 1e-6).all()
        y2, _ = nt.add_rms_norm(x, r, w)
        g = torch.tensor([448.0 * 6 / float(y2.abs().max())])
        q, s, y2, h = nt.add_rms_norm_nvfp4(x, r, w, global_scale=g, return_y=True)
        assert q.shape == (2, 3, 32) and s.dtype == torch.float8_e4m3fn and s.shape == (2, 3, 4)
        torch.testing.assert_close(h, x + r)
        dequant = (s.double() / float(g)).unsqueeze(-1)  # y ~ code * s / S_enc
        deq = _e2m1_values(q).reshape(2, 3, 4, 16) * dequant
        want = y2.double().reshape(2, 3, 4, 16)
        want = torch.maximum(torch.minimum(want, 6 * dequant), -6 * dequant)  # e4m3's rounded s may sit low
        assert ((deq - want).abs() <= 0.25 * want.abs() + 0.25 * dequant + 1e-6).all()
        q, s = nt.layer_norm_nvfp4(x.reshape(2, 3, 8, 8), (8, 8), global_scale=g)
        assert q.shape == (2, 3, 32) and s.shape == (2, 3, 4)
        # Swizzled: the padded [roundup(rows, 128), roundup(cols, 4)] matrix, the row-major scales
        # at their tile positions, zero elsewhere.
        q_sw, s_sw = nt.layer_norm_mxfp4(x, 64, scale_layout="swizzled")
        q_rm, s_rm = nt.layer_norm_mxfp4(x, 64)
        assert torch.equal(q_sw.view(torch.uint8), q_rm.view(torch.uint8))
        assert s_sw.shape == (128, 4) and s_sw.dtype == _launch.E8M0
        assert torch.equal(s_sw.view(torch.uint8), _reference.swizzle_block_scales(s_rm.reshape(6, 2)).view(torch.uint8))
        q8, s8 = nt.rms_norm_mxfp8(x, 64, w, scale_layout="swizzled")
        assert q8.shape == x.shape and s8.shape == (128, 4)


QUANT_ERRORS = [
    (lambda: nt.rms_norm_fp8(torch.randn(2, 8, requires_grad=True), 8), RuntimeError, "inference only"),
    (lambda: nt.rms_norm_fp8(torch.randn(2, 8), 8, fp8_dtype=torch.float16), ValueError, "fp8_dtype=torch.float16"),
    (lambda: nt.rms_norm_fp8(torch.randn(2, 8), 8, quant_scale=torch.ones(2)), ValueError,
     "quant_scale must be a float32 tensor of one element"),
    (lambda: nt.rms_norm_fp8(torch.randn(2, 8), 8, amax=torch.zeros(1)), ValueError, "quant_scale and amax are for"),
    (lambda: nt.layer_norm_fp8(torch.randn(2, 8), 8, quant_scale=torch.ones(1, dtype=torch.float64)), ValueError,
     "torch.float64"),
    (lambda: nt.add_rms_norm_int8(torch.randn(2, 8), torch.randn(2, 7)), ValueError, "residual"),
    (lambda: nt.rms_norm_mxfp8(torch.randn(2, 8), 8, fp8_dtype=torch.int8), ValueError, "fp8_dtype=torch.int8"),
    (lambda: torch.ops.normjit.quant_norm_fwd(torch.randn(2, 8), None, None, None, "rmsnorm", 1e-5, False, "fp4",
                                              None, None, False), ValueError, "quant='fp4'"),
    (lambda: nt.rms_norm_mxfp4(torch.randn(2, 7), 7), ValueError, "normalized size 7 must be even"),
    (lambda: nt.rms_norm_nvfp4(torch.randn(2, 8), 8, global_scale=None), ValueError,
     "global_scale must be a float32 tensor of one element"),
    (lambda: nt.rms_norm_nvfp4(torch.randn(2, 8), 8), TypeError, "global_scale"),
    (lambda: nt.rms_norm_mxfp4(torch.randn(2, 8), 8, scale_layout="tiled"), ValueError, "scale_layout='tiled'"),
    (lambda: torch.ops.normjit.quant_norm_fwd(torch.randn(2, 8), None, None, None, "rmsnorm", 1e-5, False, "int8_row",
                                              None, None, False, "swizzled"), ValueError,
     "quant='int8_row' has no block scales"),
]


@pytest.mark.parametrize("call,error,match", QUANT_ERRORS, ids=[str(i) for i in range(len(QUANT_ERRORS))])
def test_quantized_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_quantized_fake_shapes_and_opcheck():
    x = torch.empty(4, 6, 100, dtype=BF16, device="meta")[..., :96]
    y_q, s, y, h = torch.ops.normjit.quant_norm_fwd(x, None, None, None, "rmsnorm", 1e-5, False, "int8_row", None,
                                                     None, False)
    assert y_q.dtype == torch.int8 and y_q.shape == (4, 6, 96) and y_q.stride() == (600, 100, 1)
    assert s.shape == (4, 6, 1) and s.dtype == F32 and y.numel() == 0 and h.numel() == 0
    x = torch.randn(3, 40)
    torch.library.opcheck(torch.ops.normjit.quant_norm_fwd.default,
                          (x, torch.randn(3, 40), torch.randn(40), None, "rmsnorm", 1e-5, False, "fp8_e4m3",
                           torch.tensor([4.0]), torch.zeros(1), True))
    torch.library.opcheck(torch.ops.normjit.quant_norm_fwd.default,
                          (x, None, None, torch.randn(40), "layernorm", 1e-5, True, "int8_row", None, None, False))
    # e2m1 codes [..., n / 2] at half x's row stride; block scales row-major or swizzled.
    x = torch.empty(4, 6, 100, dtype=BF16, device="meta")[..., :96]
    y_q, s, y, h = torch.ops.normjit.quant_norm_fwd(x, None, None, None, "rmsnorm", 1e-5, False, "nvfp4",
                                                     torch.empty(1, device="meta"), None, True)
    assert y_q.dtype == _launch.FP4 and y_q.shape == (4, 6, 48) and y_q.stride() == (300, 50, 1)
    assert s.shape == (4, 6, 6) and s.dtype == torch.float8_e4m3fn and y.stride() == (600, 100, 1)
    y_q, s, _, _ = torch.ops.normjit.quant_norm_fwd(x, None, None, None, "rmsnorm", 1e-5, False, "mxfp4", None, None,
                                                     False, "swizzled")
    assert s.shape == (128, 4) and s.dtype == torch.uint8
    odd = torch.empty(3, 101, dtype=BF16, device="meta")[:, :64]  # an odd row stride: made contiguous
    y_q, _, _, _ = torch.ops.normjit.quant_norm_fwd(odd, None, None, None, "rmsnorm", 1e-5, False, "mxfp4", None,
                                                     None, False)
    assert y_q.shape == (3, 32) and y_q.stride() == (32, 1)
    x = torch.randn(3, 64)
    torch.library.opcheck(torch.ops.normjit.quant_norm_fwd.default,
                          (x, torch.randn(3, 64), torch.randn(64), None, "rmsnorm", 1e-5, False, "nvfp4",
                           torch.tensor([100.0]), None, True, "swizzled"))
    torch.library.opcheck(torch.ops.normjit.quant_norm_fwd.default,
                          (x, None, None, torch.randn(64), "layernorm", 1e-5, False, "mxfp4", None, None, False))


def test_launch_quantized_arguments(stub_gpu):
    x = torch.randn(4, 1000, dtype=BF16)[:, :768]
    w = torch.randn(768, dtype=BF16)
    y_q, scales, y, h = _launch.forward_quant(x, None, w, None, "rmsnorm", 1e-6, False, "fp8_e4m3_row", None, None,
                                              False)
    (k,) = stub_gpu.kernels
    assert k.name.startswith("rmsnorm.fwd_infer.bf16.w_bf16.n768.fp8_e4m3_row.cfg_")
    a = k.launches[-1]
    assert a[FIELDS.index("x")] == x.data_ptr() and a[FIELDS.index("y")] == 0
    assert a[FIELDS.index("row_stride")] == 1000 and a[FIELDS.index("rows")] == 4
    # residual, h, dh_out, y_quant, quant_scale, amax, row_scales, block_scales, block_scale_layout,
    # dresidual, bias_in; passed by name, only those the kernel reads
    assert a[20:] == (0, 0, 0, y_q.data_ptr(), 0, 0, scales.data_ptr(), 0, 0, 0, 0)
    assert set(k.keywords[-1]) == {"y_quant", "row_scales"}
    assert y_q.dtype == torch.float8_e4m3fn and y_q.stride() == (1000, 1) and scales.shape == (4, 1)
    assert y is None and h is None


def test_launch_mxfp8_arguments(stub_gpu):
    x = torch.randn(4, 100, dtype=BF16)
    y_q, scales, y, h = _launch.forward_quant(x, None, None, None, "rmsnorm", 1e-6, False, "mxfp8_e4m3", None, None,
                                              True)
    (k,) = stub_gpu.kernels
    assert k.name.startswith("rmsnorm.fwd_infer.bf16.w_bf16.n100.mxfp8_e4m3.cfg_")
    a = k.launches[-1]
    # residual, h, dh_out, y_quant, quant_scale, amax, row_scales, block_scales, block_scale_layout,
    # dresidual, bias_in
    assert a[20:] == (0, 0, 0, y_q.data_ptr(), 0, 0, 0, scales.data_ptr(), 0, 0, 0)
    assert a[FIELDS.index("y")] == y.data_ptr() and scales.shape == (4, 4) and scales.dtype == _launch.E8M0
    # The GEMMs' layout: one 128x4 tile of zeros where no scale goes.
    y_q, scales, y, h = _launch.forward_quant(x, None, None, None, "rmsnorm", 1e-6, False, "mxfp8_e4m3", None, None,
                                              False, "swizzled")
    assert k.launches[-1][28] == 1 and scales.shape == (128, 4) and (scales.view(torch.uint8)[4:] == 0).all()


def test_launch_fp4_arguments(stub_gpu):
    # Rows 1000 elements apart: the codes' rows 500 bytes apart, two a byte.
    x = torch.randn(4, 3, 1000, dtype=BF16)[..., :96]
    r = torch.randn(4, 3, 1000, dtype=BF16)[..., :96]
    s_enc = torch.tensor([336.0])
    y_q, scales, y, h = _launch.forward_quant(x, r, None, None, "rmsnorm", 1e-6, False, "nvfp4", s_enc, None, False,
                                              "swizzled")
    (k,) = stub_gpu.kernels
    assert k.name.startswith("rmsnorm.fwd_infer.bf16.w_bf16.n96.residual.nvfp4.cfg_")
    a = k.launches[-1]
    assert a[FIELDS.index("row_stride")] == 1000 and a[FIELDS.index("rows")] == 12
    assert a[20:] == (r.data_ptr(), h.data_ptr(), 0, y_q.data_ptr(), s_enc.data_ptr(), 0, 0, scales.data_ptr(), 1, 0,
                      0)
    assert y_q.dtype == _launch.FP4 and y_q.shape == (4, 3, 48) and y_q.stride() == (1500, 500, 1)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (128, 8)  # 12 rows, 6 scales: padded
    y_q, scales, y, h = _launch.forward_quant(x, None, None, None, "layernorm", 1e-5, False, "mxfp4", None, None,
                                              True)
    a = stub_gpu.kernels[-1].launches[-1]
    assert a[20:] == (0, 0, 0, y_q.data_ptr(), 0, 0, 0, scales.data_ptr(), 0, 0, 0)
    assert scales.shape == (4, 3, 3) and scales.dtype == _launch.E8M0 and y.stride() == (3000, 1000, 1)
    # An odd row stride: x is made contiguous first (the codes' rows must lie whole bytes apart).
    odd = torch.randn(5, 101, dtype=BF16)[:, :64]
    y_q, scales, _, _ = _launch.forward_quant(odd, None, None, None, "rmsnorm", 1e-6, False, "mxfp4", None, None,
                                              False)
    a = stub_gpu.kernels[-1].launches[-1]
    assert a[FIELDS.index("row_stride")] == 64 and a[FIELDS.index("x")] != odd.data_ptr()
    assert y_q.shape == (5, 32) and y_q.stride() == (32, 1)


def test_stub_kernel_takes_the_bindings_arguments():
    """The stub's fields are Kernel.launch's parameters, in order: _launch passes the fused ones by
    these names."""
    for fn, first in ((normjit._normjit.Kernel.launch, "x"), (normjit._normjit.max_vec_for, "x")):
        names = re.findall(r"(\w+): ", fn.__doc__.splitlines()[0])
        names = names[names.index(first):]
        if fn is normjit._normjit.Kernel.launch:
            assert names == list(FIELDS)
        else:  # max_vec_for: the pointers, row_stride, then the fused pointers by name
            assert set(names) <= set(FIELDS) and names[-6:] == ["residual", "h", "dh_out", "y_quant", "dresidual",
                                                                 "bias_in"]


# ---- quantized outputs on an fp32 residual stream ---------------------------------------------

# quant -> (the add_* function with its format's arguments, the op's quant_scale): eps 1e-6 given,
# as eps=None would take x's dtype's.
ADD_QUANT_CALLS = {
    "fp8_e4m3": (lambda x, r, w, **kw: nt.add_rms_norm_fp8(x, r, w, 1e-6, quant_scale=torch.tensor([16.0]), **kw),
                 torch.tensor([16.0])),
    "fp8_e5m2_row": (lambda x, r, w, **kw: nt.add_rms_norm_fp8(x, r, w, 1e-6, fp8_dtype=torch.float8_e5m2, **kw),
                     None),
    "int8_row": (lambda x, r, w, **kw: nt.add_rms_norm_int8(x, r, w, 1e-6, **kw), None),
    "mxfp8_e4m3": (lambda x, r, w, **kw: nt.add_rms_norm_mxfp8(x, r, w, 1e-6, **kw), None),
    "mxfp4": (lambda x, r, w, **kw: nt.add_rms_norm_mxfp4(x, r, w, 1e-6, **kw), None),
    "nvfp4": (lambda x, r, w, **kw: nt.add_rms_norm_nvfp4(x, r, w, 1e-6, global_scale=torch.tensor([200.0]), **kw),
              torch.tensor([200.0])),
}


def _bits(t):
    """t as comparable bits: its bytes for the 1-byte (fp8, e8m0, e2m1) dtypes."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.int8 else t


@pytest.mark.parametrize("quant", list(ADD_QUANT_CALLS))
@pytest.mark.parametrize("x_dtype", [BF16, F16], ids=["bf16", "f16"])
def test_add_quantized_f32_stream_cpu(quant, x_dtype):
    """A float32 residual beside a bf16 / f16 x in the add_* quantized calls: h = x + residual
    summed in fp32 and kept float32 (not rounded to x's dtype); codes, scales and y are those of
    the same format on h itself (the unrounded sum is what is normalized); y in x's dtype."""
    torch.manual_seed(5)
    x = torch.randn(2, 3, 64).to(x_dtype)
    r = 4 * torch.randn(2, 3, 64)
    w = torch.randn(64).to(x_dtype)
    fn, scale = ADD_QUANT_CALLS[quant]
    with torch.no_grad():
        q, s, y, h = fn(x, r, w, return_y=True)
        assert h.dtype == F32 and h.shape == x.shape and y.dtype == x_dtype and y.shape == x.shape
        assert torch.equal(h, x.float() + r)
        assert not torch.equal(h, h.to(x_dtype).float())  # what a residual in x's dtype would round
        want_q, want_s, want_y, _ = torch.ops.normjit.quant_norm_fwd(h, None, w, None, "rmsnorm", 1e-6, False, quant,
                                                                     scale, None, True)
        q2, s2, h2 = fn(x, r, w)  # without y
    assert q.dtype == want_q.dtype and q.shape == want_q.shape and torch.equal(_bits(q), _bits(want_q))
    if scale is None or quant == "nvfp4":  # per row or per block: the kernel's scales
        assert torch.equal(_bits(s), _bits(want_s))
    assert torch.equal(y, want_y.to(x_dtype))
    assert torch.equal(_bits(q2), _bits(q)) and torch.equal(h2, h)
    if quant in ("fp8_e5m2_row", "int8_row"):  # against float64 from h too
        y64 = ref64(h.double(), w.double(), None, "rmsnorm", 1e-6)
        torch.testing.assert_close(q.double() * s.double(), y64, rtol=2.0 ** -3, atol=float(s.max()))


def test_add_quantized_residual_dtype_errors():
    x, x32 = torch.randn(2, 8, dtype=BF16), torch.randn(2, 8)
    stream = (r"residual \(\[2, 8\], torch.float64, cpu\) must match x "
              r"\(\[2, 8\], torch.bfloat16 \(or float32: an fp32 residual stream\), cpu\)")
    for fn, _ in ADD_QUANT_CALLS.values():
        with pytest.raises(ValueError, match=stream):
            fn(x, x32.double(), None)
    with pytest.raises(ValueError, match=r"residual \(\[2, 8\], torch.float16, cpu\) must match x"):
        nt.add_rms_norm_int8(x, x32.half())
    # Beside a float32 x, a float32 residual is the plain residual (h float32 as x; no stream), and
    # a float64 one is refused without the stream's alternative.
    with torch.no_grad():
        q, s, h = nt.add_rms_norm_int8(x32, 2 * x32)
    assert h.dtype == F32 and torch.equal(h, 3 * x32)
    with pytest.raises(ValueError, match=r"torch.float64, cpu\) must match x \(\[2, 8\], torch.float32, cpu\)"):
        nt.add_rms_norm_fp8(x32, x32.double())
    # The op refuses the same, eagerly and in its fake (its CUDA path reads the residual as x's
    # dtype or as float32).
    for dev in ("cpu", "meta"):
        xd = x.to(dev)
        with pytest.raises(ValueError, match=r"residual.dtype=torch.float64: the residual must be in x's dtype "
                                             r"\(torch.bfloat16\) or float32 \(an fp32 residual stream\)"):
            torch.ops.normjit.quant_norm_fwd(xd, xd.double(), None, None, "rmsnorm", 1e-5, False, "int8_row", None,
                                             None, False)
    with pytest.raises(ValueError, match=r"residual.dtype=torch.float64: the residual must be in x's dtype "
                                         r"\(torch.float32\)$"):
        torch.ops.normjit.quant_norm_fwd(x32, x32.double(), None, None, "rmsnorm", 1e-5, False, "int8_row", None,
                                         None, False)


def test_add_quantized_f32_stream_fake_shapes_and_opcheck():
    # h float32 in the layout x and the residual share (rows 100 elements apart); codes and y as
    # without a residual.
    for device in ("meta", "fake-cuda"):
        ctx = FakeTensorMode() if device == "fake-cuda" else contextlib.nullcontext()
        with ctx:
            dev = "cuda" if device == "fake-cuda" else "meta"
            x = torch.empty(4, 6, 100, dtype=BF16, device=dev)[..., :96]
            r = torch.empty(4, 6, 100, dtype=F32, device=dev)[..., :96]
            y_q, s, y, h = torch.ops.normjit.quant_norm_fwd(x, r, None, None, "rmsnorm", 1e-5, False, "fp8_e4m3_row",
                                                             None, None, True)
            assert (h.dtype, h.shape, h.stride()) == (F32, (4, 6, 96), (600, 100, 1))
            assert (y.dtype, y.stride(), y_q.dtype, y_q.stride()) == (BF16, (600, 100, 1), torch.float8_e4m3fn,
                                                                      (600, 100, 1))
            y_q, s, _, h = torch.ops.normjit.quant_norm_fwd(x, r, None, None, "rmsnorm", 1e-5, False, "nvfp4",
                                                             torch.empty(1, device=dev), None, False, "swizzled")
            assert (h.dtype, h.stride()) == (F32, (600, 100, 1))
            assert (y_q.dtype, y_q.shape, y_q.stride(), s.shape) == (_launch.FP4, (4, 6, 48), (300, 50, 1), (128, 8))
            # Strided unlike x: both taken contiguous, h too.
            _, _, _, h = torch.ops.normjit.quant_norm_fwd(x, torch.empty(4, 6, 96, dtype=F32, device=dev), None,
                                                          None, "rmsnorm", 1e-5, False, "int8_row", None, None, False)
            assert (h.dtype, h.stride()) == (F32, (576, 96, 1))
    torch.manual_seed(6)
    x, r, w = torch.randn(3, 64, dtype=BF16), torch.randn(3, 64), torch.randn(64, dtype=BF16)
    for quant, scale, amax, layout in (("fp8_e4m3", torch.tensor([4.0]), torch.zeros(1), "row_major"),
                                       ("int8_row", None, None, "row_major"),
                                       ("mxfp8_e5m2", None, None, "swizzled"),
                                       ("nvfp4", torch.tensor([100.0]), None, "row_major")):
        torch.library.opcheck(torch.ops.normjit.quant_norm_fwd.default,
                              (x, r, w, None, "rmsnorm", 1e-5, False, quant, scale, amax, True, layout))


def test_compile_add_quantized_f32_stream_cpu():
    torch.manual_seed(7)
    x, r, w = torch.randn(4, 64, dtype=F16), torch.randn(4, 64), torch.randn(64, dtype=F16)

    def block(x, r, w):
        q, s, h = nt.add_rms_norm_mxfp8(x, r, w, 1e-6)
        q8, s8, y8, h8 = nt.add_rms_norm_int8(x, r, w, 1e-6, return_y=True)
        return q.view(torch.uint8), s.view(torch.uint8), h * 2, q8, s8, y8, h8

    torch._dynamo.reset()
    with torch.no_grad():
        want = block(x, r, w)
        got = torch.compile(block, backend="aot_eager", fullgraph=True)(x, r, w)
    assert got[2].dtype == got[6].dtype == F32 and got[5].dtype == F16
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))


def test_launch_quantized_f32_stream_arguments(stub_gpu):
    x = torch.randn(4, 1000, dtype=BF16)[:, :768]
    r = torch.randn(4, 1000)[:, :768]
    w = torch.randn(768, dtype=BF16)
    y_q, scales, y, h = _launch.forward_quant(x, r, w, None, "rmsnorm", 1e-6, False, "fp8_e4m3_row", None, None,
                                              True)
    (k,) = stub_gpu.kernels
    assert k.name.startswith("rmsnorm.fwd_infer.bf16.w_bf16.n768.residual_f32.fp8_e4m3_row.cfg_")
    a = _args(k)
    assert h.dtype == F32 and h.stride() == (1000, 1) and y.dtype == BF16 and y_q.dtype == torch.float8_e4m3fn
    assert (a["x"], a["residual"], a["h"], a["y"], a["y_quant"], a["row_scales"], a["row_stride"]) == (
        x.data_ptr(), r.data_ptr(), h.data_ptr(), y.data_ptr(), y_q.data_ptr(), scales.data_ptr(), 1000)
    assert set(k.keywords[-1]) == {"residual", "h", "y_quant", "row_scales"}
    s_enc = torch.tensor([300.0])
    y_q, scales, _, h = _launch.forward_quant(x.contiguous(), r.contiguous(), w, None, "rmsnorm", 1e-6, False,
                                              "nvfp4", s_enc, None, False, "swizzled")
    k = stub_gpu.kernels[-1]
    assert k.name.startswith("rmsnorm.fwd_infer.bf16.w_bf16.n768.residual_f32.nvfp4.cfg_")
    a = _args(k)
    assert h.dtype == F32 and (a["h"], a["quant_scale"], a["block_scales"], a["block_scale_layout"]) == (
        h.data_ptr(), s_enc.data_ptr(), scales.data_ptr(), 1)
    # A float32 residual beside a float32 x is the plain residual.
    _launch.forward_quant(torch.randn(4, 768), torch.randn(4, 768), None, None, "rmsnorm", 1e-6, False, "int8_row",
                          None, None, False)
    assert stub_gpu.kernels[-1].name.startswith("rmsnorm.fwd_infer.f32.w_f32.n768.residual.int8_row.cfg_")


# ---- memory_efficient: the backward from y ----------------------------------------------------

@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm", "adalayernorm", "adarmsnorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_memory_efficient_reference_backward_matches_the_backward_of_x(norm, zero_centered):
    # fp32 y keeps x̂ to ~1e-7: the backward from y must match the backward from x that closely.
    torch.manual_seed(1)
    ada = norm.startswith("ada")
    x = torch.randn(2, 3, 24)
    shape = (2, 24) if ada else (24,)
    w, b = torch.rand(shape) + 0.5, torch.randn(shape) * 0.5
    y, _, mean, rstd, _ = torch.ops.normjit.fused_norm_fwd(x, None, w, b, norm, 1e-5, True, zero_centered, "none",
                                                           0.0, inf)
    dy = torch.randn_like(x)
    from_x = torch.ops.normjit.fused_norm_bwd(dy, None, x, w, mean, rstd, torch.empty(0), norm, zero_centered,
                                              "none", True)
    from_y = torch.ops.normjit.fused_norm_bwd(dy, None, y, w, torch.empty(0), rstd, torch.empty(0), norm,
                                              zero_centered, "none", True, b, True)
    for got, want in zip(from_y, from_x):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_add_norm_memory_efficient_cpu_gradients(norm):
    torch.manual_seed(2)
    x, r = torch.randn(3, 5, 24), torch.randn(3, 5, 24)
    w, b = torch.rand(24) + 0.5, torch.randn(24) * 0.5
    grads = []
    for memory_efficient in (False, True):
        args = [t.clone().requires_grad_() for t in (x, r, w, b)]
        if norm == "rmsnorm":
            y, h = nt.add_rms_norm(args[0], args[1], args[2], 1e-6, args[3], memory_efficient=memory_efficient)
        else:
            y, h = nt.add_layer_norm(args[0], args[1], args[2], args[3], 1e-6, memory_efficient=memory_efficient)
        (y * torch.cos(y) + h).sum().backward()
        grads.append([a.grad for a in args])
    for got, want in zip(*reversed(grads)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_opcheck_memory_efficient_ops_cpu():
    x, w, b = torch.randn(3, 16), torch.rand(16) + 0.5, torch.randn(16)
    args = (*_grad(x.clone()), None, *_grad(w.clone(), b.clone()), "layernorm", 1e-5, True, False, "none", 0.0, inf,
            True)
    torch.library.opcheck(torch.ops.normjit.fused_norm_fwd.default, args)
    # The backward op's inputs as the autograd formula passes them: no gradient flows through it.
    y, _, mean, rstd, mask = torch.ops.normjit.fused_norm_fwd(x, None, w, b, "layernorm", 1e-5, True, False, "none",
                                                              0.0, inf, True)
    torch.library.opcheck(torch.ops.normjit.fused_norm_bwd.default,
                          (torch.randn(3, 16), None, y, w, mean, rstd, mask, "layernorm", False, "none", True, b, True))


def test_memory_efficient_saves_y_not_x():
    # What autograd keeps: y (and the bias), never x.
    x = torch.randn(4, 16, requires_grad=True)
    w, b = (torch.rand(16) + 0.5).requires_grad_(), torch.randn(16).requires_grad_()
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y, _ = nt.add_layer_norm(x, torch.randn(4, 16), w, b, memory_efficient=True)
    assert any(t is y or (t.shape == y.shape and torch.equal(t, y)) for t in kept)
    assert not any(t.shape == x.shape and torch.equal(t, x.detach()) for t in kept)


@pytest.mark.parametrize("weight, bias, match", [
    ([1.0, 0.0, 1.0], None, r"element 1 of the weights: weight=0, bias=0"),
    ([1.0, 0.1, 1.0], [0.0, 0.9, 0.0], r"element 1 .*weight=0.1, bias=0.9 \(needs weight != 0 and \|bias\| <= 8"),
    (None, [0.0, 9.0, 0.0], r"element 1 .*weight=1, bias=9"),
])
def test_memory_efficient_refuses_weights_that_lose_x(weight, bias, match):
    x = torch.randn(2, 3, requires_grad=True)
    w = torch.tensor(weight, requires_grad=True) if weight is not None else None
    b = torch.tensor(bias, requires_grad=True) if bias is not None else None
    with pytest.raises(ValueError, match="add_layer_norm: memory_efficient=True recovers x from y.*" + match):
        nt.add_layer_norm(x, torch.randn(2, 3), w, b, memory_efficient=True)
    # Without gradients nothing is kept, so nothing is refused; nor with memory_efficient off.
    with torch.no_grad():
        nt.add_layer_norm(x, torch.randn(2, 3), w, b, memory_efficient=True)
    nt.add_layer_norm(x, torch.randn(2, 3), w, b)


def test_memory_efficient_errors_and_modules():
    with pytest.raises(ValueError, match="memory_efficient=True recovers x from y, which epilogue='relu_bitmask'"):
        torch.ops.normjit.fused_norm_fwd(torch.randn(2, 8), None, None, None, "layernorm", 1e-5, True, False,
                                         "relu_bitmask", 0.0, 1.0, True)
    m = nt.LayerNorm(8, memory_efficient=True)
    assert m.memory_efficient and set(m.state_dict()) == {"weight", "bias"}
    model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.RMSNorm(8))
    assert nt.swap_norms(model, memory_efficient=True) == 2
    assert all(mod.memory_efficient for mod in model)


def test_launch_memory_efficient_arguments(stub_gpu):
    x = torch.randn(4, 6, 768, dtype=BF16)
    w, b = torch.rand(768) + 0.5, torch.randn(768)
    y, _, mean, rstd, _ = _launch.forward_fused(x, None, w, b, "layernorm", 1e-5, True, False, "none", 0.0, inf)
    dy = torch.randn_like(y)
    # dbias not wanted: the spec still has the bias (x̂ needs it), dbeta goes to scratch.
    dx, dw, db, _ = _launch.backward_fused(dy, None, y, w, mean, rstd, None, "layernorm", False, "none", False, b, True)
    k = stub_gpu.kernels[-1]
    assert k.name.startswith("layernorm.bwd.bf16.w_f32.n768.bias.memory_efficient.cfg_")
    a = _args(k)
    assert (a["x"], a["y"], a["beta"], a["mean"]) == (0, y.data_ptr(), b.data_ptr(), 0)
    assert a["dbeta"] != 0 and db is None and dw.shape == (768,)


def test_compile_inductor_block_scaled_functions_cpu():
    # MX scales leave the op as uint8 codes: inductor could not lower float8_e8m0fnu outputs.
    x, w = torch.randn(4, 64, dtype=BF16), torch.randn(64, dtype=BF16)

    def block(x, w):
        q8, s8 = nt.rms_norm_mxfp8(x, 64, w)
        q4, s4 = nt.rms_norm_mxfp4(x, 64, w, scale_layout="swizzled")
        return q8.view(torch.uint8), s8, q4.view(torch.uint8), s4

    torch._dynamo.reset()
    with torch.no_grad():
        want = block(x, w)
        got = torch.compile(block, fullgraph=True)(x, w)
    assert got[1].dtype == got[3].dtype == _launch.E8M0
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
