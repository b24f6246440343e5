"""torch.autocast over the ops that carry matmuls (fused_linear_cross_entropy,
fused_linear_jsd, swiglu_linear): under autocast with float32 inputs, each op must give what
it gives on inputs cast to the autocast dtype by hand (matmuls in the autocast dtype, as
F.linear), losses in float32 (as F.cross_entropy), gradients reaching the float32 leaves in
float32; on every route (the Python wrapper, torch.ops, torch.compile, TorchScript)."""
import pytest
import torch

import fk
from fk.ops import _autocast

CPU = [("cpu", torch.bfloat16)]
CUDA = [pytest.param("cuda", d, marks=pytest.mark.cuda) for d in (torch.bfloat16, torch.float16)]
CASES = CPU + CUDA


def _leaves(*shapes, device, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=g) * scale).to(device).requires_grad_() for s in shapes]


# One entry per op: (make inputs, call through the wrapper, call through torch.ops, which of
# the inputs are differentiable leaves, float32 outputs?)

def _flce_inputs(device):
    x, w, b = _leaves((7, 16), (37, 16), (37,), device=device)
    t = torch.randint(0, 37, (7,), device=device)
    t[2] = -100
    return [x, w, t, b]


def _flce(x, w, t, b, **kw):
    return fk.fused_linear_cross_entropy(x, w, t, b, lse_square_scale=1e-4, chunk_size=3, **kw)


def _flce_op(x, w, t, b):
    return torch.ops.fk.fused_linear_cross_entropy(x, w, t, b, None, -100, 0.0, "mean", 1e-4,
                                                   None, 3, None)[0]


def _jsd_inputs(device):
    xs, ws, xt, wt = _leaves((6, 16), (29, 16), (6, 12), (29, 12), device=device, seed=1)
    xt.requires_grad_(False), wt.requires_grad_(False)
    labels = torch.tensor([1, -100, 3, 4, -100, 2], device=device)
    return [xs, ws, xt, wt, labels]


def _jsd(xs, ws, xt, wt, labels):
    return fk.fused_linear_jsd(xs, ws, xt, wt, labels, beta=0.3, temperature=1.5, chunk_size=4)


def _jsd_op(xs, ws, xt, wt, labels):
    return torch.ops.fk.fused_linear_jsd(xs, ws, xt, wt, labels, 0.3, -100, 1.5, 4)


def _swiglu_inputs(device):
    return _leaves((2, 5, 16), (24, 16), (24, 16), device=device, seed=2)


def _swiglu(x, wg, wu):
    return fk.swiglu_linear(x, wg, wu)


def _swiglu_op(x, wg, wu):
    return torch.ops.fk.swiglu_linear(x, wg, wu)


def _swiglu_recompute(x, wg, wu):
    return fk.swiglu_linear(x, wg, wu, recompute=True)


def _router_inputs(device):
    return _leaves((2, 5, 16), (12, 16), device=device, seed=3)


def _router(x, w):
    return fk.router_logits(x, w)


def _router_op(x, w):
    return torch.ops.fk.router_logits(x, w)


OPS = {
    "router_logits": (_router_inputs, _router, _router_op, True),
    "fused_linear_cross_entropy": (_flce_inputs, _flce, _flce_op, True),
    "fused_linear_jsd": (_jsd_inputs, _jsd, _jsd_op, True),
    "swiglu_linear": (_swiglu_inputs, _swiglu, _swiglu_op, False),
}
# What the by-hand call passes so that its loss is, like autocast's, computed and returned in
# float32 (fused_linear_cross_entropy's default loss dtype is its input's).
HAND_KWARGS = {"fused_linear_cross_entropy": {"loss_dtype": torch.float32}}
ROUTES = ("wrapper", "torch.ops", "compile")


def _run(fn, inputs, device, dtype, autocast):
    """fn's output and the gradients of inputs' leaves (a fixed grad_output)."""
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    for t in leaves:
        t.grad = None
    with torch.autocast(device, dtype=dtype, enabled=autocast):
        out = fn(*inputs)
    g = torch.linspace(0.5, 1.5, out.numel(), device=device).reshape(out.shape)
    (out.float() * g).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _cast_by_hand(inputs, dtype):
    """The inputs as the autocast rule casts them, through a differentiable cast."""
    return [t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for t in inputs]


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("op", sorted(OPS))
def test_autocast_equals_inputs_cast_by_hand(op, route, device, dtype):
    make, wrapper, via_ops, is_loss = OPS[op]
    fn = {"wrapper": wrapper, "torch.ops": via_ops}.get(route)
    if route == "compile":
        torch._dynamo.reset()
        # (Inductor's CUDA code generation needs Triton, which the GPU tests block)
        fn = torch.compile(wrapper, fullgraph=True,
                           backend="inductor" if device == "cpu" else "aot_eager")
    inputs = make(device)
    out, grads = _run(fn, inputs, device, dtype, autocast=True)
    kw = HAND_KWARGS.get(op, {})
    want, want_grads = _run(lambda *a: wrapper(*_cast_by_hand(a, dtype), **kw), inputs, device,
                            dtype, autocast=False)
    assert out.dtype == (torch.float32 if is_loss else dtype)
    assert want.dtype == out.dtype
    exact = dict(atol=0, rtol=0) if route != "compile" and device == "cpu" else {}
    torch.testing.assert_close(out, want.to(out.dtype), **exact)
    for g, w in zip(grads, want_grads):
        assert g.dtype == torch.float32  # the float32 leaves get float32 gradients
        torch.testing.assert_close(g, w, **exact)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_autocast_off_or_float64_is_unchanged(op, device, dtype):
    make, wrapper, _, _ = OPS[op]
    inputs = make(device)
    out, grads = _run(wrapper, inputs, device, dtype, autocast=False)
    assert out.dtype == torch.float32
    # Under autocast of another device type nothing is cast.
    other = "cuda" if device == "cpu" else "cpu"
    with torch.autocast(other, dtype=torch.bfloat16):
        assert wrapper(*inputs).dtype == torch.float32
    if device == "cpu":  # float64 is never cast (torch's rule)
        inputs64 = [t.detach().double().requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                    for t in inputs]
        out64, _ = _run(wrapper, inputs64, device, dtype, autocast=True)
        assert out64.dtype == torch.float64


@pytest.mark.parametrize("device,dtype", CASES)
def test_fused_linear_cross_entropy_class_weights_stay(device, dtype):
    """ce_weight (cross entropy's class weights) is not a matmul input: left as given."""
    x, w, t, b = _flce_inputs(device)
    ce_weight = torch.rand(37, device=device) + 0.5
    with torch.autocast(device, dtype=dtype):
        loss, z = fk.fused_linear_cross_entropy(x, w, t, b, ce_weight, label_smoothing=0.1,
                                                lse_square_scale=1e-3, return_z_loss=True)
    assert loss.dtype == z.dtype == torch.float32
    want, want_z = fk.fused_linear_cross_entropy(x.to(dtype), w.to(dtype), t, b.to(dtype),
                                                 ce_weight, label_smoothing=0.1,
                                                 lse_square_scale=1e-3, return_z_loss=True,
                                                 loss_dtype=torch.float32)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(z, want_z)


def test_modules_under_autocast():
    torch.manual_seed(0)
    head = fk.nn.FusedLinearCrossEntropyLoss()
    x = torch.randn(5, 16, requires_grad=True)
    lin = torch.nn.Linear(16, 23, bias=False)
    t = torch.randint(0, 23, (5,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head(lin.weight, x, t)
        ref = torch.nn.functional.cross_entropy(lin(x), t)  # torch's own AMP: bf16 linear
    assert loss.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=0)
    loss.backward()
    assert lin.weight.grad.dtype == torch.float32
    mlp = fk.nn.FusedSwiGLU(16, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mlp(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in mlp.parameters())


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_under_autocast():
    @torch.jit.script
    def f(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, wg: torch.Tensor):
        loss = torch.ops.fk.fused_linear_cross_entropy(x, w, t)[0]
        return loss, torch.ops.fk.swiglu_linear(x, wg, wg)

    x, w, b = _flce_inputs("cpu")[:2] + [None]
    t = torch.randint(0, 37, (7,))
    wg = torch.randn(24, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, y = f(x, w, t, wg)
    assert loss.dtype == torch.float32 and y.dtype == torch.bfloat16
    want = fk.fused_linear_cross_entropy(x.bfloat16(), w.bfloat16(), t, loss_dtype=torch.float32)
    torch.testing.assert_close(loss, want, atol=0, rtol=0)
    loss.backward()
    assert w.grad.dtype == torch.float32


def test_rules_cover_the_matmul_ops():
    assert _autocast.RULES == {
        "fused_linear_cross_entropy": ("x", "weight", "bias"),
        "fused_linear_jsd": ("student_input", "student_weight", "teacher_input",
                             "teacher_weight"),
        "_swiglu_linear_forward": ("x", "w_gate", "w_up"),
        "router_logits": ("x", "weight"),
    }


def test_norms_keep_their_input_dtype_under_autocast():
    """Norms are not on torch's lower-precision list: under autocast they run on what they are
    given (float32 residual streams stay float32); a float32 weight with 16-bit x is an error
    naming the dtypes (fk.transformers and fk.liger cast such weights to x's dtype)."""
    x = torch.randn(3, 16)
    w = torch.randn(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fk.rms_norm(x, w).dtype == torch.float32
        assert fk.layer_norm(x, w, w).dtype == torch.float32
        with pytest.raises(RuntimeError, match="x and weight must have the same dtype"):
            fk.rms_norm(x.bfloat16(), w)
