"""fk.fused_add_rms_norm at every test level: Triton source (interpreter), CPU backend,
autograd, opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker
``cuda``)."""
import io

import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_rms_norm, round_nearest, round_toward_zero)

MODES = ("llama", "gemma", "none")
CASTING = {"none": 0, "llama": 1, "gemma": 2}


# --- the reference: a decoder layer's add, then the models' RMSNorm ---------------------------

def ref_residual_sum(x, residual, cast=round_nearest):
    """``residual + hidden_states`` in x's dtype: an fp32 sum rounded once with `cast` (fp64
    inputs: the fp64 sum)."""
    if x.dtype == torch.float64:
        return x + residual
    return cast(x.float() + residual.float(), x.dtype)


def ref_fused_add_rms_norm(x, residual, weight=None, eps=1e-6, offset=0.0, casting_mode="llama",
                           cast=round_nearest):
    s = ref_residual_sum(x, residual, cast)
    return ref_rms_norm(s, weight, eps, offset, casting_mode, cast=cast), s


def ref_grads(x, residual, w, dy, ds, eps, offset, mode, cast=round_nearest):
    """float64 gradients (dx = dresidual, dw). dx: the derivative of the exact formula at the
    rounded sum s (rounding passes gradients through), plus ds. dw: the sum over rows of dy
    times the normalized s the forward multiplied the weight with, rounded as the mode
    rounds it (with `cast`)."""
    s = ref_residual_sum(x, residual, cast).detach()
    sd = s.double().requires_grad_()
    wd = None if w is None else w.detach().double()
    gx = torch.zeros_like(sd)
    if dy is not None:
        y = ref_rms_norm(sd, wd, eps, offset, "gemma")
        (gx,) = torch.autograd.grad(y, sd, dy.double())
    if ds is not None:
        gx = gx + ds.double()
    if w is None or dy is None:
        return gx, None
    if mode == "gemma":
        xh = sd.detach() * torch.rsqrt(sd.detach().pow(2).mean(-1, keepdim=True) + eps)
    else:
        xh = ref_rms_norm(s, None, eps, 0.0, mode, cast=cast).double()
    gw = (dy.double() * xh).reshape(-1, x.shape[-1]).sum(0)
    return gx, gw


def _cancel_scale(n, *grads):
    """With one element per row the norm's dx is a cancellation of terms of dy's size."""
    if n != 1:
        return None
    return sum(g.double().norm().item() for g in grads if g is not None)


# --- level 1: the Triton source under the interpreter ---------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["single-prefetch", "single", "looped"])
def test_interpreter(dtype, mode, kind):
    mod = load_triton_src("fused_add_rms_norm")
    dw_kernel = load_triton_src("rms_norm").rms_norm_dw_kernel
    casting = CASTING[mode]
    looped = kind == "looped"
    m, n, block, eps, offset = 5, (300 if looped else 100), 128, 1e-6, 0.5
    x, r, w = randn(m, n, dtype=dtype), randn(m, n, dtype=dtype), randn(n, dtype=dtype)
    y, s = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    rstd = torch.full((m,), float("nan"))
    if looped:
        mod.fused_add_rms_norm_fwd_looped_kernel[(m,)](x, r, w, y, s, rstd, m, n, eps, offset, 1,
                                                       casting, BLOCK_N=block)
    else:
        rows = 2
        mod.fused_add_rms_norm_fwd_kernel[(cdiv(m, rows),)](x, r, w, y, s, rstd, m, n, eps,
                                                             offset, 1, casting, BLOCK_N=block,
                                                             ROWS=rows)
    y_ref, s_ref = ref_fused_add_rms_norm(x, r, w, eps, offset, mode, cast=round_toward_zero)
    assert torch.equal(s, s_ref), "residual_out"
    assert_close(y, y_ref, dtype, factor=1.5, what="y")

    # Backward: 2 programs over 3 rows each (the second has 2); with and without the
    # gradient of residual_out.
    programs, rows_per_program = 2, 3
    dy = randn(m, n, dtype=dtype)
    ds = randn(m, n, dtype=dtype) if kind != "single" else None
    dx = torch.full_like(x, float("nan"))
    dw_partial = torch.full((programs, n), float("nan"))
    args = (dy, ds if ds is not None else dy, s, w, rstd, dx, dw_partial, m, n, offset,
            rows_per_program, 1, int(ds is not None), 1, 1, casting)
    if looped:
        mod.fused_add_rms_norm_bwd_looped_kernel[(programs,)](*args, BLOCK_N=block)
    else:
        mod.fused_add_rms_norm_bwd_kernel[(programs,)](*args, BLOCK_N=block,
                                                        PREFETCH=int(kind == "single-prefetch"))
    gx, gw = ref_grads(x, r, w, dy, ds, eps, offset, mode, cast=round_toward_zero)
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=3, what="dx")
    dw = torch.full((n,), float("nan"), dtype=dtype)
    dw_kernel[(cdiv(n, 64),)](dw_partial, dw, dw, programs, n, n, BLOCK_P=2, BLOCK_N=64)
    assert_close(dw, round_toward_zero(gw.float(), dtype), dtype, factor=3, what="dw")


@pytest.mark.parametrize("looped", [False, True])
def test_interpreter_skips_unwanted_outputs(looped):
    """want_dx = 0 leaves dx untouched; want_dw = 0 leaves the partials untouched."""
    mod = load_triton_src("fused_add_rms_norm")
    m, n = 3, 40
    s, dy, w = randn(m, n), randn(m, n), randn(n)
    rstd = torch.rsqrt(s.pow(2).mean(-1) + 1e-6)
    for want_dx, want_dw in ((0, 1), (1, 0)):
        dx = torch.full_like(s, float("nan"))
        part = torch.full((1, n), float("nan"))
        args = (dy, dy, s, w, rstd, dx, part, m, n, 0.0, m, 1, 0, want_dx, want_dw, 1)
        if looped:
            mod.fused_add_rms_norm_bwd_looped_kernel[(1,)](*args, BLOCK_N=16)
        else:
            mod.fused_add_rms_norm_bwd_kernel[(1,)](*args, BLOCK_N=64, PREFETCH=1)
        assert torch.isnan(dx).all() != bool(want_dx)
        assert torch.isnan(part).all() != bool(want_dw)


# --- level 2: the CPU backend against the reference --------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 257), (4, 4096)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_cpu_forward_backward(dtype, mode, shape, with_weight):
    eps, offset = 1e-5, (1.0 if mode == "gemma" else 0.0)
    x = randn(*shape, dtype=dtype).requires_grad_()
    r = randn(*shape, dtype=dtype).requires_grad_()
    w = randn(shape[-1], dtype=dtype).requires_grad_() if with_weight else None
    y, s = fk.fused_add_rms_norm(x, r, w, eps, offset, mode)
    assert y.dtype == s.dtype == dtype and y.shape == s.shape == x.shape
    y_ref, s_ref = ref_fused_add_rms_norm(x.detach(), r.detach(), w, eps, offset, mode)
    assert torch.equal(s, s_ref)
    assert_close(y, y_ref, dtype, what="y")
    dy, ds = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    torch.autograd.backward([y, s], [dy, ds])
    gx, gw = ref_grads(x, r, w, dy, ds, eps, offset, mode)
    scale = _cancel_scale(shape[-1], dy, ds)
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    assert_close(r.grad, gx, dtype, factor=3, what="dresidual", scale=scale)
    if with_weight:
        assert_close(w.grad, gw, dtype, factor=3, what="dw")


def test_cpu_matches_rms_norm_of_the_sum_exactly():
    for dtype in DTYPES:
        x, r, w = randn(6, 64, dtype=dtype), randn(6, 64, dtype=dtype), randn(64, dtype=dtype)
        for mode in MODES:
            y, s = fk.fused_add_rms_norm(x, r, w, 1e-6, 0.25, mode)
            assert torch.equal(s, r + x)
            assert torch.equal(y, fk.rms_norm(r + x, w, 1e-6, 0.25, mode))


def test_cpu_matches_hf_decoder_layer_in_fp32():
    h, residual, w = randn(6, 64), randn(6, 64), randn(64)
    hidden = residual + h
    var = hidden.pow(2).mean(-1, keepdim=True)
    hf = w * (hidden * torch.rsqrt(var + 1e-6))
    y, s = fk.fused_add_rms_norm(h, residual, w, 1e-6)
    assert torch.equal(s, hidden)
    assert_close(y, hf, torch.float32)


@pytest.mark.parametrize("used", ["y", "residual_out"])
def test_one_output_used(used):
    x, r = randn(4, 16).requires_grad_(), randn(4, 16).requires_grad_()
    w = randn(16).requires_grad_()
    y, s = fk.fused_add_rms_norm(x, r, w)
    g = randn(4, 16)
    (y if used == "y" else s).backward(g)
    gx, gw = ref_grads(x, r, w, g if used == "y" else None, g if used != "y" else None,
                       1e-6, 0.0, "llama")
    assert_close(x.grad, gx, torch.float32, factor=3)
    assert_close(r.grad, gx, torch.float32, factor=3)
    if used == "y":
        assert_close(w.grad, gw, torch.float32, factor=3)
    else:
        assert w.grad is None  # y, the only path to the weight, is unused
        assert torch.equal(x.grad, g)


def test_frozen_weight_and_only_weight_needs_grad():
    x, r, w = randn(4, 16).requires_grad_(), randn(4, 16), randn(16)
    y, s = fk.fused_add_rms_norm(x, r, w)
    (y.sum() + s.sum()).backward()
    assert x.grad is not None and r.grad is None
    x, r, w = randn(4, 16), randn(4, 16), randn(16).requires_grad_()
    y, s = fk.fused_add_rms_norm(x, r, w)
    (y.sum() + s.sum()).backward()
    assert_close(w.grad, ref_grads(x, r, w, torch.ones(4, 16), None, 1e-6, 0.0, "llama")[1],
                 torch.float32, factor=3)


def test_backward_op_output_mask():
    s, dy, ds, w = randn(3, 8), randn(3, 8), randn(3, 8), randn(8)
    rstd = torch.rsqrt(s.pow(2).mean(-1) + 1e-6)
    op = torch.ops.fk._fused_add_rms_norm_backward
    dx, dw = op(dy, ds, s, w, rstd, 0.0, "llama", [True, False])
    assert dx is not None and dw is None
    dx, dw = op(dy, None, s, w, rstd, 0.0, "llama", [False, True])
    assert dx is None and dw.shape == (8,)


def test_cpu_non_contiguous_and_empty():
    x, r, w = randn(40, 6).t(), randn(6, 40), randn(40)
    assert not x.is_contiguous()
    y, s = fk.fused_add_rms_norm(x, r, w)
    y_ref, s_ref = ref_fused_add_rms_norm(x, r, w)
    assert torch.equal(s, s_ref) and s.is_contiguous() and y.is_contiguous()
    assert_close(y, y_ref, torch.float32)
    for shape in ((0, 8), (3, 0)):
        e = torch.empty(*shape, requires_grad=True)
        y, s = fk.fused_add_rms_norm(e, torch.empty(*shape), torch.ones(shape[-1]))
        assert y.shape == s.shape == shape
        (y.sum() + s.sum()).backward()
        assert e.grad.shape == shape


def test_double_backward_is_a_clear_error():
    x = randn(4, 16).requires_grad_()
    y, _ = fk.fused_add_rms_norm(x, randn(4, 16), randn(16))
    (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input -----------------------------------------------------------------------------

def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(*shape, dtype=dtype, device=device)


BAD = [
    ("residual dtype", lambda d: (_t(2, 8, device=d), _t(2, 8, dtype=torch.float16, device=d),
                                  None, "llama"), "must have the same dtype"),
    ("residual shape", lambda d: (_t(2, 8, device=d), _t(2, 9, device=d), None, "llama"),
     "must have the same shape"),
    ("weight dtype", lambda d: (_t(2, 8, device=d), _t(2, 8, device=d),
                                _t(8, dtype=torch.float16, device=d), "llama"),
     "must have the same dtype"),
    ("weight size", lambda d: (_t(2, 8, device=d), _t(2, 8, device=d), _t(7, device=d), "llama"),
     "weight must have shape"),
    ("int dtype", lambda d: (_t(2, 8, dtype=torch.int64, device=d),
                             _t(2, 8, dtype=torch.int64, device=d), None, "llama"),
     "not supported"),
    ("casting mode", lambda d: (_t(2, 8, device=d), _t(2, 8, device=d), None, "mistral"),
     "casting_mode must be one of"),
    ("scalar", lambda d: (torch.tensor(1.0, device=d), torch.tensor(1.0, device=d), None,
                          "llama"), "at least one dimension"),
]


def _call_bad(make, device):
    x, r, w, mode = make(device)
    return fk.fused_add_rms_norm(x, r, w, 1e-6, 0.0, mode)


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta
    assert cpu.startswith("fk::fused_add_rms_norm: "), cpu


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.fused_add_rms_norm(_t(2, 8), _t(2, 8, device="meta"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.fused_add_rms_norm(_t(2, 8), _t(2, 8), _t(8, device="meta"))


def test_bad_backward_input():
    s, w = randn(3, 8), randn(8)
    rstd = torch.ones(3)
    with pytest.raises(RuntimeError, match="fk::_fused_add_rms_norm_backward: grad_residual_out "
                                           "and residual_out must have the same shape"):
        torch.ops.fk._fused_add_rms_norm_backward(s, randn(3, 9), s, w, rstd, 0.0, "llama",
                                                  [True, True])


# --- the module ------------------------------------------------------------------------------

def test_module():
    m = fk.nn.FusedAddRMSNorm(32, eps=1e-5)
    assert torch.equal(m.weight, torch.ones(32))
    m.weight.data = randn(32)
    x, r = randn(3, 32), randn(3, 32)
    y, s = m(x, r)
    # A Hugging Face layer's sequence, with torch's own RMSNorm.
    ref = torch.nn.RMSNorm(32, eps=1e-5)
    ref.weight.data = m.weight.data.clone()
    assert torch.equal(s, r + x)
    assert_close(y, ref(r + x), torch.float32)
    g = fk.nn.FusedAddRMSNorm(32, eps=1e-6, offset=1.0, casting_mode="gemma")
    assert torch.equal(g.weight, torch.zeros(32))
    assert_close(g(x, r)[0], ref_rms_norm(r + x, g.weight, 1e-6, 1.0, "gemma"), torch.float32)
    with pytest.raises(ValueError):
        fk.nn.FusedAddRMSNorm(32, casting_mode="mistral")
    assert "casting_mode='gemma'" in repr(g)


def test_torchscript_module_save_load():
    m = fk.nn.FusedAddRMSNorm(24, eps=1e-5)
    m.weight.data = randn(24)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(m), buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    x, r = randn(2, 3, 24).requires_grad_(), randn(2, 3, 24)
    y, s = loaded(x, r)
    y_ref, s_ref = m(x, r)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)
    (y.sum() + s.sum()).backward()
    assert x.grad is not None


# --- level 3: autograd, opcheck, torch.compile ---------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_weight", [True, False])
def test_gradcheck(mode, with_weight):
    x = randn(3, 9, dtype=torch.float64).requires_grad_()
    r = randn(3, 9, dtype=torch.float64).requires_grad_()
    w = randn(9, dtype=torch.float64).requires_grad_() if with_weight else None
    args = (x, r, w) if with_weight else (x, r)
    fn = (lambda x, r, w=None: fk.fused_add_rms_norm(x, r, w, 1e-6, 0.5, mode))
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("with_weight", [True, False])
def test_opcheck(with_weight):
    x = randn(4, 3, 40).requires_grad_()
    r = randn(4, 3, 40).requires_grad_()
    w = randn(40).requires_grad_() if with_weight else None
    torch.library.opcheck(torch.ops.fk.fused_add_rms_norm, (x, r, w, 1e-6, 0.0, "llama"))
    wd = None if w is None else w.detach()
    torch.library.opcheck(torch.ops.fk._fused_add_rms_norm_forward,
                          (x.detach(), r.detach(), wd, 1e-5, 1.0, "gemma"),
                          test_utils=("test_schema", "test_faketensor"))
    _, s, rstd = torch.ops.fk._fused_add_rms_norm_forward(x.detach(), r.detach(), wd, 1e-6, 0.0,
                                                          "llama")
    dy = randn(4, 3, 40)
    for ds in (randn(4, 3, 40), None):
        torch.library.opcheck(torch.ops.fk._fused_add_rms_norm_backward,
                              (dy, ds, s, wd, rstd, 0.0, "llama", [True, with_weight]),
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def layer(h, residual, w):
        h, residual = fk.fused_add_rms_norm(h, residual, w, 1e-6)
        return (h * residual).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [randn(rows, 32).requires_grad_(), randn(rows, 32).requires_grad_(),
                randn(32).requires_grad_()]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args)
        ref = layer(*eager_args)
        assert_close(out, ref, torch.float32, factor=10)
        out.sum().backward()
        ref.sum().backward()
        for a, b in zip(args, eager_args):
            assert_close(a.grad, b.grad, torch.float32, factor=10)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Covers every forward and backward bucket, the unaligned variants (odd N), the looped
# backward (8192 < N) and the looped forward (16384 < N).
CUDA_N = [1, 7, 64, 127, 256, 1000, 1024, 2047, 3584, 4096, 5120, 8192, 12288, 16384, 16385,
          65536]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", CUDA_N)
@pytest.mark.parametrize("mode", MODES)
def test_cuda_matches_reference(dtype, n, mode):
    m = 37 if n <= 16384 else 5
    eps, offset = 1e-6, (1.0 if mode == "gemma" else 0.0)
    x = randn(m, n, dtype=dtype, device="cuda").requires_grad_()
    r = randn(m, n, dtype=dtype, device="cuda").requires_grad_()
    w = randn(n, dtype=dtype, device="cuda").requires_grad_()
    poison_cuda_cache()
    y, s = fk.fused_add_rms_norm(x, r, w, eps, offset, mode)
    assert not torch.isnan(y).any() and not torch.isnan(s).any(), "unwritten output elements"
    assert torch.equal(s, r.detach() + x.detach()), "residual_out is torch's add"
    y_ref, _ = ref_fused_add_rms_norm(x.cpu(), r.cpu(), w.cpu(), eps, offset, mode)
    assert_close(y, y_ref, dtype, factor=1.5, what="y")
    assert_close(y, fk.rms_norm(s, w, eps, offset, mode), dtype, factor=0.1, what="y vs rms_norm")
    dy, ds = randn(m, n, dtype=dtype, device="cuda"), randn(m, n, dtype=dtype, device="cuda")
    poison_cuda_cache()
    torch.autograd.backward([y, s], [dy, ds])
    gx, gw = ref_grads(x.cpu(), r.cpu(), w.cpu(), dy.cpu(), ds.cpu(), eps, offset, mode)
    scale = _cancel_scale(n, dy, ds)
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    assert_close(r.grad, gx, dtype, factor=3, what="dresidual", scale=scale)
    # With one element per row, dw sums m terms of dy's size (x_hat is +-1) that can cancel.
    wscale = dy.double().abs().sum().item() if n == 1 else None
    assert_close(w.grad, gw, dtype, factor=3, what="dw", scale=wscale)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4096, 1000, 12288])
def test_cuda_partial_gradients(dtype, n):
    """y alone, residual_out alone, a frozen weight, only the weight, no weight."""
    m = 1500  # more rows than programs: every program walks several rows
    x = randn(m, n, dtype=dtype, device="cuda")
    r = randn(m, n, dtype=dtype, device="cuda")
    w = randn(n, dtype=dtype, device="cuda")
    g = randn(m, n, dtype=dtype, device="cuda")
    cpu = [t.cpu() for t in (x, r, w, g)]

    def run(grad_x, grad_w, use_y, use_s, weight=True):
        xs = x.clone().requires_grad_(grad_x)
        ws = w.clone().requires_grad_(grad_w) if weight else None
        y, s = fk.fused_add_rms_norm(xs, r, ws)
        outs = ([y] if use_y else []) + ([s] if use_s else [])
        poison_cuda_cache()
        torch.autograd.backward(outs, [g] * len(outs))
        return xs.grad, (ws.grad if weight else None)

    for use_y, use_s in ((True, False), (False, True)):
        dx, dw = run(True, True, use_y, use_s)
        gx, gw = ref_grads(cpu[0], cpu[1], cpu[2], cpu[3] if use_y else None,
                           cpu[3] if use_s else None, 1e-6, 0.0, "llama")
        assert_close(dx, gx, dtype, factor=3, what=f"dx y={use_y} s={use_s}")
        if use_y:
            assert_close(dw, gw, dtype, factor=3, what="dw")
        else:
            assert dw is None
    gx, gw = ref_grads(cpu[0], cpu[1], cpu[2], cpu[3], cpu[3], 1e-6, 0.0, "llama")
    dx, dw = run(True, False, True, True)  # frozen weight
    assert dw is None
    assert_close(dx, gx, dtype, factor=3, what="dx, frozen weight")
    dx, dw = run(False, True, True, True)  # only the weight
    assert dx is None
    assert_close(dw, gw, dtype, factor=3, what="dw alone")
    dx, _ = run(True, False, True, True, weight=False)
    gx, _ = ref_grads(cpu[0], cpu[1], None, cpu[3], cpu[3], 1e-6, 0.0, "llama")
    assert_close(dx, gx, dtype, factor=3, what="dx, no weight")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (2, 3, 4096), (8192, 4096), (3, 128)])
def test_cuda_llama_shapes_misaligned_and_strided(dtype, shape):
    x = randn(*shape, dtype=dtype, device="cuda")
    r = randn(*shape, dtype=dtype, device="cuda")
    w = randn(shape[-1], dtype=dtype, device="cuda")
    y_ref, s_ref = ref_fused_add_rms_norm(x.cpu(), r.cpu(), w.cpu())
    for xi, ri in ((misaligned(x), r), (x, misaligned(r))):
        y, s = fk.fused_add_rms_norm(xi, ri, w)
        assert torch.equal(s.cpu(), s_ref)
        assert_close(y, y_ref, dtype, factor=1.5)
    x2 = x.reshape(-1, shape[-1])
    xt = x2.t().contiguous().t() if x2.shape[0] > 1 else torch.stack([x2, x2], -1).flatten(1)[:, ::2]
    assert not xt.is_contiguous() and torch.equal(xt, x2)  # column-major, or strided columns
    y, s = fk.fused_add_rms_norm(xt, r.reshape(-1, shape[-1]), w)
    assert_close(y, y_ref.reshape(-1, shape[-1]), dtype, factor=1.5)
    # Misaligned gradients take the unaligned backward.
    xg = x.clone().requires_grad_()
    y, s = fk.fused_add_rms_norm(xg, r, w)
    dy, ds = randn(*shape, dtype=dtype, device="cuda"), randn(*shape, dtype=dtype, device="cuda")
    torch.autograd.backward([y, s], [misaligned(dy), misaligned(ds)])
    gx, _ = ref_grads(x.cpu(), r.cpu(), w.cpu(), dy.cpu(), ds.cpu(), 1e-6, 0.0, "llama")
    assert_close(xg.grad, gx, dtype, factor=3)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.fused_add_rms_norm(_t(2, 4, dtype=torch.float64, device="cuda"),
                              _t(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.fused_add_rms_norm(_t(2, 4, device="cuda"), _t(2, 4))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile_graph():
    e = torch.empty(0, 64, device="cuda")
    y, s = fk.fused_add_rms_norm(e, e, torch.ones(64, device="cuda"))
    assert y.shape == s.shape == (0, 64)
    x = randn(4, 3, 40, device="cuda").requires_grad_()
    r = randn(4, 3, 40, device="cuda").requires_grad_()
    w = randn(40, device="cuda").requires_grad_()
    torch.library.opcheck(torch.ops.fk.fused_add_rms_norm, (x, r, w, 1e-6, 0.0, "llama"))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda x, r, w: sum(t.sum() for t in fk.fused_add_rms_norm(x, r, w)),
                      fullgraph=True, backend="aot_eager")
    f(x, r, w).backward()
    assert x.grad is not None and r.grad is not None and w.grad is not None
    # CUDA-graph capture of forward and backward (no host synchronisation inside).
    xs, rs = x.detach().clone().requires_grad_(), r.detach().clone()
    ws = w.detach().clone().requires_grad_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph
        y, s = fk.fused_add_rms_norm(xs, rs, ws)
        torch.autograd.backward([y, s], [torch.ones_like(y), torch.ones_like(s)])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    xs.grad = ws.grad = None
    with torch.cuda.graph(graph):
        y, s = fk.fused_add_rms_norm(xs, rs, ws)
        torch.autograd.backward([y, s], [torch.ones_like(y), torch.ones_like(s)])
    graph.replay()
    torch.cuda.synchronize()
    y_ref, s_ref = fk.fused_add_rms_norm(xs.detach(), rs, ws.detach())
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)
    gx, gw = ref_grads(xs.cpu(), rs.cpu(), ws.cpu(), torch.ones(4, 3, 40), torch.ones(4, 3, 40),
                       1e-6, 0.0, "llama")
    assert_close(xs.grad, gx, torch.float32, factor=3)
    assert_close(ws.grad, gw, torch.float32, factor=3)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    n = 4096
    m = (1 << 31) // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xg = x.requires_grad_()
    y, s = fk.fused_add_rms_norm(xg, r, w)
    rows = [slice(0, 4), slice(m - 4, m)]
    for sl in rows:
        y_ref, s_ref = ref_fused_add_rms_norm(x[sl].detach().cpu(), r[sl].cpu(), w.detach().cpu())
        assert torch.equal(s[sl].cpu(), s_ref)
        assert_close(y[sl], y_ref, torch.bfloat16, factor=1.5)
    del r
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    torch.autograd.backward([y, s], [g, g])
    for sl in rows:
        # dx = rms_norm's backward at residual_out plus the gradient of residual_out.
        sd = s[sl].detach().cpu().double().requires_grad_()
        yd = ref_rms_norm(sd, w.detach().cpu().double(), 1e-6, 0.0, "gemma")
        (gs,) = torch.autograd.grad(yd, sd, g[sl].cpu().double())
        assert_close(xg.grad[sl], gs + g[sl].cpu().double(), torch.bfloat16, factor=3)
    assert w.grad is not None and torch.isfinite(w.grad).all()
    del x, xg, y, s, g, w
    torch.cuda.empty_cache()
