"""fk.swiglu_fp8 / fk.swiglu_fp8_backward / fk.moe_swiglu_fp8 / fk.moe_swiglu_fp8_backward at
every test level: Triton source (interpreter, up to the float8 cast), CPU backend against
float64 references (h, its gradients; the quantization through tests/helpers.py's reference of
the format), autograd through h, opcheck, torch.compile, bad input, and the CUDA kernels
(marker ``cuda``).

The quantized copies are checked bit for bit as the reference quantization of the ``h`` the
op returns (``return_h=True``); ``h`` itself against float64 silu(gate) * up (* p) rounded
once to x's dtype."""
import math

import pytest
import torch

import fk
from helpers import (DTYPES, VARIANT_DTYPE, assert_close, assert_quantized_near, cdiv,
                     error_lines, fixed_copies_same, interp_segment_blocks, load_triton_src,
                     misaligned, packed_same, poison_cuda_cache, randn, ref_grads,
                     ref_quantize_rows, ref_quantize_segments, ref_swiglu, round_toward_zero,
                     same)

FP8 = torch.float8_e4m3fn
LAYOUTS = ["rowwise", "columnwise", "both"]
# (M, n): full blocks, partial blocks in either dim, fewer than one block, one row / column.
SHAPES = [(128, 256), (130, 200), (5, 300), (257, 129), (1, 1), (3, 128)]
# Token counts per expert: empty experts first, in the middle and last; partial blocks;
# a segment of exactly 128; one expert.
COUNTS = [[0, 130, 5, 0, 165, 0], [128, 1, 127, 44], [300], [0, 0, 300]]
EPS = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
# How far a GPU's dx may lie from float64's: 4 roundings of the dtype, and 2^-16 for the
# float32 exp and division approximations in the silu's derivative; near the derivative's
# zeros dx has no relative accuracy: a whole float8 subnormal spacing is allowed there.
GPU_REL = {dt: 4 * e + 2.0 ** -16 for dt, e in EPS.items()}


def _silu_mul(g, u):
    return g / (1 + torch.exp(-g)) * u


def _gate_up(x):
    n = x.shape[1] // 2
    return x[:, :n], x[:, n:]


def _ref_h(x, probs=None, cast=None):
    """silu(gate) * up (* probs) in float64, rounded once to x's dtype (with cast)."""
    g, u = _gate_up(x.cpu())
    if probs is None:
        return ref_swiglu(g, u, **({"cast": cast} if cast else {}))
    h = _silu_mul(g.double(), u.double()) * probs.double().cpu()[:, None]
    return (cast or (lambda t, d: t.to(d)))(h.float(), x.dtype)


def ref_quantized(h, layout, pow2, counts=None):
    """(q, s, qt, st) before the float8 cast of h (M, n): fk's layout, the column-wise copy
    per segment when counts are given (None for a copy not asked for)."""
    q = s = qt = st = None
    if layout != "columnwise":
        q, s = ref_quantize_rows(h, pow2)
    if layout != "rowwise":
        if counts is None:
            qt, st = ref_quantize_rows(h.t(), pow2)
        else:
            qt, st = ref_quantize_segments(h, counts, pow2)
    return q, s, qt, st


def check_quantized(got, h, layout, pow2, counts=None):
    """got: (q, s, qt, st) with None for a copy not asked for; bit for bit the reference
    quantization of h."""
    for i, (g, w) in enumerate(zip(got, ref_quantized(h.cpu(), layout, pow2, counts))):
        assert (g is None) == (w is None), i
        if g is None:
            continue
        assert g.is_contiguous() and g.shape == w.shape, (i, g.shape, w.shape)
        assert g.dtype == (FP8 if i % 2 == 0 else torch.float32)
        same(g.cpu(), w.to(FP8) if i % 2 == 0 else w)


def as_four(out, layout):
    """A layout's copies as (q, s, qt, st), None for those not asked for."""
    if layout == "rowwise":
        return (*out[:2], None, None)
    if layout == "columnwise":
        return (None, None, *out[:2])
    return tuple(out[:4])


def moe_inputs(counts, n, dtype, device="cpu", seed=0):
    m = sum(counts)
    x = randn(m, 2 * n, dtype=dtype, device=device, scale=2.0, seed=seed)
    probs = torch.rand(m, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    tpe = torch.tensor(counts, dtype=torch.int64, device=device)
    return x, probs, tpe


def special_x(dtype, m=260, n=300):
    """x (m, 2n): an all-zero block of h (row 0, block 1: gate 0), an inf in up (row 1,
    block 0), a NaN in gate (row 2, block 2), -inf in gate (row 259: silu(-inf) * up is
    NaN), huge values (row 4: h overflows float16 -> inf)."""
    x = randn(m, 2 * n, seed=3)
    x[0, 128:256] = 0
    x[1, n + 5] = math.inf
    x[2, 290] = math.nan
    x[m - 1, 7] = -math.inf
    x[4, :128] *= 300 if dtype == torch.float16 else 1
    x[4, n:n + 128] *= 300 if dtype == torch.float16 else 1
    return x.to(dtype)


# --- level 1: the Triton sources under the interpreter (float32 in place of float8) -------

def _run_fwd(mod, x, layout, pow2, probs=None, tpe=None, tile=128):
    m, n = x.shape[0], x.shape[1] // 2
    e = 0 if tpe is None or layout == "rowwise" else len(tpe)
    rows_t = (m + 127 * e) // 128 if e else cdiv(m, 128)
    q, qt, h = (torch.full(shape, math.nan) for shape in ((m, n), (n, m), (m, n)))
    h = h.to(x.dtype)
    s, st = torch.full((cdiv(n, 128), m), -1.0), torch.full((rows_t, n), -1.0)
    grid = (rows_t if e else cdiv(m, tile), cdiv(n, 128))
    blocks = interp_segment_blocks(mod, tpe, m, rows_t) if e else x
    mod.swiglu_fp8_fwd_kernel[grid](
        x, probs if probs is not None else x, blocks, q, s, qt, st, h,
        m, n, e, int(probs is not None), int(layout != "columnwise"),
        int(layout != "rowwise"), 1, int(pow2), TILE_M=tile, TILE_N=128)
    return as_four((q, s, qt, st), "both"), h


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,tile", [("rowwise", 32), ("columnwise", 128), ("both", 128)])
@pytest.mark.parametrize("shape", [(130, 200), (128, 128), "special"])
def test_interpreter_forward(dtype, layout, tile, shape):
    mod = load_triton_src("swiglu_fp8")
    x = special_x(dtype) if shape == "special" else randn(shape[0], 2 * shape[1], dtype=dtype,
                                                          scale=2.0)
    for pow2 in (False, True):
        (q, s, qt, st), h = _run_fwd(mod, x, layout, pow2, tile=tile)
        if shape != "special":
            assert_close(h, _ref_h(x, cast=round_toward_zero), dtype, what="h")
        want = as_four((q, s, qt, st), "both")
        ref = ref_quantized(h.float(), "both", pow2)
        for i, (g, w) in enumerate(zip(want, ref)):
            if (i < 2 and layout == "columnwise") or (i >= 2 and layout == "rowwise"):
                continue
            same(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("counts", COUNTS)
@pytest.mark.parametrize("layout", ["rowwise", "both"])
def test_interpreter_moe_forward(dtype, counts, layout):
    mod = load_triton_src("swiglu_fp8")
    x, probs, tpe = moe_inputs(counts, 140, dtype)
    (q, s, qt, st), h = _run_fwd(mod, x, layout, False, probs=probs, tpe=tpe,
                                 tile=32 if layout == "rowwise" else 128)
    assert_close(h, _ref_h(x, probs, cast=round_toward_zero), dtype, what="h")
    for i, (g, w) in enumerate(zip((q, s, qt, st),
                                   ref_quantized(h.float(), "both", False, counts))):
        if i < 2 or layout == "both":
            same(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [100, 128, 1300])
def test_interpreter_dx(dtype, n):
    mod = load_triton_src("swiglu_fp8")
    m = 7
    x, dh = randn(m, 2 * n, dtype=dtype), randn(m, n, dtype=dtype)
    probs = torch.rand(m)
    for has_p in (0, 1):
        dx, dp = torch.full((m, 2 * n), math.nan, dtype=dtype), torch.full((m,), math.nan)
        mod.swiglu_fp8_dx_kernel[(cdiv(m, 4),)](dh, x, probs, dx, dp, dx, dp, m, n, has_p, 1, 0,
                                                0, ROWS=4, BLOCK_N=256)
        p = probs.double() if has_p else torch.ones(m, dtype=torch.float64)
        gx, gp = ref_grads(lambda x, p: _silu_mul(*_gate_up(x)) * p[:, None],
                           [x.requires_grad_(), p.requires_grad_()], dh)
        assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=2, what="dx")
        if has_p:
            assert_close(dp, gp, torch.float32, factor=10, what="dp")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,tile", [("rowwise", 32), ("columnwise", 128), ("both", 128)])
@pytest.mark.parametrize("m,n", [(130, 256), (5, 128)])
def test_interpreter_backward_quantized(dtype, layout, tile, m, n):
    """The quantized dx is bit for bit the reference quantization of the dx the dx kernel
    writes (the same float32 formula, rounded to x's dtype)."""
    mod = load_triton_src("swiglu_fp8")
    x, dh = randn(m, 2 * n, dtype=dtype, scale=2.0), randn(m, n, dtype=dtype)
    dx, dp = torch.empty(m, 2 * n, dtype=dtype), torch.empty(m)
    mod.swiglu_fp8_dx_kernel[(cdiv(m, 4),)](dh, x, x, dx, dp, dx, dp, m, n, 0, 1, 0, 0, ROWS=4,
                                            BLOCK_N=256)
    for pow2 in (False, True):
        q, qt = torch.full((m, 2 * n), math.nan), torch.full((2 * n, m), math.nan)
        s, st = torch.full((2 * n // 128, m), -1.0), torch.full((cdiv(m, 128), 2 * n), -1.0)
        mod.swiglu_fp8_bwd_q_kernel[(cdiv(m, tile), n // 128)](
            dh, x, q, s, qt, st, m, n, int(layout != "columnwise"), int(layout != "rowwise"),
            int(pow2), TILE_M=tile, TILE_N=128)
        for i, (g, w) in enumerate(zip((q, s, qt, st), ref_quantized(dx.float(), "both", pow2))):
            if (i < 2 and layout == "columnwise") or (i >= 2 and layout == "rowwise"):
                continue
            same(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(13, 256), (8, 128)])
def test_interpreter_dx_quantized(dtype, m, n):
    """The row-wise quantizing form of the dx kernel (chunks of 128 columns): the copy bit for
    bit the reference quantization of the dx it also writes; dp as without quantization."""
    mod = load_triton_src("swiglu_fp8")
    x, dh = randn(m, 2 * n, dtype=dtype, scale=2.0), randn(m, n, dtype=dtype)
    probs = torch.rand(m)
    dx, dp = torch.full((m, 2 * n), math.nan, dtype=dtype), torch.full((m,), math.nan)
    dx0, dp0 = dx.clone(), dp.clone()
    mod.swiglu_fp8_dx_kernel[(cdiv(m, 4),)](dh, x, probs, dx0, dp0, dx0, dp0, m, n, 1, 1, 0, 0,
                                            ROWS=4, BLOCK_N=256)
    for pow2 in (False, True):
        q, s = torch.full((m, 2 * n), math.nan), torch.full((2 * n // 128, m), -1.0)
        mod.swiglu_fp8_dx_kernel[(cdiv(m, 8),)](dh, x, probs, dx, dp, q, s, m, n, 1, 1, 1,
                                                int(pow2), ROWS=8, BLOCK_N=128)
        same(dx, dx0)
        rq, rs = ref_quantize_rows(dx.float(), pow2)
        same(q, rq)
        same(s, rs)
        assert_close(dp, dp0, torch.float32, what="dp")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["both", "columnwise"])
@pytest.mark.parametrize("m,n", [(256, 256), (132, 128), (4, 384)])
def test_interpreter_backward_packed_path(dtype, layout, m, n):
    """The quantized backward's PACKED path (the tile as four slabs of interleaved rows, both
    halves' column-wise copies in words) writes the same bytes and scales as its plain path,
    which test_interpreter_backward_quantized checks against the reference: float8 outputs
    on both sides; partial row tiles, zeros, inf and NaN among the inputs."""
    mod = load_triton_src("swiglu_fp8")
    x, dh = randn(m, 2 * n, dtype=dtype, scale=2.0), randn(m, n, dtype=dtype)
    x[0, :128] = 0
    dh[1, 3], x[2, 5], x[3, n + 7] = math.inf, math.nan, -math.inf
    want_row = int(layout == "both")
    for pow2 in (0, 1):
        def launch(packed, q, s, qt, st):
            mod.swiglu_fp8_bwd_q_kernel[(cdiv(m, 128), n // 128)](
                dh, x, q, s, qt, st, m, n, want_row, 1, pow2, TILE_M=128, TILE_N=128,
                PACKED=packed)
        packed_same(launch, m, 2 * n, want_row)


# (layout, TILE_N of the PACKED run): the column-wise copy alone also in the FLAG_COLS
# variants' narrower tiles
PACKED_FORMS = [("both", 128), ("columnwise", 128), ("columnwise", 64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,tile_n", PACKED_FORMS)
@pytest.mark.parametrize("shape,with_probs", [((256, 192), False), ((144, 128), True),
                                              ("special", False)])
def test_interpreter_packed_path(dtype, layout, tile_n, shape, with_probs):
    """The forward's PACKED path (four slabs of interleaved rows; the column-wise copy stored
    as 32-bit words of four rows' float8 bytes; TILE_N columns a tile) writes the same
    bytes, scales and h as its plain path at 128 columns, which test_interpreter_forward
    checks against the reference: float8 outputs on both sides, so both go through the
    interpreter's float8 cast (checked itself on the GPU, where the aligned shapes with a
    column-wise copy run the PACKED variants)."""
    mod = load_triton_src("swiglu_fp8")
    if shape == "special":
        x = special_x(dtype)
        x = x[:x.shape[0] // 4 * 4]
    else:
        x = randn(shape[0], 2 * shape[1], dtype=dtype, scale=2.0)
    m, n = x.shape[0], x.shape[1] // 2
    probs = torch.rand(m) if with_probs else x
    want_row = int(layout == "both")
    for pow2 in (0, 1):
        def launch(packed, q, s, qt, st):
            h = torch.zeros(m, n, dtype=x.dtype)
            tn = tile_n if packed else 128
            mod.swiglu_fp8_fwd_kernel[(cdiv(m, 128), cdiv(n, tn))](
                x, probs, x, q, s, qt, st, h, m, n, 0, int(with_probs), want_row, 1, 1, pow2,
                TILE_M=128, TILE_N=tn, PACKED=packed)
            return h
        h0, h1 = packed_same(launch, m, n, want_row)
        torch.testing.assert_close(h0, h1, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,tile_n", PACKED_FORMS)
@pytest.mark.parametrize("counts", [[0, 132, 8, 0, 164, 0], [128, 1, 127, 44], [0, 3, 300, 5],
                                    [260], [192, 65, 64, 3]])
def test_interpreter_moe_packed_path(dtype, layout, tile_n, counts):
    """The MoE forward's PACKED = 2 path (every block read as four slabs of interleaved rows;
    the column-wise copy in words where a block's first row and end are multiples of 4, as
    bytes slab by slab elsewhere) writes the same bytes, scales and h as the transposed-tile
    path, which test_interpreter_moe_forward checks against the reference: float8 outputs on
    both sides, compared as bits. Counts that are multiples of 4 (words in every block),
    ones that are not (blocks starting at rows 1, 128 + 1, ...), empty segments; segments'
    last blocks of at most 64 rows (read as half-height slabs) and of more."""
    mod = load_triton_src("swiglu_fp8")
    x, probs, tpe = moe_inputs(counts, 140, dtype)
    x[0, :128] = 0
    x[3, 5] = math.nan
    m, n, e = x.shape[0], x.shape[1] // 2, len(counts)
    rows_t = (m + 127 * e) // 128
    want_row = int(layout == "both")
    got = []
    blocks = interp_segment_blocks(mod, tpe, m, rows_t)
    for packed in (0, 2):
        q = torch.zeros(m, n, dtype=torch.float8_e4m3fn)
        qt = torch.zeros(n, m, dtype=torch.float8_e4m3fn)
        s, st = torch.full((cdiv(n, 128), m), -1.0), torch.full((rows_t, n), -1.0)
        h = torch.zeros(m, n, dtype=x.dtype)
        tn = tile_n if packed else 128
        mod.swiglu_fp8_fwd_kernel[(rows_t, cdiv(n, tn))](
            x, probs, blocks, q, s, qt, st, h, m, n, e, 1, want_row, 1, 1, 0, TILE_M=128,
            TILE_N=tn, PACKED=packed)
        got.append([q.view(torch.uint8), s.view(torch.int32), qt.view(torch.uint8),
                    st.view(torch.int32), h])
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert (got[1][1] == torch.tensor(-1.0).view(torch.int32)).all() != bool(want_row)


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_variants_fixed_copies(dtype):
    """Every variant of the forward and the quantized backward whose copies are fixed at
    compile time (COPIES; the MoE form's HAS_P) writes the same bits as itself reading them
    from its arguments, at its own tiles and paths (slabs, 128 x 64 tiles, segments)."""
    mod = load_triton_src("swiglu_fp8")
    m, n, counts = 128, 256, [64, 28, 36]
    x, probs, tpe = moe_inputs(counts, n, dtype)
    dh = randn(m, n, dtype=dtype)
    rows_t = (m + 127 * len(counts)) // 128
    blocks = interp_segment_blocks(mod, tpe, m, rows_t)
    for v in mod.variants(90):
        c = dict(v.constexprs)
        if v.dtype != VARIANT_DTYPE[dtype] or not (c.get("COPIES") or c.get("HAS_P")):
            continue
        copies, flags = c["COPIES"], {}  # the arguments this variant fixes (both copies else)
        if copies:
            flags.update(want_row=int(copies != mod.COPIES_COLS),
                         want_col=int(copies != mod.COPIES_ROWS))
        if c.get("HAS_P"):
            flags["has_p"] = 1
        moe = v.family == "moe_swiglu_fp8_fwd"
        bwd = v.family == "swiglu_fp8_bwd_q"
        k = 2 * n if bwd else n

        def launch(f, fixed, c=c, moe=moe, bwd=bwd, k=k):
            consts = c if fixed else {**c, "COPIES": 0, **({"HAS_P": 0} if "HAS_P" in c else {})}
            q, qt = torch.zeros(m, k, dtype=FP8), torch.zeros(k, m, dtype=FP8)
            s, st = torch.full((cdiv(k, 128), m), -1.0), torch.full((rows_t, k), -1.0)
            if bwd:
                mod.swiglu_fp8_bwd_q_kernel[(cdiv(m, c["TILE_M"]), n // 128)](
                    dh, x, q, s, qt, st, m, n, f.get("want_row", 1), f.get("want_col", 1), 0,
                    **consts)
                return q, s, qt, st
            h = torch.zeros(m, n, dtype=dtype)
            grid = (rows_t if moe else cdiv(m, c["TILE_M"]), cdiv(n, c["TILE_N"]))
            mod.swiglu_fp8_fwd_kernel[grid](
                x, probs, blocks if moe else x, q, s, qt, st, h, m, n, len(counts) if moe else 0,
                f.get("has_p", 0), f.get("want_row", 1), f.get("want_col", 1), 1, 0, **consts)
            return q, s, qt, st, h
        fixed_copies_same(launch, flags)


def test_variants_cover_every_dtype():
    mod = load_triton_src("swiglu_fp8")
    assert mod.variants(80) == []
    for arch in (90, 100, 120):
        fams = {}
        for v in mod.variants(arch):
            fams.setdefault(v.family, set()).add((v.dtype, v.flags, v.block))
        for fam, blocks in (("swiglu_fp8_fwd", mod.TILES_M), ("swiglu_fp8_bwd_q", mod.TILES_M),
                            ("moe_swiglu_fp8_fwd", (mod.MAX_EXPERTS,)),
                            ("swiglu_fp8_dx", (mod.DX_BLOCK,)), ("swiglu_fp8_dx_q", (128,))):
            # the aligned forms' own variants for the column-wise copy alone
            cols = {(dt, 1 | mod.FLAG_COLS, max(blocks)) for dt in ("fp32", "bf16", "fp16")
                    if fam.endswith(("_fwd", "_bwd_q"))}
            assert fams[fam] == {(dt, f, b) for dt in ("fp32", "bf16", "fp16") for f in (0, 1)
                                 for b in blocks} | cols, fam
        assert fams["moe_swiglu_fp8_blocks"] == {(dt, 0, eb) for dt in ("fp32", "bf16", "fp16")
                                                 for eb in (64, 256, 1024)}
        for v in mod.variants(arch):  # the word stores need M % 4 == 0
            packed = {"swiglu_fp8_fwd": int(v.flags & 1 and v.block == 128),
                      "swiglu_fp8_bwd_q": int(v.flags & 1 and v.block == 128),
                      "moe_swiglu_fp8_fwd": 2 * (v.flags & 1)}.get(v.family, 0)
            assert v.constexprs.get("PACKED", 0) == packed, (v.family, v.flags, v.block)
            if v.family in ("swiglu_fp8_fwd", "swiglu_fp8_bwd_q", "moe_swiglu_fp8_fwd"):
                # copies fixed where the launcher picks a variant for one layout only
                copies = (mod.COPIES_ROWS if v.constexprs["TILE_M"] == 32 else
                          mod.COPIES_COLS if v.flags & mod.FLAG_COLS else
                          mod.COPIES_BOTH if v.flags & 1 else 0)
                assert v.constexprs["COPIES"] == copies, (v.family, v.flags, v.block)
                assert v.constexprs.get("HAS_P", 0) == int(v.family.startswith("moe")), v
            if v.family.endswith("swiglu_fp8_fwd") and v.constexprs["TILE_M"] == 128:
                assert (v.constexprs["TILE_N"], v.num_warps) == (
                    mod.COLS_TILE if v.flags & mod.FLAG_COLS else
                    (128, 8 if v.family == "swiglu_fp8_fwd" or not v.flags else
                     mod.MOE_PACKED_WARPS)), (v.family, v.flags)
            if v.family == "swiglu_fp8_bwd_q" and v.flags & 1 and v.block == 128:
                assert v.num_warps == mod.BWD_PACKED_WARPS[bool(v.flags & mod.FLAG_COLS)], v


# --- level 2: the CPU backend ---------------------------------------------------------------

def check_forward(x, layout, pow2, probs=None, tpe=None, counts=None):
    if probs is None:
        out = fk.swiglu_fp8(x, layout=layout, pow2_scales=pow2, return_h=True)
        plain = fk.swiglu_fp8(x, layout=layout, pow2_scales=pow2)
    else:
        out = fk.moe_swiglu_fp8(x, probs, tpe, layout=layout, pow2_scales=pow2, return_h=True)
        plain = fk.moe_swiglu_fp8(x, probs, tpe, layout=layout, pow2_scales=pow2)
    h = out[-1]
    assert h.dtype == x.dtype and h.shape == (x.shape[0], x.shape[1] // 2)
    assert len(out) == (5 if layout == "both" else 3) and len(plain) == len(out) - 1
    got = as_four(out, layout)
    check_quantized(got, h, layout, pow2, counts)
    for a, b in zip(plain, out):  # without h: the same copies
        same(a.cpu(), b.cpu())
    return got, h


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_forward(dtype, layout, pow2, shape):
    m, n = shape
    x = randn(m, 2 * n, dtype=dtype, scale=3.0)
    _, h = check_forward(x, layout, pow2)
    assert_close(h, _ref_h(x), dtype, what="h")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pow2", [False, True])
def test_cpu_zeros_inf_nan(dtype, pow2):
    """An all-zero block gets scale 1 and zero data; a block whose h holds an inf or a NaN
    gets scale NaN and NaN data; other blocks are unaffected."""
    x = special_x(dtype)
    (q, s, qt, st), h = check_forward(x, "both", pow2)
    assert s[1, 0] == 1.0 and (q[0, 128:256].float() == 0).all()
    assert torch.isnan(s[0, 1]) and torch.isnan(q[1, :128].float()).all()  # up = inf
    assert torch.isnan(s[2, 2]) and torch.isnan(q[2, 256:].float()).all()  # gate = NaN
    assert torch.isnan(s[0, 259])  # silu(-inf) * up = NaN
    assert not torch.isnan(q[0, :128].float()).any() and not torch.isnan(s[1, 3])
    if dtype == torch.float16:  # h overflows float16
        assert torch.isinf(h[4, :128]).any() and torch.isnan(s[0, 4])
    assert torch.isnan(st[0, 5]) and torch.isnan(st[0, 290]) and torch.isnan(st[2, 7])
    assert not torch.isnan(st[0, 6])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("counts", COUNTS)
def test_cpu_moe_forward(dtype, layout, counts):
    x, probs, tpe = moe_inputs(counts, 140, dtype)
    for pow2 in (False, True):
        for t in (tpe, tpe.int()):
            _, h = check_forward(x, layout, pow2, probs, t, counts)
    assert_close(h, _ref_h(x, probs), dtype, what="h")


def test_cpu_moe_one_expert_is_plain():
    x = randn(300, 400)
    plain = fk.swiglu_fp8(x, layout="both")
    moe = fk.moe_swiglu_fp8(x, torch.ones(300), torch.tensor([300]), layout="both")
    for a, b in zip(plain, moe):
        same(a, b)


def test_cpu_moe_counts_checked():
    x, probs = randn(10, 8), torch.ones(10)
    with pytest.raises(RuntimeError, match="fk::moe_swiglu_fp8: tokens_per_expert must sum "
                                           "to M = 10, got 9"):
        fk.moe_swiglu_fp8(x, probs, torch.tensor([4, 5]))
    with pytest.raises(RuntimeError, match="must be >= 0, got -1"):
        fk.moe_swiglu_fp8(x, probs, torch.tensor([11, -1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(130, 200), (5, 256), (1, 1)])
def test_cpu_autograd_through_h(dtype, shape):
    """x.grad through h equals float64 autograd of silu(gate) * up; the quantized copies are
    not differentiable."""
    m, n = shape
    x = randn(m, 2 * n, dtype=dtype, scale=2.0).requires_grad_()
    q, s, qt, st, h = fk.swiglu_fp8(x, layout="both", return_h=True)
    assert h.requires_grad and not any(t.requires_grad for t in (q, s, qt, st))
    dh = randn(m, n, dtype=dtype)
    h.backward(dh)
    (gx,) = ref_grads(lambda x: _silu_mul(*_gate_up(x)), [x], dh)
    assert_close(x.grad, gx, dtype, factor=2, what="dx")
    assert_close(fk.swiglu_fp8_backward(dh, x.detach()), gx, dtype, factor=2, what="dx fn")
    # without h nothing is differentiable
    assert not any(t.requires_grad for t in fk.swiglu_fp8(x, layout="both"))


class _DownProj(torch.autograd.Function):
    """y = h @ w.T computed from h's FP8 row-wise copy (dequantized: a CPU stand-in for an
    FP8 GEMM), the gradient passed to h: the pattern of the module docstring."""

    @staticmethod
    def forward(ctx, h, q, s, w):
        ctx.save_for_backward(w)
        return fk.fp8_dequantize(q, s, dtype=torch.float32) @ w.t()

    @staticmethod
    def backward(ctx, dy):
        (w,) = ctx.saved_tensors
        return (dy @ w).to(w.dtype), None, None, None


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_straight_through_down_projection(dtype):
    """The forward uses the FP8 copy (within FP8 error of float64 h @ w.T); x.grad is float64
    autograd of silu(gate) * up @ w.T, as if there were no quantization."""
    m, n, k = 130, 256, 64
    x = randn(m, 2 * n, dtype=dtype, scale=2.0).requires_grad_()
    w = randn(k, n, dtype=dtype)
    q, s, h = fk.swiglu_fp8(x, return_h=True)
    y = _DownProj.apply(h, q, s, w.float())
    dy = randn(m, k)
    y.backward(dy)
    g, u = _gate_up(x.detach().double())
    h64 = _silu_mul(g, u)
    ref = h64 @ w.double().t()
    bound = h64.abs() @ w.double().abs().t() * (2.0 ** -4 + 2 * EPS[dtype]) + 1e-12
    assert ((y.double() - ref).abs() <= bound).all()
    (gx,) = ref_grads(lambda x: _silu_mul(*_gate_up(x)) @ w.double().t(),
                      [x.detach().clone().requires_grad_()], dy)
    assert_close(x.grad, gx, dtype, factor=4, what="dx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("counts", COUNTS[:2])
def test_cpu_moe_autograd_through_h(dtype, counts):
    x, probs, tpe = moe_inputs(counts, 140, dtype)
    x.requires_grad_()
    probs.requires_grad_()
    q, s, h = fk.moe_swiglu_fp8(x, probs, tpe, return_h=True)
    dh = randn(*h.shape, dtype=dtype)
    h.backward(dh)
    gx, gp = ref_grads(lambda x, p: _silu_mul(*_gate_up(x)) * p[:, None], [x, probs], dh)
    assert_close(x.grad, gx, dtype, factor=2, what="dx")
    assert_close(probs.grad, gp, torch.float32, factor=10, what="dprobs")
    dx, dp = fk.moe_swiglu_fp8_backward(dh, x.detach(), probs.detach())
    assert dp.dtype == torch.float32 and torch.equal(dx, x.grad) and torch.equal(dp, probs.grad)
    # only probs requires grad
    p2 = probs.detach().requires_grad_()
    fk.moe_swiglu_fp8(x.detach(), p2, tpe, return_h=True)[-1].backward(dh)
    assert torch.equal(p2.grad, probs.grad)


def test_cpu_gradcheck():
    """float64 gradcheck of h is not possible (x is float32 / bfloat16 / float16 only);
    finite differences of the float32 h against the backward instead."""
    x = randn(3, 2 * 130, scale=2.0, seed=5)
    dh = randn(3, 130, seed=6)
    dx = fk.swiglu_fp8_backward(dh, x).double()
    eps = 1e-3
    for j in (0, 7, 129, 130, 200, 259):
        xp, xm = x.clone(), x.clone()
        xp[:, j] += eps
        xm[:, j] -= eps
        hp = fk.swiglu_fp8(xp, return_h=True)[-1].double()
        hm = fk.swiglu_fp8(xm, return_h=True)[-1].double()
        fd = ((hp - hm) * dh.double()).sum(1) / (2 * eps)
        assert torch.allclose(fd, dx[:, j], rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("m,n", [(130, 256), (1, 128), (257, 384)])
def test_cpu_backward_quantized(dtype, layout, pow2, m, n):
    x, dh = randn(m, 2 * n, dtype=dtype, scale=2.0), randn(m, n, dtype=dtype)
    dx = fk.swiglu_fp8_backward(dh, x)
    (gx,) = ref_grads(lambda x: _silu_mul(*_gate_up(x)), [x.clone().requires_grad_()], dh)
    assert dx.dtype == dtype and dx.shape == x.shape
    assert_close(dx, gx, dtype, factor=2, what="dx")
    out = fk.swiglu_fp8_backward(dh, x, grad_layout=layout, pow2_scales=pow2)
    check_quantized(as_four(out, layout), dx, layout, pow2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pow2", [False, True])
def test_cpu_moe_backward_quantized(dtype, pow2):
    x, probs, _ = moe_inputs([0, 130, 5, 0, 165], 256, dtype)
    dh = randn(300, 256, dtype=dtype)
    dx, dp = fk.moe_swiglu_fp8_backward(dh, x, probs)
    q, s, dp2 = fk.moe_swiglu_fp8_backward(dh, x, probs, grad_layout="rowwise",
                                           pow2_scales=pow2)
    check_quantized((q, s, None, None), dx, "rowwise", pow2)
    assert torch.equal(dp, dp2)


def test_cpu_non_contiguous_and_empty():
    x = randn(400, 300).t()
    for a, b in zip(fk.swiglu_fp8(x, layout="both"), fk.swiglu_fp8(x.contiguous(), "both")):
        same(a, b)
    for m, n in ((0, 200), (130, 0)):
        q, s, qt, st, h = fk.swiglu_fp8(torch.zeros(m, 2 * n), "both", return_h=True)
        assert [tuple(t.shape) for t in (q, s, qt, st, h)] == [
            (m, n), (cdiv(n, 128), m), (n, m), (cdiv(m, 128), n), (m, n)]
        assert fk.swiglu_fp8_backward(torch.zeros(m, n), torch.zeros(m, 2 * n)).shape == (m, 2 * n)
    q, s, qt, st = fk.moe_swiglu_fp8(torch.zeros(0, 256), torch.zeros(0),
                                     torch.zeros(3, dtype=torch.int64), "both")
    assert qt.shape == (128, 0) and st.shape == (2, 128) and (st == 1).all()
    dx, dp = fk.moe_swiglu_fp8_backward(torch.zeros(4, 0), torch.zeros(4, 0), torch.ones(4))
    assert dx.shape == (4, 0) and torch.equal(dp, torch.zeros(4))


# --- bad input: the same message from the CPU backend and the fake kernels --------------

def _t(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("1-D", lambda d: fk.swiglu_fp8(_t(128, d=d)), "x must be 2-D"),
    ("odd", lambda d: fk.swiglu_fp8(_t(2, 7, d=d)), "last dim must be even"),
    ("double", lambda d: fk.swiglu_fp8(_t(2, 8, dtype=torch.float64, d=d)), "not supported"),
    ("layout", lambda d: fk.swiglu_fp8(_t(2, 8, d=d), "transposed"), "layout must be"),
    ("grad shape", lambda d: fk.swiglu_fp8_backward(_t(2, 8, d=d), _t(2, 8, d=d)),
     "grad_h must have shape"),
    ("grad dtype", lambda d: fk.swiglu_fp8_backward(_t(2, 4, dtype=torch.float16, d=d),
                                                    _t(2, 8, d=d)), "must have the same dtype"),
    ("grad layout", lambda d: fk.swiglu_fp8_backward(_t(2, 4, d=d), _t(2, 8, d=d), "rows"),
     "grad_layout must be"),
    ("grad n", lambda d: fk.swiglu_fp8_backward(_t(2, 100, d=d), _t(2, 200, d=d), "rowwise"),
     "multiple of 128, got n = 100"),
    ("probs dtype", lambda d: fk.moe_swiglu_fp8(_t(2, 8, d=d), _t(2, dtype=torch.float16, d=d),
                                                _t(1, dtype=torch.int64, d=d)),
     "probs must be float32"),
    ("probs shape", lambda d: fk.moe_swiglu_fp8(_t(2, 8, d=d), _t(3, d=d),
                                                _t(1, dtype=torch.int64, d=d)),
     "probs must have shape"),
    ("tpe dtype", lambda d: fk.moe_swiglu_fp8(_t(2, 8, d=d), _t(2, d=d), _t(1, d=d)),
     "tokens_per_expert must be a 1-D int32 or int64"),
    ("no experts", lambda d: fk.moe_swiglu_fp8(_t(2, 8, d=d), _t(2, d=d),
                                               _t(0, dtype=torch.int64, d=d)),
     "at least one expert"),
    ("moe layout", lambda d: fk.moe_swiglu_fp8(_t(2, 8, d=d), _t(2, d=d),
                                               _t(1, dtype=torch.int64, d=d), "x"),
     "layout must be"),
    ("moe grad", lambda d: fk.moe_swiglu_fp8_backward(_t(2, 8, d=d), _t(2, 8, d=d), _t(2, d=d)),
     "grad_h must have shape"),
    ("moe probs", lambda d: fk.moe_swiglu_fp8_backward(_t(2, 4, d=d), _t(2, 8, d=d), _t(1, d=d)),
     "probs must have shape"),
    ("moe grad layout", lambda d: fk.moe_swiglu_fp8_backward(_t(2, 128, d=d), _t(2, 256, d=d),
                                                             _t(2, d=d), "both"),
     "grad_layout must be 'none' or 'rowwise'"),
    ("moe grad n", lambda d: fk.moe_swiglu_fp8_backward(_t(2, 4, d=d), _t(2, 8, d=d),
                                                        _t(2, d=d), "rowwise"),
     "multiple of 128, got n = 4"),
]


@pytest.mark.parametrize("name,call,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, call, msg):
    cpu, meta = error_lines(call, ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.moe_swiglu_fp8(_t(2, 8), _t(2, d="meta"), _t(1, dtype=torch.int64))


# --- level 3: opcheck, torch.compile -------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck(layout):
    x = randn(130, 512)
    x16 = x.bfloat16()
    for args in ((x, layout, False, True), (x16, layout, True, False)):
        torch.library.opcheck(torch.ops.fk.swiglu_fp8, args)
    xx, probs, tpe = moe_inputs([0, 60, 70], 256, torch.float32)
    torch.library.opcheck(torch.ops.fk.moe_swiglu_fp8, (xx, probs, tpe, layout, False, True))
    dh = randn(130, 256)
    torch.library.opcheck(torch.ops.fk.swiglu_fp8_backward, (dh, x, layout, False))
    torch.library.opcheck(torch.ops.fk.swiglu_fp8_backward, (dh, x, "none", False))
    torch.library.opcheck(torch.ops.fk.moe_swiglu_fp8_backward, (dh, xx, probs, "none", False))
    torch.library.opcheck(torch.ops.fk.moe_swiglu_fp8_backward,
                          (dh, xx, probs, "rowwise", True))


def test_opcheck_autograd():
    """With inputs that require grad. test_aot_dispatch_dynamic is left out here: it sums
    every output for its backward, which torch does not implement for float8 (the quantized
    copies); test_torch_compile_fullgraph runs the backward through AOT autograd instead."""
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    x = randn(130, 512).requires_grad_()
    torch.library.opcheck(torch.ops.fk.swiglu_fp8, (x, "both", False, True), test_utils=utils)
    xx, probs, tpe = moe_inputs([0, 60, 70], 256, torch.float32)
    torch.library.opcheck(torch.ops.fk.moe_swiglu_fp8,
                          (xx.requires_grad_(), probs.requires_grad_(), tpe, "both", False,
                           True), test_utils=utils)


def test_torch_compile_fullgraph():
    def f(x, probs, tpe):
        q, s, qt, st, h = fk.swiglu_fp8(x, layout="both", return_h=True)
        mq, ms, mqt, mst, mh = fk.moe_swiglu_fp8(x, probs, tpe, layout="both", return_h=True)
        return (h.float() * 2).sum() + (mh.float() ** 2).sum(), (q, s, qt, st, mq, ms, mqt, mst)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for m in (130, 257):
        counts = [m - 100, 0, 100]
        x, probs, tpe = moe_inputs(counts, 200, torch.float32, seed=m)
        grads = []
        for fn in (compiled, f):
            xr, pr = x.clone().requires_grad_(), probs.clone().requires_grad_()
            loss, copies = fn(xr, pr, tpe)
            loss.backward()
            grads.append((loss, copies, xr.grad, pr.grad))
        (l1, c1, gx1, gp1), (l2, c2, gx2, gp2) = grads
        torch.testing.assert_close(l1, l2)
        for a, b in zip(c1, c2):
            same(a, b)
        torch.testing.assert_close(gx1, gx2)
        torch.testing.assert_close(gp1, gp2)


# --- level 5: the CUDA kernels ---------------------------------------------------------------

# Large shapes (linghe's n, Llama-3-8B's) are checked in bf16 without the pow2 / misaligned
# repeats: the float64 reference of the quantization runs on the CPU.
CUDA_SHAPES = SHAPES + [(1000, 1000)]
LARGE = [(8192, 1408), (1024, 14336)]


def _fp8_gpu():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def _need_fp8_gpu():
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_cuda_forward(dtype, layout, shape):
    """h against float64; the copies bit for bit the reference quantization of the h the GPU
    returns (float8 cast included), poisoned outputs; x 16-byte aligned and not."""
    m, n = shape
    if not _fp8_gpu():
        with pytest.raises(RuntimeError, match="compute capability 9.0 or newer"):
            fk.swiglu_fp8(randn(m, 2 * n, dtype=dtype, device="cuda"), layout)
        return
    x = randn(m, 2 * n, dtype=dtype, device="cuda", scale=3.0)
    for pow2 in (False, True):
        for xx in (x, misaligned(x)):
            poison_cuda_cache()
            _, h = check_forward(xx, layout, pow2)
    assert_close(h, _ref_h(x), dtype, what="h")


@pytest.mark.cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", LARGE)
def test_cuda_forward_large(layout, shape):
    _need_fp8_gpu()
    m, n = shape
    x = randn(m, 2 * n, dtype=torch.bfloat16, device="cuda", scale=3.0)
    poison_cuda_cache()
    _, h = check_forward(x, layout, False)
    assert_close(h, _ref_h(x), torch.bfloat16, what="h")


@pytest.mark.cuda
def test_cuda_columnwise_rows_too_wide_for_narrow_tiles():
    """The column-wise copy alone of aligned rows that need more of its narrower tiles
    (COLS_TILE's 64 columns) than the grid's y dimension takes (65535): the launcher runs
    128-column tiles instead. Against the column-wise copy layout "both" writes in
    128-column tiles (its row-wise copy needs them), which test_cuda_forward checks against
    the reference at narrower rows."""
    _need_fp8_gpu()
    n = 65535 * 64 + 16
    x = randn(16, 2 * n, dtype=torch.bfloat16, device="cuda", scale=3.0)
    both = fk.swiglu_fp8(x, layout="both")
    poison_cuda_cache()
    for a, b in zip(fk.swiglu_fp8(x, layout="columnwise"), both[2:]):
        same(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_zeros_inf_nan(dtype):
    _need_fp8_gpu()
    x = special_x(dtype).cuda()
    for pow2 in (False, True):
        (q, s, qt, st), _ = check_forward(x, "both", pow2)
        assert s[1, 0] == 1.0 and torch.isnan(s[0, 1]) and torch.isnan(s[2, 2])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("counts", COUNTS + [[0] * 100 + [4096] + [1] * 900 + [0] * 23,
                                            [1024] * 8, [37] * 256, [132, 5, 0, 171] * 64])
def test_cuda_moe_forward(dtype, layout, counts):
    """Up to 1024 experts (the largest expert block), empty ones, segments of 1 row. The
    aligned shapes (M and n multiples of 16) run the slab path: [1024] * 8 stores the
    column-wise copy in words only, [37] * 256 mostly as bytes, the last both."""
    _need_fp8_gpu()
    big = sum(counts) > 1000
    n = 1408 if big else 140
    x, probs, tpe = moe_inputs(counts, n, dtype, device="cuda")
    for pow2 in ((False,) if big else (False, True)):
        for xx, pp, tt in (((x, probs, tpe),) if big else
                           ((x, probs, tpe), (misaligned(x), misaligned(probs), tpe),
                            (x, probs, misaligned(tpe)))):
            poison_cuda_cache()
            _, h = check_forward(xx, layout, pow2, pp, tt, counts)
    assert_close(h, _ref_h(x, probs), dtype, what="h")


@pytest.mark.cuda
def test_cuda_moe_too_many_experts():
    _need_fp8_gpu()
    x, probs, tpe = moe_inputs([1] * 1025, 128, torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="at most 1024 experts on CUDA, got 1025"):
        fk.moe_swiglu_fp8(x, probs, tpe, layout="columnwise")
    check_forward(x, "rowwise", False, probs, tpe, None)  # the row-wise copy has no limit


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(130, 200), (8192, 1408), (1, 1), (3, 5000)])
def test_cuda_backward(dtype, shape):
    _need_fp8_gpu()
    m, n = shape
    x = randn(m, 2 * n, dtype=dtype, device="cuda", scale=2.0).requires_grad_()
    probs = torch.rand(m, device="cuda").requires_grad_()
    dh = randn(m, n, dtype=dtype, device="cuda")
    poison_cuda_cache()
    fk.swiglu_fp8(x, return_h=True)[-1].backward(dh)
    (gx,) = ref_grads(lambda x: _silu_mul(*_gate_up(x)), [x], dh)
    assert_close(x.grad, gx, dtype, factor=2, what="dx")
    x.grad = None
    fk.moe_swiglu_fp8(x, probs, torch.tensor([m], device="cuda"), return_h=True)[-1].backward(dh)
    gx, gp = ref_grads(lambda x, p: _silu_mul(*_gate_up(x)) * p[:, None], [x, probs], dh)
    assert_close(x.grad, gx, dtype, factor=2, what="moe dx")
    assert_close(probs.grad, gp, torch.float32, factor=10, what="dprobs")
    # misaligned inputs (the unaligned variant): the same results up to rounding (dprobs
    # sums its rows in another order)
    dx, dp = fk.moe_swiglu_fp8_backward(misaligned(dh), misaligned(x.detach()),
                                        misaligned(probs.detach()))
    assert_close(dx, gx, dtype, factor=2, what="moe dx, misaligned")
    assert_close(dp, gp, torch.float32, factor=10, what="dprobs, misaligned")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(130, 256), (2048, 1408), (1, 128), (256, 14336)])
def test_cuda_backward_quantized(dtype, layout, shape):
    """The quantized dx within FP8 error of float64 dx (the GPU's dx is within 2 roundings
    of it); where the dx kernel and the quantizing kernel agree on dx, bit for bit."""
    _need_fp8_gpu()
    m, n = shape
    x = randn(m, 2 * n, dtype=dtype, device="cuda", scale=2.0)
    dh = randn(m, n, dtype=dtype, device="cuda")
    (gx,) = ref_grads(lambda x: _silu_mul(*_gate_up(x)), [x.clone().requires_grad_()], dh)
    for pow2 in (False, True):
        for xx in (x, misaligned(x)):
            poison_cuda_cache()
            q, s, qt, st = as_four(fk.swiglu_fp8_backward(dh, xx, layout, pow2), layout)
            if q is not None:
                assert_quantized_near(q, s, gx, GPU_REL[dtype], pow2, 1.0)
            if qt is not None:
                assert_quantized_near(qt, st, gx.t(), GPU_REL[dtype], pow2, 1.0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(130, 256), (8192, 1408), (1, 128)])
def test_cuda_moe_backward_quantized(dtype, shape):
    _need_fp8_gpu()
    m, n = shape
    x = randn(m, 2 * n, dtype=dtype, device="cuda", scale=2.0)
    probs = torch.rand(m, device="cuda")
    dh = randn(m, n, dtype=dtype, device="cuda")
    gx, gp = ref_grads(lambda x, p: _silu_mul(*_gate_up(x)) * p[:, None],
                       [x.clone().requires_grad_(), probs.clone().requires_grad_()], dh)
    for pow2 in (False, True):
        for xx, pp in ((x, probs), (misaligned(x), misaligned(probs))):
            poison_cuda_cache()
            q, s, dp = fk.moe_swiglu_fp8_backward(dh, xx, pp, "rowwise", pow2)
            # dx is rounded to x's dtype before it is quantized; rows of a small probability
            # put float16's dx among its subnormals (|dx| ~ 1e-6 at p ~ 1e-3), where that
            # rounding is up to 2^-25 absolute (seen on an H100: 2.7e-8 past the bound; and in
            # a block whose largest |dx| was among them, its scale 0.23 % off for 0.20 allowed).
            assert_quantized_near(q, s, gx, GPU_REL[dtype], pow2, 1.0,
                                  absolute=2.0 ** -25 if dtype == torch.float16 else 0.0)
            assert_close(dp, gp, torch.float32, factor=10, what="dprobs")


@pytest.mark.cuda
def test_cuda_opcheck_compile_graph():
    """opcheck on CUDA; torch.compile; the MoE form captured in a CUDA graph (no host sync)
    and replayed with new token counts."""
    _need_fp8_gpu()
    x, probs, tpe = moe_inputs([100, 0, 200], 256, torch.bfloat16, device="cuda")
    torch.library.opcheck(torch.ops.fk.swiglu_fp8, (x, "both", False, True))
    torch.library.opcheck(torch.ops.fk.moe_swiglu_fp8, (x, probs, tpe, "both", False, True))
    f = torch.compile(lambda x: fk.swiglu_fp8(x, layout="both"), fullgraph=True,
                      backend="aot_eager")  # (inductor would need Triton, blocked here)
    for a, b in zip(f(x), fk.swiglu_fp8(x, layout="both")):
        same(a.cpu(), b.cpu())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fk.moe_swiglu_fp8(x, probs, tpe, layout="both")
    counts = [0, 129, 171]
    tpe.copy_(torch.tensor(counts))
    g.replay()
    h = fk.moe_swiglu_fp8(x, probs, tpe, layout="rowwise", return_h=True)[-1]
    check_quantized(out, h, "both", False, counts)


@pytest.mark.cuda
def test_cuda_scaled_mm_interop():
    """torch._scaled_mm (1 x 128 activations, 128 x 128 weights) on fk.swiglu_fp8's output
    gives the GEMM of h within FP8 error."""
    _need_fp8_gpu()
    m, n, k = 256, 512, 1024
    x = randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
    w = randn(n, k, device="cuda", dtype=torch.bfloat16)
    q, s, h = fk.swiglu_fp8(x, return_h=True)
    wq, ws = fk.fp8_quantize(w, block=(128, 128))
    out = torch._scaled_mm(q, wq.t(), scale_a=s.t(), scale_b=ws.t(), out_dtype=torch.bfloat16)
    ref = h.double() @ w.double().t()
    bound = h.double().abs() @ w.double().abs().t() * (2 * 2.0 ** -4 + 2.0 ** -7)
    assert ((out.double() - ref).abs() <= bound).all()
