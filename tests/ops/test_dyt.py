"""fk.dyt at every test level: Triton source (interpreter), CPU backend, autograd, opcheck,
torch.compile, TorchScript, bad input, the module, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, round_nearest, round_toward_zero)


def ref_dyt(x, alpha, gamma, beta=None, cast=round_nearest):
    """DyT as the paper's module defines it, gamma * tanh(alpha * x) + beta, in float64,
    rounded once to x's dtype with `cast`."""
    y = torch.tanh(alpha.double().reshape(()) * x.double()) * gamma.double()
    if beta is not None:
        y = y + beta.double()
    return y if x.dtype == torch.float64 else cast(y.float(), x.dtype)


def ref_dyt_grads(x, alpha, gamma, beta, dy):
    """float64 gradients (dx, dalpha, dgamma, dbeta) of ref_dyt through autograd."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None
              for t in (x, alpha, gamma, beta)]
    y = torch.tanh(leaves[1].reshape(()) * leaves[0]) * leaves[2]
    if beta is not None:
        y = y + leaves[3]
    y.backward(dy.double())
    return [t.grad if t is not None else None for t in leaves]


def dx_scale(alpha, gamma, dy):
    """The size of the terms dx is made of (dy * gamma * alpha times 1 - tanh^2, a
    cancellation of 1 and tanh^2 where alpha x is large): dx's error is measured against it."""
    return (dy.double() * gamma.double() * alpha.double().reshape(())).norm().item()


def grad_scales(x, alpha, gamma, dy):
    """The sizes of the terms each parameter gradient sums (x * s, dy * t, dy; s = (1 - t^2)
    * gamma * dy): the sums cancel, so their rounding error is measured against these. For
    dalpha, as for dx (dx_scale), the terms of 1 - t^2 too: where alpha x is large that
    difference of 1 and t^2 keeps only the bits the two do not share."""
    x, dy = x.detach().double(), dy.double()
    t = torch.tanh(alpha.detach().double().reshape(()) * x)
    gdy = gamma.detach().double() * dy
    return [(x * gdy).norm().item(), (dy * t).norm().item(), dy.norm().item()]


def _params(n, dtype, with_beta=True, device="cpu", scalar_alpha=False):
    alpha = randn(1, dtype=dtype, device=device) * 0.3 + 0.7
    if scalar_alpha:
        alpha = alpha.reshape(())
    gamma = randn(n, dtype=dtype, device=device)
    beta = randn(n, dtype=dtype, device=device) if with_beta else None
    return alpha, gamma, beta


# --- level 1: the Triton source under the interpreter ---------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params_fp32", [True, False])
@pytest.mark.parametrize("with_beta", [True, False])
@pytest.mark.parametrize("n,block,rows", [(40, 16, 4), (33, 64, 2)])
def test_interpreter(dtype, params_fp32, with_beta, n, block, rows):
    mod = load_triton_src("dyt")
    m = 7
    pdt = torch.float32 if params_fp32 else dtype
    x, dy = randn(m, n, dtype=dtype, scale=2.0), randn(m, n, dtype=dtype)
    alpha, gamma, beta = _params(n, pdt, with_beta)
    y = torch.full_like(x, float("nan"))
    mod.dyt_fwd_kernel[(cdiv(m, rows), cdiv(n, block))](
        x, alpha, gamma, gamma if beta is None else beta, y, m, n, int(with_beta),
        BLOCK_N=block, ROWS=rows)
    assert_close(y, ref_dyt(x, alpha, gamma, beta, cast=round_toward_zero), dtype, factor=1.5,
                 what="y")
    nb, rows_per_program = cdiv(n, block), 2 * rows
    programs = cdiv(m, rows_per_program)
    dx = torch.full_like(x, float("nan"))
    partial = torch.full((programs, 2 * n + nb), float("nan"))
    mod.dyt_bwd_kernel[(programs, nb)](dy, x, alpha, gamma, dx, partial, m, n, rows_per_program,
                                       nb, BLOCK_N=block, ROWS=rows)
    gx, ga, gg, gb = ref_dyt_grads(x, alpha, gamma, beta, dy)
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=3, what="dx",
                 scale=dx_scale(alpha, gamma, dy))
    da = torch.full_like(alpha, float("nan"))
    dg = torch.full_like(gamma, float("nan"))
    db = torch.full_like(gamma, float("nan"))
    mod.dyt_reduce_kernel[(cdiv(n, 8) + 1,)](partial, da, dg, db, programs, n, nb,
                                             int(with_beta), BLOCK_P=2, BLOCK_N=8)
    sa, sg, sb = grad_scales(x, alpha, gamma, dy)
    assert_close(da, ga, pdt, factor=3, what="dalpha", scale=sa)
    assert_close(dg, gg, pdt, factor=3, what="dgamma", scale=sg)
    if with_beta:
        assert_close(db, gb, pdt, factor=3, what="dbeta", scale=sb)
    else:
        assert torch.isnan(db).all(), "dbeta written without beta"


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("params_fp32", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 257), (4, 4096)])
@pytest.mark.parametrize("with_beta", [True, False])
def test_cpu_forward_backward(dtype, params_fp32, shape, with_beta):
    pdt = torch.float32 if params_fp32 else dtype
    x = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    params = [p.requires_grad_() if p is not None else None
              for p in _params(shape[-1], pdt, with_beta)]
    y = fk.dyt(x, *params)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert_close(y, ref_dyt(x, *params), dtype, what="y")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    ref = ref_dyt_grads(x, *params, dy)
    assert_close(x.grad, ref[0], dtype, factor=3, what="dx",
                 scale=dx_scale(params[0], params[1], dy))
    scales = grad_scales(x, params[0], params[1], dy)
    for p, r, sc, name in zip(params, ref[1:], scales, ("dalpha", "dgamma", "dbeta")):
        if p is not None:
            assert p.grad.dtype == p.dtype and p.grad.shape == p.shape
            assert_close(p.grad, r, pdt, factor=3, what=name, scale=sc)


def test_cpu_matches_the_module_formula_in_fp32():
    x, (a, g, b) = randn(6, 64), _params(64, torch.float32)
    torch.testing.assert_close(fk.dyt(x, a, g, b), g * torch.tanh(a * x) + b)


def test_scalar_alpha_non_contiguous_and_empty():
    x = randn(40, 6).t()
    a, g, b = _params(40, torch.float32, scalar_alpha=True)
    assert not x.is_contiguous()
    assert_close(fk.dyt(x, a, g, b), ref_dyt(x, a, g, b), torch.float32)
    a.requires_grad_()
    fk.dyt(x, a, g, b).sum().backward()
    assert a.grad.shape == ()
    assert fk.dyt(torch.empty(0, 8), *_params(8, torch.float32)).shape == (0, 8)
    assert fk.dyt(torch.empty(3, 0), *_params(0, torch.float32)).shape == (3, 0)
    xe = torch.empty(0, 8, requires_grad=True)
    pe = [p.requires_grad_() for p in _params(8, torch.float32)]
    fk.dyt(xe, *pe).sum().backward()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in pe)


def test_only_some_gradients():
    x = randn(4, 16)
    a, g, b = _params(16, torch.float32)
    g.requires_grad_()
    fk.dyt(x, a, g, b).sum().backward()
    assert g.grad is not None and a.grad is None and b.grad is None and x.grad is None
    x.requires_grad_()
    fk.dyt(x, a, g.detach(), None).sum().backward()
    assert x.grad is not None


def test_double_backward_is_a_clear_error():
    x = randn(4, 16).requires_grad_()
    (gx,) = torch.autograd.grad(fk.dyt(x, *_params(16, torch.float32)).pow(2).sum(), x,
                                create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input -----------------------------------------------------------------------------

def _f(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("scalar x", lambda d: (_f(d=d), _f(1, d=d), _f(1, d=d), None), "at least one dimension"),
    ("int x", lambda d: (_f(2, 8, dtype=torch.int64, d=d), _f(1, d=d), _f(8, d=d), None),
     "not supported"),
    ("alpha size", lambda d: (_f(2, 8, d=d), _f(2, d=d), _f(8, d=d), None),
     "alpha must have shape"),
    ("gamma size", lambda d: (_f(2, 8, d=d), _f(1, d=d), _f(7, d=d), None),
     "gamma must have shape"),
    ("beta size", lambda d: (_f(2, 8, d=d), _f(1, d=d), _f(8, d=d), _f(9, d=d)),
     "beta must have shape"),
    ("alpha gamma dtypes", lambda d: (_f(2, 8, d=d), _f(1, d=d),
                                      _f(8, dtype=torch.float16, d=d), None),
     "alpha and gamma must have the same dtype"),
    ("beta dtype", lambda d: (_f(2, 8, d=d), _f(1, d=d), _f(8, d=d),
                              _f(8, dtype=torch.float16, d=d)),
     "gamma and beta must have the same dtype"),
    ("param dtype", lambda d: (_f(2, 8, dtype=torch.bfloat16, d=d),
                               _f(1, dtype=torch.float16, d=d),
                               _f(8, dtype=torch.float16, d=d), None),
     "must be float32 or x's dtype"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.dyt(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_backward_input_cpu_and_meta_agree():
    def call(d):
        return torch.ops.fk._dyt_backward(_f(2, 7, d=d), _f(2, 8, d=d), _f(1, d=d),
                                          _f(8, d=d), None, [True] * 4)
    cpu, meta = error_lines(call, ("cpu", "meta"), "grad_y and x must have the same shape")
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.dyt(torch.ones(2, 8), torch.ones(1), torch.ones(8, device="meta"))


def test_module():
    m = fk.nn.DyT(32)
    assert [n for n, _ in m.named_parameters()] == ["alpha", "gamma", "beta"]
    assert m.alpha.shape == (1,) and m.alpha.item() == 0.5
    assert torch.equal(m.gamma, torch.ones(32)) and torch.equal(m.beta, torch.zeros(32))
    with torch.no_grad():
        m.gamma.copy_(randn(32))
        m.beta.copy_(randn(32))
    x = randn(3, 5, 32)
    assert_close(m(x), ref_dyt(x, m.alpha, m.gamma, m.beta), torch.float32)
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    nb = fk.nn.DyT(32, beta=False, init_alpha=1.5)
    assert nb.beta is None and nb.alpha.item() == 1.5
    assert_close(nb(x), ref_dyt(x, nb.alpha, nb.gamma), torch.float32)
    half = fk.nn.DyT(32).to(torch.bfloat16)
    assert half(x.bfloat16()).dtype == torch.bfloat16


# --- level 3: autograd, opcheck, torch.compile, TorchScript ------------------------------

@pytest.mark.parametrize("with_beta", [True, False])
@pytest.mark.parametrize("scalar_alpha", [True, False])
def test_gradcheck(with_beta, scalar_alpha):
    x = randn(3, 9, dtype=torch.float64, scale=2.0).requires_grad_()
    params = [p.requires_grad_() for p in _params(9, torch.float64, with_beta,
                                                   scalar_alpha=scalar_alpha) if p is not None]
    assert torch.autograd.gradcheck(fk.dyt, (x, *params))


@pytest.mark.parametrize("with_beta", [True, False])
def test_opcheck(with_beta):
    x = randn(4, 3, 40).requires_grad_()
    params = [p.requires_grad_() if p is not None else None
              for p in _params(40, torch.float32, with_beta)]
    torch.library.opcheck(torch.ops.fk.dyt, (x, *params))
    xb = randn(4, 40, dtype=torch.bfloat16).requires_grad_()
    torch.library.opcheck(torch.ops.fk.dyt, (xb, *params))
    dy = randn(4, 3, 40)
    detached = [p.detach() if p is not None else None for p in params]
    torch.library.opcheck(torch.ops.fk._dyt_backward,
                          (dy, x.detach(), *detached, [True, True, True, with_beta]),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.fk._dyt_backward,
                          (dy, x.detach(), *detached, [False, True, False, False]),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def block(x, a, g, b):
        return fk.dyt(x, a, g, b) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [randn(rows, 32).requires_grad_(), *[p.requires_grad_() for p in
                                                    _params(32, torch.float32)]]
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
        self.norm = fk.nn.DyT(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) + fk.dyt(x, self.norm.alpha, self.norm.gamma)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    module = _Scripted()
    path = tmp_path / "dyt.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::dyt" in str(loaded.inlined_graph)
    x = randn(3, 6, 7)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [module(xs[0]), loaded(xs[1])]
    torch.testing.assert_close(outs[1], outs[0])
    p = module.norm
    assert_close(outs[0], ref_dyt(x, p.alpha, p.gamma, p.beta) + ref_dyt(x, p.alpha, p.gamma),
                 torch.float32)
    dy = randn(3, 6, 7)
    for o in outs:
        o.backward(dy)
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Every column bucket (256, 1024, 2048, 4096), widths that are not multiples of them, a 128K
# width.
CUDA_N = [1, 7, 64, 200, 256, 257, 1000, 1024, 1025, 2047, 4096, 5120, 8192, 12345, 128256]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params_fp32", [True, False])
@pytest.mark.parametrize("n", CUDA_N)
def test_cuda_matches_reference(dtype, params_fp32, n):
    m = 37 if n <= 16384 else 3
    pdt = torch.float32 if params_fp32 else dtype
    for with_beta in (True, False):
        x = randn(m, n, dtype=dtype, device="cuda", scale=2.0).requires_grad_()
        params = [p.requires_grad_() if p is not None else None
                  for p in _params(n, pdt, with_beta, device="cuda")]
        poison_cuda_cache()
        y = fk.dyt(x, *params)
        assert not torch.isnan(y).any(), "unwritten output elements"
        cpu = [p.cpu() if p is not None else None for p in params]
        assert_close(y, ref_dyt(x.cpu(), *cpu), dtype, factor=1.5)
        dy = randn(m, n, dtype=dtype, device="cuda", scale=0.5)
        poison_cuda_cache()
        y.backward(dy)
        ref = ref_dyt_grads(x.cpu(), *cpu, dy.cpu())
        assert_close(x.grad, ref[0], dtype, factor=3, what="dx",
                     scale=dx_scale(cpu[0], cpu[1], dy.cpu()))
        scales = grad_scales(x.cpu(), cpu[0], cpu[1], dy.cpu())
        for p, r, sc, name in zip(params, ref[1:], scales, ("dalpha", "dgamma", "dbeta")):
            if p is not None:
                assert p.grad.dtype == pdt and p.grad.shape == p.shape
                assert_close(p.grad, r, pdt, factor=3, what=name, scale=sc)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (2, 3, 4096), (8192, 4096), (3, 128), (1, 1)])
def test_cuda_shapes_misaligned_scalar_alpha(dtype, shape):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    a, g, b = [p.requires_grad_() for p in _params(n, torch.float32, device="cuda",
                                                     scalar_alpha=True)]
    y = fk.dyt(x, a, g, b)
    assert_close(y, ref_dyt(x.cpu(), a.cpu(), g.cpu(), b.cpu()), dtype, factor=1.5)
    dy = randn(*shape, dtype=dtype, device="cuda")
    y.backward(dy * 3.0)
    ref = ref_dyt_grads(x.cpu(), a.cpu(), g.cpu(), b.cpu(), dy.cpu() * 3.0)
    assert a.grad.shape == ()
    scales = [None] + grad_scales(x.cpu(), a.cpu(), g.cpu(), dy.cpu() * 3.0)
    for t, r, sc in zip((x, a, g, b), ref, scales):
        assert_close(t.grad, r, dtype if t is x else torch.float32, factor=3, scale=sc)
    xm = misaligned(randn(*shape, dtype=dtype, device="cuda"))
    gm, bm = misaligned(g.detach()), misaligned(b.detach())
    ym = fk.dyt(xm, a.detach(), gm, bm)
    assert_close(ym, ref_dyt(xm.cpu(), a.cpu(), gm.cpu(), bm.cpu()), dtype, factor=1.5)
    dym = misaligned(dy)
    dx, da, dg, db = torch.ops.fk._dyt_backward(dym, xm, a.detach(), gm, bm, [True] * 4)
    ref = ref_dyt_grads(xm.cpu(), a.cpu(), gm.cpu(), bm.cpu(), dym.cpu())
    scales = [None] + grad_scales(xm.cpu(), a.cpu(), gm.cpu(), dym.cpu())
    for t, r, sc in zip((dx, da, dg, db), ref, scales):
        assert_close(t, r, dtype if t is dx else torch.float32, factor=3, scale=sc)
    xt = randn(n, 6, dtype=dtype, device="cuda").t()
    assert_close(fk.dyt(xt, a.detach(), g.detach()), ref_dyt(xt.cpu(), a.cpu(), g.cpu()),
                 dtype, factor=1.5)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.dyt(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.dyt(_f(2, 4, dtype=torch.float64, d="cuda"), _f(1, dtype=torch.float64, d="cuda"),
               _f(4, dtype=torch.float64, d="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.dyt(_f(2, 4, d="cuda"), _f(1), _f(4, d="cuda"))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    assert fk.dyt(_f(0, 64, d="cuda"), *_params(64, torch.float32, device="cuda")).shape == (0, 64)
    xe = _f(0, 64, d="cuda").requires_grad_()
    pe = [p.requires_grad_() for p in _params(64, torch.float32, device="cuda")]
    fk.dyt(xe, *pe).sum().backward()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in pe)
    x = randn(4, 3, 40, device="cuda").requires_grad_()
    params = [p.requires_grad_() for p in _params(40, torch.float32, device="cuda")]
    torch.library.opcheck(torch.ops.fk.dyt, (x, *params))
    # aot_eager: traces fk's fake kernels and autograd without Inductor.
    f = torch.compile(lambda x, a, g, b: fk.dyt(x, a, g, b).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, *params).backward()
    assert x.grad is not None and all(p.grad is not None for p in params)


@pytest.mark.cuda
def test_cuda_graph_capture():
    x = randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    dy = randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    a, g, b = _params(1000, torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.fk._dyt_backward(dy, x, a, g, b, [True] * 4)  # load the kernels first
        fk.dyt(x, a, g, b)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fk.dyt(x, a, g, b)
        grads = torch.ops.fk._dyt_backward(dy, x, a, g, b, [True] * 4)
    x.copy_(randn(64, 1000, device="cuda", dtype=torch.bfloat16, scale=2.0))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, ref_dyt(x.cpu(), a.cpu(), g.cpu(), b.cpu()), torch.bfloat16, factor=1.5)
    ref = ref_dyt_grads(x.cpu(), a.cpu(), g.cpu(), b.cpu(), dy.cpu())
    scales = [None] + grad_scales(x.cpu(), a.cpu(), g.cpu(), dy.cpu())
    for t, r, sc in zip(grads, ref, scales):
        assert_close(t, r, torch.bfloat16 if t.dtype == torch.bfloat16 else torch.float32,
                     factor=3, scale=sc)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = 4096
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    a, g, b = _params(n, torch.bfloat16, device="cuda")
    y = fk.dyt(x, a, g, b)
    for rows in (slice(0, 4), slice(m - 4, m)):
        assert_close(y[rows], ref_dyt(x[rows].cpu(), a.cpu(), g.cpu(), b.cpu()), torch.bfloat16,
                     factor=1.5)
    dy = torch.ones_like(x)
    dx, da, dg, db = torch.ops.fk._dyt_backward(dy, x, a, g, b, [True] * 4)
    del y
    for rows in (slice(0, 4), slice(m - 4, m)):
        ref = ref_dyt_grads(x[rows].cpu(), a.cpu(), g.cpu(), b.cpu(), dy[rows].cpu())
        assert_close(dx[rows], ref[0], torch.bfloat16, factor=3)
    # dbeta is the column sum of dy = ones: m in every column (exact in fp32 partial sums,
    # rounded to bfloat16).
    assert torch.equal(db.float().cpu(), torch.full((n,), float(m)).bfloat16().float())
    del x, dy, dx
    torch.cuda.empty_cache()
