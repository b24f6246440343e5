"""fk.kl_div at every test level: Triton source (interpreter), CPU backend, autograd, opcheck,
torch.compile, TorchScript, the module, bad input, and the CUDA kernels (marker ``cuda``)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import fk
from helpers import (DTYPES, assert_close, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, round_nearest, round_toward_zero)

REDUCTIONS = ("none", "sum", "mean", "batchmean")


def ref_kl_div(x, t, reduction="batchmean", log_target=False, eps=1e-10):
    """float64 reference from the definition: sum of t * (log t - x) with t clamped to eps
    inside the log (t log t = 0 at t = 0), or exp(t) * (t - x) for log-targets."""
    x, t = x.double(), t.double()
    if log_target:
        pw = torch.exp(t) * (t - x)
    else:
        pw = torch.xlogy(t, torch.clamp(t, min=eps)) - t * x
    if reduction == "none":
        return pw
    total = pw.sum()
    if reduction == "mean":
        return total / pw.numel()
    if reduction == "batchmean" and pw.dim() > 0:
        return total / pw.shape[0]
    return total


def _inputs(shape, dtype=torch.float32, device="cpu", log_target=False, seed=0, zeros=True):
    """Log-probabilities x and (log-)probabilities t over the last dim; with zeros, some
    target probabilities are exactly 0 (log-targets -inf there)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.log_softmax(torch.randn(*shape, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(*shape, generator=g) * 2, -1)
    if zeros and p.numel() > 0:
        p.view(-1)[::5] = 0.0
    t = torch.log(p) if log_target else p
    return x.to(device=device, dtype=dtype), t.to(device=device, dtype=dtype)


def _ref_grad(x, t, grad_out, **kw):
    xd = x.detach().double().requires_grad_()
    ref_kl_div(xd, t, **kw).backward(grad_out.double())
    return xd.grad


# --- level 1: the Triton source under the interpreter ---------------------------------------

def _run_reduce(mod, x, t, scale, log_target, programs, block, eps=1e-10, write_grad=True):
    grad = torch.full_like(x, float("nan"))
    part = torch.full((programs,), float("nan"))
    loss = torch.full((), float("nan"))
    mod.kl_div_fwd_kernel[(programs,)](x, t, grad, part, x.numel(), eps, scale,
                                       int(log_target), int(write_grad), BLOCK=block, PER_SM=1)
    mod.kl_div_sum_kernel[(1,)](part, loss, programs, scale, BLOCK=4)
    return loss, grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log_target", [False, True])
def test_interpreter_reduce(dtype, log_target):
    """5 x 37 = 185 elements in tiles of 16: 11 full tiles and a partial one of 9, over 1,
    3 and 12 programs (more programs than tiles: some walk none)."""
    mod = load_triton_src("kl_div")
    x, t = _inputs((5, 37), dtype, log_target=log_target)
    for reduction, scale in (("sum", 1.0), ("batchmean", 1 / 5), ("mean", 1 / 185)):
        ref = ref_kl_div(x, t, reduction, log_target)
        ref_g = _ref_grad(x, t, torch.tensor(1.0), reduction=reduction, log_target=log_target)
        for programs in (1, 3, 12):
            loss, grad = _run_reduce(mod, x, t, scale, log_target, programs, 16)
            assert_close(loss, ref.float(), torch.float32, factor=2, what="loss")
            # scale * slope in fp32, one rounding to the dtype (exact for "sum" of -t).
            expect = round_toward_zero(ref_g.float(), dtype)
            if reduction == "sum" and not log_target:
                assert torch.equal(grad, expect)
            else:
                assert_close(grad, expect, dtype, what="grad")
    # Without the gradient: the gradient buffer is untouched.
    loss, grad = _run_reduce(mod, x, t, 1.0, log_target, 3, 16, write_grad=False)
    assert_close(loss, ref_kl_div(x, t, "sum", log_target).float(), torch.float32, factor=2)
    assert torch.isnan(grad).all()


def test_interpreter_reduce_exact_tiles_and_one_short_tile():
    mod = load_triton_src("kl_div")
    for shape in ((4, 16), (1, 5)):
        x, t = _inputs(shape)
        loss, grad = _run_reduce(mod, x, t, 1.0, False, 2, 16)
        assert_close(loss, ref_kl_div(x, t, "sum").float(), torch.float32, factor=2)
        assert torch.equal(grad, -t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log_target", [False, True])
def test_interpreter_pointwise(dtype, log_target):
    mod = load_triton_src("kl_div")
    x, t = _inputs((3, 45), dtype, log_target=log_target)
    g = torch.randn(3, 45, generator=torch.Generator().manual_seed(1)).to(dtype)
    for programs in (1, 4):
        out = torch.full_like(x, float("nan"))
        mod.kl_div_pointwise_kernel[(programs,)](x, t, out, x.numel(), 1e-10, int(log_target), 0,
                                                 BLOCK=16, PER_SM=1)
        ref = ref_kl_div(x, t, "none", log_target)
        assert_close(out, round_toward_zero(ref.float(), dtype), dtype, what="loss")
        back = torch.full_like(x, float("nan"))
        mod.kl_div_pointwise_kernel[(programs,)](g, t, back, x.numel(), 1e-10, int(log_target),
                                                 1, BLOCK=16, PER_SM=1)
        ref_g = _ref_grad(x, t, g, reduction="none", log_target=log_target)
        assert_close(back, round_toward_zero(ref_g.float(), dtype), dtype, what="grad")


def test_interpreter_zero_targets_and_eps():
    mod = load_triton_src("kl_div")
    x = torch.tensor([-1.0, -float("inf"), -2.0, -3.0, -0.5])
    t = torch.tensor([0.0, 0.0, 1e-12, 0.5, -0.25])
    out = torch.empty(5)
    mod.kl_div_pointwise_kernel[(1,)](x, t, out, 5, 1e-10, 0, 0, BLOCK=8, PER_SM=1)
    ref = ref_kl_div(x, t, "none", eps=1e-10).float()
    assert out[0] == 0 and torch.isnan(out[1]) and torch.isnan(ref[1])
    assert_close(out[2:], ref[2:], torch.float32)


# --- level 2: the CPU backend against the reference -----------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_target", [False, True])
def test_cpu_forward_backward(dtype, reduction, log_target):
    x, t = _inputs((9, 130), dtype, log_target=log_target)
    ref = ref_kl_div(x, t, reduction, log_target)
    xa = x.clone().requires_grad_()
    loss = fk.kl_div(xa, t, reduction, log_target)
    if reduction == "none":
        assert loss.dtype == dtype and loss.shape == x.shape
        assert_close(loss, round_nearest(ref.float(), dtype) if dtype != torch.float64 else ref,
                     dtype, factor=2, what="loss")
    else:
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        assert loss.dtype == acc and loss.shape == ()
        assert_close(loss, ref.to(acc), acc, factor=2, what="loss")
    g_out = (torch.rand(ref.shape, generator=torch.Generator().manual_seed(3)) + 0.5)
    loss.backward(g_out.to(loss.dtype))
    # The gradient is rounded to the dtype in the forward and once more when scaled.
    ref_g = _ref_grad(x, t, g_out, reduction=reduction, log_target=log_target)
    assert xa.grad.dtype == dtype
    assert_close(xa.grad, ref_g, dtype, factor=3, what="grad")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_target", [False, True])
def test_cpu_matches_torch(reduction, log_target):
    x, t = _inputs((16, 300), log_target=log_target)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about "mean"
        ref = F.kl_div(xb, t, reduction=reduction, log_target=log_target)
    out = fk.kl_div(xa, t, reduction, log_target)
    assert_close(out, ref, torch.float32)
    g = torch.rand_like(ref) + 0.5
    out.backward(g)
    ref.backward(g)
    assert_close(xa.grad, xb.grad, torch.float32)


def test_any_rank():
    for shape in ((2, 3, 17), (40,), (), (5, 1)):
        x, t = _inputs(shape, zeros=False) if shape else (torch.tensor(-0.7), torch.tensor(0.4))
        for reduction in REDUCTIONS:
            xa = x.clone().requires_grad_()
            out = fk.kl_div(xa, t, reduction)
            ref = ref_kl_div(x, t, reduction)
            assert out.shape == ref.shape
            assert_close(out, ref.float(), torch.float32, factor=2)
            out.backward(torch.ones_like(out))
            assert_close(xa.grad, _ref_grad(x, t, torch.ones(ref.shape), reduction=reduction),
                         torch.float32, factor=2)


def test_zero_targets_eps_and_torch_differences():
    x = torch.tensor([[-1.0, -float("inf"), -2.0, -3.0, -0.5]])
    t = torch.tensor([[0.0, 0.0, 1e-12, 0.5, 0.25]])
    ref_torch = F.kl_div(x, t, reduction="none")
    out = fk.kl_div(x, t, "none")
    # t == 0: 0 (NaN where input is -inf), as torch.
    assert out[0, 0] == 0 and torch.isnan(out[0, 1]) and torch.isnan(ref_torch[0, 1])
    # 0 < t < eps: t log eps instead of t log t; eps = 0 is torch's formula.
    assert_close(out[0, 2:], ref_kl_div(x, t, "none")[0, 2:].float(), torch.float32)
    assert not torch.allclose(out[0, 2], ref_torch[0, 2], rtol=1e-3, atol=0)
    assert torch.allclose(fk.kl_div(x, t, "none", eps=0.0), ref_torch, equal_nan=True)
    # Negative targets (not probabilities): torch NaN, fk t (log eps - x).
    neg = fk.kl_div(torch.tensor([-1.0]), torch.tensor([-0.5]), "none")
    assert_close(neg, torch.tensor([-0.5 * (torch.log(torch.tensor(1e-10)).item() + 1.0)]),
                 torch.float32)
    # log_target: eps unused; t = -inf gives exp(-inf) * (-inf) = NaN, as torch.
    lt = torch.tensor([[-float("inf"), -1.0]])
    out_lt = fk.kl_div(torch.tensor([[-2.0, -3.0]]), lt, "none", True)
    ref_lt = F.kl_div(torch.tensor([[-2.0, -3.0]]), lt, reduction="none", log_target=True)
    assert torch.isnan(out_lt[0, 0]) and torch.isnan(ref_lt[0, 0])
    assert_close(out_lt[0, 1], ref_lt[0, 1], torch.float32)


def test_nan_inf_propagate_like_torch():
    x, t = _inputs((3, 20))
    x[0, 3], x[1, 4], t[2, 6] = float("nan"), float("inf"), float("nan")
    for reduction in ("none", "sum"):
        out, ref = fk.kl_div(x, t, reduction), F.kl_div(x, t, reduction=reduction)
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        assert torch.equal(torch.isinf(out), torch.isinf(ref))


def test_empty():
    for shape in ((0, 5), (3, 0), (0,)):
        x = torch.zeros(shape, requires_grad=True)
        for reduction in ("sum", "mean", "batchmean"):
            out = fk.kl_div(x, torch.zeros(shape), reduction)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = F.kl_div(x.detach(), torch.zeros(shape), reduction=reduction)
            assert out.dtype == torch.float32 and torch.equal(out.isnan(), ref.isnan())
            assert out.isnan() or out == 0
            out.backward()
            assert x.grad.shape == shape
        assert fk.kl_div(x, torch.zeros(shape), "none").shape == shape


def test_non_contiguous_inputs():
    x, t = _inputs((20, 12))
    xt, tt = x.t().contiguous().t(), t[:, :]
    xs = torch.cat([x, x], 1)[:, ::2]
    for xi in (xt, xs):
        xa = xi.clone().requires_grad_() if xi is xt else xi.detach().requires_grad_()
        out = fk.kl_div(xa, tt, "batchmean")
        assert_close(out, ref_kl_div(xi, t).float(), torch.float32)
        out.backward()
        assert_close(xa.grad, -t / 20, torch.float32)


def test_target_requires_grad_is_a_clear_error():
    x, t = _inputs((3, 8))
    ta = t.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="target requires grad"):
        fk.kl_div(x.requires_grad_(), ta)
    with torch.no_grad():  # no gradient wanted: fine
        assert_close(fk.kl_div(x, ta), ref_kl_div(x, t).float(), torch.float32)
    fk.kl_div(x, ta.detach()).backward()


def test_input_without_grad_gets_no_graph():
    x, t = _inputs((3, 8))
    out = fk.kl_div(x, t)
    assert not out.requires_grad


def test_module():
    x, t = _inputs((6, 30))
    for kw in (dict(), dict(reduction="batchmean"), dict(reduction="sum", log_target=True)):
        tt = torch.log(t) if kw.get("log_target") else t
        m, ref = fk.nn.KLDivLoss(**kw), torch.nn.KLDivLoss(**kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_close(m(x, tt), ref(x, tt), torch.float32)
    assert fk.nn.KLDivLoss().reduction == "mean"  # torch's default
    with pytest.warns(UserWarning):  # legacy arguments map as in torch
        legacy = fk.nn.KLDivLoss(size_average=False)
    assert legacy.reduction == "sum"
    with pytest.raises(ValueError, match="reduction"):
        fk.nn.KLDivLoss(reduction="avg")
    with pytest.raises(ValueError, match="eps"):
        fk.nn.KLDivLoss(eps=-1.0)
    assert "eps=" in repr(fk.nn.KLDivLoss(eps=1e-8))


def test_retain_graph_backward_twice():
    x, t = _inputs((4, 16))
    xa = x.clone().requires_grad_()
    loss = fk.kl_div(xa * 1, t)
    loss.backward(torch.tensor(3.0), retain_graph=True)
    first = xa.grad.clone()
    loss.backward(torch.tensor(3.0))
    assert_close(xa.grad, 2 * first, torch.float32)
    assert_close(first, _ref_grad(x, t, torch.tensor(3.0)), torch.float32)


@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_double_backward_is_a_clear_error(reduction):
    x, t = _inputs((4, 16))
    xa = x.clone().requires_grad_()
    out = fk.kl_div(xa * 1, t, reduction)
    g_out = torch.ones_like(out, requires_grad=True)
    (g,) = torch.autograd.grad(out, xa, g_out, create_graph=True)
    assert_close(g, _ref_grad(x, t, torch.ones(out.shape), reduction=reduction), torch.float32)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.pow(2).sum().backward()


# --- bad input -----------------------------------------------------------------------------

def _bad(**over):
    def make(d):
        args = dict(input=torch.ones(3, 5, device=d), target=torch.ones(3, 5, device=d),
                    reduction="batchmean", log_target=False, eps=1e-10)
        args.update({k: (v(d) if callable(v) else v) for k, v in over.items()})
        return args
    return make


BAD = [
    ("input int", _bad(input=lambda d: torch.ones(3, 5, dtype=torch.int32, device=d),
                       target=lambda d: torch.ones(3, 5, dtype=torch.int32, device=d)),
     "input has dtype Int, which is not supported"),
    ("dtypes differ", _bad(target=lambda d: torch.ones(3, 5, dtype=torch.bfloat16, device=d)),
     "input and target must have the same dtype"),
    ("shapes differ", _bad(target=lambda d: torch.ones(3, 1, device=d)),
     "input and target must have the same shape"),
    ("reduction", _bad(reduction="avg"), "reduction must be one of"),
    ("eps", _bad(eps=-1.0), "eps must be non-negative, got -1"),
]


def _call_bad(make, device):
    a = make(device)
    return torch.ops.fk.kl_div(a["input"], a["target"], a["reduction"], a["log_target"],
                               a["eps"])


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta and cpu.startswith("fk::kl_div: ")


def test_bad_backward_input_cpu_and_meta_agree():
    def call(d):
        return torch.ops.fk._kl_div_backward(torch.ones(3, 5, device=d),
                                             torch.ones(3, 4, device=d), False)
    cpu, meta = error_lines(call, ("cpu", "meta"), "must have the same shape")
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.kl_div(torch.ones(2, 4), torch.ones(2, 4, device="meta"))


# --- level 3: autograd, opcheck, torch.compile, TorchScript ---------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_target", [False, True])
def test_gradcheck(reduction, log_target):
    x, t = _inputs((4, 7), torch.float64, log_target=log_target, zeros=False)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fk.kl_div(x, t, reduction, log_target), (x,))


def test_opcheck():
    x, t = _inputs((5, 11))
    for args in ((x.clone().requires_grad_(), t, "batchmean", False, 1e-10),
                 (x.clone().requires_grad_(), torch.log(t + 1e-3), "none", True, 1e-10),
                 (x.clone().requires_grad_(), t, "mean", False, 0.0),
                 (x.clone(), t, "sum", False, 1e-6)):
        torch.library.opcheck(torch.ops.fk.kl_div, args)
    internal = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    for reduction in ("sum", "none"):
        torch.library.opcheck(torch.ops.fk._kl_div_forward, (x, t, reduction, False, 1e-10, True),
                              test_utils=internal)
    torch.library.opcheck(torch.ops.fk._kl_div_backward, (torch.randn(5, 11), t, True),
                          test_utils=internal)


def test_torch_compile_fullgraph():
    def step(h, w, t):
        return fk.kl_div(h @ w, t) + fk.kl_div(h @ w, t, "none").sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        g = torch.Generator().manual_seed(rows)
        h = torch.randn(rows, 16, generator=g).requires_grad_()
        w = torch.randn(16, 40, generator=g).requires_grad_()
        t = torch.softmax(torch.randn(rows, 40, generator=g), -1)
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = compiled(h, w, t), step(h2, w2, t)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        assert_close(h.grad, h2.grad, torch.float32, factor=10)
        assert_close(w.grad, w2.grad, torch.float32, factor=10)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_module(tmp_path):
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 20)
            self.loss = fk.nn.KLDivLoss(reduction="batchmean", eps=1e-8)

        def forward(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return self.loss(torch.log_softmax(self.proj(h), -1), t)

    torch.manual_seed(0)
    m = Head()
    h, t = torch.randn(6, 8), torch.softmax(torch.randn(6, 20), -1)
    scripted = torch.jit.script(m)
    path = tmp_path / "head.pt"
    scripted.save(str(path))
    loaded = torch.jit.load(str(path))
    assert_close(loaded(h, t), m(h, t), torch.float32)
    assert_close(loaded(h, t), m(h, t), torch.float32)  # optimized on the second call
    loaded(h, t).backward()
    g = loaded.proj.weight.grad.clone()
    m.zero_grad()
    m(h, t).backward()
    assert_close(g, m.proj.weight.grad, torch.float32)


# --- level 5: CUDA kernels -----------------------------------------------------------------

CUDA_V = [1, 7, 100, 1000, 4095, 4096, 8193, 32000, 50257, 128256]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", CUDA_V)
@pytest.mark.parametrize("log_target", [False, True])
def test_cuda_matches_reference(dtype, v, log_target):
    n = 37 if v <= 32000 else 5
    x, t = _inputs((n, v), dtype, "cuda", log_target=log_target, seed=v)
    xc, tc = x.cpu(), t.cpu()
    for reduction in REDUCTIONS:
        ref = ref_kl_div(xc, tc, reduction, log_target)
        poison_cuda_cache()
        xa = x.clone().requires_grad_()
        loss = fk.kl_div(xa, t, reduction, log_target)
        if reduction == "none":
            assert loss.dtype == dtype
            assert_close(loss, round_nearest(ref.float(), dtype), dtype, factor=2, what="loss")
        else:
            assert loss.dtype == torch.float32 and loss.shape == ()
            assert_close(loss, ref.float(), torch.float32, factor=2, what="loss")
        g_out = torch.rand(ref.shape, device="cuda") + 0.5
        loss.backward(g_out.to(loss.dtype))
        assert not torch.isnan(xa.grad).any(), "unwritten gradient elements"
        ref_g = _ref_grad(xc, tc, g_out.cpu(), reduction=reduction, log_target=log_target)
        if reduction != "none":  # scale * slope rounded to the dtype, then times g_out
            ref_g = round_nearest(ref_g / g_out.cpu().double(), dtype).double() * g_out.cpu()
        # (float16: target / rows, and / (rows * V) for "mean", lie in the subnormal range,
        # rounded once in the forward and again times grad_output)
        assert_close(xa.grad, ref_g, dtype, factor=3, what="grad",
                     rounding=2 if dtype == torch.float16 else 0)
        with torch.no_grad():
            out = fk.kl_div(x, t, reduction, log_target)
            assert_close(out, loss.detach(), dtype if reduction == "none" else torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_llama_shapes_one_row_misaligned_non_contiguous(dtype):
    for shape in ((1, 128256), (3, 151936), (2, 5, 4099)):
        x, t = _inputs(shape, dtype, "cuda", seed=shape[-1])
        xa = x.clone().requires_grad_()
        loss = fk.kl_div(xa, t)
        loss.backward()
        assert_close(loss, ref_kl_div(x.cpu(), t.cpu()).float(), torch.float32, factor=2)
        # -t * fp32(1 / size(0)) in fp32, rounded once to the dtype.
        ref_g = round_nearest(_ref_grad(x.cpu(), t.cpu(), torch.tensor(1.0)), dtype)
        assert_close(xa.grad, ref_g, dtype, what="grad")
    x, t = _inputs((5, 1001), dtype, "cuda")
    for xi, ti in ((misaligned(x), t), (x, misaligned(t)), (misaligned(x), misaligned(t))):
        xa = xi.detach().requires_grad_()
        for reduction in ("batchmean", "none"):
            out = fk.kl_div(xa, ti, reduction)
            ref = ref_kl_div(x.cpu(), t.cpu(), reduction)
            assert_close(out, ref.to(out.dtype), out.dtype, factor=2)
            out.backward(torch.ones_like(out))
        assert_close(xa.grad, -t * (1 + 1 / 5), dtype, factor=3)
    xt = x.t().contiguous().t().requires_grad_()
    fk.kl_div(xt, t, "sum").backward()
    assert torch.equal(xt.detach(), x) and torch.equal(xt.grad, -t)


@pytest.mark.cuda
def test_cuda_partial_sums_over_many_programs_are_deterministic():
    x, t = _inputs((8192, 4097), torch.float32, "cuda", seed=5)
    losses = [fk.kl_div(x, t) for _ in range(3)]
    assert all(torch.equal(losses[0], l) for l in losses[1:])
    assert_close(losses[0], ref_kl_div(x.cpu(), t.cpu()).float(), torch.float32, factor=2)


@pytest.mark.cuda
def test_cuda_empty_zero_targets_and_nan():
    x, t = _inputs((4, 300), device="cuda")
    x[0, 0], t[0, 0] = -float("inf"), 0.0
    out = fk.kl_div(x, t, "none")
    ref = F.kl_div(x, t, reduction="none")
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().sum() == 1
    assert torch.isnan(fk.kl_div(x, t))
    e = torch.empty(0, 8, device="cuda", requires_grad=True)
    assert torch.isnan(fk.kl_div(e, e.detach(), "mean"))
    assert fk.kl_div(e, e.detach(), "sum") == 0
    fk.kl_div(e, e.detach(), "sum").backward()
    assert e.grad.shape == (0, 8)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.kl_div(torch.ones(2, 4, dtype=torch.float64, device="cuda"),
                  torch.ones(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.kl_div(torch.ones(2, 4, device="cuda"), torch.ones(2, 4))


@pytest.mark.cuda
def test_cuda_graph_capture():
    shape = (64, 5000)
    x, t = _inputs(shape, torch.bfloat16, "cuda")
    static_x, static_t = x.clone().requires_grad_(), t.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (loads the kernels) outside the capture
        fk.kl_div(static_x * 1, static_t).backward()
        fk.kl_div(static_x * 1, static_t, "none").sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    static_x.grad = None
    two = torch.tensor(2.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = fk.kl_div(static_x * 1, static_t)
        static_loss.backward(two)
        static_none = fk.kl_div(static_x * 1, static_t, "none")
        static_none.backward(torch.full_like(static_none, 0.5))
    for seed in (1, 2):
        x2, t2 = _inputs(shape, torch.bfloat16, "cuda", seed=seed)
        with torch.no_grad():
            static_x.copy_(x2)
        static_t.copy_(t2)
        graph.replay()
        assert_close(static_loss, ref_kl_div(x2.cpu(), t2.cpu()).float(), torch.float32,
                     factor=2)
        ref_none = ref_kl_div(x2.cpu(), t2.cpu(), "none")
        assert_close(static_none, ref_none.float(), torch.bfloat16, factor=2)
        ref_g = -t2.cpu().double() * (2 / 64 + 0.5)
        assert_close(static_x.grad, ref_g, torch.bfloat16, factor=3)


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    x, t = _inputs((5, 33), device="cuda")
    for reduction in ("batchmean", "none"):
        torch.library.opcheck(torch.ops.fk.kl_div,
                              (x.clone().requires_grad_(), t, reduction, False, 1e-10))
    f = torch.compile(lambda x, t: fk.kl_div(x * 2, t), fullgraph=True, backend="aot_eager")
    xa = x.clone().requires_grad_()
    f(xa, t).backward()
    assert_close(xa.grad, -2 * t / 5, torch.float32)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    v = 128256
    n = (1 << 31) // v + 3
    x = torch.full((n, v), -11.0, device="cuda", dtype=torch.bfloat16)
    t = torch.full((n, v), 1 / 65536, device="cuda", dtype=torch.bfloat16)
    t[-1, -5:] = 0.25
    xa = x.clone().requires_grad_()
    loss = fk.kl_div(xa, t, "sum")
    loss.backward()
    tail = ref_kl_div(x[-1:].cpu(), t[-1:].cpu(), "sum")
    body = ref_kl_div(x[:1].cpu(), t[:1].cpu(), "sum")
    assert_close(loss, (body * (n - 1) + tail).float(), torch.float32, factor=10)
    assert torch.equal(xa.grad[-1, -5:], -t[-1, -5:]) and torch.equal(xa.grad[0, :3], -t[0, :3])
    del xa, loss
    out = fk.kl_div(x, t, "none")
    assert_close(out[-1:], ref_kl_div(x[-1:].cpu(), t[-1:].cpu(), "none").to(torch.bfloat16),
                 torch.bfloat16, factor=2)
    del x, t, out
    torch.cuda.empty_cache()
