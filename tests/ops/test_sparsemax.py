"""fk.sparsemax at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_grads, round_nearest, round_toward_zero)

INF = float("inf")
NAN = float("nan")

# The interpreter evaluates -inf - (-inf) and x / 0 in numpy for rows without a finite
# maximum, which warns, and converts program ids through one-element arrays.
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
              pytest.mark.filterwarnings(
                  "ignore:Conversion of an array with ndim:DeprecationWarning")]


# --- references (float64, from the sorted slice) ------------------------------------------

def ref_sparsemax(x, dim=-1, cast=round_nearest):
    """Sparsemax from its sort-based definition in float64: sort z = x - max descending,
    k* = max{k : 1 + k z_(k) > z_(1) + ... + z_(k)}, tau = (z_(1) + ... + z_(k*) - 1) / k*,
    y = max(z - tau, 0); rounded once to x's dtype with `cast`. A slice without a finite
    maximum (+inf, NaN, or only -inf) is NaN. Differentiable (autograd through the sort)."""
    x64 = x.double() if x.dtype != torch.float64 else x
    if x64.dim() == 0:
        x64 = x64.reshape(1)
    z = x64.movedim(dim, -1)
    m = z.amax(-1, keepdim=True)
    z = z - m.detach()
    zs = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=torch.float64)
    support = 1 + k * zs > torch.cumsum(zs, -1)
    count = support.sum(-1, keepdim=True)
    tau = (torch.where(support, zs, 0.0).sum(-1, keepdim=True) - 1) / count
    y = torch.clamp(z - tau, min=0.0)
    y = torch.where(torch.isfinite(m), y, NAN).movedim(-1, dim).reshape(x.shape)
    return y if x.dtype == torch.float64 else cast(y.float(), x.dtype)


def ref_sparsemax_backward(dy, y, dim=-1, cast=round_nearest):
    """grad_x = dy - mean over {y > 0} of dy on {y > 0}, else 0; float64, from the given y."""
    y64, dy64 = y.double(), dy.double()
    on = y64 > 0
    count = on.sum(dim, keepdim=True).clamp(min=1)
    mean = torch.where(on, dy64, 0.0).sum(dim, keepdim=True) / count
    dx = torch.where(on, dy64 - mean, 0.0)
    return dx if y.dtype == torch.float64 else cast(dx.float(), y.dtype)


def _special_rows(x):
    """Patterns in the first rows of a (m >= 9, n >= 8) tensor, in place: ties (all equal),
    the first half -inf, every third element -inf, one finite element, a +inf, a NaN, a row
    of only -inf, a uniform row (the most passes of the search), large values."""
    n = x.shape[-1]
    x[1] = 0.25
    x[2, : n // 2 + 1] = -INF
    x[3, 1::3] = -INF
    x[4] = -INF
    x[4, n // 3] = 1.5
    x[5, n // 2] = INF
    x[6, n - 1] = NAN
    x[7] = -INF
    x[8] = torch.rand(n, dtype=torch.float32).to(x.dtype)
    return x


NAN_ROWS = [5, 6, 7]
FINITE_ROWS = [0, 1, 2, 3, 4, 8]


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,block", [(100, 128), (128, 128), (21, 32)])
def test_interpreter(dtype, n, block):
    mod = load_triton_src("sparsemax")
    m = 11
    x = _special_rows(randn(m, n, dtype=dtype, scale=2.0))
    y = torch.full_like(x, 7.0)
    mod.sparsemax_fwd_kernel[(m,)](x, y, n, n, m, n, BLOCK_N=block)
    ref = ref_sparsemax(x, cast=round_toward_zero)
    assert_close(y, ref, dtype, factor=2, what="y")
    assert torch.isnan(y[NAN_ROWS]).all() and not torch.isnan(y[FINITE_ROWS]).any()
    assert torch.equal(y[1], torch.full((n,), 1.0 / n).to(dtype).to(torch.float32).to(dtype)) \
        or dtype == torch.bfloat16
    assert y[4, n // 3] == 1 and (y[4].sum() == 1)
    assert (y[2, : n // 2 + 1] == 0).all() and (y[3, 1::3] == 0).all()
    dy = randn(m, n, dtype=dtype)
    dx = torch.full_like(x, 7.0)
    mod.sparsemax_bwd_kernel[(m,)](dy, y, dx, n, n, n, m, n, BLOCK_N=block)
    assert_close(dx, ref_sparsemax_backward(dy, y, cast=round_toward_zero), dtype, factor=2,
                 what="dx")


DISTRIBUTIONS = {
    "randn": lambda m, n: torch.randn(m, n),
    "randn * 0.01": lambda m, n: torch.randn(m, n) * 0.01,
    "randn * 100": lambda m, n: torch.randn(m, n) * 100,
    "uniform": lambda m, n: torch.rand(m, n),
    "ramp": lambda m, n: torch.arange(n).float().expand(m, n) / n * 2,
    "geometric": lambda m, n: torch.exp2(-torch.arange(n).float()).expand(m, n).contiguous(),
    "large": lambda m, n: torch.randn(m, n) * 1e4 + 1e6,
    "few levels": lambda m, n: torch.randint(0, 4, (m, n)).float() * 0.3,
}


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_interpreter_matches_the_sort_exactly_up_to_rounding(name):
    """The search ends on the same support as the sort: outputs agree to fp32 rounding, and
    every entry the reference sets to 0 (beyond rounding) is exactly 0."""
    mod = load_triton_src("sparsemax")
    torch.manual_seed(0)
    m, n = 2, 300
    x = DISTRIBUTIONS[name](m, n)
    y = torch.full_like(x, 7.0)
    mod.sparsemax_fwd_kernel[(m,)](x, y, n, n, m, n, BLOCK_N=512)
    ref = ref_sparsemax(x.double())
    assert (y.double() - ref).abs().max() <= 4e-7 * max(1.0, ref.abs().max().item())
    assert (y[ref == 0] == 0).all()
    assert (y.double().sum(-1) - 1).abs().max() < 1e-5


# --- level 2: the CPU backend against the reference --------------------------------------

SHAPES_DIMS = [((1,), -1), ((1, 1), 0), ((3, 7), -1), ((3, 7), 0), ((2, 3, 257), 1),
               ((2, 3, 257), -1), ((4, 4096), -1)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
def test_cpu_forward_backward(dtype, shape, dim):
    x = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    y = fk.sparsemax(x, dim)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    ref = ref_sparsemax(x.detach(), dim)
    assert_close(y, ref, dtype, what="y")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    scale = dy.double().norm().item()
    assert_close(x.grad, ref_sparsemax_backward(dy, y.detach(), dim), dtype, factor=2,
                 what="dx from y", scale=scale)
    if dtype in (torch.float32, torch.float64):
        # Autograd through the sort. (On the coarse 16-bit grids an entry sits exactly at
        # the threshold now and then, where the derivative is one-sided and the sort's
        # autograd counts the entry in; the backward counts only y > 0.)
        (gx,) = ref_grads(lambda t: ref_sparsemax(t, dim), [x], dy)
        assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_special_rows(dtype):
    n = 50
    x = _special_rows(randn(11, n, dtype=dtype, scale=2.0)).requires_grad_()
    y = fk.sparsemax(x)
    assert torch.isnan(y[NAN_ROWS]).all() and not torch.isnan(y[FINITE_ROWS]).any()
    assert_close(y, ref_sparsemax(x.detach()), dtype)
    assert (y[1] == torch.tensor(1.0 / n).to(dtype)).all()
    assert y[4, n // 3] == 1 and (y[2, : n // 2 + 1] == 0).all() and (y[3, 1::3] == 0).all()
    dy = randn(11, n, dtype=dtype)
    y.backward(dy)
    assert (x.grad[NAN_ROWS] == 0).all()
    assert_close(x.grad, ref_sparsemax_backward(dy, y.detach()), dtype, factor=2)


@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_cpu_distributions(name):
    torch.manual_seed(1)
    x = DISTRIBUTIONS[name](3, 300)
    y = fk.sparsemax(x)
    ref = ref_sparsemax(x.double())
    assert (y.double() - ref).abs().max() <= 4e-7 * max(1.0, ref.abs().max().item())
    assert (y[ref == 0] == 0).all()


def test_cpu_non_contiguous_empty_and_scalar():
    x = randn(40, 6).t()
    assert not x.is_contiguous()
    for dim in (0, 1, -1):
        assert_close(fk.sparsemax(x, dim), ref_sparsemax(x, dim), torch.float32)
    for shape, dim in (((0, 8), -1), ((3, 0), -1), ((0, 8), 0), ((2, 0, 3), 1)):
        out = fk.sparsemax(torch.empty(shape), dim)
        assert out.shape == shape
    s = torch.tensor(2.5, requires_grad=True)
    out = fk.sparsemax(s, 0)
    assert out.shape == () and out.item() == 1.0
    assert fk.sparsemax(s, -1).item() == 1.0
    out.backward()
    assert s.grad.item() == 0.0


def test_double_backward_is_a_clear_error():
    x = randn(4, 16).requires_grad_()
    (gx,) = torch.autograd.grad((fk.sparsemax(x) * randn(4, 16)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_module():
    x = randn(3, 4, 5)
    for dim in (0, 1, -1):
        mod = fk.nn.Sparsemax(dim)
        assert_close(mod(x), ref_sparsemax(x, dim), torch.float32)
        assert repr(mod) == f"Sparsemax(dim={dim})"
    assert fk.nn.Sparsemax().dim == -1


# --- bad input -----------------------------------------------------------------------------

BAD = [
    ("int dtype", lambda d: fk.sparsemax(torch.ones(2, 3, dtype=torch.int64, device=d)),
     "not supported"),
    ("dim too large", lambda d: fk.sparsemax(torch.ones(2, 3, device=d), 2), "out of range"),
    ("dim too small", lambda d: fk.sparsemax(torch.ones(2, 3, device=d), -3), "out of range"),
    ("scalar dim", lambda d: fk.sparsemax(torch.tensor(1.0, device=d), 1), "out of range"),
    ("backward shapes", lambda d: torch.ops.fk._sparsemax_backward(
        torch.ones(2, 3, device=d), torch.ones(2, 4, device=d), -1), "must have the same shape"),
    ("backward dtypes", lambda d: torch.ops.fk._sparsemax_backward(
        torch.ones(2, 3, dtype=torch.float16, device=d), torch.ones(2, 3, device=d), -1),
     "must have the same dtype"),
    ("backward dim", lambda d: torch.ops.fk._sparsemax_backward(
        torch.ones(2, 3, device=d), torch.ones(2, 3, device=d), 5), "out of range"),
]


@pytest.mark.parametrize("name,call,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, call, msg):
    cpu, meta = error_lines(call, ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        torch.ops.fk._sparsemax_backward(torch.ones(2, 3), torch.ones(2, 3, device="meta"), -1)


# --- level 3: autograd, opcheck, torch.compile, TorchScript --------------------------------

@pytest.mark.parametrize("shape,dim", [((3, 9), -1), ((3, 9), 0), ((2, 3, 5), 1)])
def test_gradcheck(shape, dim):
    x = randn(*shape, dtype=torch.float64, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fk.sparsemax(t, dim), (x,))


def test_opcheck():
    x = randn(4, 3, 40).requires_grad_()
    torch.library.opcheck(torch.ops.fk.sparsemax, (x, -1))
    torch.library.opcheck(torch.ops.fk.sparsemax, (x, 1))
    torch.library.opcheck(torch.ops.fk.sparsemax, (x.detach(), 0))
    y = fk.sparsemax(x.detach(), 1)
    torch.library.opcheck(torch.ops.fk._sparsemax_backward, (randn(4, 3, 40), y, 1),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    def f(x):
        return fk.sparsemax(fk.sparsemax(x, -1), 1)

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
        self.act = fk.nn.Sparsemax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) + fk.sparsemax(x) + torch.ops.fk.sparsemax(x, 0)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    module = _Scripted()
    path = tmp_path / "sparsemax.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::sparsemax" in str(loaded.graph)
    x = randn(3, 6, 7)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [module(xs[0]), loaded(xs[1])]
    torch.testing.assert_close(outs[1], outs[0])
    ref = ref_sparsemax(x, 1) + ref_sparsemax(x, -1) + ref_sparsemax(x, 0)
    assert_close(outs[1], ref, torch.float32)
    dy = randn(3, 6, 7)
    for o in outs:
        o.backward(dy)
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Every bucket (aligned widths and odd ones) up to the 32768 limit.
CUDA_N = [1, 7, 64, 100, 256, 1000, 1024, 2047, 2048, 4096, 5000, 8192, 16384, 16385, 20000,
          32767, 32768]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", CUDA_N)
def test_cuda_matches_reference(dtype, n):
    m = 37 if n <= 4096 else 9
    x = randn(m, n, dtype=dtype, device="cuda", scale=3.0)
    if n >= 16:
        x = _special_rows(x)
    x.requires_grad_()
    poison_cuda_cache()
    y = fk.sparsemax(x)
    ref = ref_sparsemax(x.detach().cpu())
    assert torch.equal(torch.isnan(y.cpu()), torch.isnan(ref)), "unwritten or wrong NaN rows"
    assert_close(y, ref, dtype, factor=1.5, what="y")
    assert (y.cpu()[ref == 0] == 0).all()
    dy = randn(m, n, dtype=dtype, device="cuda", scale=2.0)
    poison_cuda_cache()
    y.backward(dy)
    assert not torch.isnan(x.grad).any(), "unwritten gradient elements"
    assert_close(x.grad, ref_sparsemax_backward(dy.cpu(), y.detach().cpu()), dtype, factor=2,
                 what="dx from y", scale=dy.double().norm().item())


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
@pytest.mark.parametrize("n", [4096, 32768])
def test_cuda_distributions(name, n):
    torch.manual_seed(2)
    x = DISTRIBUTIONS[name](8, n).cuda()
    y = fk.sparsemax(x).cpu()
    ref = ref_sparsemax(x.cpu().double())
    assert (y.double() - ref).abs().max() <= 4e-7 * max(1.0, ref.abs().max().item())
    assert (y[ref == 0] == 0).all()
    yb = fk.sparsemax(x.bfloat16())
    assert_close(yb, ref_sparsemax(x.bfloat16().cpu()), torch.bfloat16, factor=1.5)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [50, 1000, 4096, 20000])
def test_cuda_misaligned(dtype, n):
    x = misaligned(_special_rows(randn(11, n, dtype=dtype, device="cuda", scale=3.0)))
    x.requires_grad_()
    poison_cuda_cache()
    y = fk.sparsemax(x)
    assert_close(y, ref_sparsemax(x.detach().cpu()), dtype, factor=1.5)
    dy = misaligned(randn(11, n, dtype=dtype, device="cuda"))
    y.backward(dy)
    assert_close(x.grad, ref_sparsemax_backward(dy.cpu(), y.detach().cpu()), dtype, factor=2,
                 scale=dy.double().norm().item())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_other_dims_non_contiguous(dtype):
    x = randn(4, 300, 6, dtype=dtype, device="cuda", scale=2.0).requires_grad_()
    for dim in (0, 1, 2, -2):
        y = fk.sparsemax(x, dim)
        assert y.is_contiguous() and y.shape == x.shape
        assert_close(y, ref_sparsemax(x.detach().cpu(), dim), dtype, factor=1.5,
                     what=f"dim {dim}")
        dy = randn(4, 300, 6, dtype=dtype, device="cuda")
        (gx,) = torch.autograd.grad(y, x, dy)
        assert_close(gx, ref_sparsemax_backward(dy.cpu(), y.detach().cpu(), dim), dtype,
                     factor=2, what=f"dx dim {dim}", scale=dy.double().norm().item())
    xt = randn(1000, 6, dtype=dtype, device="cuda").t().requires_grad_()
    y = fk.sparsemax(xt)
    assert_close(y, ref_sparsemax(xt.detach().cpu()), dtype, factor=1.5)
    dy = randn(1, 1000, dtype=dtype, device="cuda").expand(6, 1000)  # row stride 0
    (gx,) = torch.autograd.grad(y, xt, dy)
    assert_close(gx, ref_sparsemax_backward(dy.cpu(), y.detach().cpu()), dtype, factor=2,
                 scale=dy.double().norm().item())
    assert fk.sparsemax(torch.tensor(3.0, device="cuda", dtype=dtype), 0).item() == 1.0


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, call, msg in BAD:
        cpu, cuda = error_lines(call, ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.sparsemax(torch.ones(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        torch.ops.fk._sparsemax_backward(torch.ones(2, 3, device="cuda"), torch.ones(2, 3), -1)
    with pytest.raises(RuntimeError, match="more than 32768 elements is not supported on CUDA"):
        fk.sparsemax(torch.ones(2, 32769, device="cuda"))
    with pytest.raises(RuntimeError, match="more than 32768 elements is not supported on CUDA"):
        fk.sparsemax(torch.ones(32769, 2, device="cuda"), 0)
    with pytest.raises(RuntimeError, match="more than 32768 elements is not supported on CUDA"):
        torch.ops.fk._sparsemax_backward(torch.ones(2, 40000, device="cuda"),
                                         torch.ones(2, 40000, device="cuda"), -1)


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    for shape, dim in (((0, 64), -1), ((5, 0), -1), ((0, 64), 0)):
        assert fk.sparsemax(torch.empty(shape, device="cuda"), dim).shape == shape
    x = randn(4, 3, 40, device="cuda").requires_grad_()
    torch.library.opcheck(torch.ops.fk.sparsemax, (x, -1))
    torch.library.opcheck(torch.ops.fk.sparsemax, (x, 1))
    f = torch.compile(lambda x: fk.sparsemax(x, 1).pow(2).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x).backward()
    assert x.grad is not None


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1000, 4096, 32768])
def test_cuda_graph_capture(n):
    """No host synchronisation: forward and backward capture into a CUDA graph."""
    x = randn(8, n, device="cuda")
    dy = randn(8, n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.fk._sparsemax_backward(dy, fk.sparsemax(x), -1)  # load the kernels first
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fk.sparsemax(x)
        dx = torch.ops.fk._sparsemax_backward(dy, y, -1)
    x.copy_(randn(8, n, device="cuda", scale=0.01))  # many more passes than at capture
    g.replay()
    torch.cuda.synchronize()
    assert_close(y, ref_sparsemax(x.cpu()), torch.float32)
    assert_close(dx, ref_sparsemax_backward(dy.cpu(), y.cpu()), torch.float32, factor=2,
                 scale=dy.double().norm().item())


@pytest.mark.cuda
@pytest.mark.parametrize("n", [4096, 1000])
def test_cuda_more_than_2_31_elements(n):
    """Rows past element 2^31: aligned (4096) and unaligned (1000) kernels."""
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = fk.sparsemax(x)
    dx = torch.ops.fk._sparsemax_backward(dy, y, -1)
    for rows in (slice(0, 3), slice(m - 3, m)):
        assert_close(y[rows], ref_sparsemax(x[rows].cpu()), torch.bfloat16, factor=1.5)
        assert_close(dx[rows], ref_sparsemax_backward(dy[rows].cpu(), y[rows].cpu()),
                     torch.bfloat16, factor=2, scale=dy[rows].double().norm().item())
    del x, dy, y, dx
    torch.cuda.empty_cache()
