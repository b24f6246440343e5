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


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 100, 2048, 5000])
def test_interpreter_forward_backward(dtype, n):
    mod = load_triton_src("swiglu")
    block = 1024
    a, b, dc = (randn(n, dtype=dtype) for _ in range(3))
    c = torch.full_like(a, float("nan"))
    grid = (cdiv(n, block),)
    mod.swiglu_fwd_kernel[grid](a, b, c, n, BLOCK=block)
    assert_close(c, ref_swiglu(a, b, cast=round_toward_zero), dtype, what="c")
    da, db = torch.full_like(a, float("nan")), torch.full_like(a, float("nan"))
    mod.swiglu_bwd_kernel[grid](dc, a, b, da, db, n, BLOCK=block)
    ga, gb = ref_grads(_silu_mul, [a.requires_grad_(), b.requires_grad_()], dc)
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


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.swiglu(torch.ones(4), torch.ones(4, device="meta"))


# --- level 3: autograd and operator checks -----------------------------------------------

def test_gradcheck():
    a = randn(3, 17, dtype=torch.float64).requires_grad_()
    b = randn(3, 17, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(fk.swiglu, (a, b))


def test_opcheck_swiglu():
    a = randn(4, 33).requires_grad_()
    b = randn(4, 33).requires_grad_()
    torch.library.opcheck(torch.ops.fk.swiglu, (a, b))
    torch.library.opcheck(torch.ops.fk.swiglu, (a.detach(), b.detach()))


def test_opcheck_swiglu_backward():
    a, b, dc = randn(4, 33), randn(4, 33), randn(4, 33)
    torch.library.opcheck(torch.ops.fk._swiglu_backward, (dc, a, b),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


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
