"""fk.geglu at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import math

import pytest
import torch
import torch.nn.functional as F

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_geglu, ref_gelu, ref_grads, round_toward_zero)

MODES = ("tanh", "none")
SHAPES = [(1,), (7,), (3, 257), (2, 3, 1000), (5, 4096)]


# --- the reference: helpers.ref_gelu / ref_geglu, and the tails without cancellation ------

def _gelu_tails(a, approximate):
    """The same functions without the cancellation of 1 + tanh(z) and 1 + erf(x) for large
    negative a (which costs even float64 every digit below a = -7): 1 + tanh(z) =
    2 sigmoid(2z), 1 + erf(x) = erfc(-x)."""
    if approximate == "tanh":
        return a * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))
    return 0.5 * a * torch.special.erfc(-a / math.sqrt(2))


def _gelu_mul(approximate, gelu=ref_gelu):
    return lambda a, b: gelu(a, approximate) * b


def _ref_grads(a, b, dc, approximate):
    return ref_grads(_gelu_mul(approximate), [a.detach().requires_grad_(),
                                              b.detach().requires_grad_()], dc)


# --- level 1: the Triton source under the interpreter ---------------------------------

pytestmark = [
    # The interpreter's exp overflows to inf for sigmoid's far tail, as the GPU's does.
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 100, 2048, 5000])
@pytest.mark.parametrize("approximate", MODES)
def test_interpreter_forward_backward(dtype, n, approximate):
    mod = load_triton_src("geglu")
    approx = mod.MODES["erf" if approximate == "none" else approximate]
    block = 1024
    a, b, dc = (randn(n, dtype=dtype) for _ in range(3))
    c = torch.full_like(a, float("nan"))
    grid = (cdiv(n, block),)
    mod.geglu_fwd_kernel[grid](a, b, c, n, APPROX=approx, BLOCK=block)
    assert_close(c, ref_geglu(a, b, approximate, cast=round_toward_zero), dtype, what="c")
    da, db = torch.full_like(a, float("nan")), torch.full_like(a, float("nan"))
    mod.geglu_bwd_kernel[grid](dc, a, b, da, db, n, APPROX=approx, BLOCK=block)
    ga, gb = _ref_grads(a, b, dc, approximate)
    assert_close(da, round_toward_zero(ga.float(), dtype), dtype, factor=2, what="da")
    assert_close(db, round_toward_zero(gb.float(), dtype), dtype, factor=2, what="db")


def _wide_range_inputs(steps):
    return torch.cat([torch.linspace(-12, 12, steps), torch.tensor([0.0, 1e-30, -1e-30, 1e-6])])


def _tails_grad(a, approximate):
    """gelu'(a) in float64 by autograd through _gelu_tails."""
    a64 = a.detach().double().cpu().requires_grad_()
    (g,) = torch.autograd.grad(_gelu_tails(a64, approximate).sum(), a64)
    return g.to(a.device)


def _assert_elementwise_fp32(out, ref, a, approximate, what, rtol):
    """Each element within `rtol` of the float64 reference. The exact form loses the tail as
    torch does (1 + erf(x) cancels for x << 0), so there the error is measured against |a|
    (the size of the terms). The tanh form keeps its relative accuracy down to underflow,
    less what rounding its exponent u = 2 sqrt(2/pi) (a + 0.044715 a^3) to fp32 costs: a few
    |u| 2^-24 (1e-5 at a = -9, where gelu(a) is 1e-28)."""
    ref, a64 = ref.double(), a.double()
    if approximate == "tanh":
        scale = ref.abs()
        tol = rtol + 3e-7 * (1.6 * (a64 + 0.044715 * a64 ** 3)).abs()
    else:
        scale, tol = torch.maximum(ref.abs(), a64.abs()), rtol
    err = (out.double() - ref).abs() / scale.clamp_min(1e-30)
    worst = (err / tol).argmax()
    assert (err <= tol).all(), (f"{what}: relative error {err.flatten()[worst]:.3g} at a = "
                                f"{a.flatten()[worst].item()}")


@pytest.mark.parametrize("approximate", MODES)
def test_interpreter_wide_range_fp32(approximate):
    """Large and tiny activations in fp32: the kernels' tanh form, a * sigmoid(2z), is the
    same function as 0.5 * a * (1 + tanh(z)); the derivatives hold up in the tails too."""
    mod = load_triton_src("geglu")
    approx = mod.MODES["erf" if approximate == "none" else approximate]
    a = _wide_range_inputs(1999)
    n = a.numel()
    b, dc = torch.ones(n), torch.ones(n)
    c, da, db = (torch.full_like(a, float("nan")) for _ in range(3))
    mod.geglu_fwd_kernel[(cdiv(n, 512),)](a, b, c, n, APPROX=approx, BLOCK=512)
    mod.geglu_bwd_kernel[(cdiv(n, 512),)](dc, a, b, da, db, n, APPROX=approx, BLOCK=512)
    ga = _tails_grad(a, approximate)
    ref = _gelu_tails(a.double(), approximate)
    _assert_elementwise_fp32(c, ref, a, approximate, "c", rtol=2e-6)
    _assert_elementwise_fp32(db, ref, a, approximate, "db", rtol=2e-6)
    # da: gelu'(a), a sum of terms of size up to max(1, |a| * density); fp32 on each term.
    assert torch.allclose(da.double(), ga, rtol=2e-6, atol=2e-7)


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", MODES)
def test_cpu_forward_backward(dtype, shape, approximate):
    a = randn(*shape, dtype=dtype).requires_grad_()
    b = randn(*shape, dtype=dtype).requires_grad_()
    c = fk.geglu(a, b, approximate)
    assert c.dtype == dtype and c.shape == a.shape and c.is_contiguous()
    assert_close(c, ref_geglu(a, b, approximate), dtype)
    dc = randn(*shape, dtype=dtype)
    c.backward(dc)
    ga, gb = _ref_grads(a, b, dc, approximate)
    assert_close(a.grad, ga, dtype, factor=2, what="da")
    assert_close(b.grad, gb, dtype, factor=2, what="db")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", MODES)
def test_cpu_is_torch_gelu_in_fp32_rounded_once(dtype, approximate):
    a, b = randn(4, 300, dtype=dtype, scale=3), randn(4, 300, dtype=dtype)
    torch_ref = (F.gelu(a.float(), approximate=approximate) * b.float()).to(dtype)
    assert torch.equal(fk.geglu(a, b, approximate), torch_ref)


def test_default_is_tanh():
    a, b = randn(5, 33, scale=3), randn(5, 33)
    assert torch.equal(fk.geglu(a, b), fk.geglu(a, b, "tanh"))
    assert not torch.equal(fk.geglu(a, b), fk.geglu(a, b, "none"))


def test_cpu_non_contiguous():
    b = randn(64, 60)[:, ::2]
    a = randn(60, 64).t()[:, :30]
    assert not a.is_contiguous() and not b.is_contiguous()
    for approximate in MODES:
        assert_close(fk.geglu(a, b, approximate), ref_geglu(a, b, approximate), torch.float32)


def test_cpu_empty():
    a = torch.empty(0, 5)
    assert fk.geglu(a, a).shape == (0, 5)
    assert fk.geglu(a, a, "none").shape == (0, 5)


@pytest.mark.parametrize("approximate", MODES)
def test_cpu_nan_inf_propagate(approximate):
    a = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    b = torch.tensor([1.0, 1.0, 1.0, float("nan")])
    out = fk.geglu(a, b, approximate)
    ref = F.gelu(a, approximate=approximate) * b
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(out[~torch.isnan(ref)], ref[~torch.isnan(ref)])


# --- bad input: the same message from every backend -----------------------------------

BAD = [
    ("dtypes differ",
     lambda d: (torch.ones(4, device=d), torch.ones(4, dtype=torch.float16, device=d), "tanh"),
     "fk::geglu: a and b must have the same dtype"),
    ("shapes differ", lambda d: (torch.ones(4, device=d), torch.ones(5, device=d), "tanh"),
     "fk::geglu: a and b must have the same shape"),
    ("int dtype", lambda d: (torch.ones(4, dtype=torch.int32, device=d),) * 2 + ("none",),
     "not supported"),
    ("approximate", lambda d: (torch.ones(4, device=d), torch.ones(4, device=d), "sigmoid"),
     "fk::geglu: approximate must be 'tanh' or 'none', got 'sigmoid'"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.geglu(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_approximate_in_backward_ops():
    a, b, dc = randn(4), randn(4), randn(4)
    for device in ("cpu", "meta"):
        args = [t.to(device) for t in (dc, a, b)]
        with pytest.raises(RuntimeError, match="approximate must be 'tanh' or 'none'"):
            torch.ops.fk._geglu_backward(*args, "erf")
        with pytest.raises(RuntimeError, match="approximate must be 'tanh' or 'none'"):
            torch.ops.fk._geglu_backward_(*args, "erf")
    with pytest.raises(RuntimeError, match="fk::_geglu_backward_: a and b must be contiguous"):
        torch.ops.fk._geglu_backward_(randn(4, 3), randn(3, 4).t(), randn(4, 3), "tanh")
    with pytest.raises(RuntimeError, match="fk::_geglu_backward_: a and b must not share"):
        a = randn(4, 3)
        torch.ops.fk._geglu_backward_(randn(4, 3), a, a, "tanh")


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.geglu(torch.ones(4), torch.ones(4, device="meta"))


# --- level 3: autograd, operator checks, torch.compile, TorchScript -----------------------

@pytest.mark.parametrize("approximate", MODES)
def test_gradcheck(approximate):
    a = randn(3, 17, dtype=torch.float64, scale=2).requires_grad_()
    b = randn(3, 17, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fk.geglu(a, b, approximate), (a, b))


@pytest.mark.parametrize("approximate", MODES)
def test_opcheck(approximate):
    a = randn(4, 33).requires_grad_()
    b = randn(4, 33).requires_grad_()
    torch.library.opcheck(torch.ops.fk.geglu, (a, b, approximate))
    torch.library.opcheck(torch.ops.fk.geglu, (a.detach(), b.detach(), approximate, True))
    dc = randn(4, 33)
    torch.library.opcheck(torch.ops.fk._geglu_backward, (dc, a.detach(), b.detach(), approximate),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    torch.library.opcheck(torch.ops.fk._geglu_backward_,
                          (dc, a.detach().clone(), b.detach().clone(), approximate),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def mlp(x, wg, wu, wd):
        h = fk.geglu(x @ wg, x @ wu, "tanh", True) + fk.geglu(x @ wu, x @ wg, "none")
        return h @ wd

    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [randn(rows, 32).requires_grad_(), randn(32, 48).requires_grad_(),
                randn(32, 48).requires_grad_(), randn(48, 16).requires_grad_()]
        eager_args = [t.detach().clone().requires_grad_() for t in args]
        out = compiled(*args)
        ref = mlp(*eager_args)
        assert_close(out, ref, torch.float32, factor=10)
        out.pow(2).sum().backward()
        ref.pow(2).sum().backward()
        for got, want in zip(args, eager_args):
            assert_close(got.grad, want.grad, torch.float32, factor=10)


def test_torchscript_script_save_load(tmp_path):
    @torch.jit.script
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fk.geglu(a, b) + fk.geglu(a, b, "none") + torch.ops.fk.geglu(b, a, "tanh", False)

    a, b = randn(4, 40, scale=2), randn(4, 40)
    expect = sum(ref_geglu(x, y, m) for x, y, m in ((a, b, "tanh"), (a, b, "none"),
                                                       (b, a, "tanh")))
    assert_close(f(a, b), expect, torch.float32, factor=3)

    mlp = fk.nn.GEGLUMLP(24, 40, approximate="none")
    path = tmp_path / "mlp.pt"
    torch.jit.script(mlp).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::geglu" in str(loaded.inlined_graph)
    x = randn(3, 24)
    xl = x.clone().requires_grad_()
    xe = x.clone().requires_grad_()
    out_l, out_e = loaded(xl), mlp(xe)
    torch.testing.assert_close(out_l, out_e, rtol=1e-5, atol=1e-6)
    out_l.sum().backward()
    out_e.sum().backward()
    torch.testing.assert_close(xl.grad, xe.grad, rtol=1e-5, atol=1e-6)


# --- fk.nn.GEGLUMLP and backward_in_place (the contract itself: tests/ops/test_glu.py) ----

def _mlp_grads(in_place, approximate="tanh", device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    mlp = fk.nn.GEGLUMLP(32, 80, approximate, backward_in_place=in_place).to(device=device,
                                                                              dtype=dtype)
    x = randn(3, 5, 32, dtype=dtype, device=device, seed=seed).requires_grad_()
    mlp(x).pow(2).sum().backward()
    return [x.grad] + [p.grad for p in mlp.parameters()]


def _torch_mlp_grads(approximate="tanh", device="cpu", dtype=torch.float32, seed=0):
    """The same parameters through Hugging Face GemmaMLP's formula, in torch."""
    torch.manual_seed(seed)
    mlp = fk.nn.GEGLUMLP(32, 80, approximate).to(device=device, dtype=dtype)
    x = randn(3, 5, 32, dtype=dtype, device=device, seed=seed).requires_grad_()
    h = F.gelu(mlp.gate_proj(x), approximate=approximate) * mlp.up_proj(x)
    mlp.down_proj(h).pow(2).sum().backward()
    return [x.grad] + [p.grad for p in mlp.parameters()]


def test_module_matches_gemma_mlp_names_and_formula():
    mlp = fk.nn.GEGLUMLP(32, 80)
    assert sorted(mlp.state_dict()) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]
    assert mlp.gate_proj.weight.shape == (80, 32) and mlp.down_proj.weight.shape == (32, 80)
    assert mlp.approximate == "tanh" and mlp.backward_in_place
    x = randn(2, 32)
    ref = mlp.down_proj(F.gelu(mlp.gate_proj(x), approximate="tanh") * mlp.up_proj(x))
    assert_close(mlp(x), ref, torch.float32, factor=10)
    biased = fk.nn.GEGLUMLP(32, 80, "none", bias=True, dtype=torch.float64)
    assert biased.up_proj.bias.dtype == torch.float64
    with pytest.raises(ValueError, match="approximate must be one of"):
        fk.nn.GEGLUMLP(32, 80, approximate="erf")


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("approximate", MODES)
def test_mlp_backward_matches_torch(in_place, approximate):
    for got, ref in zip(_mlp_grads(in_place, approximate), _torch_mlp_grads(approximate)):
        assert_close(got, ref, torch.float32, factor=10)


# --- level 5: CUDA kernels -----------------------------------------------------------------

CUDA_SHAPES = [(1,), (7,), (3, 257), (2, 3, 1000), (5, 4097), (8192, 14336)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CUDA_SHAPES)
@pytest.mark.parametrize("approximate", MODES)
def test_cuda_matches_reference(dtype, shape, approximate):
    # Random inputs: a tensor of one or a few elements can land below fp16's normal range,
    # where a correctly rounded value is a few percent off; errors are measured against
    # at least the smallest normal.
    tiny = torch.finfo(dtype).tiny
    a = randn(*shape, dtype=dtype, device="cuda", scale=2).requires_grad_()
    b = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    poison_cuda_cache()
    c = fk.geglu(a, b, approximate)
    assert not torch.isnan(c).any(), "unwritten output elements"
    assert_close(c, ref_geglu(a, b, approximate), dtype, scale=tiny)
    dc = randn(*shape, dtype=dtype, device="cuda")
    poison_cuda_cache()
    c.backward(dc)
    assert not torch.isnan(a.grad).any() and not torch.isnan(b.grad).any()
    ga, gb = _ref_grads(a, b, dc, approximate)
    assert_close(a.grad, ga, dtype, factor=2, what="da", scale=tiny)
    assert_close(b.grad, gb, dtype, factor=2, what="db", scale=tiny)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", MODES)
def test_cuda_agrees_with_torch_gelu(dtype, approximate):
    """Against torch's own CUDA gelu in fp32, rounded once: at most one unit in the last
    place apart (where the fp32 values straddle a rounding boundary). Compared where
    a > -3: below, torch's 1 + tanh(z) cancels and loses the digits that the kernels'
    sigmoid form keeps."""
    a = randn(1000, 1111, dtype=dtype, device="cuda", scale=3)
    b = randn(1000, 1111, dtype=dtype, device="cuda")
    out = fk.geglu(a, b, approximate)
    ref = (F.gelu(a.float(), approximate=approximate) * b.float()).to(dtype)
    assert_close(out, ref, dtype)
    if dtype != torch.float32:
        keep = a > -3
        info = torch.finfo(dtype)
        ulp = ref[keep].float().abs() * info.eps + info.smallest_normal * info.eps
        assert ((out[keep].float() - ref[keep].float()).abs() <= ulp).all()


@pytest.mark.cuda
@pytest.mark.parametrize("approximate", MODES)
def test_cuda_wide_range_fp32(approximate):
    a = _wide_range_inputs(199999).cuda()
    ones = torch.ones_like(a)
    c = fk.geglu(a, ones, approximate)
    da, db = torch.ops.fk._geglu_backward(ones, a, ones, approximate)
    ref = _gelu_tails(a.double(), approximate)
    # exp(x) is ex2.approx(x * log2(e)) on the GPU: the rounded product costs |x| 2^-24 more.
    _assert_elementwise_fp32(c, ref, a, approximate, "c", rtol=4e-6)
    _assert_elementwise_fp32(db, ref, a, approximate, "db", rtol=4e-6)
    ga = _tails_grad(a, approximate)
    assert torch.allclose(da.double(), ga, rtol=1e-5, atol=4e-7)
    nonfinite = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0], device="cuda")
    other = torch.tensor([1.0, 1.0, 1.0, float("nan")], device="cuda")
    out = fk.geglu(nonfinite, other, approximate)
    ref = F.gelu(nonfinite, approximate=approximate) * other
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(out[~torch.isnan(ref)], ref[~torch.isnan(ref)])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_non_contiguous(dtype):
    for approximate in MODES:
        a = misaligned(randn(3, 1001, dtype=dtype, device="cuda"))
        b = misaligned(randn(3, 1001, dtype=dtype, device="cuda"))
        assert_close(fk.geglu(a, b, approximate), ref_geglu(a, b, approximate), dtype)
        a = randn(1001, 6, dtype=dtype, device="cuda").t()
        b = randn(6, 2002, dtype=dtype, device="cuda")[:, ::2]
        assert_close(fk.geglu(a, b, approximate), ref_geglu(a, b, approximate), dtype)
        dc = misaligned(randn(6, 1001, dtype=dtype, device="cuda"))
        da, db = torch.ops.fk._geglu_backward(dc, a, b, approximate)
        ga, gb = _ref_grads(a, b, dc, approximate)
        assert_close(da, ga, dtype, factor=2, what="da")
        assert_close(db, gb, dtype, factor=2, what="db")


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.geglu(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.geglu(torch.ones(4, dtype=torch.float64, device="cuda"),
                 torch.ones(4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.geglu(torch.ones(4, device="cuda"), torch.ones(4))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    a = torch.empty(0, 7, device="cuda", dtype=torch.bfloat16)
    assert fk.geglu(a, a).shape == (0, 7)
    assert fk.geglu(a, a, "none").shape == (0, 7)
    x = randn(4, 33, device="cuda").requires_grad_()
    y = randn(4, 33, device="cuda").requires_grad_()
    for approximate in MODES:
        torch.library.opcheck(torch.ops.fk.geglu, (x, y, approximate))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda x, y: fk.geglu(x, y, "tanh", True).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, y).backward()
    ga, gb = _ref_grads(x, y, torch.ones(4, 33, device="cuda"), "tanh")
    assert_close(x.grad, ga, torch.float32, factor=2)
    assert_close(y.grad, gb, torch.float32, factor=2)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = (1 << 31) + 4099
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dc = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    slices = (slice(0, 4096), slice((1 << 31) - 2048, (1 << 31) + 2048), slice(n - 4096, n))
    refs = {}
    for approximate in MODES:
        c = fk.geglu(a, b, approximate)
        for sl in slices:
            assert_close(c[sl], ref_geglu(a[sl], b[sl], approximate), torch.bfloat16,
                         what=f"{approximate} {sl}")
        del c
    for sl in slices:
        refs[sl] = _ref_grads(a[sl], b[sl], dc[sl], "tanh")
    torch.ops.fk._geglu_backward_(dc, a, b, "tanh")   # a, b now hold da, db
    for sl, (ga, gb) in refs.items():
        assert_close(a[sl], ga, torch.bfloat16, factor=2, what=f"da {sl}")
        assert_close(b[sl], gb, torch.bfloat16, factor=2, what=f"db {sl}")
    del a, b, dc
    torch.cuda.empty_cache()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", MODES)
def test_cuda_mlp_in_place(dtype, approximate):
    for got, ref in zip(_mlp_grads(True, approximate, "cuda", dtype),
                        _torch_mlp_grads(approximate, "cuda", dtype)):
        assert_close(got, ref, dtype, factor=10)


@pytest.mark.cuda
def test_cuda_in_place_saves_memory():
    def peak(in_place):
        x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        a, b = x.repeat(1, 4), x.repeat(1, 4)
        y = fk.geglu(a, b, "tanh", in_place)
        del a, b
        dy = torch.randn_like(y)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y.backward(dy)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    size = 2048 * 4096 * 2  # bytes of a (and of b)
    assert peak(False) >= 2 * size      # new grad_a and grad_b
    assert peak(True) < size            # neither: they went into a and b
