"""normjit.torch on a GPU: forward and backward against float64 torch over dtypes, sizes, leading
shapes and strided rows; opcheck; torch.compile; CUDA graphs; training a small transformer block
with normjit's norms against torch's; a second GPU. Skipped, with the reason, without a GPU."""
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import normjit.torch as nt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import blocks  # noqa: E402
from test_torch_cpu import ref64  # noqa: E402

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
inf = math.inf
# (x dtype, weight dtype) -> tolerance relative to the output's magnitude: about two ulps of the
# dtype the result is stored in.
DTYPES = {"bf16": (BF16, BF16), "f16": (F16, F16), "f32": (F32, F32), "bf16_wf32": (BF16, F32)}
TOL = {BF16: 1.6e-2, F16: 2e-3, F32: 2e-5}
DT_NAMES = {BF16: "bf16", F16: "f16", F32: "f32"}


def close(got, want, tol, what, scale=None):
    """|got - want| <= tol * (|want| + scale), elementwise, want in float64; scale: max|want| unless
    the caller knows the magnitude the result's rounding error follows."""
    if want.numel():
        scale = max(scale or 0.0, want.abs().max().item())
    else:
        scale = 0.0
    torch.testing.assert_close(got.double(), want, atol=tol * max(scale, 1e-6), rtol=tol, msg=lambda m: f"{what}: {m}")


def make_x(lead, n, dtype, strided, device):
    """Standard-normal x [*lead, n]; strided: a view of the first n columns of a wider tensor."""
    width = n + 8 if strided else n
    x = torch.randn(*lead, width, device=device, dtype=F32).to(dtype)
    return x[..., :n] if strided else x


def check_forward_backward(fn, norm, x, w, b, eps, tol, relu=None):
    """Runs fn (y = fn(x, w, b)) forward and backward and compares y, dx, dw, db with float64."""
    leaves = [t for t in (x, w, b) if t is not None]
    for t in leaves:
        t.requires_grad_(True)
    out = fn(x, w, b)
    y, mask = out if relu else (out, None)
    assert y.dtype == x.dtype and y.shape == x.shape
    want = ref64(x.detach(), *(t.detach() if t is not None else None for t in (w, b)), norm, eps,
                 *(relu or (None, None)))
    close(y, want, tol[x.dtype], "y")
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    it = iter(leaves64)
    x64, w64, b64 = (next(it) if t is not None else None for t in (x, w, b))
    # The backward's semantics: dy passes where normjit's mask keeps y (elements on a clip edge may
    # round either way; the mask itself is checked away from the edges).
    want64 = ref64(x64, w64, b64, norm, eps)
    dy64 = dy.double() if mask is None else dy.double() * _unpack(mask, y.shape[-1])
    grads64 = torch.autograd.grad(want64, leaves64, dy64)
    # dx = rstd * (dy*w - ...) cancels: its error scales with rstd * |dy * w|, not with |dx|
    # (N = 1, or a row whose x-hat is near +-1, gives dx near 0 from terms of that size).
    xd = x.detach().double()
    xc = xd - xd.mean(-1, keepdim=True) if norm in ("layernorm", "adalayernorm") else xd
    rstd = torch.rsqrt(xc.square().mean(-1) + eps).max().item()
    terms = rstd * dy.abs().max().item() * (w.abs().max().item() if w is not None else 1.0)
    for name, g, g64, t in zip(("dx", "dweight", "dbias"), grads, grads64, leaves):
        assert g.dtype == t.dtype and g.shape == t.shape, name
        close(g, g64, 2 * tol[g.dtype], name, scale=terms if name == "dx" else None)
    return mask


def _unpack(mask, n):
    """uint8 bit mask [..., ceil(n / 8)] -> float64 [..., n] of 0 and 1 (bit k of byte j: column 8j + k)."""
    bits = torch.stack([(mask >> k) & 1 for k in range(8)], -1)
    return bits.reshape(*mask.shape[:-1], -1)[..., :n].double()


CASES = []
for i, n in enumerate((1, 7, 768, 2880, 4097, 65536)):
    for j, dt in enumerate(DTYPES):
        lead = [(3,), (2, 33), (4, 1, 5), (37,)][(i + j) % 4] if n < 65536 else (3,)
        CASES.append(pytest.param(dt, n, lead, (i + j) % 2 == 1, id=f"{dt}-n{n}-{'x'.join(map(str, lead))}"
                                  + ("-strided" if (i + j) % 2 else "")))


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dt,n,lead,strided", CASES)
def test_forward_backward_against_float64(gpu, norm, dt, n, lead, strided):
    torch.manual_seed(n)
    x_dtype, w_dtype = DTYPES[dt]
    x = make_x(lead, n, x_dtype, strided, gpu)
    w = torch.randn(n, device=gpu).to(w_dtype)
    b = torch.randn(n, device=gpu).to(w_dtype) if norm == "layernorm" else None
    if norm == "layernorm":
        fn = lambda x, w, b: nt.layer_norm(x, (n,), w, b)  # noqa: E731
    else:
        fn = lambda x, w, b: nt.rms_norm(x, [n], w)  # noqa: E731
    check_forward_backward(fn, norm, x, w, b, 1e-5 if norm == "layernorm" else torch.finfo(x_dtype).eps, TOL)


def test_largest_n(gpu):
    n = 262144
    x = torch.randn(2, n, device=gpu, dtype=BF16)
    w = torch.randn(n, device=gpu)
    b = torch.randn(n, device=gpu)
    check_forward_backward(lambda x, w, b: nt.layer_norm(x, n, w, b), "layernorm", x, w, b, 1e-5, TOL)


def test_no_weight_bias_only_and_multi_dim(gpu):
    x = torch.randn(6, 4, 96, device=gpu, dtype=BF16)
    check_forward_backward(lambda x, w, b: nt.layer_norm(x, 96), "layernorm", x, None, None, 1e-5, TOL)
    b = torch.randn(96, device=gpu, dtype=BF16)
    check_forward_backward(lambda x, w, b: nt.layer_norm(x, 96, None, b), "layernorm", x, None, b, 1e-5, TOL)
    # Two normalized dimensions flatten into one row of 4 * 96.
    w2 = torch.randn(4, 96, device=gpu)
    y = nt.layer_norm(x, (4, 96), w2)
    close(y, F.layer_norm(x.double(), (4, 96), w2.double()), TOL[BF16], "y")


def test_ada_layer_norm(gpu):
    x = torch.randn(3, 50, 768, device=gpu, dtype=BF16)
    w = 1 + 0.1 * torch.randn(3, 768, device=gpu)
    b = torch.randn(3, 768, device=gpu)
    check_forward_backward(lambda x, w, b: nt.ada_layer_norm(x, w, b), "adalayernorm", x, w, b, 1e-5, TOL)


@pytest.mark.parametrize("n", [768, 3072, 4097])
def test_ada_rms_norm(gpu, n):
    x = torch.randn(2, 37, n, device=gpu, dtype=BF16)
    w = 1 + 0.1 * torch.randn(2, n, device=gpu)
    b = torch.randn(2, n, device=gpu) if n != 3072 else None
    check_forward_backward(lambda x, w, b: nt.ada_rms_norm(x, w, b, 1e-6), "adarmsnorm", x, w, b, 1e-6, TOL)


@pytest.mark.parametrize("norm", ["adalayernorm", "adarmsnorm"])
def test_ada_modulate_form(gpu, norm):
    """zero_centered on the Ada norms: DiT's x_hat * (1 + scale[b]) + shift[b], forward and backward."""
    n = 1152
    x = torch.randn(4, 33, n, device=gpu, dtype=BF16, requires_grad=True)
    scale = (0.2 * torch.randn(4, n, device=gpu)).requires_grad_()
    shift = torch.randn(4, n, device=gpu, requires_grad=True)
    fn = nt.ada_layer_norm if norm == "adalayernorm" else nt.ada_rms_norm
    y = fn(x, scale, shift, 1e-6, zero_centered=True)
    x64, s64, b64 = (t.detach().double().requires_grad_(True) for t in (x, scale, shift))
    want = ref64(x64, s64 + 1, b64, norm, 1e-6)
    close(y, want.detach(), TOL[BF16], "y")
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, scale, shift), dy)
    exp = torch.autograd.grad(want, (x64, s64, b64), dy.double())
    close(got[0], exp[0], 2 * TOL[BF16], "dx", scale=10 * dy.abs().max().item())
    close(got[1], exp[1], 2 * TOL[F32], "dscale")
    close(got[2], exp[2], 2 * TOL[F32], "dshift")


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_relu_variants_and_mask(gpu, norm):
    n = 1000
    x = torch.randn(5, 7, n, device=gpu, dtype=F16)
    w = torch.randn(n, device=gpu, dtype=F16)
    b = torch.randn(n, device=gpu, dtype=F16)
    lo, hi = -0.25, 1.5
    if norm == "layernorm":
        fn = lambda x, w, b: nt.layer_norm_relu(x, n, w, b, 1e-5, lo, hi)  # noqa: E731
    else:
        fn = lambda x, w, b: nt.rms_norm_relu(x, n, w, 1e-5, b, lo, hi)  # noqa: E731
    mask = check_forward_backward(fn, norm, x, w, b, 1e-5, TOL, relu=(lo, hi))
    assert mask.shape == (5, 7, 125) and mask.dtype == torch.uint8
    pre = ref64(x, w, b, norm, 1e-5)
    keep = torch.stack([(mask >> k) & 1 for k in range(8)], -1).reshape(5, 7, n).bool()
    inside = (pre > lo + 1e-2) & (pre < hi - 1e-2)  # away from the edges, where rounding may differ
    outside = (pre < lo - 1e-2) | (pre > hi + 1e-2)
    assert keep[inside].all() and not keep[outside].any()


def test_gradients_only_where_needed(gpu):
    x = torch.randn(8, 256, device=gpu, dtype=BF16)
    w = torch.randn(256, device=gpu, requires_grad=True)
    b = torch.randn(256, device=gpu)
    nt.layer_norm(x, 256, w, b).sum().backward()
    assert w.grad is not None and x.grad is None and b.grad is None
    x.requires_grad_(True)
    w.requires_grad_(False)
    nt.layer_norm(x, 256, w, b).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    with torch.no_grad():
        assert nt.layer_norm(x, 256, w, b).grad_fn is None


@pytest.mark.parametrize("case", ["layernorm", "rmsnorm_relu_strided"])
def test_opcheck_cuda(gpu, case):
    if case == "layernorm":
        args = (torch.randn(4, 5, 384, device=gpu, dtype=BF16, requires_grad=True),
                torch.randn(384, device=gpu, requires_grad=True), torch.randn(384, device=gpu, requires_grad=True),
                "layernorm", 1e-5, True, "none", 0.0, inf)
    else:
        args = (torch.randn(6, 400, device=gpu, dtype=F16)[:, :384].requires_grad_(),
                torch.randn(384, device=gpu, dtype=F16, requires_grad=True), None, "rmsnorm", 1e-5, True,
                "relu_bitmask", 0.0, inf)
    torch.library.opcheck(torch.ops.normjit.norm_fwd.default, args)
    x, w, b = args[:3]
    _, mean, rstd, mask = torch.ops.normjit.norm_fwd(*args)
    torch.library.opcheck(torch.ops.normjit.norm_bwd.default,
                          (torch.randn_like(x), x.detach(), w.detach(), mean, rstd, mask, args[3], args[6],
                           b is not None))


def test_compile_fullgraph_matches_eager_without_recompiles(gpu):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(512, 512), nt.LayerNorm(512), nn.GELU(), nt.RMSNorm(512)).to(gpu)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(16, 512, device=gpu, requires_grad=True)
        want = model(x)
        got = compiled(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        (gx,) = torch.autograd.grad(got.square().sum(), x)
        (wx,) = torch.autograd.grad(want.square().sum(), x)
        torch.testing.assert_close(gx, wx, atol=1e-4, rtol=1e-4)
    assert counter.frame_count == 1


def test_cuda_graph_capture_and_replay(gpu):
    ln = nt.LayerNorm(1024).to(gpu, BF16)
    x = torch.randn(64, 1024, device=gpu, dtype=BF16, requires_grad=True)
    # Warm up (loads the forward and backward kernels) on a side stream, as torch recommends.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ln(x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    ln.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ln(x)
        y.float().square().sum().backward()
    for _ in range(2):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            x.grad.zero_()
            ln.weight.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        x2 = x.detach().clone().requires_grad_(True)
        want = F.layer_norm(x2.float(), (1024,), ln.weight.float(), ln.bias.float())
        close(y, want.double(), TOL[BF16], "replayed y")
        # The graph's dy is 2 y of the y it stored: the reference backward takes the same dy (from its
        # own y, a few elements round to the neighbouring bf16 and move dx by more than its tolerance).
        (dx_want,) = torch.autograd.grad(want, x2, 2 * y.detach().float())
        close(x.grad, dx_want.double(), 4 * TOL[BF16], "replayed dx")


def test_cuda_graph_capture_of_a_cold_spec_is_an_error(gpu):
    x = torch.randn(8, 328, device=gpu, dtype=F16)  # a size no other test loads
    with pytest.raises(RuntimeError, match=r"rmsnorm\.fwd_infer\.f16\.w_f16\.n328.*run the op once"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            nt.rms_norm(x, 328)
    assert not torch.cuda.is_current_stream_capturing()
    # Warmed, the same call captures.
    nt.rms_norm(x, 328)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nt.rms_norm(x, 328)
    graph.replay()
    torch.testing.assert_close(y, F.rms_norm(x, (328,)), atol=2e-3, rtol=2e-3)


def _train(model, batches, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for step in range(steps):
        loss = model.loss(batches[step % len(batches)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_training_matches_torch(gpu, norm):
    """The same bf16 model (fp32 norm weights), init and data, with torch's norms and with normjit's."""
    torch.manual_seed(0)
    vocab, seq = 128, 65
    # Learnable data: each token is followed by a fixed other token.
    successor = torch.randperm(vocab, device=gpu)
    batches = []
    for _ in range(16):
        tokens = [torch.randint(0, vocab, (16,), device=gpu)]
        for _ in range(seq - 1):
            tokens.append(successor[tokens[-1]])
        batches.append(torch.stack(tokens, 1))
    reference = blocks.use_fp32_norms(blocks.TinyLM(vocab=vocab, dim=128, heads=4, layers=2, norm=norm).to(gpu, BF16))
    model = blocks.TinyLM(vocab=vocab, dim=128, heads=4, layers=2, norm=norm).to(gpu, BF16)
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
            m.float()
    model.load_state_dict(reference.state_dict())
    assert nt.swap_norms(model) == 5
    steps = 300
    want = _train(reference, batches, steps)
    got = _train(model, batches, steps)
    assert got[-1] < 0.5 * got[0], got[::30]
    diffs = [abs(a - b) / max(b, 0.1) for a, b in zip(got, want)]
    assert sum(diffs) / steps < 0.05, (got[::30], want[::30])
    assert abs(got[0] - want[0]) < 0.02 * want[0]


def test_second_gpu(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs; this machine has one")
    dev = torch.device("cuda", 1)
    ln = nt.LayerNorm(512).to(dev)
    x = torch.randn(32, 512, device=dev, requires_grad=True)
    assert torch.cuda.current_device() == 0
    y = ln(x)
    y.sum().backward()
    assert y.device == dev and x.grad.device == dev
    assert nt.runtime(1).device_ordinal == 1
    assert any(name.startswith("layernorm.fwd_train.f32.w_f32.n512") for name in nt.loaded_kernels()[1])
    torch.testing.assert_close(y, F.layer_norm(x, (512,), ln.weight, ln.bias), atol=1e-5, rtol=1e-5)
    assert torch.cuda.current_device() == 0


# ---- the fusions: residual add and zero-centred weights ----------------------------------------

ADD_CASES = []
for i, n in enumerate((7, 768, 4097, 5120, 18432)):
    for j, dt in enumerate(("bf16", "f16", "f32", "bf16_wf32")):
        lead = [(3,), (2, 33), (4, 1, 5), (37,)][(i + j) % 4]
        ADD_CASES.append(pytest.param(dt, n, lead, (i + j) % 2 == 1, id=f"{dt}-n{n}-{'x'.join(map(str, lead))}"
                                      + ("-strided" if (i + j) % 2 else "")))


def _add_norm_reference64(h, w, b, norm, eps, zero_centered, dy, dh):
    """The float64 reference of an add_* call from its h: y = norm(h) (scale w, or 1 + w
    zero-centred; bias b or None) and the gradients for dy on y and dh on h. Returns (y64, dh64,
    [dweight64(, dbias64)], terms): dh64 = dnorm(dy) + dh, the gradient of x and the residual;
    terms, the magnitude dx's rounding error follows (rstd * |dy| * |scale| + |dh|: dnorm's terms
    cancel)."""
    h64 = h.detach().double().requires_grad_(True)
    w64 = w.detach().double().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True) if b is not None else None
    y64 = ref64(h64, w64 + 1 if zero_centered else w64, b64, norm, eps)
    grads64 = torch.autograd.grad(y64, [t for t in (h64, w64, b64) if t is not None], dy.double())
    hd = h64.detach()
    hc = hd - hd.mean(-1, keepdim=True) if norm == "layernorm" else hd
    rstd = torch.rsqrt(hc.square().mean(-1) + eps).max().item()
    scale = (w64.detach() + (1 if zero_centered else 0)).abs().max().item()
    terms = rstd * dy.abs().max().item() * scale + dh.abs().max().item()
    return y64.detach(), grads64[0] + dh.double(), list(grads64[1:]), terms


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("dt,n,lead,strided", ADD_CASES)
def test_add_norm_against_float64(gpu, norm, zero_centered, dt, n, lead, strided):
    """h = x + residual is bit-identical to torch's add in x's dtype; y = norm(h) and the gradients
    (dx = dresidual = dnorm(dy) + dh) against float64."""
    torch.manual_seed(n + 7 * strided)
    x_dtype, w_dtype = DTYPES[dt]
    x, r = make_x(lead, n, x_dtype, strided, gpu), make_x(lead, n, x_dtype, not strided, gpu)
    w = (0.2 if zero_centered else 1.0) * torch.randn(n, device=gpu)
    w = w.to(w_dtype)
    b = torch.randn(n, device=gpu).to(w_dtype) if norm == "layernorm" else None
    eps = 1e-5
    leaves = [t.requires_grad_(True) for t in (x, r, w, b) if t is not None]
    if norm == "layernorm":
        y, h = nt.add_layer_norm(x, r, w, b, eps, zero_centered=zero_centered)
    else:
        y, h = nt.add_rms_norm(x, r, w, eps, zero_centered=zero_centered)
    assert y.dtype == h.dtype == x_dtype and y.shape == h.shape == x.shape
    assert torch.equal(h, x.detach() + r.detach()), "h differs from x + residual"
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    want, dx64, wgrads64, terms = _add_norm_reference64(h, w, b, norm, eps, zero_centered, dy, dh)
    close(y, want, TOL[x_dtype], "y")
    grads = torch.autograd.grad((y, h), leaves, (dy, dh))
    dx, dres = grads[0], grads[1]
    assert torch.equal(dx, dres), "dx and dresidual differ"
    close(dx, dx64, 2 * TOL[x_dtype], "dx", scale=terms)
    for name, g, g64, t in zip(("dweight", "dbias"), grads[2:], wgrads64, leaves[2:]):
        assert g.dtype == t.dtype and g.shape == t.shape, name
        close(g, g64, 2 * TOL[g.dtype], name)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dt,n,lead,strided", [("bf16", 7, (3,), False), ("bf16_wf32", 4097, (2, 33), True),
                                                ("f16", 5120, (37,), False), ("bf16", 18432, (4, 1, 5), True)],
                         ids=["bf16-n7", "bf16_wf32-n4097-strided", "f16-n5120", "bf16-n18432-strided"])
@pytest.mark.parametrize("with_bias_in", [False, True], ids=["plain", "bias_in"])
def test_add_norm_f32_stream_against_float64(gpu, norm, dt, n, lead, strided, with_bias_in):
    """A float32 residual beside a bf16 / f16 x: h = (x + bias_in) + residual in fp32 (not rounded),
    y = norm(h) in x's dtype; gradients: x's in x's dtype (dh rounded), the residual's in fp32, bias_in's
    the rows' sum of dh, against float64."""
    torch.manual_seed(n + 11 * strided)
    x_dtype, w_dtype = DTYPES[dt]
    x = make_x(lead, n, x_dtype, strided, gpu)
    r = make_x(lead, n, F32, not strided, gpu)
    w = torch.randn(n, device=gpu).to(w_dtype)
    b = torch.randn(n, device=gpu).to(w_dtype) if norm == "layernorm" else None
    bias_in = torch.randn(n, device=gpu).to(w_dtype) if with_bias_in else None
    eps = 1e-5
    leaves = [t.requires_grad_(True) for t in (x, r, w, b, bias_in) if t is not None]
    if norm == "layernorm":
        y, h = nt.add_layer_norm(x, r, w, b, eps, bias_in=bias_in)
    else:
        y, h = nt.add_rms_norm(x, r, w, eps, bias_in=bias_in)
    assert y.dtype == x_dtype and h.dtype == F32 and y.shape == h.shape == x.shape
    h_want = x.detach().float() + (bias_in.detach().float() if with_bias_in else 0) + r.detach()
    assert torch.equal(h, h_want), "h differs from (x + bias_in) + residual in fp32"
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    want, dh64, wgrads64, terms = _add_norm_reference64(h, w, b, norm, eps, False, dy, dh)
    close(y, want, TOL[x_dtype], "y")
    grads = torch.autograd.grad((y, h), leaves, (dy, dh))
    dx, dres = grads[0], grads[1]
    assert dx.dtype == x_dtype and dres.dtype == F32
    assert torch.equal(dx, dres.to(x_dtype)), "dx is not dresidual rounded to x's dtype"
    close(dres, dh64, 2 * TOL[F32], "dresidual", scale=terms)
    close(dx, dh64, 2 * TOL[x_dtype], "dx", scale=terms)
    names = ["dweight", "dbias"][: 1 + (b is not None)]
    for name, g, g64, t in zip(names, grads[2:], wgrads64, leaves[2:]):
        assert g.dtype == t.dtype and g.shape == t.shape, name
        close(g, g64, 2 * TOL[g.dtype], name)
    if with_bias_in:
        g = grads[-1]
        assert g.dtype == bias_in.dtype and g.shape == (n,)
        close(g, dh64.reshape(-1, n).sum(0), 2 * TOL[g.dtype], "dbias_in")
    # The same through torch.compile (the custom ops, their fake implementations).
    torch._dynamo.reset()
    if norm == "layernorm":
        compiled = torch.compile(lambda x, r, w, b: nt.add_layer_norm(x, r, w, b, 1e-5, bias_in=bias_in),
                                 fullgraph=True)
    else:
        compiled = torch.compile(lambda x, r, w, b: nt.add_rms_norm(x, r, w, 1e-5, bias_in=bias_in), fullgraph=True)
    yc, hc_ = compiled(x.detach(), r.detach(), w.detach(), b.detach() if b is not None else None)
    assert torch.equal(hc_, h.detach()) and torch.equal(yc, y.detach())


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_zero_centered_norm_against_float64(gpu, norm):
    n = 2880
    x = torch.randn(3, 40, n, device=gpu, dtype=BF16)
    w = 0.2 * torch.randn(n, device=gpu)
    b = torch.randn(n, device=gpu) if norm == "layernorm" else None
    if norm == "layernorm":
        fn = lambda x, w, b: nt.layer_norm(x, n, w, b, zero_centered=True)  # noqa: E731
    else:
        fn = lambda x, w, b: nt.rms_norm(x, n, w, 1e-5, zero_centered=True)  # noqa: E731
    leaves = [t.requires_grad_(True) for t in (x, w, b) if t is not None]
    y = fn(x, w, b)
    w64 = w.detach().double().requires_grad_(True)
    b64 = b.detach().double().requires_grad_(True) if b is not None else None
    x64 = x.detach().double().requires_grad_(True)
    want = ref64(x64, w64 + 1, b64, norm, 1e-5)
    close(y, want.detach(), TOL[BF16], "y")
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy)
    grads64 = torch.autograd.grad(want, [t for t in (x64, w64, b64) if t is not None], dy.double())
    close(grads[0], grads64[0], 2 * TOL[BF16], "dx", scale=5 * dy.abs().max().item())
    for name, g, g64 in zip(("dweight", "dbias"), grads[1:], grads64[1:]):
        close(g, g64, 2 * TOL[F32], name)


def test_opcheck_fused_cuda(gpu):
    x = torch.randn(4, 5, 384, device=gpu, dtype=BF16, requires_grad=True)
    r = torch.randn(4, 5, 384, device=gpu, dtype=BF16, requires_grad=True)
    w = torch.randn(384, device=gpu, requires_grad=True)
    args = (x, r, w, None, "rmsnorm", 1e-6, True, True, "none", 0.0, inf)
    torch.library.opcheck(torch.ops.normjit.fused_norm_fwd.default, args)
    _, h, mean, rstd, mask = (t.detach() for t in torch.ops.normjit.fused_norm_fwd(*args))
    # The backward op's inputs as the autograd formula passes them: no gradient flows through it.
    torch.library.opcheck(torch.ops.normjit.fused_norm_bwd.default,
                          (torch.randn_like(x), torch.randn_like(x), h, w.detach(), mean, rstd, mask, "rmsnorm", True,
                           "none", False))


class _PreNormBlock(nn.Module):
    """Two pre-norm sublayers on a residual stream: the add of each feeds the next norm."""

    def __init__(self, dim):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(0.1 * torch.randn(dim)), nn.Parameter(torch.ones(dim))
        self.fc1, self.fc2 = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, residual, fused):
        if fused:
            y, h = nt.add_rms_norm(x, residual, self.w1, 1e-6, zero_centered=True)
            y2, h2 = nt.add_layer_norm(self.fc1(y), h, self.w2, None, 1e-5)
        else:
            h = x + residual
            y = F.rms_norm(h, h.shape[-1:], self.w1 + 1, 1e-6)
            h2 = self.fc1(y) + h
            y2 = F.layer_norm(h2, h2.shape[-1:], self.w2, None, 1e-5)
        return self.fc2(y2) + h2


def test_fused_block_compile_and_graph_replay(gpu):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    block = _PreNormBlock(512).to(gpu)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(lambda x, r: block(x, r, True), backend=counter, fullgraph=True)
    x = torch.randn(16, 512, device=gpu, requires_grad=True)
    r = torch.randn(16, 512, device=gpu)
    want = block(x, r, False)
    for fn in (lambda x, r: block(x, r, True), compiled):
        got = fn(x, r)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        (gx,) = torch.autograd.grad(got.square().sum(), x)
        (wx,) = torch.autograd.grad(want.square().sum(), x, retain_graph=True)
        torch.testing.assert_close(gx, wx, atol=1e-3, rtol=1e-3)
    assert counter.frame_count == 1
    # Captured in a CUDA graph (kernels already loaded above), replayed on new inputs.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block(x, r, True)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        r.copy_(torch.randn_like(r))
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(out, block(x, r, False), atol=1e-4, rtol=1e-4)


# ---- the C++ eager path against the Python one -----------------------------------------------

def _native_and_python(monkeypatch, fn, inputs):
    """fn's outputs and the gradients of its differentiable inputs through the C++ eager path and
    through the Python autograd path (the same kernels): ([outputs], [grads]) for each."""
    from normjit.torch import _native
    if _native.eager_norm is None:
        pytest.skip(f"no C++ eager path: {_native.why_not}")
    runs = []
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(_native, "eager_norm", None)
            leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None
                      for t in inputs]
            out = fn(*leaves)
            out = out if isinstance(out, tuple) else (out,)
            diff = [o for o in out if o.is_floating_point()]
            grads = torch.autograd.grad(diff, [t for t in leaves if t is not None and t.requires_grad],
                                        [torch.ones_like(o) * 0.5 + torch.arange(o.shape[-1], device=o.device) / o.shape[-1]
                                         for o in diff])
            runs.append((out, grads))
    return runs


@pytest.mark.parametrize("case", ["ln", "rms_strided", "rms_relu", "add_rms_zc", "add_ln_bf16_wf32", "ada_rms",
                                  "ln_no_weight"])
def test_native_path_equals_python_path(gpu, monkeypatch, case):
    torch.manual_seed(3)
    n = 1000 if case != "ada_rms" else 768
    x = make_x((6, 7), n, BF16, case == "rms_strided", gpu)
    w = torch.randn(n, device=gpu, dtype=F32 if case == "add_ln_bf16_wf32" else BF16)
    b = torch.randn_like(w)
    r = torch.randn_like(x)
    fns = {
        "ln": (lambda x, w, b: nt.layer_norm(x, (n,), w, b), (x, w, b)),
        "rms_strided": (lambda x, w: nt.rms_norm(x, (n,), w), (x, w)),
        "rms_relu": (lambda x, w: nt.rms_norm_relu(x, (n,), w, clip_lower=-0.5, clip_upper=1.0), (x, w)),
        "add_rms_zc": (lambda x, r, w: nt.add_rms_norm(x, r, w, zero_centered=True), (x, r, w)),
        "add_ln_bf16_wf32": (lambda x, r, w, b: nt.add_layer_norm(x, r, w, b), (x, r, w, b)),
        "ada_rms": (lambda x, w: nt.ada_rms_norm(x, w), (x.reshape(6, 7, n), torch.randn(6, n, device=gpu))),
        "ln_no_weight": (lambda x: nt.layer_norm(x, (n,)), (x,)),
    }
    fn, inputs = fns[case]
    (out_c, grads_c), (out_py, grads_py) = _native_and_python(monkeypatch, fn, inputs)
    assert len(out_c) == len(out_py) and len(grads_c) == len(grads_py)
    for a, b_ in zip(out_c + grads_c, out_py + grads_py):
        assert a.dtype == b_.dtype and a.shape == b_.shape and a.stride() == b_.stride()
        assert torch.equal(a, b_)
    assert "::NormFunction" in out_c[0].grad_fn.name()  # the C++ node, not the Python Function


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_native_backward_op_equals_autograd(gpu, norm):
    """torch.ops.normjit.eager_norm_backward with the saved statistics gives autograd's gradients bit for bit."""
    from normjit.torch import _native
    if _native.eager_norm is None:
        pytest.skip(f"no C++ eager path: {_native.why_not}")
    torch.manual_seed(5)
    n = 1000
    x = make_x((4, 9), n, BF16, True, gpu)
    w = torch.randn(n, device=gpu, dtype=F32)
    b = torch.randn_like(w) if norm == "layernorm" else None
    dy = torch.randn(4, 9, n, device=gpu, dtype=BF16)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    eps = 1e-5  # rms_norm's default is finfo(x.dtype).eps: the same eps on both sides
    y = (nt.layer_norm(leaves[0], (n,), *leaves[1:], eps=eps) if b is not None
         else nt.rms_norm(leaves[0], (n,), leaves[1], eps=eps))
    expected = torch.autograd.grad(y, leaves, dy)
    _, mean, rstd = torch.ops.normjit.norm_fwd(x, w, b, norm, eps, True, "none", 0.0, 0.0)[:3]
    got = torch.ops.normjit.eager_norm_backward(dy, None, x, w, mean if b is not None else None, rstd, None,
                                                _native.NORMS[norm], False, 0, b is not None)
    assert len(got) == 3 and (got[2] is None) == (b is None)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.equal(g, e)
    if b is not None:
        with pytest.raises(RuntimeError, match="norm=0 subtracts the mean and needs the saved mean"):
            torch.ops.normjit.eager_norm_backward(dy, None, x, w, None, rstd, None, 0, False, 0, True)


def test_native_path_capture_of_a_cold_spec_is_an_error(gpu):
    from normjit.torch import _native
    if _native.eager_norm is None:
        pytest.skip(f"no C++ eager path: {_native.why_not}")
    x = torch.randn(8, 344, device=gpu, dtype=F16)  # a size no other test loads
    with pytest.raises(RuntimeError, match=r"rmsnorm\.fwd_infer\.f16\.w_f16\.n344 .*run the op once"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            nt.rms_norm(x, 344)
    nt.rms_norm(x, 344)
    assert any("rmsnorm.fwd_infer.f16.w_f16.n344" in k for k in nt.loaded_kernels()[0])


@pytest.mark.parametrize("norm", ["adalayernorm", "adarmsnorm"])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "modulate"])
@pytest.mark.parametrize("n,strided", [(768, False), (4097, True)])
def test_add_ada_norm_against_float64(gpu, norm, zero_centered, n, strided):
    """h = x + residual bit-identical to torch's add; y = ada_norm(h) and the gradients against float64."""
    torch.manual_seed(n)
    x, r = make_x((3, 41), n, BF16, strided, gpu), make_x((3, 41), n, BF16, False, gpu)
    w = ((0.2 if zero_centered else 1.0) * torch.randn(3, n, device=gpu)).requires_grad_()
    b = torch.randn(3, n, device=gpu, requires_grad=True)
    x.requires_grad_(True)
    r.requires_grad_(True)
    fn = nt.add_ada_layer_norm if norm == "adalayernorm" else nt.add_ada_rms_norm
    y, h = fn(x, r, w, b, 1e-6, zero_centered=zero_centered)
    assert torch.equal(h, x.detach() + r.detach()), "h differs from x + residual"
    h64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (h, w, b))
    want = ref64(h64, w64 + 1 if zero_centered else w64, b64, norm, 1e-6)
    close(y, want.detach(), TOL[BF16], "y")
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    got = torch.autograd.grad((y, h), (x, r, w, b), (dy, dh))
    exp = torch.autograd.grad(want, (h64, w64, b64), dy.double())
    assert torch.equal(got[0], got[1]), "dx and dresidual differ"
    close(got[0], exp[0] + dh.double(), 2 * TOL[BF16], "dx", scale=10 * dy.abs().max().item())
    close(got[2], exp[1], 2 * TOL[F32], "dweight")
    close(got[3], exp[2], 2 * TOL[F32], "dbias")


# ---- quantized outputs ------------------------------------------------------------------------

def _codes_close(got, want, quant):
    """Codes within half a step of the format (the kernel's fp32 y may round a value on a boundary
    the other way), and equal to the float64 ones for all but a few boundary values."""
    got = got.double().cpu()
    if quant == "int8_row":
        assert (got - want).abs().max() <= 0.5 + 1e-3
        exact = (got == want.round()).double().mean().item()
    else:
        rel = 2.0 ** -4 if "e4m3" in quant else 2.0 ** -3
        bad = (got - want).abs() > rel * want.abs() + 2.0 ** -9
        assert not bad.any(), f"{int(bad.sum())} codes off by more than half a step"
        dtype = _launch_dtypes()[quant]
        exact = (got == want.to(dtype).double()).double().mean().item()
    assert exact >= 0.999, f"only {exact:.5f} of the codes equal the float64 ones"


def _launch_dtypes():
    from normjit.torch import _launch
    return _launch.QUANT_DTYPES


@pytest.mark.parametrize("quant", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_row", "fp8_e5m2_row", "int8_row", "mxfp8_e4m3",
                                   "mxfp8_e5m2"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dt", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("n,strided,residual", [(7, False, False), (4096, True, True), (5120, False, True),
                                                (20001, True, False)])
def test_quantized_against_float64(gpu, quant, norm, dt, n, strided, residual):
    torch.manual_seed(n)
    x = make_x((3, 5), n, dt, strided, "cuda")
    r = make_x((3, 5), n, dt, strided, "cuda") if residual else None
    w = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt) if norm == "layernorm" else None
    per_row = quant.endswith("_row")
    per_block = quant.startswith("mx")
    scale = None if per_row or per_block else torch.tensor([448.0 / 8], device="cuda")
    amax = None if per_row or per_block else torch.zeros(1, device="cuda")
    with torch.no_grad():
        y_q, scales, y, h = torch.ops.normjit.quant_norm_fwd(x, r, w, b, norm, 1e-5, False, quant, scale, amax, True)
    src = (x.float() + r.float()).to(dt) if residual else x
    if residual:
        assert torch.equal(h, src)
    assert y_q.shape == x.shape and y_q.stride() == x.stride()  # x's row layout, strided or not
    _check_quant_codes(quant, y_q, scales, amax, y, src.double().cpu(), w, b, norm, dt, n)


def _check_quant_codes(quant, y_q, scales, amax, y, x64, w, b, norm, dt, n):
    """The codes (FP8, int8, MXFP8) and scales of one eps = 1e-5 call that normalized the rows x64
    (x, or h = x + residual; float64 on the CPU), and its y, against float64; per-tensor formats
    with quant_scale 448 / 8 (amax its max |y|)."""
    from test_torch_cpu import _quant64
    per_row = quant.endswith("_row")
    per_block = quant.startswith("mx")
    w64, b64 = w.double().cpu(), None if b is None else b.double().cpu()
    want, want_scale = _quant64(x64, w64, b64, norm, 1e-5, quant, 448.0 / 8)
    if per_block:
        # The block scales equal the float64 ones but where a block's amax sits on a power of two
        # within fp32's error; the codes against the kernel's own X.
        got_x = torch.exp2(scales.view(torch.uint8).double().cpu() - 127)
        ratio = got_x / want_scale
        assert ((ratio == 1) | (ratio == 2) | (ratio == 0.5)).all() and (ratio == 1).double().mean() >= 0.999
        y64 = ref64(x64, w64, b64, norm, 1e-5)
        qmax = 448.0 if "e4m3" in quant else 57344.0
        blocks = F.pad(y64, (0, (-n) % 32)).reshape(y64.shape[:-1] + (-1, 32)) / got_x.unsqueeze(-1)
        want = blocks.reshape(y64.shape[:-1] + (-1,))[..., :n].clamp(-qmax, qmax)
    elif per_row:
        torch.testing.assert_close(scales.double().cpu(), want_scale, rtol=2e-5, atol=0)
        # The codes against the kernel's own scale: one ulp of the scale moves no code.
        want = (ref64(x64, w64, b64, norm, 1e-5) /
                scales.double().cpu()).clamp(-448.0 if "e4m3" in quant else -57344.0 if "e5m2" in quant else -127.0,
                                             448.0 if "e4m3" in quant else 57344.0 if "e5m2" in quant else 127.0)
    else:
        y64 = ref64(x64, w64, b64, norm, 1e-5)
        torch.testing.assert_close(amax.double().cpu(), y64.abs().max().reshape(1), rtol=1e-5, atol=0)
    _codes_close(y_q, want, quant)
    close(y, ref64(x64, w64, b64, norm, 1e-5).cuda(), TOL[dt], "y")


def test_quantized_functions_compile_and_graph_replay(gpu):
    x = torch.randn(64, 4096, device="cuda", dtype=BF16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=BF16)

    def block(x, r, w):
        q, s, h = nt.add_rms_norm_fp8(x, r, w)
        return q.float() * s, h

    with torch.no_grad():
        want = block(x, r, w)
        compiled = torch.compile(block, fullgraph=True)
        got = compiled(x, r, w)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        q8, s8 = nt.rms_norm_int8(x, 4096, w)  # warm the int8 spec before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gq, gs, gh = nt.add_rms_norm_fp8(x, r, w)
            g8, gs8 = nt.rms_norm_int8(x, 4096, w)
        x.copy_(torch.randn_like(x))
        graph.replay()
        q, s, h = nt.add_rms_norm_fp8(x, r, w)
        assert torch.equal(gq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(gs, s) and torch.equal(gh, h)
        q8, s8 = nt.rms_norm_int8(x, 4096, w)
        assert torch.equal(g8, q8) and torch.equal(gs8, s8)


@pytest.mark.parametrize("quant", ["mxfp4", "nvfp4", "mxfp8_e4m3"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dt", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("n,strided,residual", [(8, False, False), (4096, True, True), (5120, False, True),
                                                (20002, True, False)])
def test_block_scaled_fp4_against_float64_both_layouts(gpu, quant, norm, dt, n, strided, residual):
    """e2m1 codes (two a byte, first element low) and their scales against float64 y with the
    kernel's own scales; the swizzled layout holds the same scales at the 128x4 tiles' places
    (padding zero) and leaves the codes unchanged."""
    from normjit.torch import _reference
    torch.manual_seed(n)
    x = make_x((3, 5), n, dt, strided, "cuda")
    r = make_x((3, 5), n, dt, strided, "cuda") if residual else None
    w = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt) if norm == "layernorm" else None
    src = (x.float() + r.float()).to(dt) if residual else x
    y64 = ref64(src.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), norm, 1e-5)
    s_enc = torch.tensor([448.0 * 6 / y64.abs().max().item()], device="cuda") if quant == "nvfp4" else None
    with torch.no_grad():
        y_q, scales, y, h = torch.ops.normjit.quant_norm_fwd(x, r, w, b, norm, 1e-5, False, quant, s_enc, None, True)
        y_sw, scales_sw, _, _ = torch.ops.normjit.quant_norm_fwd(x, r, w, b, norm, 1e-5, False, quant, s_enc, None,
                                                                 False, "swizzled")
    assert torch.equal(y_sw.view(torch.uint8), y_q.view(torch.uint8))
    rows = 15
    assert scales_sw.shape == (128, (scales.shape[-1] + 3) // 4 * 4)
    assert torch.equal(scales_sw.view(torch.uint8).cpu(),
                       _reference.swizzle_block_scales(scales.reshape(rows, -1).cpu()).view(torch.uint8))
    if quant == "mxfp8_e4m3":
        return  # its codes: test_quantized_against_float64
    _check_fp4_codes(quant, y_q, scales, s_enc, y, y64, dt, n)


def _check_fp4_codes(quant, y_q, scales, s_enc, y, y64, dt, n):
    """e2m1 codes (mxfp4, nvfp4 with its S_enc s_enc) and their row-major block scales of one call,
    and its y, against y64 (its float64 y, on the CPU) with the kernel's own scales."""
    from normjit.torch import _launch
    from test_torch_cpu import _e2m1_values
    lead = tuple(y64.shape[:-1])
    block = 16 if quant == "nvfp4" else 32
    assert y_q.dtype == _launch.FP4 and y_q.shape == lead + (n // 2,)
    pad = (-n) % block
    blocks = F.pad(y64, (0, pad)).reshape(*lead, -1, block)
    if quant == "nvfp4":
        s = scales.double().cpu()
        want_s = (blocks.abs().amax(-1) / 6 * s_enc.item()).clamp(max=448.0)
        assert ((s - want_s).abs() <= want_s * 2.0 ** -4 * 1.001 + 2.0 ** -10).all()  # e4m3: half a step
        dequant = s / s_enc.item()
    else:
        dequant = torch.exp2(scales.view(torch.uint8).double().cpu() - 127)
        amax = blocks.abs().amax(-1)
        ratio = dequant / torch.exp2(torch.floor(torch.log2(amax)) - 2)
        assert ((ratio == 1) | (ratio == 2) | (ratio == 0.5)).all() and (ratio == 1).double().mean() >= 0.99
    got = F.pad(_e2m1_values(y_q.cpu()), (0, pad)).reshape(*lead, -1, block) * dequant.unsqueeze(-1)
    lim = 6 * dequant.unsqueeze(-1)
    want = torch.maximum(torch.minimum(blocks, lim), -lim)
    # Half a step of e2m1 (relative 2^-2; 0.25 of the scale near zero), plus y's fp32 error.
    bad = (got - want).abs() > 0.25 * want.abs() + 0.25 * dequant.unsqueeze(-1) + 1e-5 * (1 + want.abs())
    assert not bad.any(), f"{int(bad.sum())} codes off by more than half a step"
    close(y, y64.cuda(), TOL[dt], "y")


def test_fp4_functions_compile_and_graph_replay(gpu):
    x = torch.randn(64, 4096, device="cuda", dtype=BF16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=BF16)
    g = torch.tensor([100.0], device="cuda")

    def block(x, r, w):
        q, s, h = nt.add_rms_norm_nvfp4(x, r, w, global_scale=g, scale_layout="swizzled")
        q4, s4 = nt.rms_norm_mxfp4(h, 4096, w)
        return q.view(torch.uint8), s.view(torch.uint8), q4.view(torch.uint8), s4.view(torch.uint8), h

    with torch.no_grad():
        want = block(x, r, w)
        got = torch.compile(block, fullgraph=True)(x, r, w)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = block(x, r, w)
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(captured, block(x, r, w)))


# ---- quantized outputs on an fp32 residual stream ----------------------------------------------

_FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _add_rms_norm_quant(quant, x, r, w, scale, amax, **kw):
    """The add_rms_norm_* function of a format, eps 1e-5: (codes, scales, [y,] h); scale: fp8's
    quant_scale (None: per row) or nvfp4's global_scale."""
    if quant.startswith("fp8"):
        return nt.add_rms_norm_fp8(x, r, w, 1e-5, quant_scale=scale, amax=amax, fp8_dtype=_FP8_DTYPE[quant[4:8]], **kw)
    if quant == "int8_row":
        return nt.add_rms_norm_int8(x, r, w, 1e-5, **kw)
    if quant.startswith("mxfp8"):
        return nt.add_rms_norm_mxfp8(x, r, w, 1e-5, fp8_dtype=_FP8_DTYPE[quant[6:]], **kw)
    if quant == "mxfp4":
        return nt.add_rms_norm_mxfp4(x, r, w, 1e-5, **kw)
    return nt.add_rms_norm_nvfp4(x, r, w, 1e-5, global_scale=scale, **kw)


@pytest.mark.parametrize("quant", ["fp8_e4m3", "fp8_e5m2_row", "int8_row", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp4",
                                   "nvfp4"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dt,n,strided", [(BF16, 8, False), (BF16, 4096, True), (F16, 5120, False)],
                         ids=["bf16-n8", "bf16-n4096-strided", "f16-n5120"])
def test_add_quantized_f32_stream_against_float64(gpu, quant, norm, dt, n, strided):
    """A float32 residual beside a bf16 / f16 x with a quantized output (.residual_f32 with the
    quantizing epilogue): h = x + residual in fp32, bit-exact and kept float32 (not rounded to x's
    dtype); the codes and scales against float64 from h, checked as test_quantized_against_float64
    and test_block_scaled_fp4_against_float64_both_layouts check them; y in x's dtype. rmsnorm through
    the add_rms_norm_* functions (the eager launch path), layernorm through the op."""
    torch.manual_seed(n + 17 * strided)
    x = make_x((3, 5), n, dt, strided, gpu)
    r = make_x((3, 5), n, F32, strided, gpu)  # strided as x: one shared row layout
    w = torch.randn(n, device=gpu, dtype=dt)
    b = torch.randn(n, device=gpu, dtype=dt) if norm == "layernorm" else None
    h_want = x.float() + r
    y64 = ref64(h_want.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), norm, 1e-5)
    fp4 = quant in ("mxfp4", "nvfp4")
    if quant == "nvfp4":
        scale = torch.tensor([448.0 * 6 / y64.abs().max().item()], device=gpu)
    elif quant == "fp8_e4m3":
        scale = torch.tensor([448.0 / 8], device=gpu)
    else:
        scale = None
    amax = torch.zeros(1, device=gpu) if quant == "fp8_e4m3" else None
    with torch.no_grad():
        if norm == "rmsnorm":
            y_q, scales, y, h = _add_rms_norm_quant(quant, x, r, w, scale, amax, return_y=True)
        else:
            y_q, scales, y, h = torch.ops.normjit.quant_norm_fwd(x, r, w, b, norm, 1e-5, False, quant, scale, amax,
                                                                 True)
    assert h.dtype == F32 and h.shape == x.shape and h.stride() == x.stride() and y.dtype == dt
    assert torch.equal(h, h_want), "h differs from x + residual in fp32"
    bias = ".bias" if b is not None else ""
    spec = f"{norm}.fwd_infer.{DT_NAMES[dt]}.w_{DT_NAMES[dt]}.n{n}{bias}.residual_f32.{quant}"
    assert any(k.startswith(spec + ".") for k in nt.loaded_kernels()[0]), spec
    if fp4:
        assert y_q.stride()[:-1] == tuple(st // 2 for st in x.stride()[:-1])  # two codes a byte, x's rows
        _check_fp4_codes(quant, y_q, scales, scale, y, y64, dt, n)
    else:
        assert y_q.shape == x.shape and y_q.stride() == x.stride()
        _check_quant_codes(quant, y_q, scales, amax, y, h.double().cpu(), w, b, norm, dt, n)


def test_add_quantized_f32_stream_compile_and_graph_replay(gpu):
    """The fp32-stream quantized calls through torch.compile (the op's fake gives h float32) and
    in a captured CUDA graph: the same bits as eagerly."""
    x = torch.randn(64, 4096, device=gpu, dtype=BF16)
    r = 4 * torch.randn(64, 4096, device=gpu)
    w = torch.randn(4096, device=gpu, dtype=BF16)
    g = torch.tensor([100.0], device=gpu)

    def block(x, r, w):
        q, s, h = nt.add_rms_norm_fp8(x, r, w, 1e-5)
        q4, s4, h4 = nt.add_rms_norm_nvfp4(x, r, w, 1e-5, global_scale=g, scale_layout="swizzled")
        return q.view(torch.uint8), s, h, q4.view(torch.uint8), s4.view(torch.uint8), h4

    with torch.no_grad():
        want = block(x, r, w)
        assert want[2].dtype == want[5].dtype == F32
        got = torch.compile(block, fullgraph=True)(x, r, w)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = block(x, r, w)
        r.copy_(4 * torch.randn_like(r))
        graph.replay()
        again = block(x, r, w)
        assert torch.equal(again[2], x.float() + r)
        assert all(torch.equal(a, b) for a, b in zip(captured, again))


# ---- memory_efficient: the backward from y ----------------------------------------------------

MEMSAVE_CASES = [("layernorm", "bf16_wf32", 4096, False), ("rmsnorm", "bf16", 2880, True),
                 ("layernorm", "f32", 4097, True), ("rmsnorm", "f16", 18432, False),
                 ("layernorm", "bf16_wf32", 65536, False)]


@pytest.mark.parametrize("norm,dt,n,residual", MEMSAVE_CASES)
def test_memory_efficient_matches_the_backward_of_x(gpu, norm, dt, n, residual):
    """memory_efficient=True against the same call keeping x: y equal bit for bit, gradients within
    twice x's dtype's tolerance (x̂ from y carries y's rounding) times 1 + max |bias / weight|."""
    torch.manual_seed(n)
    x_dtype, w_dtype = DTYPES[dt]
    x = make_x((3, 11), n, x_dtype, False, gpu)
    r = make_x((3, 11), n, x_dtype, False, gpu) if residual else None
    w = (0.5 + torch.rand(n, device=gpu)).to(w_dtype)
    b = (0.5 * torch.randn(n, device=gpu)).to(w_dtype) if norm == "layernorm" else None
    outs = []
    for memory_efficient in (False, True):
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, r, w, b) if t is not None]
        it = iter(leaves)
        xi, ri, wi, bi = (next(it) if t is not None else None for t in (x, r, w, b))
        if residual:
            call = nt.add_layer_norm if norm == "layernorm" else nt.add_rms_norm
            args = (xi, ri, wi, bi, 1e-5) if norm == "layernorm" else (xi, ri, wi, 1e-5)
            y, h = call(*args, memory_efficient=memory_efficient)
            out = (y, h)
        else:
            y = (nt.layer_norm(xi, n, wi, bi, memory_efficient=memory_efficient) if norm == "layernorm"
                 else nt.rms_norm(xi, n, wi, 1e-5, memory_efficient=memory_efficient))
            out = (y,)
        torch.manual_seed(1)
        seeds = tuple(torch.randn_like(o) for o in out)
        grads = torch.autograd.grad(out, leaves, seeds)
        outs.append((out, grads))
    (out_x, grads_x), (out_y, grads_y) = outs
    for a, bb in zip(out_x, out_y):
        assert torch.equal(a, bb)
    ratio = (b.double().abs() / w.double().abs()).max().item() if b is not None else 0.0
    tol = 2 * TOL[x_dtype] * (1 + ratio)
    for name, gx, gy in zip(("dx", "dresidual" if residual else "dweight", "dweight", "dbias"), grads_x, grads_y):
        close(gy, gx.double(), tol, name)


def test_memory_efficient_compile_graph_and_refusal(gpu):
    torch.manual_seed(0)
    m = nt.LayerNorm(1024, memory_efficient=True).to(gpu)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_(0, 0.5)
    ref = nt.LayerNorm(1024).to(gpu)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(64, 1024, device=gpu, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True)
    for fn in (m, compiled):
        (gx,) = torch.autograd.grad(fn(x).square().sum(), x)
        (wx,) = torch.autograd.grad(ref(x).square().sum(), x)
        close(gx, wx.double(), 1e-4, "dx")
    # A zero in the weight: x̂ is lost there, and the eager call says so.
    with torch.no_grad():
        m.weight[5] = 0
    with pytest.raises(ValueError, match=r"layer_norm: memory_efficient=True .* element 5 of the weights: weight=0"):
        m(x)
