"""fk.moe_permute_fp8 at every test level: Triton source (interpreter, up to the float8
cast), CPU backend, opcheck, torch.compile, bad input, and the CUDA kernels (marker
``cuda``).

The reference is independent of the op: the permuted rows from tests/helpers.py's
ref_permute (argsort and index_select), quantized by tests/helpers.py's float64 reference of
the format (row-wise, and per expert segment for the column-wise copy). The quantized copies
are checked bit for bit; the row map, counts and permuted probs exactly."""
import math

import pytest
import torch

import fk
from helpers import (DTYPES, VARIANT_DTYPE, assert_close, cdiv, error_lines,
                     fixed_copies_same, interp_row_map, interp_segment_blocks, load_triton_src,
                     misaligned, poison_cuda_cache, randn, ref_permute, ref_quantize_rows,
                     ref_quantize_segments, ref_segment_blocks, routing, same)

FP8 = torch.float8_e4m3fn
LAYOUTS = ["rowwise", "columnwise", "both"]


def ref_quantized(tokens, rmap, probs, pad_to, layout, pow2, n=None):
    """(q, s, qt, st, permuted_probs, row_map, tokens_per_expert): q, qt before the float8
    cast (float32), None for the copies not asked for."""
    permuted, pp, row_map, tpe = ref_permute(tokens.cpu(), rmap.cpu(),
                                             None if probs is None else probs.cpu(), pad_to, n)
    q = s = qt = st = None
    if layout != "columnwise":
        q, s = ref_quantize_rows(permuted, pow2)
    if layout != "rowwise":
        qt, st = ref_quantize_segments(permuted, tpe.tolist(), pow2)
    return q, s, qt, st, pp, row_map, tpe


def special_tokens(t, h, dtype):
    """Tokens with an all-zero block (token 0, columns 128..255), an inf (token 1), a NaN
    (token 2) and -inf (token t - 1)."""
    x = randn(t, h, seed=3, scale=3.0)
    x[0, 128:256] = 0
    x[1, 5] = math.inf
    x[2, h - 1] = math.nan
    x[t - 1, 7] = -math.inf
    return x.to(dtype)


# --- level 1: the Triton source under the interpreter (float32 in place of float8) --------

def _interp(tokens, rmap, probs, pad_to, layout, pow2, extra_rows=0, packed=0, fp8=False,
            tile_k=128):
    """Runs moe_permute's map kernels, then this op's kernel for the layout (the tile
    kernel's tiles tile_k columns wide); returns (q, s, qt, st, pout, row_map, tpe) as the
    reference has them."""
    mod = load_triton_src("moe_permute_fp8")
    t, h = tokens.shape
    e = rmap.shape[1]
    # the slab form needs N % 4 == 0 (fp8: the runs compared with it)
    tpe, row_map, src, n = interp_row_map(rmap, pad_to, extra_rows=extra_rows,
                                          multiple=4 if fp8 else 1)
    nk = cdiv(h, 128)
    rows_t = (n + 127 * e) // 128
    q, qt = torch.full((n, h), math.nan), torch.full((h, n), math.nan)
    if fp8:  # float8 outputs (the slab form stores 32-bit words of float8 bytes)
        q, qt = q.to(FP8), qt.to(FP8)
    s, st = torch.full((nk, n), -1.0), torch.full((rows_t + 1, h), -1.0)
    pin = probs if probs is not None else tokens
    pout = torch.full((n,), math.nan, dtype=pin.dtype)
    want_pp = int(probs is not None)
    if layout == "rowwise":
        mod.moe_permute_fp8_scatter_kernel[(t + cdiv(n, 4),)](
            tokens, row_map, q, s, pin, pout, src, t, h, e, n, want_pp, int(pow2), KB=2, BE=4,
            NB=2, ZR=4)
    else:
        blocks = interp_segment_blocks(mod, tpe, n, rows_t + 1)
        mod.moe_permute_fp8_tile_kernel[(rows_t + 1, cdiv(h, tile_k))](
            tokens, src, blocks, pin, pout, q, s, qt, st, t, h, e, n,
            int(layout == "both"), want_pp, int(pow2), PACKED=packed, TILE_K=tile_k)
    got_q = (q, s) if layout != "columnwise" else (None, None)
    got_t = (qt, st[:rows_t]) if layout != "rowwise" else (None, None)
    return (*got_q, *got_t, pout if probs is not None else None, row_map, tpe)


@pytest.mark.parametrize("counts", [[0, 132, 8, 0, 164, 0], [128, 1, 127, 44], [260], [0],
                                    [-5, 300, 0, 129], [3] * 40, [0] * 7 + [1000]])
@pytest.mark.parametrize("cdtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("rb", [1, 4])
def test_interpreter_segment_blocks(counts, cdtype, rb):
    """_common.segment_blocks_kernel (the MoE FP8 tile kernels' blocks; int32 counts here,
    int64 in moe_swiglu_fp8) against walking the segments in Python: every block of every
    segment in order, partial last blocks, empty and negative counts, blocks past the last
    one (the grid's spare programs), rows cut at M, a table whose rows RB does not divide,
    E_BLOCK above E."""
    mod = load_triton_src("moe_permute_fp8")
    tpe = torch.tensor(counts, dtype=cdtype)
    total = sum(max(c, 0) for c in counts)
    for m in (total, max(total - 70, 0)):
        rows = (m + 127 * len(counts)) // 128 + 3
        for e_block in (None, 64):
            got = interp_segment_blocks(mod, tpe, m, rows, e_block=e_block, rb=rb)
            assert torch.equal(got, ref_segment_blocks(counts, m, rows)), (m, e_block)


def _bits(v):
    """v's bit patterns where it is float8 or float32 (NaNs then compare equal)."""
    return v.view({FP8: torch.uint8, torch.float32: torch.int32}.get(v.dtype, v.dtype))


def check(got, ref):
    """got, ref: (q, s, qt, st, permuted_probs, row_map, tokens_per_expert); the copies bit
    for bit (ref before the float8 cast; got float8 or, under the interpreter, float32)."""
    for i, (g, w) in enumerate(zip(got[:5], ref[:5])):
        assert (g is None) == (w is None), i
        if g is None:
            continue
        assert g.shape == w.shape and g.is_contiguous(), (i, g.shape, w.shape)
        if g.dtype == FP8:
            w = w.to(FP8)
        same(g.cpu(), w)
    assert got[5].dtype == torch.int32 and torch.equal(got[5].cpu().long(), ref[5])
    assert got[6].dtype == torch.int32 and torch.equal(got[6].cpu().long(), ref[6])


# (layout, k, pad_to, extra rows, slab form): two passes of KB experts (k = 9), rows past the
# last segment, segments of any length (pad_to 1: the slab form's blocks stored byte by byte)
INTERP = [("rowwise", 3, 4, 0, 0), ("rowwise", 9, 16, 37, 0), ("columnwise", 3, 4, 0, 0),
          ("both", 9, 16, 37, 0), ("columnwise", 2, 16, 40, 1), ("both", 5, 1, 12, 1),
          ("both", 3, 4, 0, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,k,pad_to,extra,packed", INTERP)
def test_interpreter(dtype, layout, k, pad_to, extra, packed):
    """Empty experts, a token routed nowhere, partial blocks in both dims, special values;
    the tile kernel's plain and slab forms."""
    t, e, h = 40, 11, 300
    rmap, probs = routing(t, e, k, empty=(2, 10))
    rmap[5] = False
    x = special_tokens(t, h, dtype)
    pow2 = extra > 0
    p = probs if extra else None
    got = _interp(x, rmap, p, pad_to, layout, pow2, extra, packed=0)
    n = (got[0] if got[0] is not None else got[2].t()).shape[0]
    check(got, ref_quantized(x, rmap, p, pad_to, layout, pow2, n))
    if packed:
        # The slab form against the plain one checked above, both storing float8 (the slab
        # form's words hold float8 bytes), so that both go through the interpreter's float8
        # cast: the same bytes and scales.
        plain = _interp(x, rmap, p, pad_to, layout, pow2, extra, packed=0, fp8=True)
        slabs = _interp(x, rmap, p, pad_to, layout, pow2, extra, packed=1, fp8=True)
        for a, b in zip(plain, slabs):
            if a is not None:
                assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad_to,extra", [(4, 0), (16, 40), (1, 12)])
def test_interpreter_columnwise_narrow_tiles(dtype, pad_to, extra):
    """The column-wise copy alone in the aligned variant's narrower tiles (FLAG_COLS,
    COLS_TILE: slabs TILE_K columns wide), as the launcher runs it: segments of more than 128
    rows (a full block, then a partial one; blocks of more and of at most 64 rows), H = 300
    (a last tile of 44 columns), INTERP's pad_to (1: blocks stored byte by byte), rows past
    the last segment, empty experts, special values."""
    mod = load_triton_src("moe_permute_fp8")
    tile_k = mod.COLS_TILE[0]
    t, e, h = 200, 5, 300
    assert tile_k < 128 and h % tile_k and h % 128
    rmap, probs = routing(t, e, 3, empty=(2,))
    rmap[5] = False
    x = special_tokens(t, h, dtype)
    args = (x, rmap, probs, pad_to, "columnwise", extra > 0, extra)
    # The plain form at this width, float32 data (before the float8 cast) against the
    # reference.
    plain = _interp(*args, tile_k=tile_k)
    check(plain, ref_quantized(*args[:6], plain[2].shape[1]))
    tpe = plain[6].tolist()
    assert max(tpe) > 128 and any(0 < c % 128 <= 64 for c in tpe), tpe
    # The slab form stores float8 (words of float8 bytes): its data against the plain form's
    # float8 bytes at this width (both through the interpreter's float8 cast, which can land
    # a value one binade low, so not against the reference's cast), its scales and probs
    # against the reference.
    slabs = _interp(*args, packed=1, fp8=True, tile_k=tile_k)
    plain8 = _interp(*args, packed=0, fp8=True, tile_k=tile_k)
    ref = ref_quantized(*args[:6], slabs[2].shape[1])
    assert torch.equal(_bits(slabs[2]), _bits(plain8[2]))
    check(slabs, (*ref[:2], plain8[2], *ref[3:]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_tile_variants_fixed_copies(dtype):
    """The tile kernel's variants for the column-wise copy alone, compiled for it (COPIES),
    write the same bits as themselves reading it from their arguments, at their own tiles,
    over segments with partial and empty blocks."""
    mod = load_triton_src("moe_permute_fp8")
    t, h, e = 40, 256, 5
    rmap, probs = routing(t, e, 2, empty=(3,))
    tokens = special_tokens(t, h, dtype)
    tpe, row_map, src, n = interp_row_map(rmap, 4, multiple=4)
    rows_t = (n + 127 * e) // 128
    blocks = interp_segment_blocks(mod, tpe, n, rows_t + 1)
    for v in mod.variants(90):
        c = v.constexprs
        if v.family != "moe_permute_fp8_tile" or v.dtype != VARIANT_DTYPE[dtype]:
            continue
        assert c["COPIES"] == (mod.COPIES_COLS if v.flags & mod.FLAG_COLS else 0), v
        if not c["COPIES"] or v.flags & mod.FLAG_PROBS_F32:
            continue

        def launch(f, fixed, c=c):
            q, qt = torch.zeros(n, h, dtype=FP8), torch.zeros(h, n, dtype=FP8)
            s, st = torch.full((cdiv(h, 128), n), -1.0), torch.full((rows_t + 1, h), -1.0)
            pout = torch.full((n,), -1.0)
            mod.moe_permute_fp8_tile_kernel[(rows_t + 1, cdiv(h, c["TILE_K"]))](
                tokens, src, blocks, probs, pout, q, s, qt, st, t, h, e, n, f["want_row"], 1,
                0, **dict(c, COPIES=c["COPIES"] * fixed))
            return q, s, qt, st, pout
        fixed_copies_same(launch, {"want_row": 0})


def test_variants_cover_every_dtype():
    """sm_90 and newer: per dtype and flags (aligned, float32 probs with 16-bit tokens) one
    scatter variant and one tile variant per expert block, each once, and with the aligned
    flag one tile variant more per expert block for the column-wise copy alone (FLAG_COLS,
    at COLS_TILE's width and warps); no FP8 kernels before sm_89."""
    mod = load_triton_src("moe_permute_fp8")
    assert mod.variants(80) == []
    for arch in (90, 100, 120):
        want = []
        for dt in ("fp32", "bf16", "fp16"):
            for flags in (0, 1, 2, 3):
                if dt == "fp32" and flags & 2:
                    continue
                want.append(("moe_permute_fp8_scatter", dt, flags, 1))
                for form in ((0, mod.FLAG_COLS) if flags & 1 else (0,)):
                    want.append(("moe_permute_fp8_tile", dt, flags | form, mod.MAX_EXPERTS))
            want += [("moe_permute_fp8_blocks", dt, 0, eb) for eb in (64, 256, 1024)]
        vs = mod.variants(arch)
        assert sorted((v.family, v.dtype, v.flags, v.block) for v in vs) == sorted(want)
        for v in vs:
            if v.family == "moe_permute_fp8_tile":
                assert v.constexprs["PACKED"] == v.flags & 1  # slabs in the aligned variant
                # (TILE_K, warps): 128 columns but for the column-wise copy alone
                assert (v.constexprs["TILE_K"], v.num_warps) == (
                    mod.COLS_TILE if v.flags & mod.FLAG_COLS
                    else (128, mod.TILE_WARPS[v.flags & 1]))
        assert mod.MAX_EXPERTS == 1024  # the launcher's expert limit


# --- level 2: the CPU backend --------------------------------------------------------------

def run(tokens, rmap, probs, pad_to, layout, pow2=False, **kw):
    """fk.moe_permute_fp8 as (q, s, qt, st, permuted_probs, row_map, tokens_per_expert)."""
    out = fk.moe_permute_fp8(tokens, rmap, probs, pad_to, layout=layout, pow2_scales=pow2,
                             **kw)
    copies = {"rowwise": (*out[:2], None, None), "columnwise": (None, None, *out[:2])}
    return (*copies.get(layout, out[:4]), *out[-3:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("k,pad_to,bound", [(2, 16, True), (3, 4, False), (17, 1, False)])
def test_cpu_matches_reference(dtype, layout, pow2, k, pad_to, bound):
    t, e, h = 45, 20, 300
    rmap, probs = routing(t, e, k, empty=(0, 7))
    x = special_tokens(t, h, dtype)
    kw = {"topk": k} if bound else {}
    got = run(x, rmap, probs, pad_to, layout, pow2, **kw)
    n = fk.ops.moe_permute.moe_permute_bound(t, e, k, pad_to) if bound else None
    check(got, ref_quantized(x, rmap, probs, pad_to, layout, pow2, n))
    if bound:
        assert got[6].sum() < n  # rows past the last segment


def test_cpu_is_moe_permute_then_quantize():
    """The row-wise copy is fk.fp8_quantize of fk.moe_permute's output, the column-wise one
    (one expert) its column-wise copy; the rest is moe_permute's."""
    rmap, probs = routing(50, 6, 2)
    x = randn(50, 256, dtype=torch.bfloat16, seed=4)
    permuted, pp, row_map, tpe = fk.moe_permute(x, rmap, probs, pad_to=16, topk=2)
    q, s, pp8, row_map8, tpe8 = fk.moe_permute_fp8(x, rmap, probs, pad_to=16, topk=2)
    rq, rs = fk.fp8_quantize(permuted)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert torch.equal(pp8, pp) and torch.equal(row_map8, row_map) and torch.equal(tpe8, tpe)
    one = torch.ones(50, 1, dtype=torch.bool)
    qt, st, _, _, tpe1 = fk.moe_permute_fp8(x, one, layout="columnwise", pad_to=1)
    rqt, rst = fk.fp8_quantize(x, layout="columnwise")
    assert torch.equal(qt.view(torch.uint8), rqt.view(torch.uint8)) and torch.equal(st, rst)


def test_cpu_gradients():
    """Only permuted_probs requires grad: its gradient reaches probs as through
    fk.moe_permute; the tokens' gradient is the docstring's fk.moe_unpermute of the permuted
    rows' gradient (both against autograd through fk.moe_permute). The same through the
    operator (its registered formula) as through the eager wrapper."""
    rmap, probs = routing(30, 8, 3, empty=(4,))
    x = randn(30, 64, seed=6).requires_grad_()
    p = probs.clone().requires_grad_()
    permuted, pp, row_map, _ = fk.moe_permute(x, rmap, p, pad_to=4, topk=3)
    g = randn(*permuted.shape, seed=7)
    gp = randn(pp.shape[0], seed=8)
    torch.autograd.backward([permuted, pp], [g, gp])
    assert_close(fk.moe_unpermute(g, row_map), x.grad, torch.float32)
    n = permuted.shape[0]
    for call in (lambda *a: fk.moe_permute_fp8(*a, pad_to=4, topk=3, layout="both"),
                 lambda *a: torch.ops.fk.moe_permute_fp8(*a, 4, n, "both", False)):
        p8 = probs.clone().requires_grad_()
        out = call(x, rmap, p8)
        assert [o.requires_grad for o in out] == [False] * 4 + [True, False, False]
        out[4].backward(gp)
        assert torch.equal(p8.grad, p.grad), "dprobs"
    assert not any(o.requires_grad for o in fk.moe_permute_fp8(x, rmap) if o is not None)
    # nothing routed and no rows: probs' gradient is zero, as through fk.moe_permute
    none = torch.zeros_like(rmap)
    for name, fn in (("moe_permute", lambda p0: fk.moe_permute(x, none, p0)[1]),
                     ("moe_permute_fp8", lambda p0: fk.moe_permute_fp8(x, none, p0)[2])):
        p0 = probs.clone().requires_grad_()
        pp0 = fn(p0)
        assert pp0.shape == (0,)
        pp0.sum().backward()
        assert torch.equal(p0.grad, torch.zeros_like(probs)), name
    with pytest.raises(RuntimeError, match="differentiate twice"):
        p8 = probs.clone().requires_grad_()
        pp8 = fk.moe_permute_fp8(x, rmap, p8, pad_to=4)[2]
        (gp8,) = torch.autograd.grad(pp8, p8, gp.new_ones(pp8.shape).requires_grad_(),
                                     create_graph=True)
        gp8.sum().backward()


def test_cpu_empty_and_edge_shapes():
    # no tokens, with a bound: no rows routed, every row padding
    q, s, qt, st, pp, row_map, tpe = fk.moe_permute_fp8(
        torch.empty(0, 200), torch.zeros(0, 5, dtype=torch.bool), topk=2, layout="both")
    assert q.shape == (0, 200) and qt.shape == (200, 0) and s.shape == (2, 0)
    assert st.shape == ((127 * 5) // 128, 200) and (st == 1).all()
    # nothing routed, trailing rows: zero data, scales 1.0
    q, s, qt, st, *_ = fk.moe_permute_fp8(randn(4, 130), torch.zeros(4, 3, dtype=torch.bool),
                                          num_out_rows=6, layout="both")
    assert (q.float() == 0).all() and (s == 1).all() and (qt.float() == 0).all()
    assert st.shape == ((6 + 127 * 3) // 128, 130) and (st == 1).all()
    # no experts
    q, s, _, _, tpe = fk.moe_permute_fp8(randn(3, 4), torch.zeros(3, 0, dtype=torch.bool))
    assert q.shape == (0, 4) and s.shape == (1, 0) and tpe.shape == (0,)
    # zero hidden size
    rmap, _ = routing(5, 4, 2)
    qt, st, _, _, tpe = fk.moe_permute_fp8(torch.empty(5, 0), rmap, pad_to=2,
                                           layout="columnwise")
    assert qt.shape == (0, int(tpe.sum())) and st.shape[1] == 0


# --- bad input, opcheck, torch.compile -----------------------------------------------------

def _f(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


def _b(*shape, d="cpu"):
    return torch.ones(shape, dtype=torch.bool, device=d)


BAD = [
    ("1-D tokens", lambda d: (_f(8, d=d), _b(8, 2, d=d)), {}, "tokens must be 2-D"),
    ("float64 tokens", lambda d: (_f(2, 8, dtype=torch.float64, d=d), _b(2, 2, d=d)), {},
     "tokens has dtype Double, which is not supported"),
    ("map rows", lambda d: (_f(2, 8, d=d), _b(3, 2, d=d)), {}, r"routing_map must have shape"),
    ("probs shape", lambda d: (_f(2, 8, d=d), _b(2, 3, d=d), _f(2, 2, d=d)), {},
     r"probs must have shape \(2, 3\)"),
    ("pad_to", lambda d: (_f(2, 8, d=d), _b(2, 3, d=d)), {"pad_to": 0}, "pad_to must be"),
    ("layout", lambda d: (_f(2, 8, d=d), _b(2, 3, d=d)), {"layout": "rows"},
     "layout must be 'rowwise', 'columnwise' or 'both'"),
]


@pytest.mark.parametrize("name,make,kw,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, kw, msg):
    cpu, meta = error_lines(lambda d: fk.moe_permute_fp8(*make(d), **kw), ("cpu", "meta"), msg)
    assert cpu == meta and cpu.startswith("fk::moe_permute_fp8: "), cpu


def test_topk_checks():
    with pytest.raises(RuntimeError, match="fk::moe_permute_fp8: give topk or num_out_rows"):
        fk.moe_permute_fp8(_f(2, 4), _b(2, 2), topk=1, num_out_rows=8)
    with pytest.raises(RuntimeError, match="fk::moe_permute_fp8: topk must be at least 1"):
        fk.moe_permute_fp8(_f(2, 4), _b(2, 2), topk=0)
    rmap, _ = routing(10, 4, 3)
    rmap[0] = True  # a token routed to more experts than topk
    with pytest.raises(RuntimeError, match="fk::moe_permute_fp8: the padded segments need"):
        fk.moe_permute_fp8(_f(10, 4), rmap, pad_to=1, topk=1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck(layout):
    rmap, probs = routing(20, 6, 3, empty=(2,))
    x = randn(20, 200, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fk.moe_permute_fp8, (x, rmap, probs, 4, 90, layout, False))
    torch.library.opcheck(torch.ops.fk.moe_permute_fp8, (x, rmap, None, 16, 150, layout, True))


def test_torch_compile_fullgraph():
    def f(x, rmap, p):
        q, s, qt, st, pp, row_map, tpe = fk.moe_permute_fp8(x, rmap, p, pad_to=16, topk=2,
                                                            layout="both")
        return q.float() * s.t().repeat_interleave(128, 1)[:, :x.shape[1]], qt, st, pp, tpe

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for t in (11, 19):
        rmap, probs = routing(t, 6, 2, seed=t)
        x = randn(t, 130, seed=t)
        for a, b in zip(compiled(x, rmap, probs), f(x, rmap, probs)):
            same(a.float(), b.float())


# --- level 3: the CUDA kernels -------------------------------------------------------------

def _fp8_gpu():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def _need_fp8_gpu():
    if not _fp8_gpu():
        pytest.skip("no FP8 GPU (compute capability < 9.0)")


def _same_outputs(got, want):
    """Outputs as run() gives them, on any devices: the same values, shapes and dtypes."""
    for j, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), j
        if g is not None:  # values (a NaN's sign bit may differ)
            assert g.shape == w.shape and g.dtype == w.dtype, j
            same(g.cpu(), w.cpu())


CUDA_CASES = [
    # (T, E, H, k, pad_to)
    (1, 1, 1, 1, 1),
    (37, 10, 200, 3, 16),
    (300, 64, 1000, 8, 16),
    (513, 130, 2048, 8, 128),  # E not a power of two
    (1000, 300, 777, 16, 1),  # two passes of the scatter's 8 experts; expert block 1024
    (2048, 256, 2048, 8, 16),  # linghe's experts
    # aligned H not a multiple of 64: the column-wise copy alone's narrower tiles (COLS_TILE)
    # end in a partial one; segments of more than 128 rows
    (600, 8, 1040, 2, 4),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CUDA_CASES, ids=[str(c) for c in CUDA_CASES])
def test_cuda_matches_cpu(dtype, layout, case):
    """The CPU backend's values (itself checked against the reference above): with and
    without a bound (rows past the last segment), float32 probs and probs of the tokens'
    dtype, tokens aligned and not, special values, poisoned outputs."""
    t, e, h, k, pad_to = case
    rmap, probs = routing(t, e, k, device="cuda", empty=(0,) if e > 2 else (), seed=t)
    x = special_tokens(t, h, dtype).cuda() if t >= 3 and h > 256 else \
        randn(t, h, dtype=dtype, device="cuda", scale=3.0)
    if not _fp8_gpu():
        with pytest.raises(RuntimeError, match="compute capability 9.0 or newer"):
            fk.moe_permute_fp8(x, rmap, probs, pad_to, layout=layout)
        return
    for i, (xx, p, kw) in enumerate(((x, probs, {"topk": k}), (misaligned(x), probs.to(dtype), {}),
                                     (x, None, {"topk": k}))):
        pow2 = i == 1
        poison_cuda_cache()
        _same_outputs(run(xx, rmap, p, pad_to, layout, pow2, **kw),
                      run(xx.cpu(), rmap.cpu(), None if p is None else p.cpu(), pad_to, layout,
                          pow2, **kw))


@pytest.mark.cuda
def test_cuda_columnwise_rows_too_wide_for_narrow_tiles():
    """The column-wise copy alone of aligned rows that need more of its narrower tiles
    (COLS_TILE's 64 columns) than the grid's y dimension takes (65535): the launcher runs
    128-column tiles instead. Against the copy layout "both" writes, in 128-column tiles
    (its row-wise copy needs them), itself checked against the CPU backend at narrower rows
    above: the CPU backend takes half a minute at this width."""
    _need_fp8_gpu()
    h = 65535 * 64 + 16
    rmap, probs = routing(4, 2, 1, device="cuda")
    x = randn(4, h, dtype=torch.bfloat16, device="cuda", scale=3.0)
    both = run(x, rmap, probs, 4, "both")
    poison_cuda_cache()
    _same_outputs(run(x, rmap, probs, 4, "columnwise")[2:], both[2:])


@pytest.mark.cuda
def test_cuda_too_many_experts_and_errors():
    _need_fp8_gpu()
    rmap, _ = routing(64, 1025, 2, device="cuda")
    x = randn(64, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="at most 1024 experts on CUDA, got 1025"):
        fk.moe_permute_fp8(x, rmap, layout="both")
    q, s, *_ = fk.moe_permute_fp8(x, rmap)  # the row-wise copy has no limit
    rq, rs = fk.fp8_quantize(fk.moe_permute(x, rmap)[0])
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    for name, make, kw, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.moe_permute_fp8(*make(d), **kw), ("cpu", "cuda"),
                                msg)
        assert cpu == cuda, name


@pytest.mark.cuda
def test_cuda_graph_capture_with_a_bound():
    _need_fp8_gpu()
    rmap, probs = routing(64, 16, 4, device="cuda")
    xs = randn(64, 256, dtype=torch.bfloat16, device="cuda")
    fk.moe_permute_fp8(xs, rmap, probs, topk=4, layout="both")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = run(xs, rmap, probs, 16, "both", topk=4)
    xs.copy_(randn(64, 256, dtype=torch.bfloat16, device="cuda", seed=5))
    g.replay()
    torch.cuda.synchronize()
    n = fk.ops.moe_permute.moe_permute_bound(64, 16, 4)
    check(captured, ref_quantized(xs, rmap, probs, 16, "both", False, n))
