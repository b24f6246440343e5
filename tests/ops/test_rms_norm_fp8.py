"""fk.rms_norm_fp8 at every test level: Triton source (interpreter, up to the float8 cast),
CPU backend against the float64 references of the norm and of the FP8 format, autograd
(through y, straight through the quantized copies) against torch autograd of the float
reference, opcheck, torch.compile, bad input, and the CUDA kernels (marker ``cuda``).

The quantized copies are checked bit for bit against the reference quantization of the y the
op returns; y itself against the norm's reference (and, on CPU, bit for bit against
fk.rms_norm)."""
import math

import pytest
import torch

import fk
from helpers import (DTYPES, VARIANT_DTYPE, assert_close, cdiv, error_lines,
                     fixed_copies_same, load_triton_src, misaligned, poison_cuda_cache, randn,
                     ref_grads, ref_quantize, ref_rms_norm, ref_rms_norm_grads,
                     round_toward_zero, same)

FP8 = torch.float8_e4m3fn
LAYOUTS = ["rowwise", "columnwise", "both"]
# Full blocks, partial blocks in either dim, fewer than one block, one element, 3-D.
SHAPES = [(128, 256), (130, 200), (5, 300), (257, 129), (1, 1), (3, 128), (2, 3, 260)]
EPS = 1e-6


def call(x, w, layout="both", pow2=False, eps=EPS):
    """(q, s, qt, st, rstd, y) of fk.rms_norm_fp8 with return_norm, None for a copy not
    asked for; the returned tuple's length checked against the layout."""
    r = fk.rms_norm_fp8(x, w, eps, layout=layout, pow2_scales=pow2, return_norm=True)
    assert len(r) == {"rowwise": 4, "columnwise": 4, "both": 6}[layout]
    if layout == "rowwise":
        return (*r[:2], None, None, *r[2:])
    if layout == "columnwise":
        return (None, None, *r)
    return r


def check_copies(got, y, layout, pow2):
    """The quantized copies are fk.fp8_quantize's format of y (the float64 reference), bit for
    bit: data after the float8 cast, scales exactly."""
    k = y.shape[-1]
    want = ref_quantize(y.detach().cpu().reshape(-1, k), (1, 128), pow2)
    for i, (g, w) in enumerate(zip(got[:4], want)):
        if g is None:
            assert layout != "both" and ((i < 2) == (layout == "columnwise"))
            continue
        assert g.is_contiguous() and g.shape == w.shape
        assert g.dtype == (FP8 if i % 2 == 0 else torch.float32)
        same(g.cpu(), w.to(FP8) if i % 2 == 0 else w)


def ref_rstd(x, eps=EPS):
    xd = x.detach().double().cpu().reshape(-1, x.shape[-1])
    return torch.rsqrt(xd.pow(2).mean(-1) + eps)


def check_against_ref(x, w, layout, pow2):
    got = call(x, w, layout, pow2)
    y, rstd = got[5], got[4]
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert rstd.shape == (x.numel() // x.shape[-1],) and rstd.dtype == torch.float32
    assert_close(y, ref_rms_norm(x.cpu(), w.cpu(), EPS), x.dtype, factor=1.5, what="y")
    assert_close(rstd, ref_rstd(x), torch.float32, what="rstd")
    check_copies(got, y, layout, pow2)
    return got


def special_input(dtype):
    """(260, 300): an all-zero row (1), an inf (row 2), a NaN (row 130, the second row
    tile), huge and tiny rows (3, 4: beyond float32's range when squared, except in
    float16), a row with one nonzero block (5)."""
    x = randn(260, 300, seed=5, scale=2.0)
    x[1] = 0
    x[2, 7] = math.inf
    x[130, 290] = math.nan
    x[3] *= 1e3 if dtype == torch.float16 else 1e30
    x[4] *= 1e-3 if dtype == torch.float16 else 1e-30
    x[5, 128:] = 0
    return x.to(dtype)


# --- level 1: the Triton source under the interpreter ----------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(130, 300), (128, 128), "special"])
def test_interpreter(dtype, pow2, shape):
    """Both paths (rows + tile, rstd + tile) with float32 data outputs: everything up to the
    float8 cast (Triton 3.6's interpreter converts to float8 wrongly; the cast is tested on
    the GPU). The interpreter rounds to bfloat16 toward zero: so does the reference here."""
    mod = load_triton_src("rms_norm_fp8")
    x = special_input(dtype) if shape == "special" else randn(*shape, dtype=dtype, scale=3.0)
    m, k = x.shape
    w = randn(k, dtype=dtype, scale=2.0)
    nm, nk = cdiv(m, 128), cdiv(k, 128)

    def fresh():
        return (torch.full((m, k), math.nan), torch.full((nk, m), -1.0),
                torch.full((k, m), math.nan), torch.full((nm, k), -1.0),
                torch.full((m,), -1.0), torch.full((m, k), math.nan, dtype=dtype))

    ref_y = ref_rms_norm(x, w, EPS, cast=round_toward_zero)
    # the rows path's column-wise tiles as each variant of that form has them (128 x 32,
    # and 128 x 64 aligned)
    for path, cols_k in (("rows", 32), ("rows", mod.ALIGNED_COLS_TILE[1]), ("rstd", None)):
        q, s, qt, st, rstd, y = fresh()
        if path == "rows":  # rows kernel (row-wise copy, y, rstd), tiles (column-wise copy)
            rows = 2
            mod.rms_norm_fp8_rows_kernel[(cdiv(m, rows),)](x, w, q, s, y, rstd, m, k, EPS, 1,
                                                           1, int(pow2), BLOCK_K=512, ROWS=rows)
        else:  # rstd kernel (chunks of 128), tiles writing everything
            mod.rms_norm_fp8_rstd_kernel[(m,)](x, rstd, m, k, EPS, BLOCK_K=128)
        # as the CUDA side launches it: narrower tiles for the column-wise copy alone
        row_in_tiles = int(path == "rstd")
        tile_k = 128 if row_in_tiles else cols_k
        mod.rms_norm_fp8_tile_kernel[(nm, cdiv(k, tile_k))](
            x, w, rstd, q, s, qt, st, y, m, k, row_in_tiles, 1, row_in_tiles, int(pow2),
            TILE_M=128, TILE_K=tile_k)
        assert_close(y, ref_y, dtype, factor=1.5, what=f"y ({path})")
        assert_close(rstd, ref_rstd(x), torch.float32, what=f"rstd ({path})")
        for g, want in zip((q, s, qt, st), ref_quantize(y, (1, 128), pow2)):
            same(g, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_tile_variants_fixed_outputs(dtype):
    """The tile kernel's variants for the column-wise copy alone (COPIES) write it and
    nothing else (no row-wise copy, no y) whatever their arguments say: the same bits as the
    kernel told so by its arguments, at the variants' own tiles."""
    mod = load_triton_src("rms_norm_fp8")
    m, k = 160, 256
    x, w = randn(m, k, dtype=dtype, scale=2.0), randn(k, dtype=dtype)
    rstd = torch.rand(m) + 0.5
    for v in mod.variants(90):
        c = v.constexprs
        if v.family != "rms_norm_fp8_tile" or v.dtype != VARIANT_DTYPE[dtype]:
            continue
        assert c["COPIES"] == (mod.COPIES_COLS if v.flags & mod.FLAG_COLS else 0), v
        if not c["COPIES"]:
            continue

        def launch(f, fixed, c=c):
            q, qt = torch.zeros(m, k, dtype=FP8), torch.zeros(k, m, dtype=FP8)
            s, st = torch.full((cdiv(k, 128), m), -1.0), torch.full((cdiv(m, 128), k), -1.0)
            y = torch.zeros(m, k, dtype=dtype)
            mod.rms_norm_fp8_tile_kernel[(cdiv(m, 128), cdiv(k, c["TILE_K"]))](
                x, w, rstd, q, s, qt, st, y, m, k, f["want_row"], f["want_col"], f["want_y"],
                0, **dict(c, COPIES=c["COPIES"] * fixed))
            return q, s, qt, st, y
        fixed_copies_same(launch, {"want_row": 0, "want_col": 1, "want_y": 0})


def test_variants_cover_every_dtype():
    """sm_90 and newer: every family for every dtype, plain and aligned (the tile kernel in
    both its forms); sm_80: none."""
    mod = load_triton_src("rms_norm_fp8")
    assert mod.variants(80) == []
    vs = mod.variants(90)
    forms = {"rms_norm_fp8_rows": (0,), "rms_norm_fp8_rstd": (0,),
             "rms_norm_fp8_tile": (0, mod.FLAG_COLS)}
    for fam, fam_forms in forms.items():
        got = {(v.dtype, v.flags) for v in vs if v.family == fam}
        assert got == {(dt, form | f) for dt in ("bf16", "fp16", "fp32") for f in (0, 1)
                       for form in fam_forms}, fam
    # (flags, TILE_K, warps): the column-wise form's aligned variant at its own tile
    assert {(v.flags, v.constexprs["TILE_K"], v.num_warps) for v in vs
            if v.family == "rms_norm_fp8_tile"} == {
        (0, 128, 8), (1, 128, 8), (mod.FLAG_COLS, 32, 4),
        (mod.FLAG_COLS | 1, *mod.ALIGNED_COLS_TILE[1:])}
    for v in vs:
        assert v.signature["x_ptr"] == f"*{v.dtype}"
        assert v.signature.get("q_ptr", "*fp8e4nv") == "*fp8e4nv"
        assert ("K" in v.divisible_by_16) == bool(v.flags & 1)


# --- level 2: the CPU backend -----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_matches_reference(dtype, layout, pow2, shape):
    x = randn(*shape, dtype=dtype, scale=3.0)
    w = randn(shape[-1], dtype=dtype, scale=2.0)
    got = check_against_ref(x, w, layout, pow2)
    # y is fk.rms_norm's forward, bit for bit (the same CPU reference)
    assert torch.equal(got[5], fk.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pow2", [False, True])
def test_cpu_zeros_inf_nan(dtype, pow2):
    x = special_input(dtype)
    w = randn(300, dtype=dtype)
    q, s, qt, st, rstd, y = check_against_ref(x, w, "both", pow2)
    # all-zero row: rstd 1/sqrt(eps), y 0, every block scale 1, data 0
    assert torch.isclose(rstd[1], torch.tensor(1 / math.sqrt(EPS)), rtol=1e-6)
    assert (s[:, 1] == 1).all() and (q[1].float() == 0).all()
    # a row with an inf: rstd 0, y 0 but NaN at the inf (inf * 0), so the block holding
    # it (row-wise) and the column block holding it (column-wise) are NaN, nothing else
    assert rstd[2] == 0 and torch.isnan(y[2, 7]) and (y[2, :7] == 0).all()
    assert torch.isnan(s[0, 2]) and torch.isnan(q[2, :128].float()).all()
    assert s[1, 2] == 1 and (q[2, 128:].float() == 0).all()
    assert torch.isnan(st[0, 7]) and not torch.isnan(st[0, 6])
    # a row with a NaN: rstd and the whole row NaN; every column block of its row tile NaN
    assert torch.isnan(rstd[130]) and torch.isnan(y[130]).all()
    assert torch.isnan(s[:, 130]).all() and torch.isnan(st[1]).all()
    assert not torch.isnan(st[0, 8:]).any() and not torch.isnan(st[2]).any()
    if dtype != torch.float16:
        # row 3 (|x| ~ 1e30): the float32 sum of squares overflows, rstd 0, y 0, scales 1
        assert rstd[3] == 0 and (s[:, 3] == 1).all() and (q[3].float() == 0).all()
        # row 4 (|x| ~ 1e-30): its squares underflow, eps decides: y = x / sqrt(eps), tiny
        # blocks with scales above the 2^-126 floor
        assert torch.isclose(rstd[4], torch.tensor(1 / math.sqrt(EPS)), rtol=1e-6)
        assert ((s[:, 4] < 1e-25) & (s[:, 4] > 2.0 ** -126)).all()
    assert not torch.isnan(s[:, 3:6]).any()
    assert s[1, 5] == 1 and (q[5, 128:].float() == 0).all()


def test_cpu_return_values_and_no_norm():
    """return_norm=False returns the same copies and rstd, without y; layout picks the
    copies."""
    x, w = randn(130, 260), randn(260)
    full = call(x, w, "both")
    for layout in LAYOUTS:
        r = fk.rms_norm_fp8(x, w, EPS, layout=layout)
        want = {"rowwise": full[:2], "columnwise": full[2:4], "both": full[:4]}[layout]
        assert len(r) == len(want) + 1
        for a, b in zip(r, (*want, full[4])):
            same(a, b)
    # defaults: eps 1e-6, rowwise, no pow2
    for a, b in zip(fk.rms_norm_fp8(x, w), fk.rms_norm_fp8(x, w, 1e-6, "rowwise", False)):
        same(a, b)


def test_cpu_non_contiguous_and_empty():
    x, w = randn(260, 130).t(), randn(260)
    for a, b in zip(call(x, w), call(x.contiguous(), w)):
        same(a, b)
    for shape in ((0, 200), (3, 0), (2, 0, 130)):
        x = torch.zeros(shape)
        q, s, qt, st, rstd, y = call(x, torch.ones(shape[-1]))
        m, k = math.prod(shape[:-1]), shape[-1]
        assert q.shape == (m, k) and s.shape == (cdiv(k, 128), m)
        assert qt.shape == (k, m) and st.shape == (cdiv(m, 128), k)
        assert rstd.shape == (m,) and y.shape == shape


# --- autograd: through y, straight through the quantized copies ---------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 300), (2, 3, 128), (130, 1)])
def test_backward_matches_reference_and_rms_norm(dtype, shape):
    x = randn(*shape, dtype=dtype).requires_grad_()
    w = randn(shape[-1], dtype=dtype).requires_grad_()
    out = fk.rms_norm_fp8(x, w, EPS, layout="both", return_norm=True)
    y = out[-1]
    assert y.requires_grad and not any(t.requires_grad for t in out[:-1])
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    gx, gw = ref_rms_norm_grads(x, w, dy, EPS, 0.0, "llama")
    scale = dy.double().norm().item() if shape[-1] == 1 else None
    assert_close(x.grad, gx, dtype, factor=3, what="dx", scale=scale)
    wscale = dy.double().abs().sum().item() if shape[-1] == 1 else None
    assert_close(w.grad, gw, dtype, factor=3, what="dw", scale=wscale)
    # the same backward as fk.rms_norm's (the same op, given the same rstd)
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    fk.rms_norm(x2, w2, EPS).backward(dy)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)


class _Fp8Matmul(torch.autograd.Function):
    """A consumer of the row-wise copy: dequant(data, scales) @ b, whose input gradient is
    routed into y (straight through the quantization)."""

    @staticmethod
    def forward(ctx, y, data, scales, b):
        ctx.save_for_backward(b)
        ctx.y_shape, ctx.y_dtype = y.shape, y.dtype
        return fk.fp8_dequantize(data, scales, dtype=torch.float32) @ b

    @staticmethod
    def backward(ctx, g):
        (b,) = ctx.saved_tensors
        return (g @ b.t()).reshape(ctx.y_shape).to(ctx.y_dtype), None, None, None


@pytest.mark.parametrize("dtype", DTYPES)
def test_straight_through_matches_float_reference(dtype):
    """The gradient of dequant(quantized y) @ b, routed into y, equals torch autograd of the
    float reference rms_norm(x, w) @ b (float64): dequantization is the identity for
    autograd."""
    x = randn(3, 4, 256, dtype=dtype).requires_grad_()
    w = randn(256, dtype=dtype).requires_grad_()
    b = randn(256, 32)
    q, s, rstd, y = fk.rms_norm_fp8(x, w, EPS, return_norm=True)
    out = _Fp8Matmul.apply(y, q, s, b)
    g = randn(12, 32)
    out.backward(g)

    def ref(x_, w_):
        return ref_rms_norm(x_, w_, EPS, 0.0, "gemma").reshape(12, 256) @ b.double()

    gx, gw = ref_grads(ref, [x, w], g)
    assert_close(x.grad, gx, dtype, factor=3, what="dx")
    assert_close(w.grad, gw, dtype, factor=3, what="dw")


def test_requires_grad_without_norm_is_a_clear_error():
    x, w = randn(4, 128).requires_grad_(), randn(128)
    with pytest.raises(RuntimeError, match="only y carries the gradient"):
        fk.rms_norm_fp8(x, w)
    with pytest.raises(RuntimeError, match="only y carries the gradient"):
        fk.rms_norm_fp8(x.detach(), w.requires_grad_(), layout="both")
    with pytest.raises(RuntimeError, match="only y carries the gradient"):
        torch.ops.fk.rms_norm_fp8(x, w, 1e-6, "both", False, False)
    with torch.no_grad():
        assert len(fk.rms_norm_fp8(x, w)) == 3
        assert len(torch.ops.fk.rms_norm_fp8(x, w, 1e-6, "both", False, False)) == 6
    assert len(fk.rms_norm_fp8(x.detach(), w.detach())) == 3


def test_frozen_weight_and_double_backward():
    x, w = randn(4, 128).requires_grad_(), randn(128)
    y = fk.rms_norm_fp8(x, w, return_norm=True)[-1]
    (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    assert w.grad is None
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input ----------------------------------------------------------------------------

def _t(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("scalar", lambda d: (_t(d=d), _t(1, d=d)), {}, "at least one dimension"),
    ("double", lambda d: (_t(2, 128, dtype=torch.float64, d=d), _t(128, dtype=torch.float64,
                                                                   d=d)), {}, "not supported"),
    ("int", lambda d: (_t(2, 128, dtype=torch.int32, d=d), _t(128, d=d)), {}, "not supported"),
    ("weight dtype", lambda d: (_t(2, 128, d=d), _t(128, dtype=torch.float16, d=d)), {},
     "must have the same dtype"),
    ("weight shape", lambda d: (_t(2, 128, d=d), _t(127, d=d)), {}, "weight must have shape"),
    ("layout", lambda d: (_t(2, 128, d=d), _t(128, d=d)), {"layout": "transposed"},
     "layout must be"),
]


@pytest.mark.parametrize("name,make,kw,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, kw, msg):
    cpu, meta = error_lines(lambda d: fk.rms_norm_fp8(*make(d), **kw), ("cpu", "meta"), msg)
    assert cpu == meta and cpu.startswith("fk::rms_norm_fp8: ")


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.rms_norm_fp8(_t(2, 128), _t(128, d="meta"))


# --- level 3: opcheck, torch.compile --------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("return_norm", [False, True])
def test_opcheck(layout, return_norm):
    x = randn(3, 50, 260, dtype=torch.bfloat16).requires_grad_(return_norm)
    w = randn(260, dtype=torch.bfloat16).requires_grad_(return_norm)
    # test_aot_dispatch_dynamic with gradients sums every output, which torch 2.11 cannot do
    # for float8 ones: compiled forward and backward are test_torch_compile_fullgraph's.
    utils = (("test_schema", "test_autograd_registration", "test_faketensor") if return_norm
             else "ALL")
    torch.library.opcheck(torch.ops.fk.rms_norm_fp8, (x, w, 1e-5, layout, True, return_norm),
                          test_utils=utils)


def test_torch_compile_fullgraph():
    def f(x, w):
        q, s, qt, st, rstd, y = fk.rms_norm_fp8(x, w, layout="both", return_norm=True)
        return (fk.fp8_dequantize(q, s, dtype=torch.float32) + 1,
                fk.fp8_dequantize(qt, st, dtype=torch.float32), rstd, y * 2)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for m in (130, 257):
        x, w = randn(m, 300).requires_grad_(), randn(300).requires_grad_()
        x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
        got, want = compiled(x, w), f(x2, w2)
        for a, b in zip(got, want):
            same(a.detach(), b.detach())
        dy = randn(m, 300)
        got[3].backward(dy)
        want[3].backward(dy)
        same(x.grad, x2.grad)
        same(w.grad, w2.grad)


# --- level 5: the CUDA kernels ---------------------------------------------------------------

# Single-pass buckets and their edges, partial tiles, Llama-3-8B and linghe's shapes, and
# rows past the largest single-pass block (rstd + tile path).
CUDA_SHAPES = SHAPES + [(1000, 1000), (256, 2048), (8192, 2048), (8192, 4096), (37, 16384),
                        (300, 16385), (130, 20000)]


def _fp8_gpu():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def _check_cuda(x, w, layout, pow2):
    """CUDA against the references (copies bit for bit given its y) and against the CPU
    backend: y within one rounding, the copies exactly where y agrees."""
    poison_cuda_cache()
    got = check_against_ref(x, w, layout, pow2)
    cpu = call(x.cpu(), w.cpu(), layout, pow2)
    assert_close(got[4], cpu[4], torch.float32, what="rstd vs CPU")
    assert_close(got[5], cpu[5], x.dtype, factor=0.5, what="y vs CPU")
    if torch.equal(got[5].cpu(), cpu[5]):
        for a, b in zip(got[:4], cpu[:4]):
            if a is not None:
                same(a.cpu(), b)
    # return_norm=False: the same copies (the single-pass kernel without y)
    r = fk.rms_norm_fp8(x, w, EPS, layout=layout, pow2_scales=pow2)
    want = {"rowwise": got[:2], "columnwise": got[2:4], "both": got[:4]}[layout]
    for a, b in zip(r, (*want, got[4])):
        same(a.cpu(), b.cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_cuda_matches_reference_and_cpu(dtype, layout, shape):
    if not _fp8_gpu():
        with pytest.raises(RuntimeError, match="compute capability 9.0 or newer"):
            fk.rms_norm_fp8(randn(*shape, dtype=dtype, device="cuda"),
                            randn(shape[-1], dtype=dtype, device="cuda"))
        return
    for pow2 in (False, True):
        x = randn(*shape, dtype=dtype, device="cuda", scale=3.0)
        w = randn(shape[-1], dtype=dtype, device="cuda", scale=2.0)
        for xx in (x, misaligned(x)):
            _check_cuda(xx, w, layout, pow2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_zeros_inf_nan_and_wide_rows(dtype):
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    x = special_input(dtype)
    w = randn(300, dtype=dtype)
    wide = torch.cat([x, x], 1).repeat(1, 30)  # 18000 columns: the rstd + tile path
    ww = w.repeat(60)
    for pow2 in (False, True):
        for xx, ws in ((x, w), (wide, ww)):
            _check_cuda(xx.cuda(), ws.cuda(), "both", pow2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 300), (8192, 4096), (5, 20000)])
def test_cuda_backward(dtype, shape):
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    x = randn(*shape, dtype=dtype, device="cuda").requires_grad_()
    w = randn(shape[-1], dtype=dtype, device="cuda").requires_grad_()
    y = fk.rms_norm_fp8(x, w, EPS, layout="both", return_norm=True)[-1]
    dy = randn(*shape, dtype=dtype, device="cuda")
    y.backward(dy)
    gx, gw = ref_rms_norm_grads(x.cpu(), w.cpu(), dy.cpu(), EPS, 0.0, "llama")
    assert_close(x.grad, gx, dtype, factor=3, what="dx")
    assert_close(w.grad, gw, dtype, factor=3, what="dw")


@pytest.mark.cuda
def test_cuda_bad_input_opcheck_compile_graph():
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    for name, make, kw, msg in BAD:
        if name == "double":
            continue
        cpu, cuda = error_lines(lambda d: fk.rms_norm_fp8(*make(d), **kw), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    x = randn(300, 260, device="cuda", dtype=torch.bfloat16)
    w = randn(260, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fk.rms_norm_fp8, (x, w, 1e-6, "both", False, True))
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.library.opcheck(torch.ops.fk.rms_norm_fp8, (xg, wg, 1e-6, "both", False, True),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    # aot_eager: fk's fake kernel and autograd without Inductor (the CPU tests cover it)
    f = torch.compile(lambda x, w: fk.rms_norm_fp8(x, w, layout="both"), fullgraph=True,
                      backend="aot_eager")
    for a, b in zip(f(x, w), fk.rms_norm_fp8(x, w, layout="both")):
        same(a.cpu(), b.cpu())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fk.rms_norm_fp8(x, w, layout="both", return_norm=True)
    x.copy_(randn(300, 260, dtype=torch.bfloat16))
    g.replay()
    for a, b in zip(out, fk.rms_norm_fp8(x, w, layout="both", return_norm=True)):
        same(a.cpu(), b.cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("m,k", [(131073, 16384), (65537, 32800)])
def test_cuda_more_than_2_31_elements(m, k):
    """int64 offsets: x bf16 of 2.15e9 elements, on both paths (single pass + tiles; rstd +
    tiles); the last row (its own row tile) checked against the reference in both copies."""
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    q, s, qt, st, rstd, y = fk.rms_norm_fp8(x, w, layout="both", return_norm=True)
    tail = slice(m - 1, m)
    assert_close(y[tail], ref_rms_norm(x[tail].cpu(), w.cpu(), EPS), torch.bfloat16, factor=1.5)
    rq, rs, rqt, rst = ref_quantize(y[tail].cpu(), (1, 128), False)
    same(q[tail].cpu(), rq.to(FP8))
    same(s[:, tail].cpu(), rs)
    same(qt[:, tail].cpu(), rqt.to(FP8))
    same(st[-1:].cpu(), rst)
    del x, y, q, qt
    torch.cuda.empty_cache()
