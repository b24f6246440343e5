"""fk.fp8_quantize / fk.fp8_dequantize at every test level: Triton source (interpreter, up to
the float8 cast), CPU backend against a float64 reference of the format, round-trip error
bound, opcheck, torch.compile, bad input, and the CUDA kernel (marker ``cuda``)."""
import math
import os
import subprocess
import sys

import pytest
import torch

import fk
from helpers import (DTYPES, VARIANT_DTYPE, cdiv, error_lines, fixed_copies_same,
                     load_triton_src, misaligned, packed_same, poison_cuda_cache, randn,
                     ref_dequantize, ref_quantize, ref_quantize_rows, same)

FP8 = torch.float8_e4m3fn
BLOCKS = [(1, 128), (128, 128)]
LAYOUTS = ["rowwise", "columnwise", "both"]
# Full blocks, partial blocks in either dim, fewer than one block, one row / column.
SHAPES = [(128, 256), (130, 200), (5, 300), (257, 129), (1, 1), (3, 128)]


def outputs(x, block, layout, pow2=False):
    """fk.fp8_quantize's result as (q, s, qt, st), None for a copy not asked for."""
    r = fk.fp8_quantize(x, block=block, layout=layout, pow2_scales=pow2)
    if layout == "rowwise":
        return (*r, None, None)
    if layout == "columnwise":
        return (None, None, *r)
    return r


def check_against_ref(x, block, layout, pow2):
    got = outputs(x, block, layout, pow2)
    want = ref_quantize(x.cpu(), block, pow2)
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None:
            assert layout != "both" and ((i < 2) == (layout == "columnwise"))
            continue
        assert g.is_contiguous()
        if i % 2 == 0:
            assert g.dtype == FP8 and g.shape == w.shape
            same(g.cpu(), w.to(FP8))
        else:
            assert g.dtype == torch.float32 and g.shape == w.shape
            same(g.cpu(), w)
    return got


def special_input(dtype):
    """(260, 300): an all-zero 1 x 128 block (row 0, block 1), an all-zero 128 x 128 block
    (rows 128..255, cols 128..255), an inf in row 1 / block 0, a NaN in row 2 / block 2,
    a -inf in row 259 (the partial last row tile), tiny and huge finite values (row 5's
    first block in float32 / bfloat16: amax / 448 below 2^-126, the scale's floor)."""
    x = randn(260, 300, seed=3)
    x[0, 128:256] = 0
    x[128:256, 128:256] = 0
    x[1, 5] = math.inf
    x[2, 290] = math.nan
    x[259, 7] = -math.inf
    x[3, :128] *= 1e-30
    tiny = torch.linspace(1e-37, 3e-37, 128) * (-1) ** torch.arange(128)  # normal floats
    x[5, :128] = tiny if dtype != torch.float16 else tiny * 1e30
    x[4, :128] *= 1e30 if dtype != torch.float16 else 1e4
    return x.to(dtype)


# --- level 1: the Triton source under the interpreter ----------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["both", "rows", "cols", "weight", "weight_rows",
                                  "weight_cols"])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(130, 200), (128, 128), "special"])
def test_interpreter(dtype, form, pow2, shape):
    """The kernel with float32 outputs, in each form's tile (FORMS): everything up to the
    float8 cast. Triton 3.6's interpreter converts to float8 wrongly (no saturation, no ties
    to even, NaN to 384), so the cast itself is tested on the GPU only
    (test_cuda_matches_cpu)."""
    mod = load_triton_src("fp8_quantize")
    x = special_input(dtype) if shape == "special" else randn(*shape, dtype=dtype, scale=3.0)
    m, k = x.shape
    weight = form.startswith("weight")
    flag = mod.FLAG_WEIGHT if weight else {"both": 0, "rows": mod.FLAG_ROWS,
                                           "cols": mod.FLAG_COLS}[form]
    _, tile_m, tile_k, _ = next(f for f in mod.FORMS if f[0] == flag)
    block = (128, 128) if weight else (1, 128)
    want_row, want_col = not form.endswith("cols"), not form.endswith("rows")
    rq, rs, rqt, rst = ref_quantize(x, block, pow2)
    q = torch.full((m, k), math.nan)
    qt = torch.full((k, m), math.nan)
    s = torch.full(rs.shape, -1.0)
    st = torch.full(rst.shape, -1.0)
    mod.fp8_quantize_kernel[(cdiv(m, tile_m), cdiv(k, tile_k))](
        x, q, s, qt, st, m, k, int(weight), int(want_row), int(want_col), int(pow2),
        TILE_M=tile_m, TILE_K=tile_k)
    if want_row:
        same(q, rq)
        same(s, rs)
    else:
        assert torch.isnan(q).all() and (s == -1).all()
    if want_col:
        same(qt, rqt)
        same(st, rst)
    else:
        assert torch.isnan(qt).all() and (st == -1).all()


def _packed_case(dtype, form, shape):
    """(module, x with M a multiple of 16, TILE_M, TILE_K, want_row) of a packed-path test:
    form "both" (both copies) or "cols" (the column-wise copy alone) of 1 x 128 blocks, or
    "weight" / "weight_rows" / "weight_cols" of 128 x 128 blocks, at its PACKED_FORMS tile."""
    mod = load_triton_src("fp8_quantize")
    x = special_input(dtype) if shape == "special" else randn(*shape, dtype=dtype, scale=3.0)
    if shape == "special":
        x = x[:x.shape[0] // 16 * 16]
    flag = mod.FLAG_WEIGHT if form.startswith("weight") else {"both": 0,
                                                              "cols": mod.FLAG_COLS}[form]
    tile_m, tile_k, _ = mod.PACKED_FORMS[flag]
    return mod, x, tile_m, tile_k, int(form in ("both", "weight", "weight_rows"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["both", "cols"])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(256, 192), (144, 128), "special"])
def test_interpreter_packed_path(dtype, form, pow2, shape):
    """The PACKED path (four slabs of interleaved rows; the column-wise copy stored as 32-bit
    words of four rows' float8 bytes) writes the same bytes as the kernel's plain path, which
    test_interpreter checks against the reference: float8 outputs on both sides, so both go
    through the interpreter's float8 cast (checked itself on the GPU, test_cuda_matches_cpu,
    where the aligned shapes run the PACKED variants)."""
    mod, x, tile_m, tile_k, want_row = _packed_case(dtype, form, shape)
    m, k = x.shape

    def launch(packed, q, s, qt, st):
        mod.fp8_quantize_kernel[(cdiv(m, tile_m), cdiv(k, tile_k))](
            x, q, s, qt, st, m, k, 0, want_row, 1, int(pow2), TILE_M=tile_m, TILE_K=tile_k,
            PACKED=packed)
    packed_same(launch, m, k, want_row)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["weight", "weight_rows", "weight_cols"])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", [(256, 192), (144, 272), "special"])
def test_interpreter_packed_weight_path(dtype, form, pow2, shape):
    """The PACKED path of 128 x 128 blocks (PACKED=2: one scale over the four slabs, the
    column-wise copy in 32-bit words) writes the same bytes and scales as the plain path,
    partial tiles of both dimensions among them."""
    mod, x, tile_m, tile_k, want_row = _packed_case(dtype, form, shape)
    m, k = x.shape
    want_col = int(form != "weight_rows")

    def launch(packed, q, s, qt, st):
        mod.fp8_quantize_kernel[(cdiv(m, tile_m), cdiv(k, tile_k))](
            x, q, s, qt, st, m, k, 1, want_row, want_col, int(pow2), TILE_M=tile_m,
            TILE_K=tile_k, PACKED=2 * packed)
    packed_same(launch, m, k, want_row, weight=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["both", "cols"])
@pytest.mark.parametrize("programs", [1, 3, "tiles"])
@pytest.mark.parametrize("shape", [(256, 384), (144, 128), "special"])
def test_interpreter_persistent_path(dtype, form, programs, shape):
    """The PERSISTENT path (the PACKED path over a persistent grid, each program loading its
    next tile ahead) writes the same bytes as the PACKED path one tile a program: programs
    walking several tiles (uneven counts among them), and one program a tile."""
    mod, x, tile_m, tile_k, want_row = _packed_case(dtype, form, shape)
    m, k = x.shape
    tiles = cdiv(m, tile_m) * cdiv(k, tile_k)
    grid = tiles if programs == "tiles" else min(programs, tiles)

    def launch(persistent, q, s, qt, st):  # packed_same's flag chooses the grid here
        g = (grid,) if persistent else (cdiv(m, tile_m), cdiv(k, tile_k))
        mod.fp8_quantize_kernel[g](x, q, s, qt, st, m, k, 0, want_row, 1, 0, TILE_M=tile_m,
                                   TILE_K=tile_k, PACKED=1, PERSISTENT=persistent)
    packed_same(launch, m, k, want_row)


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_variants_fixed_copies(dtype):
    """Every variant whose copies are fixed at compile time (COPIES: both, the row-wise or the
    column-wise copy alone, by form) writes the same bits as itself reading them from its
    arguments, at its own tile and path (slabs, persistent grid)."""
    mod = load_triton_src("fp8_quantize")
    m, k = 160, 256
    x = randn(m, k, dtype=dtype, scale=3.0)
    x[0, :128] = 0
    x[5, 7] = math.nan
    for v in mod.variants(90):
        c = v.constexprs
        if v.dtype != VARIANT_DTYPE[dtype] or not c["COPIES"]:
            continue
        assert c["COPIES"] == mod.FORM_COPIES[v.flags & (mod.FLAG_ROWS | mod.FLAG_COLS)]
        flags = {"want_row": int(c["COPIES"] != mod.COPIES_COLS),
                 "want_col": int(c["COPIES"] != mod.COPIES_ROWS)}

        def launch(f, fixed, c=c):
            q, qt = torch.zeros(m, k, dtype=FP8), torch.zeros(k, m, dtype=FP8)
            s, st = torch.full((cdiv(k, 128), m), -1.0), torch.full((cdiv(m, 128), k), -1.0)
            grid = ((3,) if c["PERSISTENT"] else
                    (cdiv(m, c["TILE_M"]), cdiv(k, c["TILE_K"])))
            mod.fp8_quantize_kernel[grid](x, q, s, qt, st, m, k, 0, f["want_row"],
                                          f["want_col"], 1, **dict(c, COPIES=c["COPIES"] *
                                                                   fixed))
            return q, s, qt, st
        fixed_copies_same(launch, flags)


def test_variants_cover_every_dtype():
    """sm_90 and newer: per input dtype, one float8 variant per form and alignment, plus the
    aligned both-copies form's variant for GPUs of less than 4 TB/s; sm_80 (which serves all
    of 8.x): none, so the launcher's capability check is what an 8.x GPU meets."""
    mod = load_triton_src("fp8_quantize")
    low = mod.FLAG_LOW_BANDWIDTH
    assert mod.variants(80) == []
    forms = (0, mod.FLAG_ROWS, mod.FLAG_COLS, mod.FLAG_WEIGHT)
    for arch in (90, 100, 120):
        vs = mod.variants(arch)
        assert sorted((v.dtype, v.flags) for v in vs) == sorted(
            [(dt, f | a) for dt in ("bf16", "fp16", "fp32") for f in forms for a in (0, 1)]
            + [(dt, 1 | low) for dt in ("bf16", "fp16", "fp32")])
        for v in vs:
            assert ("M" in v.divisible_by_16) == bool(v.flags & 1)
            assert v.signature["q_ptr"] == v.signature["qt_ptr"] == "*fp8e4nv"
            assert v.signature["x_ptr"] == f"*{v.dtype}" and v.block == 128
            form = next(f for f in mod.FORMS if f[0] == v.flags & ~(1 | low))
            # the packed variants at their own tile and warps, the others at the form's
            tile = mod.PACKED_FORMS[form[0]] if v.constexprs["PACKED"] else form[1:]
            assert (v.constexprs["TILE_M"], v.constexprs["TILE_K"], v.num_warps) == tile
            # the word stores need M % 4 == 0: aligned variants only, of the 1 x 128 forms
            # with qt (PACKED 1) and of 128 x 128 blocks (PACKED 2)
            assert v.constexprs["PACKED"] == (0 if not v.flags & 1 else {
                0: 1, mod.FLAG_COLS: 1, mod.FLAG_WEIGHT: 2}.get(form[0], 0))
            # the persistent grid (programs per SM): the low-bandwidth variant only, which
            # differs from its default twin in nothing else
            assert v.constexprs["PERSISTENT"] == (mod.PERSISTENT_PER_SM[0] if v.flags & low
                                                  else 0)
            if v.flags & low:
                twin = next(u for u in vs if u.dtype == v.dtype and u.flags == v.flags & ~low)
                assert twin.num_warps == v.num_warps and twin.divisible_by_16 == v.divisible_by_16
                assert dict(twin.constexprs, PERSISTENT=v.constexprs["PERSISTENT"]) == \
                    v.constexprs


# --- level 2: the CPU backend -----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_matches_reference(dtype, block, layout, pow2, shape):
    check_against_ref(randn(*shape, dtype=dtype, scale=5.0), block, layout, pow2)


def scales_input(device):
    """float32 (4096 + 64, 256) whose 1 x 128 blocks' maxima cover float32's magnitudes: each
    block one random positive finite float32 (uniform over its bit patterns: every exponent,
    the subnormals included), the others within it; then the edges of the scale's
    arithmetic: around 448 * 2^-126 (the scale's floor), the largest floats, mantissas of all
    ones, 448 and its neighbours."""
    g = torch.Generator().manual_seed(7)
    m = 4096
    bits = torch.randint(1, 0x7F7FFFFF + 1, (m, 2), generator=g, dtype=torch.int64)
    edges = [448 * 2.0 ** -126, 448.0, 3.4028234663852886e38, 1.0 - 2.0 ** -24, 2.0 - 2.0 ** -23,
             7.0, 1.5, 2.0 ** -100 * (2 - 2.0 ** -23)]
    e = torch.tensor(edges, dtype=torch.float32)
    e = torch.cat([e, torch.nextafter(e, torch.zeros_like(e)), torch.nextafter(e, e * 2)])
    e = e[torch.isfinite(e)]
    amax = torch.cat([bits.to(torch.int32).view(torch.float32).reshape(-1),
                      e.repeat(cdiv(128, e.numel()))[:128]]).reshape(-1, 2)
    x = amax.repeat_interleave(128, dim=1) * (torch.rand(amax.shape[0], 256, generator=g) * 2 - 1)
    pos = torch.randint(0, 128, amax.shape, generator=g)
    sign = torch.where(torch.rand(amax.shape, generator=g) < 0.5, -1.0, 1.0)
    for b in range(2):
        x[torch.arange(amax.shape[0]), pos[:, b] + 128 * b] = amax[:, b] * sign[:, b]
    return x.to(device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("pow2", [False, True])
def test_scales_over_float32_magnitudes(device, pow2):
    """Bit for bit against the float64 reference over blocks whose maxima span float32 (the
    GPU kernels take a / 448 and 1 / s through FMA sequences, not division)."""
    if device == "cuda" and not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    x = scales_input(device)
    assert torch.isfinite(x).all()
    check_against_ref(x, (1, 128), "both", pow2)
    if device == "cuda":
        check_against_ref(misaligned(x), (1, 128), "both", pow2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("pow2", [False, True])
def test_cpu_zeros_inf_nan(dtype, block, pow2):
    x = special_input(dtype)
    q, s, qt, st = check_against_ref(x, block, "both", pow2)
    if block == (1, 128):
        assert s[1, 0] == 1.0 and (q[0, 128:256].float() == 0).all()  # all-zero block
        assert torch.isnan(s[0, 1]) and torch.isnan(q[1, :128].float()).all()  # inf
        assert torch.isnan(s[2, 2]) and torch.isnan(q[2, 256:].float()).all()  # NaN
        assert torch.isnan(s[0, 259])  # -inf in the partial last row tile
        assert not torch.isnan(q[0:5, 128:256].float()).any()  # other blocks of those rows
        if dtype != torch.float16:
            assert s[0, 5] == 2.0 ** -126 and (q[5, :128].float().abs() >= 8).all()
        # column-wise: column 5's first 128 rows hold the inf, column 290's the NaN
        assert torch.isnan(st[0, 5]) and torch.isnan(st[0, 290]) and torch.isnan(st[2, 7])
        assert not torch.isnan(st[0, 6]) and st[1, 200] == 1.0
    else:
        assert s[1, 1] == 1.0 and (q[128:256, 128:256].float() == 0).all()
        assert torch.isnan(s[0, 0]) and torch.isnan(s[0, 2]) and torch.isnan(s[2, 0])
        assert not torch.isnan(s[0, 1]) and not torch.isnan(s[1, 0])
        assert torch.isnan(q[:128, :128].float()).all()
    for data, scales in ((q, s), (qt, st)):  # zero blocks dequantize to exact zeros
        out = fk.fp8_dequantize(data, scales, block=block, dtype=torch.float32)
        same(out, ref_dequantize(data, scales, block))
    assert (fk.fp8_dequantize(q, s, block, torch.float32)[0, 128:256] == 0).all()


@pytest.mark.parametrize("shape", [(100, 300), (300, 100), (1, 1), (128, 128)])
def test_cpu_outputs_never_share_memory(shape):
    """The column-wise copies are copies: with a single block row or column, the transpose of
    a matrix with a dim of 1 is already contiguous and must still not alias the row-wise
    output (custom ops may not return aliases)."""
    x = randn(*shape, dtype=torch.float32)
    for block in BLOCKS:
        outs = fk.fp8_quantize(x, block=block, layout="both")
        ptrs = [o.untyped_storage().data_ptr() for o in outs]
        assert len(set(ptrs)) == 4, (block, shape)


def test_not_differentiable():
    """No output requires grad, through the wrapper and the operator alike (without the
    formula, the CPU backend's ATen calls recorded a graph and a backward ran through it)."""
    x = randn(4, 256).requires_grad_()
    for out in (fk.fp8_quantize(x, layout="both"),
                torch.ops.fk.fp8_quantize(x, 1, "both", False),
                fk.fp8_quantize(x, block=(128, 128), layout="both")):
        assert not any(o.requires_grad for o in out)


def test_cpu_known_values():
    x = torch.zeros(2, 256)
    x[0, 0], x[0, 1], x[0, 2] = 448.0, -1.0, 1.0625  # scale 1: 1.0625 ties to 1.0 (even)
    x[1, :128] = 3.0  # scale 3 / 448; data 448
    x[1, 128] = 500.0  # non-pow2 scale 500 / 448
    q, s = fk.fp8_quantize(x)
    assert s[0, 0] == 1.0 and s[1, 0] == 1.0  # row 0's second block is all zero
    assert q[0, :3].float().tolist() == [448.0, -1.0, 1.0]
    assert s[0, 1] == torch.tensor(3.0) / 448 and (q[1, :128].float() == 448).all()
    q2, s2 = fk.fp8_quantize(x, pow2_scales=True)
    assert s2[0, 1] == 2.0 ** -7 and (q2[1, :128].float() == 384).all()  # 3 / 2^-7 -> 384
    # 500 / 448 rounds up to 2; 500 / 2 = 250 lies between 240 and 256 (spacing 16)
    assert s2[1, 1] == 2.0 and q2[1, 128].float() == 256.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_round_trip_error_bound(dtype, block, pow2, scale):
    """|dequant(quant(x)) - x| <= max(|x| * 2^-4, s * 2^-10) + |x| * 2^-20 per element: half
    an e4m3 ulp of q = x / s (3 mantissa bits: 2^-4 |q| for normals, 2^-10 below 2^-6) times
    s, plus the float32 roundings of the division and the product."""
    x = randn(200, 300, dtype=dtype, scale=scale)
    q, s, qt, st = fk.fp8_quantize(x, block=block, layout="both", pow2_scales=pow2)
    xd = x.double()
    for data, scales, ref in ((q, s, xd), (qt, st, xd.t())):
        out = fk.fp8_dequantize(data, scales, block=block, dtype=torch.float32).double()
        s_full = ref_dequantize(torch.ones_like(data, dtype=torch.float32), scales, block)
        bound = torch.maximum(ref.abs() * 2.0 ** -4, s_full * 2.0 ** -10) + ref.abs() * 2.0 ** -20
        assert ((out - ref).abs() <= bound).all()
        # the bound is not loose: most elements use more than a quarter of it
        assert ((out - ref).abs() > bound / 64).float().mean() > 0.5


@pytest.mark.parametrize("block", BLOCKS)
def test_pow2_scales(block):
    x = randn(300, 260, scale=7.0)
    _, s = fk.fp8_quantize(x, block=block)
    _, p = fk.fp8_quantize(x, block=block, pow2_scales=True)
    mant, _ = torch.frexp(p)
    assert (mant == 0.5).all() and (p >= s).all() and (p < 2 * s).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_dtypes(dtype):
    x = randn(130, 260)
    for block in BLOCKS:
        q, s = fk.fp8_quantize(x, block=block)
        out = fk.fp8_dequantize(q, s, block=block, dtype=dtype)
        assert out.dtype == dtype and out.shape == x.shape
        same(out, ref_dequantize(q, s, block).float().to(dtype))
    assert fk.fp8_dequantize(q, s, block=block).dtype == torch.bfloat16


def test_non_contiguous_and_empty():
    x = randn(300, 260)
    for block in BLOCKS:
        got = outputs(x.t(), block, "both")
        for g, w in zip(got, outputs(x.t().contiguous(), block, "both")):
            same(g, w)
        for shape in ((0, 200), (130, 0)):
            q, s, qt, st = outputs(torch.zeros(shape), block, "both")
            w = ref_quantize(torch.zeros(shape), block, False)
            assert [t.shape for t in (q, s, qt, st)] == [t.shape for t in w]


# --- bad input ----------------------------------------------------------------------------

def _x(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


BAD_Q = [
    ("1-D", lambda d: (_x(128, d=d),), {}, "x must be 2-D"),
    ("3-D", lambda d: (_x(2, 2, 128, d=d),), {}, "x must be 2-D"),
    ("double", lambda d: (_x(2, 128, dtype=torch.float64, d=d),), {}, "not supported"),
    ("int", lambda d: (_x(2, 128, dtype=torch.int32, d=d),), {}, "not supported"),
    ("layout", lambda d: (_x(2, 128, d=d),), {"layout": "transposed"}, "layout must be"),
]

BAD_DQ = [
    ("dtype data", lambda d: (_x(2, 128, d=d), _x(1, 2, d=d)), {}, "data must be float8_e4m3fn"),
    ("scales dtype", lambda d: (_x(2, 128, d=d).to(FP8), _x(1, 2, dtype=torch.float16, d=d)),
     {}, "scales must be float32"),
    ("scales shape", lambda d: (_x(2, 128, d=d).to(FP8), _x(2, 1, d=d)), {},
     "scales must have shape"),
    ("weight shape", lambda d: (_x(2, 129, d=d).to(FP8), _x(1, 1, d=d)),
     {"block": (128, 128)}, "scales must have shape"),
    ("out dtype", lambda d: (_x(2, 128, d=d).to(FP8), _x(1, 2, d=d)),
     {"dtype": torch.float64}, "dtype must be float32, bfloat16 or float16"),
]


@pytest.mark.parametrize("name,make,kw,msg", BAD_Q, ids=[b[0] for b in BAD_Q])
def test_bad_quantize_input_cpu_and_meta_agree(name, make, kw, msg):
    cpu, meta = error_lines(lambda d: fk.fp8_quantize(*make(d), **kw), ("cpu", "meta"), msg)
    assert cpu == meta


@pytest.mark.parametrize("name,make,kw,msg", BAD_DQ, ids=[b[0] for b in BAD_DQ])
def test_bad_dequantize_input_cpu_and_meta_agree(name, make, kw, msg):
    cpu, meta = error_lines(lambda d: fk.fp8_dequantize(*make(d), **kw), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_block_cpu_and_meta_agree():
    for call in (lambda d: torch.ops.fk.fp8_quantize(_x(2, 128, d=d), 64),
                 lambda d: torch.ops.fk.fp8_dequantize(_x(2, 128, d=d).to(FP8), _x(1, 2, d=d),
                                                       64, torch.float32)):
        cpu, meta = error_lines(call, ("cpu", "meta"), r"block must be \(1, 128\) or")
        assert cpu == meta
    with pytest.raises(RuntimeError, match=r"got \(128, 1\)"):
        fk.fp8_quantize(_x(2, 128), block=(128, 1))


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.fp8_dequantize(_x(2, 128).to(FP8), _x(1, 2, d="meta"))


# --- level 3: opcheck, torch.compile --------------------------------------------------------

@pytest.mark.parametrize("block_rows", [1, 128])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck(block_rows, layout):
    x = randn(130, 260)
    torch.library.opcheck(torch.ops.fk.fp8_quantize, (x, block_rows, layout, False))
    torch.library.opcheck(torch.ops.fk.fp8_quantize, (x.bfloat16(), block_rows, layout, True))
    if layout == "rowwise":
        q, s, _, _ = torch.ops.fk.fp8_quantize(x, block_rows, layout, False)
        # test_schema compares the inputs before and after with allclose, which torch 2.11
        # does not implement for float8; the inputs are compared bitwise here instead.
        before = q.view(torch.uint8).clone(), s.clone()
        torch.library.opcheck(torch.ops.fk.fp8_dequantize, (q, s, block_rows, torch.float16),
                              test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
        assert torch.equal(q.view(torch.uint8), before[0]) and torch.equal(s, before[1])


def test_torch_compile_fullgraph():
    def f(x, w):
        q, s, qt, st = fk.fp8_quantize(x, layout="both")
        wq, ws = fk.fp8_quantize(w, block=(128, 128), pow2_scales=True)
        return (fk.fp8_dequantize(q, s, dtype=torch.float32) + 1,
                fk.fp8_dequantize(qt, st, dtype=torch.float32),
                fk.fp8_dequantize(wq, ws, block=(128, 128), dtype=torch.float32))

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for m in (130, 257):
        x, w = randn(m, 300), randn(200, 300)
        for a, b in zip(compiled(x, w), f(x, w)):
            same(a, b)


# --- level 5: the CUDA kernel ---------------------------------------------------------------

CUDA_SHAPES = SHAPES + [(8192, 4096), (4096, 14336), (1000, 1000)]


def _fp8_gpu():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_cuda_matches_cpu(dtype, block, layout, shape):
    """Bit for bit against the reference (float8 cast included), poisoned outputs; x
    16-byte aligned (the aligned variant where M and K are multiples of 16) and not."""
    if not _fp8_gpu():
        with pytest.raises(RuntimeError, match="compute capability 9.0 or newer"):
            fk.fp8_quantize(randn(*shape, dtype=dtype, device="cuda"), block, layout)
        return
    for pow2 in (False, True):
        x = randn(*shape, dtype=dtype, device="cuda", scale=5.0)
        for xx in (x, misaligned(x)):
            poison_cuda_cache()
            check_against_ref(xx, block, layout, pow2)


_LOW_BANDWIDTH_SCRIPT = """
import sys
import torch
import fk
assert torch.ops.fk._memory_bandwidth_gbps(0) == 3000.0
cases = torch.load(sys.argv[1])
torch.save([[t.cpu() for t in fk.fp8_quantize(x.cuda(), layout="both", pow2_scales=p)]
            for x, p in cases], sys.argv[2])
"""


@pytest.mark.cuda
def test_cuda_low_bandwidth_variant(tmp_path):
    """Where the device reads below 4 TB/s (FK_MEMORY_BANDWIDTH_GBPS=3000, in a child
    process), both copies of aligned inputs come from the variant over a persistent grid
    (FLAG_LOW_BANDWIDTH): bit for bit the reference, as the default variant's are
    (test_cuda_matches_cpu). Shapes of one tile, of partial tiles, and of more tiles than
    programs (walked unevenly)."""
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    cases = [(randn(m, k, dtype=dt, scale=5.0), p)
             for dt in DTYPES for m, k in ((128, 128), (144, 400)) for p in (False, True)]
    cases.append((randn(4096, 4096, dtype=torch.bfloat16, scale=5.0), False))
    torch.save(cases, tmp_path / "in.pt")
    r = subprocess.run([sys.executable, "-c", _LOW_BANDWIDTH_SCRIPT, str(tmp_path / "in.pt"),
                        str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, FK_MEMORY_BANDWIDTH_GBPS="3000"))
    assert r.returncode == 0, r.stderr[-3000:]
    for (x, p), got in zip(cases, torch.load(tmp_path / "out.pt"), strict=True):
        for i, (g, w) in enumerate(zip(got, ref_quantize(x, (1, 128), p), strict=True)):
            same(g, w.to(FP8) if i % 2 == 0 else w)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    """int64 offsets: x (65537, 32896) bf16 (2.16e9 elements); the last row tile (one row) is
    checked against the reference in both copies, the first rows in the row-wise copy."""
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    m, k = 65537, 32896
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    q, s, qt, st = fk.fp8_quantize(x, layout="both")
    for rows in (slice(0, 2), slice(m - 1, m)):
        rq, rs = ref_quantize_rows(x[rows].cpu(), False)
        same(q[rows].cpu(), rq.to(FP8))
        same(s[:, rows].cpu(), rs)
    rqt, rst = ref_quantize_rows(x[m - 1:].t().cpu(), False)  # the last, one-row tile
    same(qt[:, m - 1:].cpu(), rqt.to(FP8))
    same(st[-1:].cpu(), rst)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", BLOCKS)
def test_cuda_zeros_inf_nan_and_dequantize(dtype, block):
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    x = special_input(dtype).cuda()
    for pow2 in (False, True):
        q, s, qt, st = check_against_ref(x, block, "both", pow2)
        for data, scales in ((q, s), (qt, st)):
            same(fk.fp8_dequantize(data, scales, block=block, dtype=torch.float32).cpu(),
                 ref_dequantize(data.cpu(), scales.cpu(), block))


@pytest.mark.cuda
def test_cuda_opcheck_compile_graph():
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    x = randn(300, 260, device="cuda", dtype=torch.bfloat16)
    for block_rows in (1, 128):
        torch.library.opcheck(torch.ops.fk.fp8_quantize, (x, block_rows, "both", False))
    f = torch.compile(lambda x: fk.fp8_quantize(x, layout="both"), fullgraph=True,
                      backend="aot_eager")  # (inductor would need Triton, blocked here)
    for a, b in zip(f(x), fk.fp8_quantize(x, layout="both")):
        same(a.cpu(), b.cpu())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fk.fp8_quantize(x, layout="both")
    x.copy_(randn(300, 260, dtype=torch.bfloat16))
    g.replay()
    for a, b in zip(out, fk.fp8_quantize(x, layout="both")):
        same(a.cpu(), b.cpu())


@pytest.mark.cuda
def test_cuda_scaled_mm_rowwise_interop():
    """torch._scaled_mm with per-row scaling on fk's operands: with K = 128 a 1 x 128 block
    is a whole row, so x's scales are per row (scale_a = s.T, (M, 1)) and w's, quantized the
    same way, per output column (scale_b = ws, (1, N)). The result is the bf16 GEMM within
    FP8 error: each operand within 2^-4 relative (half an e4m3 ulp), so the product within
    2 * 2^-4 (+ bf16 output rounding) of sum |x||w|."""
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    m, n, k = 256, 512, 128
    x = randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = randn(n, k, device="cuda", dtype=torch.bfloat16)
    q, s = fk.fp8_quantize(x)
    wq, ws = fk.fp8_quantize(w)
    out = torch._scaled_mm(q, wq.t(), scale_a=s.t(), scale_b=ws, out_dtype=torch.bfloat16)
    ref = x.double() @ w.double().t()
    mag = x.double().abs() @ w.double().abs().t()
    assert ((out.double() - ref).abs() <= mag * (2 * 2.0 ** -4 + 2.0 ** -7)).all()
    exact = fk.fp8_dequantize(q, s, dtype=torch.float32).double() @ \
        fk.fp8_dequantize(wq, ws, dtype=torch.float32).double().t()
    assert ((out.double() - exact).abs() <= mag * 2.0 ** -7).all()


@pytest.mark.cuda
def test_cuda_scaled_mm_interop():
    """torch._scaled_mm with blockwise scaling (1 x 128 activations, 128 x 128 weights; sm_90)
    on fk's operands gives the bf16 GEMM within FP8 error: each operand is within 2^-4
    relative (half an e4m3 ulp), so the product within about 2 * 2^-4 of sum |a||w|."""
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")
    m, n, k = 256, 512, 1024
    x = randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = randn(n, k, device="cuda", dtype=torch.bfloat16)
    q, s = fk.fp8_quantize(x)  # s: (k / 128, m); _scaled_mm wants (m, k / 128) M-major
    wq, ws = fk.fp8_quantize(w, block=(128, 128))  # ws: (n / 128, k / 128)
    out = torch._scaled_mm(q, wq.t(), scale_a=s.t(), scale_b=ws.t(), out_dtype=torch.bfloat16)
    ref = x.double() @ w.double().t()
    bound = x.double().abs() @ w.double().abs().t() * (2 * 2.0 ** -4 + 2.0 ** -7)
    assert ((out.double() - ref).abs() <= bound).all()
    exact = fk.fp8_dequantize(q, s, dtype=torch.float32).double() @ \
        fk.fp8_dequantize(wq, ws, block=(128, 128), dtype=torch.float32).double().t()
    assert ((out.double() - exact).abs() <= x.double().abs() @ w.double().abs().t()
            * 2.0 ** -7).all()
