"""fk.layer_norm at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import io

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_grads, round_nearest, round_toward_zero)

# (has weight, has bias)
AFFINE = [(True, True), (True, False), (False, True), (False, False)]


def ref_layer_norm(x, weight=None, bias=None, eps=1e-5, cast=round_nearest):
    """LayerNorm from its definition, in float64: (x - mean) / sqrt(biased var + eps) * w + b,
    rounded once to x's dtype with `cast` (through float32, as a kernel rounds its fp32
    result)."""
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    var = (x64 - mean).pow(2).mean(-1, keepdim=True)
    y = (x64 - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y if x.dtype == torch.float64 else cast(y.float(), x.dtype)


def ref_stats(x, eps):
    x64 = x.double()
    mean = x64.mean(-1)
    return mean, 1 / torch.sqrt((x64 - mean[..., None]).pow(2).mean(-1) + eps)


def grads_ref(x, w, b, dy, eps):
    """float64 autograd gradients of the reference (dx, dw, db; None where absent)."""
    inputs = [x.detach().requires_grad_(),
              None if w is None else w.detach().requires_grad_(),
              None if b is None else b.detach().requires_grad_()]
    return ref_grads(lambda x_, w_, b_: ref_layer_norm(x_, w_, b_, eps), inputs, dy)


def make(shape, dtype, has_w, has_b, device="cpu", grad=True):
    n = shape[-1]
    x = randn(*shape, dtype=dtype, device=device)
    w = (1.0 + 0.5 * randn(n, dtype=torch.float32)).to(device=device, dtype=dtype) if has_w else None
    b = randn(n, dtype=dtype, device=device) if has_b else None
    if grad:
        for t in (x, w, b):
            if t is not None:
                t.requires_grad_()
    return x, w, b


# --- level 1: the Triton source under the interpreter ---------------------------------

def _run_forward(mod, x, w, b, eps, block, looped, rows=2):
    m, n = x.shape
    y = torch.full_like(x, float("nan"))
    mean = torch.full((m,), float("nan"))
    rstd = torch.full((m,), float("nan"))
    wa = w if w is not None else x  # unread stand-ins, as the C++ side passes
    ba = b if b is not None else x
    flags = (int(w is not None), int(b is not None))
    if looped:
        mod.layer_norm_fwd_looped_kernel[(m,)](x, wa, ba, y, mean, rstd, n, n, m, n, eps, *flags,
                                               BLOCK_N=block)
    else:
        mod.layer_norm_fwd_kernel[(cdiv(m, rows),)](x, wa, ba, y, mean, rstd, n, n, m, n, eps,
                                                     *flags, BLOCK_N=block, ROWS=rows)
    return y, mean, rstd


def _run_backward(mod, dy, x, w, mean, rstd, block, looped, need, programs=2):
    m, n = x.shape
    rows_per_program = cdiv(m, programs)
    dx = torch.full_like(x, float("nan"))
    partial = torch.full((2, programs, n), float("nan"))
    kernel = mod.layer_norm_bwd_looped_kernel if looped else mod.layer_norm_bwd_kernel
    kernel[(programs,)](dy, x, w if w is not None else x, mean, rstd, dx, partial[0], partial[1],
                        n, n, n, m, n, rows_per_program, int(w is not None), *need,
                        BLOCK_N=block, STAGES=2, PER_SM=1)
    dwdb = torch.full((2, n), float("nan"), dtype=x.dtype)
    mod.layer_norm_dwdb_kernel[(cdiv(n, 64), 2)](partial, dwdb[0], dwdb[1], programs, n,
                                                  BLOCK_P=2, BLOCK_N=64)
    return dx, partial, dwdb


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_w,has_b", AFFINE)
@pytest.mark.parametrize("n,block,looped", [(100, 128, False), (300, 128, True)])
def test_interpreter(dtype, has_w, has_b, n, block, looped):
    mod = load_triton_src("layer_norm")
    m, eps = 5, 1e-5
    x, w, b = make((m, n), dtype, has_w, has_b, grad=False)
    y, mean, rstd = _run_forward(mod, x, w, b, eps, block, looped)
    assert_close(y, ref_layer_norm(x, w, b, eps, cast=round_toward_zero), dtype, factor=1.5,
                 what="y")
    mean_ref, rstd_ref = ref_stats(x, eps)
    assert_close(mean, mean_ref, torch.float32, what="mean")
    assert_close(rstd, rstd_ref, torch.float32, what="rstd")
    dy = randn(m, n, dtype=dtype)
    dx, partial, dwdb = _run_backward(mod, dy, x, w, mean, rstd, block, looped, (1, 1, 1))
    gx, gw, gb = grads_ref(x, w, b, dy, eps)
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=3, what="dx")
    x64, dy64 = x.double(), dy.double()
    gw_ones = (dy64 * (x64 - mean_ref[:, None]) * rstd_ref[:, None]).sum(0)  # at w = ones too
    assert_close(dwdb[0], round_toward_zero(gw_ones.float(), dtype), dtype, factor=3, what="dw")
    assert_close(dwdb[1], round_toward_zero(dy64.sum(0).float(), dtype), dtype, factor=3,
                 what="db")


@pytest.mark.parametrize("looped", [False, True])
def test_interpreter_skips_unrequested_gradients(looped):
    mod = load_triton_src("layer_norm")
    m, n, eps = 6, 100, 1e-5
    x, w, _ = make((m, n), torch.float32, True, False, grad=False)
    _, mean, rstd = _run_forward(mod, x, w, None, eps, 128, looped)
    dy = randn(m, n)
    for need in ((0, 1, 0), (0, 0, 1), (1, 0, 0)):
        dx, partial, _ = _run_backward(mod, dy, x, w, mean, rstd, 128 if not looped else 64,
                                       looped, need)
        assert torch.isnan(dx).all() != bool(need[0])
        assert torch.isnan(partial[0]).all() != bool(need[1])
        assert torch.isnan(partial[1]).all() != bool(need[2])


@pytest.mark.parametrize("looped,block", [(False, 1024), (True, 256)])
def test_interpreter_large_mean_keeps_fp32_variance(looped, block):
    """Rows with a large mean and unit spread: E[x^2] - mean^2 in fp32 would lose the
    variance to cancellation (relative error ~ mean^2 * 2^-24); the centred computation and
    the looped kernel's merge of chunk statistics keep it accurate."""
    mod = load_triton_src("layer_norm")
    m, n, eps = 4, 1000, 1e-5
    x = 3000.0 + randn(m, n)
    _, mean, rstd = _run_forward(mod, x, None, None, eps, block, looped)
    mean_ref, rstd_ref = ref_stats(x, eps)
    assert_close(mean, mean_ref, torch.float32, what="mean")
    assert_close(rstd, rstd_ref, torch.float32, factor=5, what="rstd")


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 257), (4, 4096)])
@pytest.mark.parametrize("has_w,has_b", AFFINE)
def test_cpu_forward_backward(dtype, shape, has_w, has_b):
    eps = 1e-5
    x, w, b = make(shape, dtype, has_w, has_b)
    y = fk.layer_norm(x, w, b, eps)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, ref_layer_norm(x, w, b, eps), dtype, what="y")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    gx, gw, gb = grads_ref(x, w, b, dy, eps)
    # With one element per row x - mean is 0, and dx a cancellation of terms of dy's size.
    scale = dy.double().norm().item() if shape[-1] == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    if has_w:
        assert w.grad.dtype == dtype
        assert_close(w.grad, gw, dtype, factor=3, what="dw")
    if has_b:
        assert b.grad.dtype == dtype
        assert_close(b.grad, gb, dtype, factor=3, what="db")


def test_cpu_matches_torch_layer_norm():
    x, w, b = make((6, 64), torch.float32, True, True)
    ref = torch.nn.functional.layer_norm(x, (64,), w, b, 1e-5)
    assert_close(fk.layer_norm(x, w, b), ref, torch.float32)
    assert_close(fk.layer_norm(x), torch.nn.functional.layer_norm(x, (64,)), torch.float32)


def test_statistics_outputs():
    x = randn(3, 4, 50)
    y, mean, rstd = torch.ops.fk._layer_norm_forward(x, None, None, 1e-3)
    assert mean.shape == rstd.shape == (3, 4) and mean.dtype == rstd.dtype == torch.float32
    mean_ref, rstd_ref = ref_stats(x, 1e-3)
    assert_close(mean, mean_ref, torch.float32)
    assert_close(rstd, rstd_ref, torch.float32)


def test_cpu_non_contiguous_and_empty():
    x = randn(40, 6).t()
    w, b = randn(40), randn(40)
    assert not x.is_contiguous()
    assert_close(fk.layer_norm(x, w, b), ref_layer_norm(x, w, b), torch.float32)
    assert fk.layer_norm(torch.empty(0, 8), torch.ones(8), torch.zeros(8)).shape == (0, 8)
    assert fk.layer_norm(torch.empty(3, 0), torch.ones(0)).shape == (3, 0)
    x0, w0, b0 = make((0, 8), torch.float32, True, True)
    fk.layer_norm(x0, w0, b0).sum().backward()
    assert torch.equal(w0.grad, torch.zeros(8)) and torch.equal(b0.grad, torch.zeros(8))


class _RecordMasks(TorchDispatchMode):
    """Records the output_mask of every fk::_layer_norm_backward call."""

    def __init__(self):
        super().__init__()
        self.masks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.fk._layer_norm_backward.default:
            self.masks.append(list(args[5]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_backward_asks_only_for_needed_gradients(device):
    cases = [  # (x, w, b requires_grad) -> mask
        ((True, False, False), [True, False, False]),
        ((False, True, False), [False, True, False]),
        ((False, False, True), [False, False, True]),
        ((True, True, True), [True, True, True]),
    ]
    for needs, mask in cases:
        x, w, b = make((4, 16), torch.float32, True, True, device=device, grad=False)
        for t, need in zip((x, w, b), needs):
            t.requires_grad_(need)
        with _RecordMasks() as rec:
            fk.layer_norm(x, w, b).pow(2).sum().backward()
        assert rec.masks == [mask]
        for t, need in zip((x, w, b), needs):
            assert (t.grad is not None) == need
    dx, dw, db = torch.ops.fk._layer_norm_backward(
        randn(4, 16, device=device), x.detach(), None, *torch.ops.fk._layer_norm_forward(
            x.detach(), None, None, 1e-5)[1:], [False, False, True])
    assert dx is None and dw is None and db is not None


def test_double_backward_is_a_clear_error():
    x = randn(4, 16).requires_grad_()
    (gx,) = torch.autograd.grad(fk.layer_norm(x, randn(16), randn(16)).pow(2).sum(), x,
                                create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input -----------------------------------------------------------------------------

BAD = [
    ("weight dtype", lambda d: (torch.ones(2, 8, device=d),
                                torch.ones(8, dtype=torch.float16, device=d), None),
     "must have the same dtype"),
    ("bias dtype", lambda d: (torch.ones(2, 8, device=d), None,
                              torch.ones(8, dtype=torch.float16, device=d)),
     "must have the same dtype"),
    ("weight size", lambda d: (torch.ones(2, 8, device=d), torch.ones(7, device=d), None),
     "weight must have shape"),
    ("bias size", lambda d: (torch.ones(2, 8, device=d), None, torch.ones(8, 1, device=d)),
     "bias must have shape"),
    ("int dtype", lambda d: (torch.ones(2, 8, dtype=torch.int64, device=d), None, None),
     "not supported"),
    ("scalar", lambda d: (torch.tensor(1.0, device=d), None, None), "at least one dimension"),
]


def _call_bad(make_args, device):
    x, w, b = make_args(device)
    return fk.layer_norm(x, w, b, 1e-5)


@pytest.mark.parametrize("name,make_args,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make_args, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make_args, d), ("cpu", "meta"), msg)
    assert cpu == meta


def _call_bad_backward(device, stat_dtype):
    x = torch.ones(2, 8, device=device)
    stat = torch.ones(2, device=device, dtype=stat_dtype)
    return torch.ops.fk._layer_norm_backward(x, x, None, stat, stat, [True, True, True])


def test_bad_backward_input_cpu_and_meta_agree():
    cpu, meta = error_lines(lambda d: _call_bad_backward(d, torch.float16), ("cpu", "meta"),
                            "mean must be Float")
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.layer_norm(torch.ones(2, 8), None, torch.ones(8, device="meta"))


# --- module --------------------------------------------------------------------------------

@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, True)])
def test_module_matches_torch_and_loads_its_state_dict(affine, bias):
    ref = torch.nn.LayerNorm(32, eps=1e-6, elementwise_affine=affine, bias=bias)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(randn(*p.shape))
    m = fk.nn.LayerNorm(32, eps=1e-6, elementwise_affine=affine, bias=bias)
    assert m.state_dict().keys() == ref.state_dict().keys()
    m.load_state_dict(ref.state_dict())
    x = randn(3, 5, 32)
    assert_close(m(x), ref(x), torch.float32)
    assert repr(m).endswith(repr(ref).split("(", 1)[1])
    fresh = fk.nn.LayerNorm((32,), bias=bias, dtype=torch.bfloat16)
    for name, p in torch.nn.LayerNorm(32, bias=bias, dtype=torch.bfloat16).named_parameters():
        assert torch.equal(getattr(fresh, name), p)
    with pytest.raises(ValueError):
        fk.nn.LayerNorm((4, 32))


def test_module_torchscript_save_load():
    m = fk.nn.LayerNorm(24, bias=False)
    with torch.no_grad():
        m.weight.copy_(randn(24))
    scripted = torch.jit.script(m)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    x = randn(2, 24)
    assert torch.equal(loaded(x), m(x))
    no_affine = torch.jit.script(fk.nn.LayerNorm(24, elementwise_affine=False))
    assert_close(no_affine(x), ref_layer_norm(x), torch.float32)


# --- level 3: autograd, opcheck, torch.compile ---------------------------------------------

@pytest.mark.parametrize("has_w,has_b", AFFINE)
def test_gradcheck(has_w, has_b):
    x, w, b = make((3, 9), torch.float64, has_w, has_b)
    args = tuple(t for t in (x, w, b) if t is not None)

    def fn(*ts):
        it = iter(ts)
        xx = next(it)
        ww = next(it) if has_w else None
        bb = next(it) if has_b else None
        return fk.layer_norm(xx, ww, bb, 1e-3)

    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("has_w,has_b", [(True, True), (False, False), (True, False)])
def test_opcheck(has_w, has_b):
    x, w, b = make((4, 3, 40), torch.float32, has_w, has_b)
    torch.library.opcheck(torch.ops.fk.layer_norm, (x, w, b, 1e-5))
    det = [None if t is None else t.detach() for t in (x, w, b)]
    torch.library.opcheck(torch.ops.fk._layer_norm_forward, (*det, 1e-3),
                          test_utils=("test_schema", "test_faketensor"))
    _, mean, rstd = torch.ops.fk._layer_norm_forward(*det, 1e-5)
    dy = randn(4, 3, 40)
    for mask in ([True, has_w, has_b], [False, True, True]):
        torch.library.opcheck(torch.ops.fk._layer_norm_backward,
                              (dy, det[0], det[1], mean, rstd, mask),
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def block(x, w, b, wg):
        return fk.layer_norm(x, w, b, 1e-5) @ wg

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [randn(rows, 32).requires_grad_(), randn(32).requires_grad_(),
                randn(32).requires_grad_(), randn(32, 32).requires_grad_()]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args)
        ref = block(*eager_args)
        assert_close(out, ref, torch.float32, factor=10)
        dy = randn(rows, 32)
        out.backward(dy)
        ref.backward(dy)
        for a, e in zip(args, eager_args):
            assert_close(a.grad, e.grad, torch.float32, factor=10)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Single-pass forward up to 16384 columns, single-pass backward up to 8192; the rest looped.
CUDA_N = [1, 7, 64, 127, 256, 1000, 1024, 2047, 4096, 5120, 8192, 8193, 16384, 16385, 65536,
          100000]


def _check_cuda(x, w, b, eps, dtype, poison=True):
    if poison:
        poison_cuda_cache()
    y = fk.layer_norm(x, w, b, eps)
    assert not torch.isnan(y).any(), "unwritten output elements"
    cpu = [None if t is None else t.detach().cpu() for t in (x, w, b)]
    assert_close(y, ref_layer_norm(*cpu, eps), dtype, factor=1.5, what="y")
    dy = randn(*x.shape, dtype=dtype, device="cuda")
    if poison:
        poison_cuda_cache()
    y.backward(dy)
    gx, gw, gb = grads_ref(*cpu, dy.cpu(), eps)
    # With one element per row dx is a cancellation of terms of dy's size.
    scale = dy.double().norm().item() if x.shape[-1] == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    if w is not None:
        assert_close(w.grad, gw, dtype, factor=3, what="dw")
    if b is not None:
        assert_close(b.grad, gb, dtype, factor=3, what="db")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", CUDA_N)
def test_cuda_matches_reference(dtype, n):
    m = 37 if n <= 16384 else 5
    _check_cuda(*make((m, n), dtype, True, True, device="cuda"), 1e-5, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_w,has_b", AFFINE)
@pytest.mark.parametrize("shape", [(1, 4096), (2, 3, 4096), (8192, 4096), (3, 128), (300, 20000)])
def test_cuda_affine_combinations_and_shapes(dtype, has_w, has_b, shape):
    _check_cuda(*make(shape, dtype, has_w, has_b, device="cuda"), 1e-6, dtype, poison=False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4096, 65536])
def test_cuda_misaligned_non_contiguous_and_large_mean(dtype, n):
    w = randn(n, dtype=dtype, device="cuda")
    b = randn(n, dtype=dtype, device="cuda")
    xm = misaligned(randn(3, n, dtype=dtype, device="cuda"))
    assert_close(fk.layer_norm(xm, w, b), ref_layer_norm(xm.cpu(), w.cpu(), b.cpu()), dtype,
                 factor=1.5)
    xt = randn(n, 6, dtype=dtype, device="cuda").t()
    assert_close(fk.layer_norm(xt, w, b), ref_layer_norm(xt.cpu(), w.cpu(), b.cpu()), dtype,
                 factor=1.5)
    # fp32 statistics of rows far from zero (the mean is exact in bf16 / fp16 here).
    x = (64.0 + randn(5, n, device="cuda")).to(dtype)
    _, mean, rstd = torch.ops.fk._layer_norm_forward(x, None, None, 1e-5)
    mean_ref, rstd_ref = ref_stats(x.cpu(), 1e-5)
    assert_close(mean, mean_ref, torch.float32)
    assert_close(rstd, rstd_ref, torch.float32, factor=5)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make_args, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make_args, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    cpu, cuda = error_lines(lambda d: _call_bad_backward(d, torch.float16), ("cpu", "cuda"),
                            "mean must be Float")
    assert cpu == cuda
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.layer_norm(torch.ones(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.layer_norm(torch.ones(2, 4, device="cuda"), torch.ones(4))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    w = torch.ones(64, device="cuda", requires_grad=True)
    b = torch.zeros(64, device="cuda", requires_grad=True)
    x0 = torch.empty(0, 64, device="cuda", requires_grad=True)
    y0 = fk.layer_norm(x0, w, b)
    assert y0.shape == (0, 64)
    y0.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and torch.equal(b.grad, torch.zeros_like(b))
    _, mean, rstd = torch.ops.fk._layer_norm_forward(torch.empty(3, 0, device="cuda"), None,
                                                     None, 1e-5)
    assert mean.shape == (3,) and torch.isnan(mean).all() and torch.isnan(rstd).all()
    x, w, b = make((4, 3, 40), torch.float32, True, True, device="cuda")
    torch.library.opcheck(torch.ops.fk.layer_norm, (x, w, b, 1e-5))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda x, w, b: fk.layer_norm(x, w, b).pow(2).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, w, b).backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = 4096
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = fk.layer_norm(x, w, b)
    for rows in (slice(0, 4), slice(m - 4, m)):
        assert_close(y[rows], ref_layer_norm(x[rows].detach().cpu(), w.detach().cpu(),
                                             b.detach().cpu()), torch.bfloat16, factor=1.5)
    # Backward: dy nonzero only in the last rows, so dw / db come from rows past 2^31 elements.
    dy = torch.zeros_like(y)
    dy[m - 4:] = torch.randn(4, n, device="cuda", dtype=torch.bfloat16)
    y.backward(dy)
    xs = x[m - 4:].detach().cpu()
    gx, gw, gb = grads_ref(xs, w.detach().cpu(), b.detach().cpu(), dy[m - 4:].cpu(), 1e-5)
    assert_close(x.grad[m - 4:], gx, torch.bfloat16, factor=3, what="dx")
    assert_close(w.grad, gw, torch.bfloat16, factor=3, what="dw")
    assert_close(b.grad, gb, torch.bfloat16, factor=3, what="db")
    del x, y, dy
    torch.cuda.empty_cache()
