"""fk.gated_group_rms_norm at every test level: Triton source (interpreter), CPU backend,
autograd, opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker
``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, check_compile_matches_eager, error_lines,
                     load_triton_src, misaligned, poison_cuda_cache, randn, round_nearest,
                     round_toward_zero)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")


# --- the reference, written from Hugging Face's Qwen3NextRMSNormGated ---------------------

def ref_gated(x, gate, weight, group_size, eps=1e-6, activation="silu", transpose_out=False,
              cast=round_nearest):
    """Qwen3NextRMSNormGated over groups: float32 statistics, the normalized x cast to x's
    dtype, times the weight (rounded: Hugging Face multiplies in x's dtype), times act of the
    float32 gate, cast once. float64 throughout (and differentiable) for float64 inputs."""
    dtype = x.dtype
    f64 = dtype == torch.float64
    acc = torch.float64 if f64 else torch.float32
    rnd = (lambda t: t) if f64 else (lambda t: cast(t, dtype).to(acc))
    n = x.shape[-1]
    xs = x.to(acc).reshape(*x.shape[:-1], n // group_size, group_size)
    y = rnd(xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps))
    if weight is not None:
        w = weight.to(acc)
        y = rnd(y * (w if w.shape[0] == group_size else w.reshape(-1, group_size)))
    g = gate.to(acc).reshape(xs.shape)
    a = g * torch.sigmoid(g) if activation == "silu" else torch.sigmoid(g)
    y = (y * a).reshape(x.shape)
    if transpose_out:
        b, s, h, d = x.shape
        y = y.transpose(0, 1).reshape(s, b, h * d)
    return y if f64 else cast(y, dtype)


def ref_grads(x, gate, weight, dy, *args):
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, gate, weight)]
    ref_gated(*leaves, *args).backward(dy.double())
    return [None if t is None else t.grad for t in leaves]


def make_inputs(shape, group_size, per_group=False, dtype=torch.float32, device="cpu",
                weight=True):
    x = randn(*shape, dtype=dtype, device=device)
    gate = randn(*shape, dtype=dtype, device=device, scale=2.0)
    wn = group_size if per_group else shape[-1]
    w = (1 + 0.3 * randn(wn)).to(device=device, dtype=dtype) if weight else None
    return x, gate, w


# --- level 1: the Triton source under the interpreter ---------------------------------

# shape, group size, weight per group, BM, BG
INTERP_CASES = {
    "heads_transposed": ((2, 3, 2, 24), 8, False, 4, 8),
    "one_group_per_row": ((5, 12), 12, True, 2, 16),
    "qwen3_next": ((1, 3, 4, 16), 16, True, 8, 16),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("case,transpose_out", [(c, t) for c in INTERP_CASES for t in (False, True)
                                                 if len(INTERP_CASES[c][0]) == 4 or not t])
def test_interpreter(case, activation, dtype, transpose_out):
    mod = load_triton_src("gated_group_rms_norm")
    shape, gs, per_group, bm, bg = INTERP_CASES[case]
    x, gate, w = make_inputs(shape, gs, per_group, dtype)
    n = shape[-1]
    m = x.numel() // n
    b, s, h = shape[:3] if transpose_out else (1, 1, 1)
    act = 0 if activation == "silu" else 1
    y = torch.full(ref_gated(x, gate, w, gs, 1e-6, activation, transpose_out).shape,
                   float("nan"), dtype=dtype)
    tiles = cdiv(m, bm) * (n // gs)
    mod.gated_group_rms_norm_fwd_kernel[(tiles,)](x, gate, w, y, m, n, gs, b, s, h, 1e-6, 1,
                                                  int(per_group), act, int(transpose_out),
                                                  BM=bm, BG=bg)
    ref = ref_gated(x, gate, w, gs, 1e-6, activation, transpose_out, cast=round_toward_zero)
    assert not torch.isnan(y).any(), "unwritten elements"
    assert_close(y, ref, dtype, what="y")
    dy = randn(*y.shape, dtype=dtype)
    programs = 3
    dx, dg = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    part = torch.full((programs, w.numel()), float("nan"))
    mod.gated_group_rms_norm_bwd_kernel[(programs,)](dy, x, gate, w, dx, dg, part, m, n, gs, b, s,
                                                     h, 1e-6, 1, int(per_group), act,
                                                     int(transpose_out), BM=bm, BG=bg)
    gx, gg, gw = ref_grads(x, gate, w, dy, gs, 1e-6, activation, transpose_out)
    assert not torch.isnan(dx).any() and not torch.isnan(dg).any()
    assert_close(dx, gx, dtype, factor=2, what="dx")
    assert_close(dg, gg, dtype, factor=2, what="dgate")
    assert_close(part.sum(0), gw, dtype, factor=2, what="dw")


def test_variants_cover_every_dtype_and_alignment():
    mod = load_triton_src("gated_group_rms_norm")
    vs = mod.variants(90)
    for family, tiles in (("gated_group_rms_norm_fwd", mod.FWD_TILES),
                          ("gated_group_rms_norm_bwd", mod.BWD_TILES)):
        for dt in ("fp32", "bf16", "fp16"):
            for bg in tiles:
                got = {v.flags for v in vs if v.family == family and v.dtype == dt
                       and v.block == bg}
                assert got == {0, 1, 257}, (family, dt, bg, got)  # 257: aligned, rows % 16 == 0


# --- level 2: the CPU backend against the reference --------------------------------------

# shape, group size, weight per group, transpose_out
CONFIGS = {
    "qwen3_next_heads": ((2, 3, 4, 16), 16, True, True),
    "groups_full_weight": ((2, 5, 32), 8, False, False),
    "one_group": ((7, 24), 24, False, False),
    "transposed_groups": ((2, 4, 3, 12), 4, False, True),
}


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_cpu_forward_backward(dtype, cfg, activation):
    shape, gs, per_group, tr = CONFIGS[cfg]
    x, gate, w = make_inputs(shape, gs, per_group, dtype)
    for t in (x, gate, w):
        t.requires_grad_()
    y = fk.gated_group_rms_norm(x, gate, w, gs, 1e-6, activation, tr)
    ref = ref_gated(x.detach(), gate.detach(), w.detach(), gs, 1e-6, activation, tr)
    assert y.dtype == dtype and y.shape == ref.shape and y.is_contiguous()
    assert_close(y, ref, dtype, what="y")
    dy = randn(*y.shape, dtype=dtype)
    y.backward(dy)
    gx, gg, gw = ref_grads(x, gate, w, dy, gs, 1e-6, activation, tr)
    assert_close(x.grad, gx, dtype, factor=2, what="dx")
    assert_close(gate.grad, gg, dtype, factor=2, what="dgate")
    assert_close(w.grad, gw, dtype, factor=2, what="dw")


def test_cpu_matches_hugging_face_qwen3_next():
    """Against transformers' Qwen3NextRMSNormGated on (B, S, H, D) heads reshaped as the
    model does (rows of head_v_dim), then (B, S, H * D)."""
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    b, s, h, d = 2, 5, 3, 16
    norm = mod.Qwen3NextRMSNormGated(d, eps=1e-6)
    with torch.no_grad():
        norm.weight.add_(0.3 * randn(d))
    x, z = randn(b, s, h, d), randn(b, s, h, d)
    ref = norm(x.reshape(-1, d), z.reshape(-1, d)).reshape(b, s, h * d)
    with torch.no_grad():
        y = fk.gated_group_rms_norm(x, z, norm.weight, d)
        yt = fk.gated_group_rms_norm(x, z, norm.weight, d, transpose_out=True)
    assert_close(y.reshape(b, s, h * d), ref, torch.float32)
    assert_close(yt, ref.transpose(0, 1), torch.float32)


def test_nn_module_matches_hugging_face_qwen3_next():
    """fk.nn.RMSNormGated loads Qwen3NextRMSNormGated's state dict and matches it, forward and
    backward; group_size splits the row as FLA's gated norm does."""
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    d = 16
    hf = mod.Qwen3NextRMSNormGated(d, eps=1e-6)
    with torch.no_grad():
        hf.weight.add_(0.3 * randn(d))
    ours = fk.nn.RMSNormGated(d, eps=1e-6)
    ours.load_state_dict(hf.state_dict())
    x, z = randn(6, d), randn(6, d)  # float32: Hugging Face's module computes in float32
    xs = [x.clone().requires_grad_() for _ in range(2)]
    y_hf, y = hf(xs[0], z), ours(xs[1], z)
    assert_close(y, y_hf, torch.float32)
    y_hf.sum().backward()
    y.sum().backward()
    assert_close(xs[1].grad, xs[0].grad, torch.float32, factor=2)
    assert_close(ours.weight.grad, hf.weight.grad, torch.float32, factor=2)
    grouped = fk.nn.RMSNormGated(d, group_size=4, activation="sigmoid")
    assert_close(grouped(x, z), ref_gated(x, z, grouped.weight.detach(), 4, 1e-6, "sigmoid"),
                 torch.float32)
    with pytest.raises(ValueError, match="activation"):
        fk.nn.RMSNormGated(d, activation="gelu")


def test_cpu_no_weight_strided_and_empty():
    x, gate, _ = make_inputs((4, 6, 16), 8)
    y = fk.gated_group_rms_norm(x, gate, None, 8, activation="sigmoid")
    assert_close(y, ref_gated(x, gate, None, 8, 1e-6, "sigmoid"), torch.float32)
    xt = x.transpose(0, 1)  # not contiguous
    y = fk.gated_group_rms_norm(xt, gate.transpose(0, 1), None, 4)
    assert_close(y, ref_gated(xt, gate.transpose(0, 1), None, 4), torch.float32)
    e = torch.empty(0, 3, 8, requires_grad=True)
    w = torch.ones(8, requires_grad=True)
    y = fk.gated_group_rms_norm(e, e.detach(), w, 4)
    y.sum().backward()
    assert y.shape == (0, 3, 8) and torch.equal(w.grad, torch.zeros(8))
    y = fk.gated_group_rms_norm(torch.empty(2, 0, 3, 8), torch.empty(2, 0, 3, 8), None, 8,
                                transpose_out=True)
    assert y.shape == (0, 2, 24)


def test_only_gate_needs_grad_and_double_backward():
    x, gate, w = make_inputs((3, 16), 8)
    gate.requires_grad_()
    y = fk.gated_group_rms_norm(x, gate, w, 8)
    dy = torch.ones_like(y)
    y.backward(dy)
    assert_close(gate.grad, ref_grads(x, gate, w, dy, 8)[1], torch.float32, factor=2)
    assert w.grad is None
    x.requires_grad_()
    (gx,) = torch.autograd.grad(fk.gated_group_rms_norm(x, gate, w, 8).pow(2).sum(), x,
                                create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input: the same message from every backend -----------------------------------

def _bad(x=(2, 3, 4, 16), g=None, w=(16,), gs=8, dt=torch.float32, gdt=None, wdt=None,
         act="silu", tr=False):
    def make(device):
        t = lambda shape, dtype: None if shape is None else torch.ones(shape, dtype=dtype,
                                                                       device=device)
        return t(x, dt), t(g or x, gdt or dt), t(w, wdt or dt), gs, 1e-6, act, tr
    return make


BAD = [
    ("int x", _bad(dt=torch.int32, wdt=torch.float32), "not supported"),
    ("gate dtype", _bad(gdt=torch.float16), "must have the same dtype"),
    ("gate shape", _bad(g=(2, 3, 4, 8)), "must have the same shape"),
    ("activation", _bad(act="gelu"), "activation must be 'silu' or 'sigmoid'"),
    ("group size", _bad(gs=6), "must be positive and divide"),
    ("zero group size", _bad(gs=0), "must be positive and divide"),
    ("transpose 3-D", _bad(x=(2, 3, 16), tr=True), "transpose_out needs x of 4 dims"),
    ("weight shape", _bad(w=(4,)), "weight must have shape"),
    ("weight dtype", _bad(wdt=torch.float16), "must have the same dtype"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.gated_group_rms_norm(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_backward_bad_grad_shape():
    x, gate, w = make_inputs((2, 3, 4, 16), 8)
    op = torch.ops.fk._gated_group_rms_norm_backward
    for device in ("cpu", "meta"):
        with pytest.raises(RuntimeError, match="grad_y must have the output's shape"):
            op(torch.ones(2, 3, 64, device=device), x.to(device), gate.to(device), w.to(device),
               8, 1e-6, "silu", True, True)


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------------

@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gradcheck(cfg, activation):
    shape, gs, per_group, tr = CONFIGS[cfg]
    x, gate, w = make_inputs(shape, gs, per_group, torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b, c: fk.gated_group_rms_norm(a, b, c, gs, 1e-6, activation, tr),
        (x.requires_grad_(), gate.requires_grad_(), w.requires_grad_()))


def test_opcheck():
    x, gate, w = make_inputs((2, 3, 4, 16), 16, True)
    for t in (x, gate, w):
        t.requires_grad_()
    op = torch.ops.fk.gated_group_rms_norm
    torch.library.opcheck(op, (x, gate, w, 16, 1e-6, "silu", True))
    torch.library.opcheck(op, (x, gate, None, 8, 1e-5, "sigmoid", False))
    dy = randn(3, 2, 64)
    torch.library.opcheck(torch.ops.fk._gated_group_rms_norm_backward,
                          (dy, x.detach(), gate.detach(), w.detach(), 16, 1e-6, "silu", True,
                           True), test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def f(x, gate, w):
        return fk.gated_group_rms_norm(x, gate, w, 8, transpose_out=True).pow(2).sum()

    check_compile_matches_eager(
        f, lambda s: [t.requires_grad_() for t in make_inputs((2, s, 3, 16), 8)])


def test_torchscript(tmp_path):
    def f(x: torch.Tensor, gate: torch.Tensor, w: torch.Tensor):
        return fk.gated_group_rms_norm(x, gate, w, 8, 1e-6, "sigmoid", False)

    scripted = torch.jit.script(f)
    path = str(tmp_path / "gated.pt")
    torch.jit.save(scripted, path)
    x, gate, w = make_inputs((3, 16), 8)
    assert torch.equal(torch.jit.load(path)(x, gate, w), f(x, gate, w))


# --- level 5: CUDA kernels -----------------------------------------------------------------

# shape, group size, weight per group, transpose_out
CUDA_SHAPES = {
    "qwen3_next": ((2, 257, 32, 128), 128, True, True),
    "qwen3_next_flat": ((3, 65, 32, 128), 128, True, False),
    "fla_groups": ((2, 100, 2048), 256, False, False),
    "one_group_4096": ((33, 4096), 4096, False, False),
    "odd_group": ((2, 9, 5, 40), 40, True, True),
    "odd_groups_full_weight": ((17, 3 * 96), 96, False, False),
    "one_row": ((1, 1, 1, 64), 64, True, True),
    "group_8192": ((3, 8192), 8192, True, False),
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CUDA_SHAPES))
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_cuda_matches_reference(dtype, name, activation):
    shape, gs, per_group, tr = CUDA_SHAPES[name]
    x, gate, w = make_inputs(shape, gs, per_group, dtype, "cuda")
    for t in (x, gate, w):
        t.requires_grad_()
    poison_cuda_cache()
    y = fk.gated_group_rms_norm(x, gate, w, gs, 1e-6, activation, tr)
    cpu = [t.detach().cpu() for t in (x, gate, w)]
    assert not torch.isnan(y).any(), "unwritten output elements"
    assert_close(y, ref_gated(*cpu, gs, 1e-6, activation, tr), dtype, what="y")
    dy = randn(*y.shape, dtype=dtype, device="cuda")
    poison_cuda_cache()
    y.backward(dy)
    gx, gg, gw = ref_grads(*cpu, dy.cpu(), gs, 1e-6, activation, tr)
    assert_close(x.grad, gx, dtype, factor=2, what="dx")
    assert_close(gate.grad, gg, dtype, factor=2, what="dgate")
    assert_close(w.grad, gw, dtype, factor=2, what="dw")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_no_weight(dtype):
    x, gate, w = make_inputs((2, 33, 4, 128), 128, True, dtype, "cuda")
    xm, gm, wm = misaligned(x), misaligned(gate), misaligned(w)
    y = fk.gated_group_rms_norm(xm, gm, wm, 128, transpose_out=True)
    assert_close(y, ref_gated(x.cpu(), gate.cpu(), w.cpu(), 128, transpose_out=True), dtype)
    y = fk.gated_group_rms_norm(x, gate, None, 64, activation="sigmoid")
    assert_close(y, ref_gated(x.cpu(), gate.cpu(), None, 64, activation="sigmoid"), dtype)


@pytest.mark.cuda
def test_cuda_bad_input_and_empty():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.gated_group_rms_norm(*make(d)), ("cpu", "cuda"),
                                msg)
        assert cpu == cuda, name
    x = torch.ones(2, 16384, device="cuda")
    with pytest.raises(RuntimeError, match="must be at most 8192 on CUDA"):
        fk.gated_group_rms_norm(x, x, None, 16384)
    e = torch.empty(0, 3, 64, device="cuda", requires_grad=True)
    w = torch.ones(64, device="cuda", requires_grad=True)
    y = fk.gated_group_rms_norm(e, e.detach(), w, 64)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    xs, gs_, ws = make_inputs((2, 3, 4, 64), 64, True, device="cuda")
    torch.library.opcheck(torch.ops.fk.gated_group_rms_norm,
                          (xs.requires_grad_(), gs_, ws.requires_grad_(), 64, 1e-6, "silu",
                           True))
