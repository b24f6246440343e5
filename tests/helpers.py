"""The one shared test helper: independent pure-torch references, tolerances, utilities.

The references here are written from the models' definitions (Hugging Face Llama / Gemma
RMSNorm, SwiGLU MLP), in float64 unless a casting mode says otherwise; they share no code
with fk's CPU backend.
"""
from __future__ import annotations

import importlib
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The variants' names of those dtypes (triton_src/_common.py DTYPES).
VARIANT_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

# Relative error bounds (||out - ref|| / ||ref||) for one rounding to the dtype, plus room
# for fp32 accumulation-order differences.
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out64.shape == ref64.shape, (out64.shape, ref64.shape)
    if torch.isnan(out64).any() or torch.isnan(ref64).any():
        same = torch.equal(torch.isnan(out64), torch.isnan(ref64))
        assert same, "NaN pattern differs"
        out64, ref64 = out64.nan_to_num(0.0), ref64.nan_to_num(0.0)
    denom = ref64.norm().item()
    num = (out64 - ref64).norm().item()
    return num / denom if denom > 0 else num


def assert_close(out, ref, dtype, factor=1.0, what="", scale=None, rounding=0):
    """Relative error within TOL[dtype] * factor. Where the result is a near-cancellation
    of larger terms (e.g. the input gradient of a norm over one element), pass the size of
    those terms as `scale`: the error is then measured against max(||ref||, scale).

    Where the exact result lies where `out`'s dtype has few bits (float16 subnormals: a
    vocabulary's probabilities times 1 / rows), no kernel can come closer than `ref` rounded to
    that dtype: `rounding=k` adds k times the error of that rounding to the tolerance (k = 2
    for a result rounded twice, e.g. a stored gradient scaled again in the backward)."""
    err = rel_err(out, ref)
    tol = TOL[dtype] * factor
    if rounding:
        tol += rounding * rel_err(round_nearest(ref.detach().double(), out.dtype), ref)
    if scale is not None:
        ref_norm = ref.detach().double().norm().item()
        if ref_norm > 0:
            err = err * ref_norm / max(ref_norm, scale)
        elif scale > 0:
            err = err / scale
        # (a zero reference with terms of size 0, e.g. dyt's alpha rounding to 0: the plain,
        # absolute error)
    assert err <= tol, f"{what} relative error {err:.3g} > {tol:.3g}"


def randn(*shape, dtype=torch.float32, device="cpu", scale=1.0, seed=None):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def error_lines(call, devices, match):
    """The first line of the RuntimeError that `call(device)` raises, for each device; each
    must match `match`. Backends are meant to agree on the text. "fake-cuda" runs the call on
    CUDA tensors under FakeTensorMode (what torch.compile traces)."""
    import pytest

    lines = []
    for device in devices:
        with pytest.raises(RuntimeError, match=match) as e:
            if device == "fake-cuda":  # the fake kernel, on tensors that claim a CUDA device
                from torch._subclasses.fake_tensor import FakeTensorMode
                with FakeTensorMode():
                    call("cuda")
            else:
                call(device)
        lines.append(str(e.value).splitlines()[0])
    return lines


# --- references -----------------------------------------------------------------------

def round_nearest(t, dtype):
    """fp32 -> dtype, round to nearest even: what GPUs and torch do."""
    return t.to(dtype)


def round_toward_zero(t, dtype):
    """fp32 -> dtype as Triton 3.6's interpreter converts: bfloat16 by dropping the low 16
    bits (round toward zero), other dtypes to nearest (tests/test_interpreter.py checks it).
    Level-1 tests pass it to the references so that both sides round alike."""
    if dtype != torch.bfloat16:
        return t.to(dtype)
    bits = t.to(torch.float32).contiguous().view(torch.int32) & -65536
    return bits.view(torch.float32).to(torch.bfloat16)


def ref_swiglu(a, b, cast=round_nearest, gate_multiplier=1.0, down_multiplier=1.0):
    """silu(a * gate_multiplier) * b * down_multiplier in float64, rounded once to a's dtype
    with `cast`."""
    a64, b64 = a.double() * gate_multiplier, b.double()
    out = a64 / (1 + torch.exp(-a64)) * b64 * down_multiplier
    return out.to(a.dtype) if a.dtype == torch.float64 else cast(out.float(), a.dtype)


def ref_gelu(a, approximate):
    """gelu from its definition: the tanh form (Gemma's gelu_pytorch_tanh) or exact (erf)."""
    if approximate == "tanh":
        return 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    return 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))


def ref_geglu(a, b, approximate, cast=round_nearest):
    """gelu(a) * b in float64, rounded once to a's dtype with `cast`."""
    out = ref_gelu(a.double(), approximate) * b.double()
    return out.to(a.dtype) if a.dtype == torch.float64 else cast(out.float(), a.dtype)


def ref_rms_norm(x, weight=None, eps=1e-6, offset=0.0, casting_mode="llama", cast=round_nearest):
    """RMSNorm as the models define it, computed in fp32 (fp64 for fp64 inputs) and rounded
    to x's dtype with `cast` where each model rounds:

    llama: HF LlamaRMSNorm: fp32 variance and normalisation, cast back to the input dtype,
           then multiplied by (offset + weight), which is formed in the weight's dtype.
    gemma: HF GemmaRMSNorm: everything in fp32, (offset + weight) in fp32, cast at the end.
    none:  rstd, the normalised x and (offset + weight) each rounded to the input dtype.
    A product of two bf16 / fp16 values is exact in fp32, so rounding it once equals the
    dtype's own multiply.
    """
    dtype = x.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def rnd(t):
        return t if dtype == torch.float64 else cast(t, dtype).to(acc)

    xf = x.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if casting_mode not in ("llama", "gemma", "none"):
        raise ValueError(casting_mode)
    if casting_mode == "none":
        rstd = rnd(rstd)
    y = xf * rstd
    if casting_mode != "gemma":
        y = rnd(y)
    if weight is not None:
        wp = offset + weight.to(acc)
        y = y * (wp if casting_mode == "gemma" else rnd(wp))
    return y.to(dtype) if dtype == torch.float64 else cast(y, dtype)


def ref_grads(fn, inputs, grad_out):
    """Gradients of fn at inputs via autograd on float64 copies."""
    leaves = [t.detach().double().requires_grad_(t.requires_grad) if t is not None else None
              for t in inputs]
    out = fn(*leaves)
    out.backward(grad_out.double())
    return [l.grad if l is not None and l.requires_grad else None for l in leaves]


def assert_quantized_near(data, scales, ref, rel, pow2, subnormal_ulps=0.5, absolute=0.0):
    """1 x 128 row blocks (data, scales) of a float x that is within ``rel`` (relative, per
    element) of the float64 ``ref``, where x itself is not known bit for bit (a GPU's fp32
    math): scales within rel of ref's (within a factor 2 for pow2 scales, whose rounding up
    may land either side of a power of two) and every element within half an e4m3 ulp of its
    scaled value (max(|q| 2^-4, 2^-10)) plus rel, plus 2^-22 |ref| + 2^-20 s for the float32
    product x * (1 / s) the format rounds before the float8 rounding. ``subnormal_ulps``: the
    float8 subnormal spacings (2^-9 s) allowed where x has no relative accuracy (x near a
    zero of a function whose terms cancel there); half of one by default. ``absolute``: an
    error allowed besides (each element's, and absolute / 448 each scale's), for an x rounded
    to a dtype before it was quantized where that rounding is absolute (half the spacing of
    float16's subnormals, 2^-25, below 2^-14)."""
    ref = ref.double().cpu()
    s_ref = ref_quantize_rows(ref, pow2)[1].double()
    s = scales.double().cpu()
    ratio = s / s_ref
    if pow2:
        assert ((ratio >= 0.5) & (ratio <= 2)).all()
    elif ref.shape[1] > 1:
        excess = (s - s_ref).abs() - (rel * s_ref + absolute / 448)
        worst = excess.argmax()
        assert (excess <= 0).all(), (f"scale {s.flatten()[worst].item():.6g} against "
                                     f"{s_ref.flatten()[worst].item():.6g}")
    # (Blocks of one element, e.g. the column-wise copy of a single row: each scale is that
    # element's own magnitude, which has no relative accuracy near a zero of a function whose
    # terms cancel there, as dx of SiLU does; the element check below bounds it.)
    out = ref_dequantize(data.cpu(), scales.cpu(), (1, 128))
    s_full = s.t().repeat_interleave(128, dim=1)[:, :ref.shape[1]]
    bound = torch.maximum(ref.abs() * 2.0 ** -4, s_full * 2.0 ** -9 * subnormal_ulps) * \
        (1 + rel) + \
        ref.abs() * (rel + 2.0 ** -22) + s_full * 2.0 ** -20 + absolute
    assert ((out - ref).abs() <= bound).all(), ((out - ref).abs() - bound).max()


def check_compile_matches_eager(f, make_args, sizes=(5, 9), factor=10):
    """torch.compile(f, fullgraph=True, dynamic=True) against f in eager mode, for the
    arguments make_args(size) of each size (a list; those that require grad are compared by
    their gradients too): the loss f returns and its gradients, float32 tolerances x factor."""
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for size in sizes:
        args = make_args(size)
        eager_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out, ref = compiled(*args), f(*eager_args)
        assert_close(out, ref, torch.float32, factor=factor)
        out.backward()
        ref.backward()
        for a, b in zip(args, eager_args):
            if a.requires_grad:
                assert_close(a.grad, b.grad, torch.float32, factor=factor)
def ref_rms_norm_grads(x, w, dy, eps, offset, mode, cast=round_nearest):
    """float64 gradients of the reference. dx: the derivative of the fp32 formula (rounding
    to the dtype passes gradients through unchanged). dw: sum over rows of dy times the
    normalized x the forward multiplied the weight with, rounded as the mode rounds it (with
    `cast`)."""
    inputs = [x.detach().requires_grad_(), None]
    gx = ref_grads(lambda x_, w_: ref_rms_norm(x_, None if w is None else w.detach().double(),
                                               eps, offset, "gemma"), inputs, dy)[0]
    if w is None:
        return gx, None
    if mode == "gemma":
        xd = x.detach().double()
        xh = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    else:
        xh = ref_rms_norm(x.detach(), None, eps, 0.0, mode, cast=cast).double()
    gw = (dy.double() * xh).reshape(-1, x.shape[-1]).sum(0)
    return gx, gw


# --- Triton sources under the interpreter ---------------------------------------------

def load_triton_src(op: str):
    """Import triton_src/<op>.py; tests/conftest.py sets TRITON_INTERPRET=1 for the run, so
    its kernels execute on the CPU."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under pytest (tests/conftest.py)"
    src = os.path.join(ROOT, "triton_src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return importlib.import_module(op)


# --- CUDA -------------------------------------------------------------------------------

def poison_cuda_cache(nbytes: int = 1 << 28):
    """Fill a large block of the caching allocator with NaN and free it, so that outputs
    allocated next reuse NaN-filled memory: an element a kernel fails to write shows."""
    t = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(float("nan"))
    del t


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of t whose data pointer is 2 bytes past a 16-byte boundary (same values)."""
    flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    view = flat[1:1 + t.numel()].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


# --- blockwise FP8 (fk.fp8_quantize, fk.rms_norm_fp8): the format of
# python/fk/ops/fp8_quantize.py, in float64 -------------------------------------------------

def ref_scales(amax, pow2):
    """float32 scales of blocks with float64 absolute maxima ``amax`` (NaN read as inf):
    amax / 448 rounded once to float32 (a float64 quotient of float32 values rounds to the
    correctly rounded float32 quotient) and at least 2^-126, 1 for 0, up to a power of two
    when pow2, NaN for inf."""
    s = (amax / 448.0).float().double().clamp(min=2.0 ** -126)
    s = torch.where(amax == 0, torch.ones_like(s), s)
    if pow2:
        mant, exp = torch.frexp(s)
        s = torch.where(mant == 0.5, s, torch.ldexp(torch.ones_like(s), exp))
    return torch.where(amax == math.inf, torch.full_like(s, math.nan), s).float()


def ref_reciprocal(s):
    """1 / s rounded once to float32, as float64 (the float64 quotient of 1 by a float32
    rounds to the correctly rounded float32 one); x * it in float64 is exact for float32 x,
    so the float32 cast of the product is the correctly rounded float32 product."""
    return (1.0 / s.double()).float().double()


def ref_quantize_rows(x, pow2):
    """1 x 128 blocks along the rows of a 2-D x: (q before the float8 cast, as float32;
    scales (ceil(K / 128), M))."""
    m, k = x.shape
    nk = cdiv(k, 128)
    xp = torch.zeros(m, nk * 128, dtype=torch.float64)
    xp[:, :k] = x.double()
    a = xp.abs().reshape(m, nk, 128)
    amax = torch.where(torch.isnan(a), math.inf, a).amax(dim=2)
    s = ref_scales(amax, pow2)
    q = (xp.reshape(m, nk, 128) * ref_reciprocal(s)[:, :, None]).float().clamp(-448, 448)
    return q.reshape(m, nk * 128)[:, :k], s.t().contiguous()


def ref_quantize_tiles(x, pow2):
    """128 x 128 blocks: (q before the cast, scales (ceil(M / 128), ceil(K / 128)))."""
    m, k = x.shape
    nm, nk = cdiv(m, 128), cdiv(k, 128)
    xp = torch.zeros(nm * 128, nk * 128, dtype=torch.float64)
    xp[:m, :k] = x.double()
    a = xp.abs().reshape(nm, 128, nk, 128)
    amax = torch.where(torch.isnan(a), math.inf, a).amax(dim=(1, 3))
    s = ref_scales(amax, pow2)
    q = (xp.reshape(nm, 128, nk, 128) * ref_reciprocal(s)[:, None, :, None]).float()
    q = q.clamp(-448, 448)
    return q.reshape(nm * 128, nk * 128)[:m, :k], s


def ref_quantize_segments(x, counts, pow2):
    """The column-wise copy of x (M, K) quantized per segment of ``counts`` consecutive rows
    (the MoE ops' layout, python/fk/ops/fp8_quantize.py): (qt (K, M) before the cast, zero
    in the columns of rows after the last segment; st ((M + 127 E) // 128, K), segment e's
    blocks in its rows blk_e .., 1.0 in the rows past the last block)."""
    m, k = x.shape
    qt = torch.zeros(k, m)
    st = torch.ones((m + 127 * len(counts)) // 128, k)
    off = blk = 0
    for c in counts:
        if c:
            qt[:, off:off + c], st[blk:blk + cdiv(c, 128)] = ref_quantize_rows(x[off:off + c].t(),
                                                                               pow2)
        off, blk = off + c, blk + cdiv(c, 128)
    return qt, st


def ref_segment_blocks(counts, m, rows):
    """The (rows, 3) table of _common.segment_blocks_kernel, by walking the segments: each
    128-row block of each segment (negative counts as 0) as (first row, end row, expert), in
    order; then blocks past the last one, 128 rows apart from the segments' end, with no rows
    (end = that end) and expert E; rows end at m at most."""
    table, start = [], 0
    for e, c in enumerate(counts):
        c = max(int(c), 0)
        table += [(start + 128 * j, min(start + c, m), e) for j in range(cdiv(c, 128))]
        start += c
    blocks = len(table)
    table += [(start + 128 * (rb - blocks), min(start, m), len(counts))
              for rb in range(blocks, rows)]
    return torch.tensor(table[:rows], dtype=torch.int64).reshape(-1, 3)


def interp_segment_blocks(mod, tpe, m, rows, e_block=None, rb=4):
    """_common.segment_blocks_kernel's table for the counts tpe (through an op source that
    imports the kernel, under the interpreter): the MoE FP8 tile kernels' blocks. E_BLOCK
    the smallest power of two >= E unless given."""
    e_block = e_block or max(2, 1 << (len(tpe) - 1).bit_length())
    table = torch.full((rows, 3), -7, dtype=torch.int64)
    mod.segment_blocks_kernel[(cdiv(rows, rb),)](tpe, table, len(tpe), m, rows, E_BLOCK=e_block,
                                                 RB=rb)
    return table


def ref_quantize(x, block, pow2):
    """(q, s, qt, st) before the float8 cast, every layout."""
    if block == (1, 128):
        return (*ref_quantize_rows(x, pow2), *ref_quantize_rows(x.t(), pow2))
    q, s = ref_quantize_tiles(x, pow2)
    return q, s, q.t(), s.t()


def ref_dequantize(q, s, block):
    r, c = q.shape
    if block == (1, 128):
        full = s.double().t().repeat_interleave(128, dim=1)[:, :c]
    else:
        full = s.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:r, :c]
    return q.double() * full


def same(out, ref):
    """Equal values, NaN where the reference has NaN."""
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=0, equal_nan=True)


def packed_same(launch, m, k, want_row, weight=False):
    """An FP8 kernel's PACKED path (the column-wise copy stored as 32-bit words) against its
    plain path: runs ``launch(packed, q, s, qt, st)`` with PACKED 0 and 1 (float8 outputs of
    an (m, k) matrix, scales pre-filled with -1: 1 x 128 blocks' or, with ``weight``,
    128 x 128 blocks') and checks that both write the same bytes and scales, and every
    row-wise scale when ``want_row`` (none otherwise); returns what ``launch`` gave back, per
    run."""
    got, extra = [], []
    for packed in (0, 1):
        q = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
        qt = torch.zeros(k, m, dtype=torch.float8_e4m3fn)
        if weight:
            s = torch.full((cdiv(m, 128), cdiv(k, 128)), -1.0)
            st = torch.full((cdiv(k, 128), cdiv(m, 128)), -1.0)
        else:
            s, st = torch.full((cdiv(k, 128), m), -1.0), torch.full((cdiv(m, 128), k), -1.0)
        extra.append(launch(packed, q, s, qt, st))
        got.append([q.view(torch.uint8), s.view(torch.int32), qt.view(torch.uint8),
                    st.view(torch.int32)])  # bit patterns: NaN scales compare equal
    for a, b in zip(*got):
        assert torch.equal(a, b)
    unwritten = got[1][1] == torch.tensor(-1.0).view(torch.int32)
    assert not unwritten.any() if want_row else unwritten.all()
    return extra


def fixed_copies_same(launch, flags):
    """A quantizing kernel's variant with its copies fixed at compile time (constexpr COPIES,
    _common.COPIES_*) writes what the same kernel writes reading them from its arguments.
    ``flags`` maps each argument a variant may fix to the value it fixes it to;
    ``launch(args, fixed)`` runs the kernel with those arguments and returns its outputs
    (pre-filled). The fixed run gets every argument flipped, so a variant that read one would
    write something else; compared as bits."""
    got = [launch({a: 1 - v for a, v in flags.items()}, True), launch(dict(flags), False)]
    for a, b in zip(*got):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# --- MoE routing (fk.moe_permute, fk.moe_permute_fp8): the row map of
# python/fk/ops/moe_permute.py, through argsort and index_select ------------------------------

def routing(t, e, k, device="cpu", empty=(), seed=0, dtype=torch.bool):
    """A top-k routing map (T, E) with the experts in `empty` given no token, and probs."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g)
    if empty:
        logits[:, list(empty)] = -float("inf")
    k = min(k, e - len(empty))
    idx = logits.topk(k, dim=1).indices if k > 0 else torch.empty(t, 0, dtype=torch.long)
    m = torch.zeros(t, e, dtype=torch.bool)
    m.scatter_(1, idx, True)
    probs = torch.softmax(torch.randn(t, e, generator=g), dim=1)
    return m.to(device=device, dtype=dtype), probs.to(device)


def interp_row_map(rmap, pad_to, n=None, extra_rows=0, multiple=1, bt=8, be=4, nbb=2,
                   be_scan=2):
    """moe_permute's three map kernels (count, scan, map) under the interpreter, the scan over
    its own expert chunks (be_scan) as the library's is; outputs poisoned first. The rows N
    are n, or the padded segments' total plus extra_rows rounded up to a multiple. Returns
    (tokens_per_expert, row_map, src, N), after checking the flag of the device-side
    assert."""
    mod = load_triton_src("moe_permute")
    t, e = rmap.shape
    nb, ne = cdiv(t, bt), cdiv(e, be)
    blk = torch.full((nb, e), -7, dtype=torch.int32)
    mod.moe_permute_count_kernel[(nb, ne)](rmap, blk, t, e, BT=bt, BE=be)
    tpe = torch.full((e,), -7, dtype=torch.int32)
    mod.moe_permute_scan_kernel[(cdiv(e, be_scan),)](blk, tpe, nb, e, pad_to, NBB=nbb,
                                                     BE=be_scan)
    if n is None:
        n = int(tpe.sum()) + extra_rows
        n += -n % multiple
    row_map = torch.full((t, e), -9, dtype=torch.int32)
    src = torch.full((n,), -1, dtype=torch.int32)
    ok = torch.full((), -9, dtype=torch.int8)
    mod.moe_permute_map_kernel[(nb, ne)](rmap, blk, tpe, row_map, src, ok, t, e, n, BT=bt,
                                         BE=be)
    assert int(ok) == int(int(tpe.sum()) <= n)  # the flag of the device-side assert
    return tpe, row_map, src, n


def ref_row_map(routing_map, pad_to):
    """(row_map (T, E) int64, -1 where not routed; padded counts (E,); routed pairs
    (tokens, experts, rows) in expert-major order), from a stable argsort of the routed
    pairs by expert."""
    mask = routing_map.cpu() != 0
    t, e = mask.shape
    counts = mask.sum(0)
    padded = (counts + pad_to - 1) // pad_to * pad_to
    starts = torch.cumsum(padded, 0) - padded
    firsts = torch.cumsum(counts, 0) - counts
    key = torch.arange(e).repeat(t, 1)  # key[t, e] = e
    key = torch.where(mask, key, e).t().reshape(-1)  # expert-major, tokens increasing
    order = torch.argsort(key, stable=True)[: int(counts.sum())]
    ex, tok = order // t, order % t
    rows = starts[ex] + torch.arange(len(order)) - firsts[ex]
    row_map = torch.full((t, e), -1, dtype=torch.int64)
    row_map[tok, ex] = rows
    return row_map, padded, tok, ex, rows


def ref_permute(tokens, routing_map, probs=None, pad_to=16, num_out_rows=None):
    """(permuted, permuted_probs, row_map, tokens_per_expert) through index_select; in the
    inputs' dtype, differentiable (float64 inputs give float64 gradients)."""
    row_map, padded, tok, ex, rows = ref_row_map(routing_map, pad_to)
    n = int(padded.sum()) if num_out_rows is None else num_out_rows
    dev = tokens.device
    rows_d = rows.to(dev)
    permuted = tokens.new_zeros((n, tokens.shape[1])).index_put(
        (rows_d,), tokens.index_select(0, tok.to(dev)))
    pp = None
    if probs is not None:
        flat = (tok * routing_map.shape[1] + ex).to(dev)
        pp = probs.new_zeros((n,)).index_put((rows_d,), probs.reshape(-1).index_select(0, flat))
    return permuted, pp, row_map, padded



# --- cross entropy (fk.cross_entropy, fk.fused_linear_cross_entropy) ---------------------

def ref_cross_entropy(logits, target, weight=None, ignore_index=-100, label_smoothing=0.0,
                      reduction="mean", lse_square_scale=0.0, softcap=None, token_scaling=False):
    """(loss, z_loss) in float64: torch's F.cross_entropy of the softcapped logits
    (softcap * tanh(logits / softcap)), plus the z-loss lse_square_scale * logsumexp^2 of
    each non-ignored row, summed, averaged over non-ignored rows ("mean") or per row.
    token_scaling: each row's loss and z-loss times its softmax probability of the target,
    detached; the mean's denominators stay the (weighted) counts of non-ignored rows."""
    import torch.nn.functional as F

    x = logits.double()
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    keep = target != ignore_index
    z = torch.where(keep, lse_square_scale * torch.logsumexp(x, -1) ** 2, 0.0)
    w = None if weight is None else weight.double()
    if token_scaling:
        ce = F.cross_entropy(x, target, w, ignore_index=ignore_index,
                             label_smoothing=label_smoothing, reduction="none")
        y = torch.where(keep, target, 0)
        p = torch.softmax(x.detach(), -1).gather(1, y[:, None])[:, 0]
        ce, z = ce * p, z * p
        if reduction == "none":
            return ce + z, z
        if reduction == "mean":
            den = keep.sum() if w is None else w[y][keep].sum()
            ce, z = ce.sum() / den, z.sum() / keep.sum()
        else:
            ce, z = ce.sum(), z.sum()
        return ce + z, z
    ce = F.cross_entropy(x, target, w, ignore_index=ignore_index,
                         label_smoothing=label_smoothing, reduction=reduction)
    if reduction == "none":
        return ce + z, z
    z = z.sum() if reduction == "sum" else z.sum() / keep.sum()
    return ce + z, z


def ref_token_accuracy(logits, target, ignore_index=-100, reduction="mean", softcap=None):
    """(token_accuracy, predicted_tokens) in plain torch: the argmax of each row of the
    softcapped logits in float32 (torch.argmax: the first maximum), -100 for ignored rows;
    per row 1.0 / 0.0 for "none", else the fraction of non-ignored rows predicted right."""
    x = logits.float()
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    keep = target != ignore_index
    pred = torch.where(keep, x.argmax(-1), -100)
    right = ((pred == target) & keep).float()
    if reduction == "none":
        return right, pred
    return right.sum() / keep.sum().float(), pred


def ref_fused_linear_cross_entropy(x, weight, target, bias=None, ce_weight=None, **kwargs):
    """ref_cross_entropy of the logits x @ weight^T + bias, formed in float64 and rounded to
    x's dtype (as a matmul with float32 accumulation returns them); differentiable."""
    logits = x.double() @ weight.double().t()
    if bias is not None:
        logits = logits + bias.double()
    if x.dtype != torch.float64:
        logits = logits.to(x.dtype).double()
    return ref_cross_entropy(logits, target, ce_weight, **kwargs)


# --- Hugging Face models for fk.transformers ----------------------------------------------

HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma",
                  "gemma2", "gemma3_text", "phi3", "olmo2", "granite")
# More model types apply_fk patches: LayerNorm models (OLMo, Phi, StarCoder 2, Cohere),
# interleaved rotary (GLM, ERNIE 4.5, Cohere), non-gated MLPs left unpatched (Phi, StarCoder 2).
HF_MORE_MODEL_TYPES = ("glm", "glm4", "olmo", "olmo3", "smollm3", "phi", "starcoder2", "cohere",
                       "cohere2", "exaone4", "ernie4_5", "hunyuan_v1_dense", "seed_oss",
                       "gpt_oss", "deepseek_v3", "granitemoe", "qwen3_next", "falcon_h1",
                       "llama4_text")

# What makes each model type differ from Llama, switched on in its tiny config so that the
# tests exercise it: MoE experts and the router loss, q/k norms, softcapping, partial rotary,
# Granite's multipliers.
_HF_EXTRA = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                    router_aux_loss_coef=0.02),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                      mlp_only_layers=[1], output_router_logits=True, router_aux_loss_coef=0.02),
    "gemma2": dict(final_logit_softcapping=5.0, attn_logit_softcapping=50.0,
                   query_pre_attn_scalar=16, sliding_window=8),
    "gemma3_text": dict(final_logit_softcapping=5.0, query_pre_attn_scalar=16, sliding_window=8),
    "phi3": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.5}),
    "granite": dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5,
                    attention_multiplier=0.2),
    "olmo": dict(clip_qkv=2.0),
    "olmo3": dict(sliding_window=8),
    "smollm3": dict(no_rope_layers=[1, 0]),
    "phi": dict(qk_layernorm=True),
    "cohere": dict(use_qk_norm=True, logit_scale=0.5),
    "cohere2": dict(logit_scale=0.5, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"]),
    "exaone4": dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    # dropout off by default (its tests switch it on with a seeded generator)
    "seed_oss": dict(attention_dropout=0.0, residual_dropout=0.0),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                    router_aux_loss_coef=0.02, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"]),
    # MLA with q_lora (q_a_layernorm), one dense layer then one MoE layer with a shared expert
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                        first_k_dense_replace=1, n_group=1, topk_group=1),
    # (its router loss is off: transformers 5.17's GraniteMoe records no router logits, and
    # its forward fails with output_router_logits=True)
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=False,
                       router_aux_loss_coef=0.02, logits_scaling=4.0,
                       embedding_multiplier=2.0, residual_multiplier=0.5,
                       attention_multiplier=0.2),
    # one gated delta-net layer, one full-attention layer
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=48,
                       shared_expert_intermediate_size=48, output_router_logits=True,
                       router_aux_loss_coef=0.02, linear_num_value_heads=4,
                       linear_num_key_heads=2, linear_key_head_dim=16,
                       linear_value_head_dim=16),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
                      mamba_d_state=16, mamba_chunk_size=8, mlp_multipliers=[0.7, 1.3],
                      lm_head_multiplier=0.5, key_multiplier=0.8, embedding_multiplier=1.5),
    # MoE on both layers (shared expert + 4 routed), rotary and q / k L2 norms on layer 0,
    # NoPE (with temperature tuning) on layer 1
    "llama4_text": dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=96,
                        no_rope_layers=[1, 0], use_qk_norm=True, attention_chunk_size=8,
                        floor_scale=4, bos_token_id=None, eos_token_id=None),
}


def tiny_hf_model(model_type, dtype=torch.float32, seed=0, **overrides):
    """A randomly initialised ``...ForCausalLM`` of ``model_type`` with a few thousand
    parameters (2 layers, hidden 64, 4 heads of 16, 2 kv heads, vocab 96), eager attention."""
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING
    kw = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              tie_word_embeddings=False, pad_token_id=0)
    if model_type != "phi3":
        kw["head_dim"] = 16
    kw.update(_HF_EXTRA.get(model_type, {}))
    kw.update(overrides)
    config = CONFIG_MAPPING[model_type](**kw)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    # Initialised in float32, then cast: torch's float32 random streams are the same in every
    # version, its bfloat16 ones are not (2.13 changed them), and the tests compare runs from
    # these weights against tolerances measured on them.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Norm weights start at 1 (Gemma's at 0): perturb them so that their gradients and the
    # per-element scaling are exercised.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.to(dtype)


# --- Jensen-Shannon divergence (fk.jsd) ----------------------------------------------------

def ref_jsd(log_q, log_p, shift_labels=None, beta=0.5, ignore_index=-100):
    """Generalized JSD in float64, as Liger Kernel defines it: with q = exp(log_q) (student)
    and p = exp(log_p) (teacher), m = beta p + (1 - beta) q, per row beta KL(p || m) +
    (1 - beta) KL(q || m); beta = 0 is KL(p || q) and beta = 1 is KL(q || p). Rows whose
    label is ignore_index are left out; the sum over the other rows is divided by their
    number (0 when there are none)."""
    x, y = log_q.double(), log_p.double()
    q, p = x.exp(), y.exp()
    if beta == 0:
        per = p * (y - x)
    elif beta == 1:
        per = q * (x - y)
    else:
        log_m = torch.log(beta * p + (1 - beta) * q)
        per = beta * p * (y - log_m) + (1 - beta) * q * (x - log_m)
    rows = per.sum(-1)
    if shift_labels is None:
        keep = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    else:
        keep = shift_labels.to(x.device) != ignore_index
    total = torch.where(keep, rows, torch.zeros_like(rows)).sum()
    return total / keep.sum().clamp(min=1)


# --- several processes (torch.distributed) ------------------------------------------------

def distributed_params():
    """pytest params (each a ``(backend, device)`` pair) of the multi-process tests: gloo on CPU, and NCCL
    on CUDA (marker cuda; skipped where fewer than 2 GPUs are visible)."""
    import pytest
    two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
    return [pytest.param(("gloo", "cpu"), id="gloo-cpu"),
            pytest.param(("nccl", "cuda"), id="nccl-cuda", marks=(pytest.mark.cuda, two_gpus))]


def _distributed_worker(rank, fn, world_size, backend, device, init_file, out_dir, args):
    import datetime
    import torch.distributed as dist
    torch.set_num_threads(1)  # the processes share the machine's cores
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method="file://" + init_file, rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        result = fn(rank, world_size, torch.device(device, rank) if device == "cuda"
                    else torch.device(device), *args)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_distributed(fn, *args, world_size=2, backend="gloo", device="cpu"):
    """``fn(rank, world_size, device, *args)`` in ``world_size`` new processes joined in one
    process group (rendezvous through a file: no port to pick). ``fn`` must be a module-level
    function (the processes import it); its results (anything ``torch.save`` takes, on the
    CPU) come back as a list, one per rank. A failure in any process raises here."""
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="fk-dist-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.spawn(_distributed_worker, nprocs=world_size, join=True,
                 args=(fn, world_size, backend, device, init_file, tmp, args))
        return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False)
                for r in range(world_size)]


# Tiny sizes for any causal-LM config: each name that the model type's config has is set.
_TINY_CONFIG = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
    moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
    num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=16,
    qk_nope_head_dim=8, v_head_dim=16, n_embd=32, n_layer=1, n_head=2, n_positions=64,
    n_inner=64, d_model=32, ffn_dim=64, num_layers=1, num_heads=2, d_ff=64, d_kv=16,
    decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64, encoder_layers=1,
    encoder_attention_heads=2, encoder_ffn_dim=64, embedding_size=32, rotary_dim=8,
    hidden_dim=32, n_positions_max=64, max_seq_len=64, max_sequence_length=64,
    vocab_size_per_layer_input=64, hidden_size_per_layer_input=8, n_heads=2, n_layers=1,
    # state-space and linear-attention layers
    mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=8,
    ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=16, n_groups=1, chunk_size=8,
    moe_shared_expert_intermediate_size=32, linear_head_dim=16, linear_num_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=1,
    linear_num_value_heads=2, pad_token_id=0,
    bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def _tiny_kwargs(default, layers):
    kw = {k: v for k, v in _TINY_CONFIG.items() if k in default}
    if "qk_rope_head_dim" in default:  # multi-head latent attention: head_dim is the rope part
        kw.pop("head_dim", None)
    for name in ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers"):
        if name in kw:
            kw[name] = layers
    return kw


def tiny_causal_lm(model_type, seed=0):
    """A randomly initialised float32 ``AutoModelForCausalLM`` of any model type, built from
    its default config with every size the config has made tiny (1 layer, or 2 where the
    config wants more, hidden 32, vocab 64), eager attention where the model has it, no
    cache, and 1-D parameters perturbed (so that norm weights are not all ones). Raises
    whatever the model's construction raises."""
    from transformers import AutoModelForCausalLM, CONFIG_MAPPING
    cls = CONFIG_MAPPING[model_type]
    default = cls().to_dict()
    for layers in (1, 2):
        kw = _tiny_kwargs(default, layers)
        for sub in ("text_config", "decoder"):  # composite configs: the language model's
            if isinstance(default.get(sub), dict):
                kw[sub] = _tiny_kwargs(default[sub], layers)
        try:
            config = cls(**kw)
            break
        except Exception:
            if layers == 2:
                raise
    config._attn_implementation = "eager"
    config.use_cache = False
    with torch.device("meta"):  # sizes the config does not name stay at their defaults
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > 5_000_000:
        raise ValueError(f"not tiny: {size} parameters at the tiny sizes")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


# --- cross entropy test inputs (cross_entropy, vocab_parallel_cross_entropy) ----------------

# Option sets: (class weights?, label_smoothing, lse_square_scale, softcap)
CE_OPTIONS = {
    "plain": (False, 0.0, 0.0, None),
    "zloss": (False, 0.0, 1e-2, None),
    "weight": (True, 0.0, 0.0, None),
    "smooth": (False, 0.1, 0.0, None),
    "weight_smooth_z": (True, 0.2, 1e-3, None),
    "softcap": (False, 0.0, 0.0, 4.0),
    "all": (True, 0.1, 1e-2, 3.0),
}


def ce_inputs(n, v, dtype=torch.float32, device="cpu", ignore=(1,), seed=0, scale=3.0):
    """(logits (n, v) * scale, targets with the rows `ignore` at -100, class weights)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=g) * scale).to(device=device, dtype=dtype)
    t = torch.randint(0, v, (n,), generator=g)
    for i in ignore:
        if i < n:
            t[i] = -100
    w = (torch.rand(v, generator=g) + 0.5).to(device)
    return x, t.to(device), w


def ce_kwargs(option, w, reduction):
    """The keyword arguments of a CE_OPTIONS option set."""
    has_w, ls, s, cap = CE_OPTIONS[option]
    return dict(weight=w if has_w else None, label_smoothing=ls, reduction=reduction,
                lse_square_scale=s, softcap=cap)
