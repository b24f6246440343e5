"""fk.swiglu at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_grads, ref_swiglu, round_toward_zero)

SHAPES = [(1,), (7,), (3, 257), (2, 3, 1000), (5, 4096)]


def _silu_mul(a, b):
    return a / (1 + torch.exp(-a)) * b


# (gate_multiplier, down_multiplier): none, Falcon-H1-like values, one of each
MULTIPLIERS = [(1.0, 1.0), (0.6, 1.7), (2.5, 1.0), (1.0, 0.25)]


def _scaled(gm, dm):
    """silu(a * gm) * b * dm from its definition, for autograd on float64 copies."""
    return lambda a, b: _silu_mul(a * gm, b) * dm


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 100, 2048, 5000])
@pytest.mark.parametrize("gm,dm", MULTIPLIERS[:2])
def test_interpreter_forward_backward(dtype, n, gm, dm):
    """The plain variants (SCALED 0) ignore the multipliers; the SCALED ones apply them."""
    mod = load_triton_src("swiglu")
    block = 1024
    scaled = int((gm, dm) != (1.0, 1.0))
    a, b, dc = (randn(n, dtype=dtype) for _ in range(3))
    c = torch.full_like(a, float("nan"))
    grid = (cdiv(n, block),)
    mod.swiglu_fwd_kernel[grid](a, b, c, n, gm, dm, BLOCK=block, SCALED=scaled)
    assert_close(c, ref_swiglu(a, b, cast=round_toward_zero, gate_multiplier=gm,
                               down_multiplier=dm), dtype, what="c")
    if scaled:  # the plain variant with these multipliers: silu(a) * b
        plain = torch.full_like(a, float("nan"))
        mod.swiglu_fwd_kernel[grid](a, b, plain, n, gm, dm, BLOCK=block, SCALED=0)
        assert_close(plain, ref_swiglu(a, b, cast=round_toward_zero), dtype, what="plain")
    da, db = torch.full_like(a, float("nan")), torch.full_like(a, float("nan"))
    mod.swiglu_bwd_kernel[grid](dc, a, b, da, db, n, gm, dm, BLOCK=block, SCALED=scaled)
    ga, gb = ref_grads(_scaled(gm, dm), [a.requires_grad_(), b.requires_grad_()], dc)
    assert_close(da, round_toward_zero(ga.float(), dtype), dtype, factor=2, what="da")
    assert_close(db, round_toward_zero(gb.float(), dtype), dtype, factor=2, what="db")


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_forward_backward(dtype, shape):
    a = randn(*shape, dtype=dtype).requires_grad_()
    b = randn(*shape, dtype=dtype).requires_grad_()
    c = fk.swiglu(a, b)
    assert c.dtype == dtype and c.shape == a.shape and c.is_contiguous()
    assert_close(c, ref_swiglu(a, b), dtype)
    dc = randn(*shape, dtype=dtype)
    c.backward(dc)
    ga, gb = ref_grads(_silu_mul, [a, b], dc)
    assert_close(a.grad, ga, dtype, factor=2, what="da")
    assert_close(b.grad, gb, dtype, factor=2, what="db")


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("gm,dm", MULTIPLIERS[1:])
@pytest.mark.parametrize("in_place", [False, True])
def test_cpu_multipliers(dtype, gm, dm, in_place):
    shape = (3, 257)
    a = randn(*shape, dtype=dtype).requires_grad_()
    b = randn(*shape, dtype=dtype, seed=1).requires_grad_()
    # backward_in_place writes into intermediates (as in an MLP), never into leaves.
    a1, b1 = a * 1, b * 1
    c = fk.swiglu(a1, b1, in_place, gate_multiplier=gm, down_multiplier=dm)
    assert c.dtype == dtype and c.shape == a.shape
    assert_close(c, ref_swiglu(a, b, gate_multiplier=gm, down_multiplier=dm), dtype)
    dc = randn(*shape, dtype=dtype, seed=2)
    c.backward(dc)
    ga, gb = ref_grads(_scaled(gm, dm), [a, b], dc)
    assert_close(a.grad, ga, dtype, factor=2, what="da")
    assert_close(b.grad, gb, dtype, factor=2, what="db")
    # Multipliers of 1 are the plain op.
    assert torch.equal(fk.swiglu(a, b, gate_multiplier=1.0, down_multiplier=1.0),
                       fk.swiglu(a, b))


def test_cpu_non_contiguous():
    b = randn(64, 60)[:, ::2]
    a = randn(60, 64).t()[:, :30]
    assert not a.is_contiguous() and not b.is_contiguous()
    assert_close(fk.swiglu(a, b), ref_swiglu(a, b), torch.float32)


def test_cpu_empty():
    a = torch.empty(0, 5)
    out = fk.swiglu(a, a)
    assert out.shape == (0, 5)


def test_cpu_nan_inf_propagate():
    a = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    b = torch.tensor([1.0, 1.0, 1.0, float("nan")])
    out = fk.swiglu(a, b)
    ref = torch.nn.functional.silu(a) * b
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(out[~torch.isnan(ref)], ref[~torch.isnan(ref)])


# --- bad input: the same message from every backend -----------------------------------

BAD = [
    ("dtypes differ", lambda d: (torch.ones(4, device=d), torch.ones(4, dtype=torch.float16, device=d)),
     "must have the same dtype"),
    ("shapes differ", lambda d: (torch.ones(4, device=d), torch.ones(5, device=d)),
     "must have the same shape"),
    ("int dtype", lambda d: (torch.ones(4, dtype=torch.int32, device=d),) * 2, "not supported"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.swiglu(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


@pytest.mark.parametrize("kw,msg", [
    (dict(gate_multiplier=float("inf")), "fk::swiglu: gate_multiplier must be finite, got inf"),
    (dict(down_multiplier=float("nan")), "fk::swiglu: down_multiplier must be finite, got nan"),
])
def test_bad_multipliers_cpu_and_meta_agree(kw, msg):
    cpu, meta = error_lines(lambda d: fk.swiglu(torch.ones(4, device=d), torch.ones(4, device=d),
                                                **kw), ("cpu", "meta"), msg)
    assert cpu == meta
    gm, dm = kw.get("gate_multiplier", 1.0), kw.get("down_multiplier", 1.0)
    ones = torch.ones(4)
    with pytest.raises(RuntimeError, match="fk::_swiglu_backward: .* must be finite"):
        torch.ops.fk._swiglu_backward(ones, ones, ones, gm, dm)
    with pytest.raises(RuntimeError, match="fk::_swiglu_backward_: .* must be finite"):
        torch.ops.fk._swiglu_backward_(ones, ones.clone(), ones.clone(), gm, dm)


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.swiglu(torch.ones(4), torch.ones(4, device="meta"))


# --- level 3: autograd and operator checks -----------------------------------------------

def test_gradcheck():
    a = randn(3, 17, dtype=torch.float64).requires_grad_()
    b = randn(3, 17, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(fk.swiglu, (a, b))
    assert torch.autograd.gradcheck(
        lambda a, b: fk.swiglu(a, b, gate_multiplier=0.6, down_multiplier=1.7), (a, b))
    assert torch.autograd.gradcheck(
        lambda a, b: fk.swiglu(a * 1, b * 1, True, 2.5, 0.25), (a, b))


def test_opcheck_swiglu():
    a = randn(4, 33).requires_grad_()
    b = randn(4, 33).requires_grad_()
    torch.library.opcheck(torch.ops.fk.swiglu, (a, b))
    torch.library.opcheck(torch.ops.fk.swiglu, (a.detach(), b.detach()))
    torch.library.opcheck(torch.ops.fk.swiglu, (a, b, False, 0.6, 1.7))


def test_opcheck_swiglu_backward():
    a, b, dc = randn(4, 33), randn(4, 33), randn(4, 33)
    for args in ((dc, a, b), (dc, a, b, 0.6, 1.7)):
        torch.library.opcheck(torch.ops.fk._swiglu_backward, args,
                              test_utils=("test_schema", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))


def test_torch_compile_multipliers():
    def f(a, b):
        return fk.swiglu(a, b, gate_multiplier=0.6, down_multiplier=1.7)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    a = randn(4, 33).requires_grad_()
    b = randn(4, 33, seed=1).requires_grad_()
    out = compiled(a, b)
    assert_close(out, ref_swiglu(a, b, gate_multiplier=0.6, down_multiplier=1.7), torch.float32)
    out.sum().backward()
    ga, gb = ref_grads(_scaled(0.6, 1.7), [a, b], torch.ones(4, 33))
    assert_close(a.grad, ga, torch.float32, factor=2)
    assert_close(b.grad, gb, torch.float32, factor=2)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_falcon_h1_mlp(bias, in_place):
    """fk.nn.SwiGLUMLP with the multipliers against Hugging Face's FalconH1MLP (the down
    multiplier inside the gate without a down bias, on the output with one)."""
    falcon = pytest.importorskip("transformers.models.falcon_h1.modeling_falcon_h1")
    from transformers import FalconH1Config
    config = FalconH1Config(hidden_size=32, intermediate_size=80, mlp_bias=bias,
                            hidden_act="silu", mlp_multipliers=[0.6, 1.7])
    torch.manual_seed(0)
    ref = falcon.FalconH1MLP(config)
    mlp = fk.nn.SwiGLUMLP(32, 80, bias=bias, backward_in_place=in_place,
                          gate_multiplier=0.6, down_multiplier=1.7)
    mlp.load_state_dict(ref.state_dict())
    x = randn(3, 5, 32).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    out, want = mlp(x), ref(x2)
    assert_close(out, want, torch.float32, factor=10)
    out.pow(2).sum().backward()
    want.pow(2).sum().backward()
    assert_close(x.grad, x2.grad, torch.float32, factor=10)
    for (name, p), q in zip(mlp.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, torch.float32, factor=10, what=name)


# --- level 5: CUDA kernels -----------------------------------------------------------------

CUDA_SHAPES = [(1,), (7,), (3, 257), (2, 3, 1000), (5, 4097), (8192, 14336)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_cuda_matches_reference(dtype, shape):
    # Random inputs: a tensor of one or a few elements can land below fp16's normal range,
    # where a correctly rounded value is a few percent off; errors are measured against
    # at least the smallest normal.
    tiny = torch.finfo(dtype).tiny
    a = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    b = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    poison_cuda_cache()
    c = fk.swiglu(a, b)
    assert not torch.isnan(c).any(), "unwritten output elements"
    assert_close(c, ref_swiglu(a, b), dtype, scale=tiny)
    dc = randn(*shape, dtype=dtype, device="cuda")
    poison_cuda_cache()
    c.backward(dc)
    assert not torch.isnan(a.grad).any() and not torch.isnan(b.grad).any()
    ga, gb = ref_grads(_silu_mul, [a, b], dc)
    assert_close(a.grad, ga, dtype, factor=2, what="da", scale=tiny)
    assert_close(b.grad, gb, dtype, factor=2, what="db", scale=tiny)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 257), (5, 4097), (8192, 14336)])
@pytest.mark.parametrize("gm,dm", MULTIPLIERS[1:])
def test_cuda_multipliers(dtype, shape, gm, dm):
    """The SCALED variants (aligned and not), out of place and in place."""
    tiny = torch.finfo(dtype).tiny
    for in_place in (False, True):
        a = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
        b = randn(*shape, dtype=dtype, device="cuda", seed=1).requires_grad_()
        poison_cuda_cache()
        c = fk.swiglu(a * 1, b * 1, in_place, gm, dm)
        assert_close(c, ref_swiglu(a, b, gate_multiplier=gm, down_multiplier=dm), dtype,
                     scale=tiny)
        dc = randn(*shape, dtype=dtype, device="cuda", seed=2)
        c.backward(dc)
        ga, gb = ref_grads(_scaled(gm, dm), [a, b], dc)
        assert_close(a.grad, ga, dtype, factor=2, what="da", scale=tiny)
        assert_close(b.grad, gb, dtype, factor=2, what="db", scale=tiny)
    am = misaligned(randn(3, 1001, dtype=dtype, device="cuda"))
    bm = misaligned(randn(3, 1001, dtype=dtype, device="cuda", seed=1))
    assert_close(fk.swiglu(am, bm, gate_multiplier=gm, down_multiplier=dm),
                 ref_swiglu(am, bm, gate_multiplier=gm, down_multiplier=dm), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_non_contiguous(dtype):
    a = misaligned(randn(3, 1001, dtype=dtype, device="cuda"))
    b = misaligned(randn(3, 1001, dtype=dtype, device="cuda"))
    assert_close(fk.swiglu(a, b), ref_swiglu(a, b), dtype)
    a = randn(1001, 6, dtype=dtype, device="cuda").t()
    b = randn(6, 2002, dtype=dtype, device="cuda")[:, ::2]
    assert_close(fk.swiglu(a, b), ref_swiglu(a, b), dtype)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.swiglu(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    cpu, cuda = error_lines(lambda d: fk.swiglu(torch.ones(4, device=d), torch.ones(4, device=d),
                                                gate_multiplier=float("inf")),
                            ("cpu", "cuda"), "gate_multiplier must be finite")
    assert cpu == cuda
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.swiglu(torch.ones(4, dtype=torch.float64, device="cuda"),
                  torch.ones(4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.swiglu(torch.ones(4, device="cuda"), torch.ones(4))


@pytest.mark.cuda
def test_cuda_empty_and_opcheck():
    a = torch.empty(0, 7, device="cuda", dtype=torch.bfloat16)
    assert fk.swiglu(a, a).shape == (0, 7)
    x = randn(4, 33, device="cuda").requires_grad_()
    y = randn(4, 33, device="cuda").requires_grad_()
    torch.library.opcheck(torch.ops.fk.swiglu, (x, y))


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = (1 << 31) + 4099
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    c = fk.swiglu(a, b)
    for sl in (slice(0, 4096), slice((1 << 31) - 2048, (1 << 31) + 2048), slice(n - 4096, n)):
        assert_close(c[sl], ref_swiglu(a[sl], b[sl]), torch.bfloat16, what=str(sl))
    del a, b, c
    torch.cuda.empty_cache()


# --- backward_in_place (the contract itself: tests/ops/test_glu.py) ----------------------

def _mlp_grads(in_place, device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    mlp = fk.nn.SwiGLUMLP(32, 80, backward_in_place=in_place).to(device=device, dtype=dtype)
    x = randn(3, 5, 32, dtype=dtype, device=device, seed=seed).requires_grad_()
    mlp(x).pow(2).sum().backward()
    return [x.grad] + [p.grad for p in mlp.parameters()]


def _torch_mlp_grads(device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    mlp = fk.nn.SwiGLUMLP(32, 80).to(device=device, dtype=dtype)
    x = randn(3, 5, 32, dtype=dtype, device=device, seed=seed).requires_grad_()
    mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)).pow(2).sum().backward()
    return [x.grad] + [p.grad for p in mlp.parameters()]


@pytest.mark.parametrize("in_place", [True, False])
def test_mlp_backward_matches_torch(in_place):
    for got, ref in zip(_mlp_grads(in_place), _torch_mlp_grads()):
        assert_close(got, ref, torch.float32, factor=10)


def test_opcheck_swiglu_backward_in_place():
    a, b, dc = randn(4, 33), randn(4, 33), randn(4, 33)
    torch.library.opcheck(torch.ops.fk._swiglu_backward_, (dc, a, b),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_mlp_in_place(dtype):
    for got, ref in zip(_mlp_grads(True, "cuda", dtype), _torch_mlp_grads("cuda", dtype)):
        assert_close(got, ref, dtype, factor=10)


@pytest.mark.cuda
def test_cuda_in_place_saves_memory():
    def peak(in_place):
        x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        a, b = x.repeat(1, 4), x.repeat(1, 4)
        y = fk.swiglu(a, b, in_place)
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
