"""fk.poly_norm at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, the module, and the CUDA kernels (marker
``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, round_nearest, round_toward_zero)


def _norm(u, eps):
    return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)


def ref_poly_norm(x, weight, bias, eps=1e-6, cast=round_nearest):
    """PolyNorm as PolyCom defines it, in float64, rounded once to x's dtype with `cast`."""
    x64, w = x.double(), weight.double()
    y = (w[0] * _norm(x64 ** 3, eps) + w[1] * _norm(x64 ** 2, eps) + w[2] * _norm(x64, eps)
         + bias.double().reshape(()))
    return y if x.dtype == torch.float64 else cast(y.float(), x.dtype)


def ref_grads(x, weight, bias, dy, eps=1e-6):
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    x64, w, b = leaves
    y = (w[0] * _norm(x64 ** 3, eps) + w[1] * _norm(x64 ** 2, eps) + w[2] * _norm(x64, eps)
         + b.reshape(()))
    y.backward(dy.double())
    return [t.grad for t in leaves]


def grad_scales(dy):
    """The parameter gradients are sums over every element of terms of dy's size; their
    rounding error is measured against that."""
    n = dy.double().norm().item()
    return [n, n]


def _params(dtype, device="cpu", scalar_bias=False):
    w = randn(3, dtype=dtype, device=device) * 0.5 + 0.3
    b = randn(1, dtype=dtype, device=device)
    return w, (b.reshape(()) if scalar_bias else b)


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params_fp32", [True, False])
@pytest.mark.parametrize("n,block,rows", [(40, 64, 2), (64, 64, 1)])
def test_interpreter(dtype, params_fp32, n, block, rows):
    mod = load_triton_src("poly_norm")
    m, eps = 5, 1e-6
    pdt = torch.float32 if params_fp32 else dtype
    x, dy = randn(m, n, dtype=dtype), randn(m, n, dtype=dtype)
    w, b = _params(pdt)
    y = torch.full_like(x, float("nan"))
    rstd = torch.full((m, 3), float("nan"))
    mod.poly_norm_fwd_kernel[(cdiv(m, rows),)](x, w, b, y, rstd, m, n, eps, BLOCK_N=block,
                                               ROWS=rows)
    assert_close(y, ref_poly_norm(x, w, b, eps, cast=round_toward_zero), dtype, factor=2,
                 what="y")
    programs, rows_per_program = 2, 3
    dx = torch.full_like(x, float("nan"))
    partial = torch.full((programs, 4), float("nan"))
    mod.poly_norm_bwd_kernel[(programs,)](dy, x, w, rstd, dx, partial, m, n, rows_per_program,
                                          BLOCK_N=block)
    gx, gw, gb = ref_grads(x, w, b, dy, eps)
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=4, what="dx")
    dw = torch.full_like(w, float("nan"))
    db = torch.full_like(b, float("nan"))
    mod.poly_norm_reduce_kernel[(1,)](partial, dw, db, programs, BLOCK_P=2)
    sw, sb = grad_scales(dy)
    assert_close(dw, gw, pdt, factor=3, what="dweight", scale=sw)
    assert_close(db, gb, pdt, factor=3, what="dbias", scale=sb)


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("params_fp32", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 257), (4, 4096)])
def test_cpu_forward_backward(dtype, params_fp32, shape):
    pdt = torch.float32 if params_fp32 else dtype
    x = randn(*shape, dtype=dtype).requires_grad_()
    w, b = [p.requires_grad_() for p in _params(pdt)]
    y = fk.poly_norm(x, w, b, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    # With one element per row y = +-w0 + w1 +-w2 + b: terms of the weights' size that can
    # cancel to almost nothing, so the error is measured against their size.
    terms = (w.detach().double().abs().sum() + b.detach().double().abs().sum()).item()
    assert_close(y, ref_poly_norm(x, w, b, 1e-5), dtype, factor=2, what="y",
                 scale=terms if shape[-1] == 1 else None)
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    gx, gw, gb = ref_grads(x, w, b, dy, 1e-5)
    # With one element per row every norm is +-1: dx is a cancellation of terms of dy's size.
    scale = dy.double().norm().item() * 10 if shape[-1] == 1 else None
    assert_close(x.grad, gx, dtype, factor=4, what="dx", scale=scale)
    sw, sb = grad_scales(dy)
    assert w.grad.dtype == pdt and b.grad.shape == b.shape
    assert_close(w.grad, gw, pdt, factor=3, what="dweight", scale=sw)
    assert_close(b.grad, gb, pdt, factor=3, what="dbias", scale=sb)


def test_cpu_matches_the_module_formula_in_fp32():
    x, (w, b) = randn(6, 64), _params(torch.float32)

    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-6)

    ref = w[0] * norm(x ** 3) + w[1] * norm(x ** 2) + w[2] * norm(x) + b
    torch.testing.assert_close(fk.poly_norm(x, w, b), ref)


def test_scalar_bias_non_contiguous_and_empty():
    x = randn(40, 6).t()
    w, b = _params(torch.float32, scalar_bias=True)
    assert not x.is_contiguous()
    assert_close(fk.poly_norm(x, w, b), ref_poly_norm(x, w, b), torch.float32, factor=2)
    b.requires_grad_()
    fk.poly_norm(x, w, b).sum().backward()
    assert b.grad.shape == ()
    assert fk.poly_norm(torch.empty(0, 8), *_params(torch.float32)).shape == (0, 8)
    assert fk.poly_norm(torch.empty(3, 0), *_params(torch.float32)).shape == (3, 0)
    xe = torch.empty(0, 8, requires_grad=True)
    pe = [p.requires_grad_() for p in _params(torch.float32)]
    fk.poly_norm(xe, *pe).sum().backward()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in pe)


def test_only_some_gradients_and_double_backward():
    x = randn(4, 16)
    w, b = _params(torch.float32)
    w.requires_grad_()
    fk.poly_norm(x, w, b).sum().backward()
    assert w.grad is not None and b.grad is None and x.grad is None
    x.requires_grad_()
    (gx,) = torch.autograd.grad(fk.poly_norm(x, w, b).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input -----------------------------------------------------------------------------

def _f(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("scalar x", lambda d: (_f(d=d), _f(3, d=d), _f(1, d=d)), "at least one dimension"),
    ("int x", lambda d: (_f(2, 8, dtype=torch.int64, d=d), _f(3, d=d), _f(1, d=d)),
     "not supported"),
    ("weight size", lambda d: (_f(2, 8, d=d), _f(4, d=d), _f(1, d=d)),
     "weight must have shape"),
    ("bias size", lambda d: (_f(2, 8, d=d), _f(3, d=d), _f(2, d=d)), "bias must have shape"),
    ("bias dtype", lambda d: (_f(2, 8, d=d), _f(3, d=d), _f(1, dtype=torch.float16, d=d)),
     "weight and bias must have the same dtype"),
    ("param dtype", lambda d: (_f(2, 8, dtype=torch.bfloat16, d=d),
                               _f(3, dtype=torch.float16, d=d), _f(1, dtype=torch.float16, d=d)),
     "must be float32 or x's dtype"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.poly_norm(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_backward_input_cpu_and_meta_agree():
    def call(d):
        return torch.ops.fk._poly_norm_backward(_f(2, 8, d=d), _f(2, 8, d=d), _f(3, d=d),
                                                _f(1, d=d), _f(2, d=d), [True] * 3)
    cpu, meta = error_lines(call, ("cpu", "meta"), "rstd must hold three values")
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.poly_norm(torch.ones(2, 8), torch.ones(3), torch.ones(1, device="meta"))


def test_module():
    m = fk.nn.PolyNorm()
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    assert torch.allclose(m.weight, torch.full((3,), 1 / 3)) and m.bias.item() == 1.0
    assert m.bias.shape == () and m.variance_epsilon == 1e-6
    x = randn(3, 5, 32)
    assert_close(m(x), ref_poly_norm(x, m.weight, m.bias), torch.float32, factor=2)
    m(x).sum().backward()
    assert m.weight.grad is not None and m.bias.grad.shape == ()
    half = fk.nn.PolyNorm(eps=1e-5).to(torch.bfloat16)
    assert half(x.bfloat16()).dtype == torch.bfloat16


# --- level 3: autograd, opcheck, torch.compile, TorchScript ------------------------------

@pytest.mark.parametrize("scalar_bias", [True, False])
def test_gradcheck(scalar_bias):
    x = randn(3, 9, dtype=torch.float64).requires_grad_()
    w, b = [p.requires_grad_() for p in _params(torch.float64, scalar_bias=scalar_bias)]
    assert torch.autograd.gradcheck(lambda x, w, b: fk.poly_norm(x, w, b, 1e-6), (x, w, b))


def test_opcheck():
    x = randn(4, 3, 40).requires_grad_()
    w, b = [p.requires_grad_() for p in _params(torch.float32)]
    torch.library.opcheck(torch.ops.fk.poly_norm, (x, w, b, 1e-6))
    xb = randn(4, 40, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fk._poly_norm_forward, (xb, w.detach(), b.detach(), 1e-5),
                          test_utils=("test_schema", "test_faketensor"))
    _, rstd = torch.ops.fk._poly_norm_forward(x.detach(), w.detach(), b.detach(), 1e-6)
    assert rstd.shape == (4, 3, 3) and rstd.dtype == torch.float32
    dy = randn(4, 3, 40)
    for mask in ([True, True, True], [False, True, False]):
        torch.library.opcheck(torch.ops.fk._poly_norm_backward,
                              (dy, x.detach(), w.detach(), b.detach(), rstd, mask),
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def block(x, w, b):
        return fk.poly_norm(x, w, b) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [randn(rows, 32).requires_grad_(),
                *[p.requires_grad_() for p in _params(torch.float32)]]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args)
        ref = block(*eager_args)
        assert_close(out, ref, torch.float32, factor=10)
        out.sum().backward()
        ref.sum().backward()
        for a, b in zip(args, eager_args):
            assert_close(a.grad, b.grad, torch.float32, factor=10)


class _Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = fk.nn.PolyNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) + fk.poly_norm(x, self.norm.weight, self.norm.bias, 1e-5)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    module = _Scripted()
    path = tmp_path / "poly_norm.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::_poly_norm_forward" in str(loaded.inlined_graph)
    x = randn(3, 6, 7)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [module(xs[0]), loaded(xs[1])]
    torch.testing.assert_close(outs[1], outs[0])
    p = module.norm
    assert_close(outs[0], ref_poly_norm(x, p.weight, p.bias) +
                 ref_poly_norm(x, p.weight, p.bias, 1e-5), torch.float32, factor=2)
    dy = randn(3, 6, 7)
    for o in outs:
        o.backward(dy)
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Every single-pass bucket and its edges, up to the 16384 limit.
CUDA_N = [1, 7, 64, 127, 256, 257, 1000, 1024, 2047, 4096, 5120, 8192, 8193, 12288, 16384]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params_fp32", [True, False])
@pytest.mark.parametrize("n", CUDA_N)
def test_cuda_matches_reference(dtype, params_fp32, n):
    m, eps = 37, 1e-6
    pdt = torch.float32 if params_fp32 else dtype
    x = randn(m, n, dtype=dtype, device="cuda").requires_grad_()
    w, b = [p.requires_grad_() for p in _params(pdt, device="cuda")]
    poison_cuda_cache()
    y = fk.poly_norm(x, w, b, eps)
    assert not torch.isnan(y).any(), "unwritten output elements"
    assert_close(y, ref_poly_norm(x.cpu(), w.cpu(), b.cpu(), eps), dtype, factor=2)
    dy = randn(m, n, dtype=dtype, device="cuda")
    poison_cuda_cache()
    y.backward(dy)
    gx, gw, gb = ref_grads(x.cpu(), w.cpu(), b.cpu(), dy.cpu(), eps)
    scale = dy.double().norm().item() * 10 if n == 1 else None
    assert_close(x.grad, gx, dtype, factor=4, what="dx", scale=scale)
    sw, sb = grad_scales(dy.cpu())
    assert w.grad.dtype == pdt and b.grad.shape == b.shape
    assert_close(w.grad, gw, pdt, factor=3, what="dweight", scale=sw)
    assert_close(b.grad, gb, pdt, factor=3, what="dbias", scale=sb)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (2, 3, 4096), (8192, 4096), (3, 128)])
def test_cuda_shapes_misaligned_scalar_bias(dtype, shape):
    x = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    w, b = [p.requires_grad_() for p in _params(torch.float32, device="cuda", scalar_bias=True)]
    y = fk.poly_norm(x, w, b)
    assert_close(y, ref_poly_norm(x.cpu(), w.cpu(), b.cpu()), dtype, factor=2)
    dy = randn(*shape, dtype=dtype, device="cuda")
    y.backward(dy * 3.0)
    gx, gw, gb = ref_grads(x.cpu(), w.cpu(), b.cpu(), dy.cpu() * 3.0)
    assert b.grad.shape == ()
    assert_close(x.grad, gx, dtype, factor=4)
    sw, sb = grad_scales(dy.cpu() * 3.0)
    assert_close(w.grad, gw, torch.float32, factor=3, scale=sw)
    assert_close(b.grad, gb, torch.float32, factor=3, scale=sb)
    xm = misaligned(randn(*shape, dtype=dtype, device="cuda"))
    wm, bm = misaligned(w.detach()), misaligned(b.detach().reshape(1))
    ym, rstd = torch.ops.fk._poly_norm_forward(xm, wm, bm, 1e-6)
    assert_close(ym, ref_poly_norm(xm.cpu(), wm.cpu(), bm.cpu()), dtype, factor=2)
    dym = misaligned(dy)
    dx, dw, db = torch.ops.fk._poly_norm_backward(dym, xm, wm, bm, misaligned(rstd), [True] * 3)
    gx, gw, gb = ref_grads(xm.cpu(), wm.cpu(), bm.cpu(), dym.cpu())
    assert_close(dx, gx, dtype, factor=4)
    sw, sb = grad_scales(dym.cpu())
    assert_close(dw, gw, torch.float32, factor=3, scale=sw)
    assert_close(db, gb, torch.float32, factor=3, scale=sb)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.poly_norm(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.poly_norm(_f(2, 4, dtype=torch.float64, d="cuda"),
                     _f(3, dtype=torch.float64, d="cuda"), _f(1, dtype=torch.float64, d="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.poly_norm(_f(2, 4, d="cuda"), _f(3), _f(1, d="cuda"))
    with pytest.raises(RuntimeError, match="columns the CUDA kernels hold in one pass"):
        fk.poly_norm(_f(2, 16385, d="cuda"), _f(3, d="cuda"), _f(1, d="cuda"))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    assert fk.poly_norm(_f(0, 64, d="cuda"), *_params(torch.float32, device="cuda")).shape == (0, 64)
    x = randn(4, 3, 40, device="cuda").requires_grad_()
    w, b = [p.requires_grad_() for p in _params(torch.float32, device="cuda")]
    torch.library.opcheck(torch.ops.fk.poly_norm, (x, w, b, 1e-6))
    # aot_eager: traces fk's fake kernels and autograd without Inductor.
    f = torch.compile(lambda x, w, b: fk.poly_norm(x, w, b).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, w, b).backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


@pytest.mark.cuda
def test_cuda_graph_capture():
    x = randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    dy = randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    w, b = _params(torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y, rstd = torch.ops.fk._poly_norm_forward(x, w, b, 1e-6)  # load the kernels first
        torch.ops.fk._poly_norm_backward(dy, x, w, b, rstd, [True] * 3)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, rstd = torch.ops.fk._poly_norm_forward(x, w, b, 1e-6)
        dx, dw, db = torch.ops.fk._poly_norm_backward(dy, x, w, b, rstd, [True] * 3)
    x.copy_(randn(64, 1000, device="cuda", dtype=torch.bfloat16, scale=2.0))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, ref_poly_norm(x.cpu(), w.cpu(), b.cpu()), torch.bfloat16, factor=2)
    gx, gw, gb = ref_grads(x.cpu(), w.cpu(), b.cpu(), dy.cpu())
    assert_close(dx, gx, torch.bfloat16, factor=4)
    sw, sb = grad_scales(dy.cpu())
    assert_close(dw, gw, torch.float32, factor=3, scale=sw)
    assert_close(db, gb, torch.float32, factor=3, scale=sb)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = 4096
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w, b = _params(torch.bfloat16, device="cuda")
    y, rstd = torch.ops.fk._poly_norm_forward(x, w, b, 1e-6)
    for rows in (slice(0, 4), slice(m - 4, m)):
        assert_close(y[rows], ref_poly_norm(x[rows].cpu(), w.cpu(), b.cpu()), torch.bfloat16,
                     factor=2)
    del y
    dy = torch.ones_like(x)
    dx, dw, db = torch.ops.fk._poly_norm_backward(dy, x, w, b, rstd, [True] * 3)
    for rows in (slice(0, 4), slice(m - 4, m)):
        gx = ref_grads(x[rows].cpu(), w.cpu(), b.cpu(), dy[rows].cpu())[0]
        assert_close(dx[rows], gx, torch.bfloat16, factor=4)
    # dbias is the sum of dy = ones over every element, rounded to bfloat16.
    assert db.float().item() == torch.tensor(float(m * n)).bfloat16().float().item()
    del x, dy, dx
    torch.cuda.empty_cache()
