"""fk.softmax at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_grads, round_nearest, round_toward_zero)

INF = float("inf")

# The interpreter evaluates -inf - (-inf) in numpy for fully masked rows, which warns, and
# converts program ids to ints through one-element arrays, which numpy deprecates.
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]


# --- references (float64, from the definition) -------------------------------------------

def ref_softmax(x, dim=-1, cast=round_nearest):
    """exp(x - max) / sum(exp(x - max)) over dim in float64, rounded once to x's dtype with
    `cast`. A slice of only -inf gives NaN (-inf - (-inf)), as in torch."""
    x64 = x.detach().double() if x.dtype != torch.float64 else x
    e = torch.exp(x64 - x64.amax(dim, keepdim=True))
    y = e / e.sum(dim, keepdim=True)
    return y if x.dtype == torch.float64 else cast(y.float(), x.dtype)


def ref_softmax_backward(dy, y, dim=-1, cast=round_nearest):
    """y * (dy - sum(dy * y)) in float64 from the given (already rounded) y."""
    y64, dy64 = y.double(), dy.double()
    dx = y64 * (dy64 - (dy64 * y64).sum(dim, keepdim=True))
    return cast(dx.float(), y.dtype) if y.dtype != torch.float64 else dx


def _masked_rows(x):
    """Masking patterns in the first rows of a (m >= 5, n) tensor, in place: a row of only
    -inf (NaN, like torch), the first half -inf (whole groups and chunks of -inf before
    any finite value), every third element -inf, and one finite element."""
    n = x.shape[-1]
    x[1] = -INF
    x[2, : n // 2 + 1] = -INF
    x[3, 1::3] = -INF
    x[4] = -INF
    x[4, n // 3] = 1.5
    return x


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,block,rows,alt", [(100, 128, 2, 0), (128, 128, 1, 0),
                                              (300, 128, None, 0), (21, 32, 4, 0),
                                              (100, 128, 2, 1), (128, 128, 1, 1),
                                              (21, 32, 4, 1)])
def test_interpreter(dtype, n, block, rows, alt):
    """rows=None: the looped kernels on 2 programs for 7 rows (each strides over rows).
    alt=1: the row-max forward (ROW_MAX) and the backward that reloads dy (RELOAD)."""
    mod = load_triton_src("softmax")
    m = 7
    x = _masked_rows(randn(m, n, dtype=dtype, scale=3.0))
    y = torch.full_like(x, float("nan"))
    if rows is None:
        mod.softmax_fwd_looped_kernel[(2,)](x, y, n, n, m, n, BLOCK_N=block, PER_SM=1)
    else:
        mod.softmax_fwd_kernel[(cdiv(m, rows),)](x, y, n, n, m, n, BLOCK_N=block, ROWS=rows,
                                                 ROW_MAX=alt)
    assert_close(y, ref_softmax(x, cast=round_toward_zero), dtype, factor=1.5, what="y")
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3, 4, 5, 6]]).any()
    dy = randn(m, n, dtype=dtype)
    dx = torch.full_like(x, float("nan"))
    if rows is None:
        mod.softmax_bwd_looped_kernel[(2,)](dy, y, dx, n, n, n, m, n, BLOCK_N=block, PER_SM=1)
    else:
        mod.softmax_bwd_kernel[(cdiv(m, rows),)](dy, y, dx, n, n, n, m, n, BLOCK_N=block,
                                                 ROWS=rows, RELOAD=alt)
    ref = ref_softmax_backward(dy, y, cast=round_toward_zero)
    assert_close(dx, ref, dtype, factor=2, what="dx")


def test_interpreter_inf_and_nan_make_the_row_nan():
    mod = load_triton_src("softmax")
    m, n = 3, 40
    x = randn(m, n)
    x[0, 5] = INF
    x[1, 33] = float("nan")
    for kernel in ("looped", "group shift", "row max"):
        y = torch.zeros_like(x)
        if kernel == "looped":
            mod.softmax_fwd_looped_kernel[(1,)](x, y, n, n, m, n, BLOCK_N=16, PER_SM=1)
        else:
            mod.softmax_fwd_kernel[(m,)](x, y, n, n, m, n, BLOCK_N=64, ROWS=1,
                                         ROW_MAX=int(kernel == "row max"))
        assert torch.isnan(y[:2]).all() and not torch.isnan(y[2]).any()
        assert torch.equal(torch.isnan(y), torch.isnan(torch.softmax(x, -1)))


# --- level 2: the CPU backend against the reference --------------------------------------

SHAPES_DIMS = [((1,), -1), ((1, 1), 0), ((3, 7), -1), ((3, 7), 0), ((2, 3, 257), 1),
               ((2, 3, 257), -1), ((4, 4096), -1)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
def test_cpu_forward_backward(dtype, shape, dim):
    x = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    y = fk.softmax(x, dim)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert_close(y, ref_softmax(x, dim), dtype, what="y")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    (gx,) = ref_grads(lambda t: ref_softmax(t, dim), [x], dy)
    # Over a single element dx is dy - dy: measure it against dy's size.
    scale = dy.double().norm().item() if shape[dim] == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_masking_like_torch(dtype):
    x = _masked_rows(randn(6, 50, dtype=dtype, scale=2.0)).requires_grad_()
    y = fk.softmax(x)
    ref = torch.softmax(x.detach().float(), -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.isnan(y[1]).all() and not torch.isnan(y[2:]).any()
    assert_close(y, ref_softmax(x), dtype)
    assert (y[2, :26] == 0).all() and (y[3, 1::3] == 0).all()
    dy = randn(6, 50, dtype=dtype)
    y.backward(dy)
    assert torch.isnan(x.grad[1]).all() and not torch.isnan(x.grad[2:]).any()
    assert (x.grad[2, :26] == 0).all()


def test_cpu_large_values_do_not_overflow():
    x = randn(4, 300, scale=1e4)
    assert_close(fk.softmax(x), ref_softmax(x), torch.float32)
    assert not torch.isnan(fk.softmax(x)).any()


def test_cpu_non_contiguous_empty_and_scalar():
    x = randn(40, 6).t()
    assert not x.is_contiguous()
    for dim in (0, 1, -1):
        assert_close(fk.softmax(x, dim), ref_softmax(x, dim), torch.float32)
    for shape, dim in (((0, 8), -1), ((3, 0), -1), ((0, 8), 0), ((2, 0, 3), 1)):
        out = fk.softmax(torch.empty(shape), dim)
        assert out.shape == shape
    s = torch.tensor(2.5, requires_grad=True)
    out = fk.softmax(s, 0)
    assert out.shape == () and out.item() == 1.0
    assert fk.softmax(s, -1).item() == 1.0
    out.backward()
    assert s.grad.item() == 0.0


def test_double_backward_is_a_clear_error():
    x = randn(4, 16).requires_grad_()
    (gx,) = torch.autograd.grad((fk.softmax(x) * randn(4, 16)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_module():
    x = randn(3, 4, 5)
    for dim in (0, 1, -1):
        m = fk.nn.Softmax(dim)
        assert_close(m(x), torch.nn.Softmax(dim)(x), torch.float32)
        assert repr(m) == f"Softmax(dim={dim})"
    assert fk.nn.Softmax().dim == -1
    with pytest.raises(ValueError, match="explicit dim"):
        fk.nn.Softmax(None)


# --- bad input -----------------------------------------------------------------------------

BAD = [
    ("int dtype", lambda d: fk.softmax(torch.ones(2, 3, dtype=torch.int64, device=d)),
     "not supported"),
    ("dim too large", lambda d: fk.softmax(torch.ones(2, 3, device=d), 2), "out of range"),
    ("dim too small", lambda d: fk.softmax(torch.ones(2, 3, device=d), -3), "out of range"),
    ("scalar dim", lambda d: fk.softmax(torch.tensor(1.0, device=d), 1), "out of range"),
    ("backward shapes", lambda d: torch.ops.fk._softmax_backward(
        torch.ones(2, 3, device=d), torch.ones(2, 4, device=d), -1), "must have the same shape"),
    ("backward dtypes", lambda d: torch.ops.fk._softmax_backward(
        torch.ones(2, 3, dtype=torch.float16, device=d), torch.ones(2, 3, device=d), -1),
     "must have the same dtype"),
    ("backward dim", lambda d: torch.ops.fk._softmax_backward(
        torch.ones(2, 3, device=d), torch.ones(2, 3, device=d), 5), "out of range"),
]


@pytest.mark.parametrize("name,call,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, call, msg):
    cpu, meta = error_lines(call, ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        torch.ops.fk._softmax_backward(torch.ones(2, 3), torch.ones(2, 3, device="meta"), -1)


# --- level 3: autograd, opcheck, torch.compile, TorchScript --------------------------------

@pytest.mark.parametrize("shape,dim", [((3, 9), -1), ((3, 9), 0), ((2, 3, 5), 1)])
def test_gradcheck(shape, dim):
    x = randn(*shape, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fk.softmax(t, dim), (x,))


def test_opcheck():
    x = randn(4, 3, 40).requires_grad_()
    torch.library.opcheck(torch.ops.fk.softmax, (x, -1))
    torch.library.opcheck(torch.ops.fk.softmax, (x, 1))
    torch.library.opcheck(torch.ops.fk.softmax, (x.detach(), 0))
    y = fk.softmax(x.detach(), 1)
    torch.library.opcheck(torch.ops.fk._softmax_backward, (randn(4, 3, 40), y, 1),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    def f(x):
        return fk.softmax(fk.softmax(x, -1), 1)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for t in (5, 9):
        x = randn(2, t, 16).requires_grad_()
        xe = x.detach().clone().requires_grad_()
        out, ref = compiled(x), f(xe)
        assert_close(out, ref, torch.float32)
        dy = randn(2, t, 16)
        out.backward(dy)
        ref.backward(dy)
        assert_close(x.grad, xe.grad, torch.float32)


class _Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = fk.nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) + fk.softmax(x) + torch.ops.fk.softmax(x, 0)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    module = _Scripted()
    path = tmp_path / "softmax.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::softmax" in str(loaded.graph)
    x = randn(3, 6, 7)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [module(xs[0]), loaded(xs[1])]
    torch.testing.assert_close(outs[1], outs[0])
    ref = ref_softmax(x, 1) + ref_softmax(x, -1) + ref_softmax(x, 0)
    assert_close(outs[1], ref, torch.float32)
    dy = randn(3, 6, 7)
    for o in outs:
        o.backward(dy)
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Every single-pass bucket (aligned widths and odd ones), both sides of the 16384 (unaligned)
# and 32768 (aligned) limits, and looped widths up to a 128K vocabulary.
CUDA_N = [1, 7, 64, 100, 256, 1000, 1024, 2047, 2048, 4096, 5000, 8192, 16384, 16385, 20000,
          32768, 32769, 40000, 128256]


def _rows_for(n):
    return 37 if n <= 4096 else (9 if n <= 32768 else 3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", CUDA_N)
def test_cuda_matches_reference(dtype, n):
    m = _rows_for(n)
    x = randn(m, n, dtype=dtype, device="cuda", scale=3.0).requires_grad_()
    poison_cuda_cache()
    y = fk.softmax(x)
    assert not torch.isnan(y).any(), "unwritten output elements"
    assert_close(y, ref_softmax(x.cpu()), dtype, factor=1.5, what="y")
    dy = randn(m, n, dtype=dtype, device="cuda")
    poison_cuda_cache()
    y.backward(dy)
    assert not torch.isnan(x.grad).any(), "unwritten gradient elements"
    assert_close(x.grad, ref_softmax_backward(dy.cpu(), y.detach().cpu()), dtype, factor=2,
                 what="dx from y")
    (gx,) = ref_grads(lambda t: ref_softmax(t), [x.detach().cpu().requires_grad_()], dy.cpu())
    scale = dy.double().norm().item() if n == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [50, 1000, 4096, 20000, 40000])
@pytest.mark.parametrize("misalign", [False, True])
def test_cuda_masking_like_torch(dtype, n, misalign):
    x = _masked_rows(randn(6, n, dtype=dtype, device="cuda", scale=3.0))
    if misalign:
        x = misaligned(x)
    x.requires_grad_()
    poison_cuda_cache()
    y = fk.softmax(x)
    ref = torch.softmax(x.detach().float(), -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), "NaN rows differ from torch"
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2, 3, 4, 5]]).any()
    assert_close(y, ref_softmax(x.cpu()), dtype, factor=1.5)
    assert (y[2, : n // 2 + 1] == 0).all() and (y[3, 1::3] == 0).all()
    dy = randn(6, n, dtype=dtype, device="cuda")
    if misalign:
        dy = misaligned(dy)
    y.backward(dy)
    assert torch.isnan(x.grad[1]).all() and not torch.isnan(x.grad[[0, 2, 3, 4, 5]]).any()
    assert_close(x.grad, ref_softmax_backward(dy.cpu(), y.detach().cpu()), dtype, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [64, 5000, 40000])
def test_cuda_inf_and_nan_make_the_row_nan(n):
    x = randn(4, n, device="cuda")
    x[0, n // 2] = INF
    x[1, n - 1] = float("nan")
    y = fk.softmax(x)
    assert torch.equal(torch.isnan(y), torch.isnan(torch.softmax(x, -1)))
    assert torch.isnan(y[:2]).all() and not torch.isnan(y[2:]).any()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_other_dims_non_contiguous_misaligned(dtype):
    x = randn(4, 300, 6, dtype=dtype, device="cuda", scale=2.0).requires_grad_()
    for dim in (0, 1, 2, -2):
        y = fk.softmax(x, dim)
        assert y.is_contiguous() and y.shape == x.shape
        assert_close(y, ref_softmax(x.cpu(), dim), dtype, factor=1.5, what=f"dim {dim}")
        dy = randn(4, 300, 6, dtype=dtype, device="cuda")
        (gx,) = torch.autograd.grad(y, x, dy)
        assert_close(gx, ref_softmax_backward(dy.cpu(), y.detach().cpu(), dim), dtype,
                     factor=2, what=f"dx dim {dim}")
    xt = randn(1000, 6, dtype=dtype, device="cuda").t().requires_grad_()
    y = fk.softmax(xt)
    assert_close(y, ref_softmax(xt.cpu()), dtype, factor=1.5)
    dy = randn(1, 1000, dtype=dtype, device="cuda").expand(6, 1000)  # row stride 0
    (gx,) = torch.autograd.grad(y, xt, dy)
    assert_close(gx, ref_softmax_backward(dy.cpu(), y.detach().cpu()), dtype, factor=2)
    for n in (4096, 20000):  # aligned width, misaligned pointer: the unaligned kernels
        xm = misaligned(randn(3, n, dtype=dtype, device="cuda"))
        assert_close(fk.softmax(xm), ref_softmax(xm.cpu()), dtype, factor=1.5)
    one = randn(1, 4096, dtype=dtype, device="cuda")
    assert_close(fk.softmax(one), ref_softmax(one.cpu()), dtype, factor=1.5)
    assert fk.softmax(torch.tensor(3.0, device="cuda", dtype=dtype), 0).item() == 1.0


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, call, msg in BAD:
        cpu, cuda = error_lines(call, ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.softmax(torch.ones(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        torch.ops.fk._softmax_backward(torch.ones(2, 3, device="cuda"), torch.ones(2, 3), -1)
    # One row past the kernels' 32-bit column offsets: a clear error, not a wrong result.
    row = torch.empty((1 << 31) - (1 << 16) + 1, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="is not supported on CUDA"):
        fk.softmax(row)
    del row
    torch.cuda.empty_cache()


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    for shape, dim in (((0, 64), -1), ((5, 0), -1), ((0, 64), 0)):
        assert fk.softmax(torch.empty(shape, device="cuda"), dim).shape == shape
    x = randn(4, 3, 40, device="cuda").requires_grad_()
    torch.library.opcheck(torch.ops.fk.softmax, (x, -1))
    torch.library.opcheck(torch.ops.fk.softmax, (x, 1))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda x: fk.softmax(x, 1).pow(2).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x).backward()
    assert x.grad is not None


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1000, 4096, 40000])
def test_cuda_graph_capture(n):
    """No host synchronisation: forward and backward capture into a CUDA graph."""
    x = randn(8, n, device="cuda")
    dy = randn(8, n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.fk._softmax_backward(dy, fk.softmax(x), -1)  # load the kernels first
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fk.softmax(x)
        dx = torch.ops.fk._softmax_backward(dy, y, -1)
    x.copy_(randn(8, n, device="cuda", scale=2.0))
    g.replay()
    torch.cuda.synchronize()
    assert_close(y, ref_softmax(x.cpu()), torch.float32)
    assert_close(dx, ref_softmax_backward(dy.cpu(), y.cpu()), torch.float32, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [4096, 1000, 40000])
def test_cuda_more_than_2_31_elements(n):
    """Rows past element 2^31: one row per program (4096), two rows per program with an odd
    width (1000: the unaligned kernels), and the looped kernels (40000)."""
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = fk.softmax(x)
    dx = torch.ops.fk._softmax_backward(dy, y, -1)
    for rows in (slice(0, 3), slice(m - 3, m)):
        assert_close(y[rows], ref_softmax(x[rows].cpu()), torch.bfloat16, factor=1.5)
        assert_close(dx[rows], ref_softmax_backward(dy[rows].cpu(), y[rows].cpu()),
                     torch.bfloat16, factor=2)
    del x, dy, y, dx
    torch.cuda.empty_cache()
