"""fk.rms_norm at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_rms_norm, ref_rms_norm_grads,
                     round_toward_zero)

MODES = ("llama", "gemma", "none")


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n,block,looped", [(100, 128, False), (300, 128, True)])
def test_interpreter(dtype, mode, n, block, looped):
    mod = load_triton_src("rms_norm")
    casting = {"none": 0, "llama": 1, "gemma": 2}[mode]
    m, eps, offset = 5, 1e-6, 0.5
    x, w, dy = randn(m, n, dtype=dtype), randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    y = torch.full_like(x, float("nan"))
    rstd = torch.full((m,), float("nan"))
    if looped:
        mod.rms_norm_fwd_looped_kernel[(m,)](x, w, y, rstd, n, n, m, n, eps, offset, 1, casting,
                                             BLOCK_N=block)
    else:
        rows = 2
        mod.rms_norm_fwd_kernel[((m + rows - 1) // rows,)](x, w, y, rstd, n, n, m, n, eps,
                                                            offset, 1, casting, BLOCK_N=block,
                                                            ROWS=rows)
    ref = ref_rms_norm(x, w, eps, offset, mode, cast=round_toward_zero)
    assert_close(y, ref, dtype, factor=1.5, what="y")
    programs, rows_per_program = 2, 3
    dx = torch.full_like(x, float("nan"))
    dw_partial = torch.full((programs, n), float("nan"))
    kernel = mod.rms_norm_bwd_looped_kernel if looped else mod.rms_norm_bwd_kernel
    kernel[(programs,)](dy, x, w, rstd, dx, dw_partial, n, n, n, m, n, offset, rows_per_program,
                        1, casting, BLOCK_N=block)
    gx, gw = ref_rms_norm_grads(x, w, dy, eps, offset, mode, cast=round_toward_zero)
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=3, what="dx")
    dw = torch.full((n,), float("nan"), dtype=dtype)
    mod.rms_norm_dw_kernel[(cdiv(n, 64),)](dw_partial, dw, dw, programs, n, n, BLOCK_P=2,
                                           BLOCK_N=64)
    assert_close(dw, round_toward_zero(gw.float(), dtype), dtype, factor=3, what="dw")


@pytest.mark.parametrize("n1", [0, 5, 64, 100, 128])
def test_interpreter_dw_two_outputs(n1):
    """rms_norm_dw_kernel's column sums of (P, N) fp32 partials, split at n1 between two
    outputs (qkv_split_norm_rope's q and k weights from one launch), against float64."""
    mod = load_triton_src("rms_norm")
    p, n = 7, 128
    part = randn(p, n, dtype=torch.float32)
    dw1 = torch.full((max(n1, 1),), float("nan"), dtype=torch.bfloat16)
    dw2 = torch.full((max(n - n1, 1),), float("nan"), dtype=torch.bfloat16)
    mod.rms_norm_dw_kernel[(cdiv(n, 16),)](part, dw1, dw2, p, n, n1, BLOCK_P=4, BLOCK_N=16)
    want = part.double().sum(0)
    assert_close(dw1[:n1], want[:n1].to(torch.bfloat16), torch.bfloat16, what="dw1")
    assert_close(dw2[:n - n1], want[n1:].to(torch.bfloat16), torch.bfloat16, what="dw2")
    assert torch.isnan(dw1[n1:]).all() and torch.isnan(dw2[n - n1:]).all(), "written past"


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 257), (4, 4096)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_cpu_forward_backward(dtype, mode, shape, with_weight):
    eps, offset = 1e-5, (1.0 if mode == "gemma" else 0.0)
    x = randn(*shape, dtype=dtype).requires_grad_()
    w = randn(shape[-1], dtype=dtype).requires_grad_() if with_weight else None
    y = fk.rms_norm(x, w, eps, offset, mode)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, ref_rms_norm(x, w, eps, offset, mode), dtype, what="y")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    gx, gw = ref_rms_norm_grads(x, w, dy, eps, offset, mode)
    # With one element per row dx is a cancellation of terms of dy's size.
    scale = dy.double().norm().item() if shape[-1] == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    if with_weight:
        assert_close(w.grad, gw, dtype, factor=3, what="dw")


def test_cpu_matches_hf_llama_formula_exactly_in_fp32():
    x, w = randn(6, 64), randn(64)
    var = x.pow(2).mean(-1, keepdim=True)
    hf = w * (x * torch.rsqrt(var + 1e-6))
    assert_close(fk.rms_norm(x, w, 1e-6), hf, torch.float32)


def test_cpu_non_contiguous_and_empty():
    x = randn(40, 6).t()
    w = randn(40)
    assert not x.is_contiguous()
    assert_close(fk.rms_norm(x, w), ref_rms_norm(x, w), torch.float32)
    assert fk.rms_norm(torch.empty(0, 8), torch.ones(8)).shape == (0, 8)
    assert fk.rms_norm(torch.empty(3, 0), torch.ones(0)).shape == (3, 0)


def test_only_weight_needs_grad():
    x = randn(4, 16)
    w = randn(16).requires_grad_()
    fk.rms_norm(x, w).sum().backward()
    assert w.grad is not None and x.grad is None


def test_double_backward_is_a_clear_error():
    x = randn(4, 16).requires_grad_()
    (gx,) = torch.autograd.grad(fk.rms_norm(x, randn(16)).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_frozen_weight():
    x = randn(4, 16).requires_grad_()
    w = randn(16)
    fk.rms_norm(x, w).sum().backward()
    assert x.grad is not None


# --- bad input -----------------------------------------------------------------------------

BAD = [
    ("dtypes differ", lambda d: (torch.ones(2, 8, device=d), torch.ones(8, dtype=torch.float16, device=d), "llama"),
     "must have the same dtype"),
    ("weight size", lambda d: (torch.ones(2, 8, device=d), torch.ones(7, device=d), "llama"),
     "weight must have shape"),
    ("int dtype", lambda d: (torch.ones(2, 8, dtype=torch.int64, device=d), None, "llama"),
     "not supported"),
    ("casting mode", lambda d: (torch.ones(2, 8, device=d), None, "mistral"),
     "casting_mode must be one of"),
    ("scalar", lambda d: (torch.tensor(1.0, device=d), None, "llama"), "at least one dimension"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta


def _call_bad(make, device):
    x, w, mode = make(device)
    return fk.rms_norm(x, w, 1e-6, 0.0, mode)


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.rms_norm(torch.ones(2, 8), torch.ones(8, device="meta"))


def test_module():
    m = fk.nn.RMSNorm(32, eps=1e-5)
    x = randn(3, 32)
    ref = torch.nn.RMSNorm(32, eps=1e-5)
    assert_close(m(x), ref(x), torch.float32)
    g = fk.nn.RMSNorm(32, eps=1e-6, offset=1.0, casting_mode="gemma")
    assert torch.equal(g.weight, torch.zeros(32))
    assert_close(g(x), ref_rms_norm(x, g.weight, 1e-6, 1.0, "gemma"), torch.float32)
    with pytest.raises(ValueError):
        fk.nn.RMSNorm((4, 32))
    none = fk.nn.RMSNorm(32, eps=None, elementwise_affine=False)
    assert_close(none(x), ref_rms_norm(x, None, torch.finfo(x.dtype).eps), torch.float32)


# --- level 3: autograd, opcheck, torch.compile ---------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_gradcheck(mode, with_weight):
    x = randn(3, 9, dtype=torch.float64).requires_grad_()
    w = randn(9, dtype=torch.float64).requires_grad_() if with_weight else None
    args = (x, w) if with_weight else (x,)
    fn = (lambda x, w=None: fk.rms_norm(x, w, 1e-6, 0.5, mode))
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("with_weight", [True, False])
def test_opcheck(with_weight):
    x = randn(4, 3, 40).requires_grad_()
    w = randn(40).requires_grad_() if with_weight else None
    torch.library.opcheck(torch.ops.fk.rms_norm, (x, w, 1e-6, 0.0, "llama"))
    torch.library.opcheck(torch.ops.fk._rms_norm_forward, (x.detach(), w, 1e-5, 1.0, "gemma"),
                          test_utils=("test_schema", "test_faketensor"))
    y, rstd = torch.ops.fk._rms_norm_forward(x.detach(), None if w is None else w.detach(),
                                             1e-6, 0.0, "llama")
    dy = randn(4, 3, 40)
    torch.library.opcheck(torch.ops.fk._rms_norm_backward,
                          (dy, x.detach(), None if w is None else w.detach(), rstd, 0.0, "llama",
                           [True, with_weight]),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def block(x, w, wg, wu):
        h = fk.rms_norm(x, w, 1e-6)
        return fk.swiglu(h @ wg, h @ wu).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [randn(rows, 32).requires_grad_(), randn(32).requires_grad_(),
                randn(32, 48).requires_grad_(), randn(32, 48).requires_grad_()]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args)
        ref = block(*eager_args)
        assert_close(out, ref, torch.float32, factor=10)
        out.sum().backward()
        ref.sum().backward()
        for a, b in zip(args, eager_args):
            assert_close(a.grad, b.grad, torch.float32, factor=10)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Both sides of the single-pass limit (16384 columns) and the bucket edges below it.
CUDA_N = [1, 7, 64, 127, 256, 1000, 1024, 2047, 4096, 5120, 8192, 8193, 12288, 16384, 16385,
          65536, 100000]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", CUDA_N)
@pytest.mark.parametrize("mode", MODES)
def test_cuda_matches_reference(dtype, n, mode):
    m = 37 if n <= 16384 else 5
    eps, offset = 1e-6, (1.0 if mode == "gemma" else 0.0)
    x = randn(m, n, dtype=dtype, device="cuda").requires_grad_()
    w = randn(n, dtype=dtype, device="cuda").requires_grad_()
    poison_cuda_cache()
    y = fk.rms_norm(x, w, eps, offset, mode)
    assert not torch.isnan(y).any(), "unwritten output elements"
    assert_close(y, ref_rms_norm(x.cpu(), w.cpu(), eps, offset, mode), dtype, factor=1.5)
    dy = randn(m, n, dtype=dtype, device="cuda")
    poison_cuda_cache()
    y.backward(dy)
    gx, gw = ref_rms_norm_grads(x.cpu(), w.cpu(), dy.cpu(), eps, offset, mode)
    # With one element per row dx is a cancellation of terms of dy's size.
    scale = dy.double().norm().item() if n == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    # With one element per row, dw sums m terms of dy's size (x_hat is +-1) that can cancel.
    wscale = dy.double().abs().sum().item() if n == 1 else None
    assert_close(w.grad, gw, dtype, factor=3, what="dw", scale=wscale)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (2, 3, 4096), (8192, 4096), (3, 128)])
def test_cuda_llama_shapes_no_weight_and_misaligned(dtype, shape):
    x = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    y = fk.rms_norm(x, None, 1e-5)
    assert_close(y, ref_rms_norm(x.cpu(), None, 1e-5), dtype, factor=1.5)
    dy = randn(*shape, dtype=dtype, device="cuda")
    y.backward(dy)
    gx, = ref_rms_norm_grads(x.cpu(), None, dy.cpu(), 1e-5, 0.0, "llama")[:1]
    assert_close(x.grad, gx, dtype, factor=3)
    xm = misaligned(randn(*shape, dtype=dtype, device="cuda"))
    w = randn(shape[-1], dtype=dtype, device="cuda")
    assert_close(fk.rms_norm(xm, w), ref_rms_norm(xm.cpu(), w.cpu()), dtype, factor=1.5)
    xt = randn(shape[-1], 6, dtype=dtype, device="cuda").t()
    assert_close(fk.rms_norm(xt, w), ref_rms_norm(xt.cpu(), w.cpu()), dtype, factor=1.5)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.rms_norm(torch.ones(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.rms_norm(torch.ones(2, 4, device="cuda"), torch.ones(4))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    assert fk.rms_norm(torch.empty(0, 64, device="cuda"), torch.ones(64, device="cuda")).shape == (0, 64)
    x = randn(4, 3, 40, device="cuda").requires_grad_()
    w = randn(40, device="cuda").requires_grad_()
    torch.library.opcheck(torch.ops.fk.rms_norm, (x, w, 1e-6, 0.0, "llama"))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda x, w: fk.rms_norm(x, w).sum(), fullgraph=True, backend="aot_eager")
    f(x, w).backward()
    assert x.grad is not None and w.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = 4096
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = fk.rms_norm(x, w)
    for rows in (slice(0, 4), slice(m - 4, m)):
        assert_close(y[rows], ref_rms_norm(x[rows].cpu(), w.cpu()), torch.bfloat16, factor=1.5)
    del x, y
    torch.cuda.empty_cache()
