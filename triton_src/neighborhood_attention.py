"""1-D neighborhood attention over the sequence, flash-attention style over the window only.

Query i of a (batch, head) attends the keys j with |j - i| <= radius * dilation,
(j - i) % dilation == 0 and 0 <= j < L (radius = kernel_size // 2; windows are cut at the
sequence ends). Positions of one residue rho = i % dilation only see each other, so the
kernels work on "sub-sequences": sub-index t of residue rho is row rho + t * dilation, and
within a sub-sequence the window is |s - t| <= radius, dilation 1. A block of BLOCK_M
consecutive sub-indices [m0, m0 + BLOCK_M) needs the keys [m0 - radius, m0 + BLOCK_M +
radius), whatever the dilation: the work per query is O(BLOCK_M + 2 * radius), never O(L).

Programs: one per (batch * head, residue, block of the sub-sequence), flattened into one grid
axis in that order (neighbouring blocks of one residue run next to each other and share their
keys in L2).

Kernels (scores and probabilities only ever exist as one (BLOCK_M, BLOCK_N) tile on chip):
  na_fwd_kernel      per query block: online softmax (exp2, fp32) over the window's key
                     blocks; writes out (contiguous (B, H, L, D)) and the per-row logsumexp
                     (fp32, natural log) for the backward.
  na_bwd_dq_kernel   per query block: delta = rowsum(dO * O) (written for the next kernel),
                     P recomputed from the logsumexp, dS = P * (dO V^T - delta),
                     dQ = scale * dS K.
  na_bwd_dkv_kernel  per key block, over the query blocks whose windows reach it:
                     dV = P^T dO, dK = scale * dS^T Q. No atomics: every output row is
                     written once by the program that owns it.
q, k, v and dO take any batch / head / row strides (unit stride along D, every stride and D a
multiple of 16, 16-byte aligned pointers: the variants are built with those hints); out,
lse, delta and the gradients are contiguous. Head dims between the buckets (80, 96, 112)
are masked up to BLOCK_D.
fp32 inputs use IEEE fp32 dot products; bf16 / fp16 use tensor cores with fp32 accumulation.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# Running-max start: finite, so that a row whose first key blocks are all outside its window
# keeps alpha = exp2(0) = 1 instead of exp2(-inf + inf).
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _dot(a, b, acc):
    """acc + a @ b in fp32: IEEE fp32 products for fp32 operands, tensor cores otherwise."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _locate(pid, H, L, dilation, BLOCK: tl.constexpr):
    """(batch, head, residue, first sub-index of the block, sub-sequence length) of a
    program of the flattened (batch * head, residue, block) grid."""
    n_sub = tl.cdiv(L, dilation)
    nb = tl.cdiv(n_sub, BLOCK)
    per_bh = nb * dilation
    bh = pid // per_bh
    rest = pid % per_bh
    rho = rest // nb
    start = (rest % nb) * BLOCK
    sub_len = (L - rho + dilation - 1) // dilation
    return bh // H, bh % H, bh, rho, start, sub_len


@triton.jit
def _tile(ptr, rows, row_stride, mask_r, cols, D):
    """A (rows, BLOCK_D) tile; rows are int64 element offsets' row numbers."""
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :],
                   mask=mask_r[:, None] & (cols < D)[None, :], other=0.0)


@triton.jit
def na_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                  q_sb, q_sh, q_sl, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl,
                  H, L, D, radius, dilation, qk_scale,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    dtype = o_ptr.dtype.element_ty
    b, h, bh, rho, m0, sub_len = _locate(tl.program_id(0), H, L, dilation, BLOCK_M)
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    t = m0 + tl.arange(0, BLOCK_M)
    t_mask = t < sub_len
    q_rows = rho + t.to(tl.int64) * dilation
    q = _tile(q_ptr + b * q_sb + h * q_sh, q_rows, q_sl, t_mask, cols, D)
    k_base = k_ptr + b * k_sb + h * k_sh
    v_base = v_ptr + b * v_sb + h * v_sh

    m_i = tl.full((BLOCK_M,), NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    lo = tl.maximum(m0 - radius, 0)
    hi = tl.minimum(m0 + BLOCK_M + radius, sub_len)
    for n0 in range(lo, hi, BLOCK_N):
        s_idx = n0 + tl.arange(0, BLOCK_N)
        s_mask = s_idx < hi
        kv_rows = rho + s_idx.to(tl.int64) * dilation
        k = _tile(k_base, kv_rows, k_sl, s_mask, cols, D)
        s = _dot(q, tl.trans(k), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32))
        diff = s_idx[None, :] - t[:, None]
        inside = (diff <= radius) & (diff >= -radius) & s_mask[None, :]
        s = tl.where(inside, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _tile(v_base, kv_rows, v_sl, s_mask, cols, D)
        acc = _dot(p.to(dtype), v, acc * alpha[:, None])
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_base = o_ptr + bh.to(tl.int64) * L * D
    tl.store(o_base + q_rows[:, None] * D + cols[None, :], out.to(dtype),
             mask=t_mask[:, None] & (cols < D)[None, :])
    lse = (m_i + tl.log2(l_safe)) * LN2
    tl.store(lse_ptr + bh.to(tl.int64) * L + q_rows, lse, mask=t_mask)


@triton.jit
def na_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                     q_sb, q_sh, q_sl, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl,
                     do_sb, do_sh, do_sl,
                     H, L, D, radius, dilation, qk_scale, scale,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    dtype = dq_ptr.dtype.element_ty
    b, h, bh, rho, m0, sub_len = _locate(tl.program_id(0), H, L, dilation, BLOCK_M)
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    t = m0 + tl.arange(0, BLOCK_M)
    t_mask = t < sub_len
    q_rows = rho + t.to(tl.int64) * dilation
    q = _tile(q_ptr + b * q_sb + h * q_sh, q_rows, q_sl, t_mask, cols, D)
    do = _tile(do_ptr + b * do_sb + h * do_sh, q_rows, do_sl, t_mask, cols, D)
    o_base = o_ptr + bh.to(tl.int64) * L * D
    o = _tile(o_base, q_rows, D, t_mask, cols, D)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    row_base = bh.to(tl.int64) * L
    tl.store(delta_ptr + row_base + q_rows, delta, mask=t_mask)
    lse2 = tl.load(lse_ptr + row_base + q_rows, mask=t_mask, other=0.0) * LOG2E
    k_base = k_ptr + b * k_sb + h * k_sh
    v_base = v_ptr + b * v_sb + h * v_sh

    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    lo = tl.maximum(m0 - radius, 0)
    hi = tl.minimum(m0 + BLOCK_M + radius, sub_len)
    for n0 in range(lo, hi, BLOCK_N):
        s_idx = n0 + tl.arange(0, BLOCK_N)
        s_mask = s_idx < hi
        kv_rows = rho + s_idx.to(tl.int64) * dilation
        k = _tile(k_base, kv_rows, k_sl, s_mask, cols, D)
        v = _tile(v_base, kv_rows, v_sl, s_mask, cols, D)
        zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        s = _dot(q, tl.trans(k), zero)
        diff = s_idx[None, :] - t[:, None]
        inside = (diff <= radius) & (diff >= -radius) & s_mask[None, :] & t_mask[:, None]
        p = tl.where(inside, tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dp = _dot(do, tl.trans(v), zero)
        ds = p * (dp - delta[:, None])
        dq = _dot(ds.to(dtype), k, dq)

    dq_base = dq_ptr + bh.to(tl.int64) * L * D
    tl.store(dq_base + q_rows[:, None] * D + cols[None, :], (dq * scale).to(dtype),
             mask=t_mask[:, None] & (cols < D)[None, :])


@triton.jit
def na_bwd_dkv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                      q_sb, q_sh, q_sl, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl,
                      do_sb, do_sh, do_sl,
                      H, L, D, radius, dilation, qk_scale, scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    dtype = dk_ptr.dtype.element_ty
    b, h, bh, rho, n0, sub_len = _locate(tl.program_id(0), H, L, dilation, BLOCK_N)
    b = b.to(tl.int64)
    h = h.to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    s_idx = n0 + tl.arange(0, BLOCK_N)
    s_mask = s_idx < sub_len
    kv_rows = rho + s_idx.to(tl.int64) * dilation
    k = _tile(k_ptr + b * k_sb + h * k_sh, kv_rows, k_sl, s_mask, cols, D)
    v = _tile(v_ptr + b * v_sb + h * v_sh, kv_rows, v_sl, s_mask, cols, D)
    q_base = q_ptr + b * q_sb + h * q_sh
    do_base = do_ptr + b * do_sb + h * do_sh
    row_base = bh.to(tl.int64) * L

    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    lo = tl.maximum(n0 - radius, 0)
    hi = tl.minimum(n0 + BLOCK_N + radius, sub_len)
    for m0 in range(lo, hi, BLOCK_M):
        t = m0 + tl.arange(0, BLOCK_M)
        t_mask = t < hi
        q_rows = rho + t.to(tl.int64) * dilation
        q = _tile(q_base, q_rows, q_sl, t_mask, cols, D)
        do = _tile(do_base, q_rows, do_sl, t_mask, cols, D)
        lse2 = tl.load(lse_ptr + row_base + q_rows, mask=t_mask, other=0.0) * LOG2E
        delta = tl.load(delta_ptr + row_base + q_rows, mask=t_mask, other=0.0)
        zero = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        st = _dot(k, tl.trans(q), zero)
        diff = t[None, :] - s_idx[:, None]
        inside = (diff <= radius) & (diff >= -radius) & t_mask[None, :] & s_mask[:, None]
        pt = tl.where(inside, tl.exp2(st * qk_scale - lse2[None, :]), 0.0)
        dv = _dot(pt.to(dtype), do, dv)
        dpt = _dot(v, tl.trans(do), zero)
        dst = pt * (dpt - delta[None, :])
        dk = _dot(dst.to(dtype), q, dk)

    mask = s_mask[:, None] & (cols < D)[None, :]
    out_off = row_base * D + kv_rows[:, None] * D + cols[None, :]
    tl.store(dk_ptr + out_off, (dk * scale).to(dtype), mask=mask)
    tl.store(dv_ptr + out_off, dv.to(dtype), mask=mask)


# Head-dim buckets: BLOCK_D -> ((fwd BLOCK_M, BLOCK_N, warps), (dq ...), (dkv ...)). The
# backward kernels walk their window in tiles of 32 (keys for dq, queries for dkv) to keep
# their five (rows, cols) fp32 tiles in registers without spilling.
CONFIGS = {16: ((64, 64, 4), (64, 32, 4), (32, 64, 4)),
           32: ((64, 64, 4), (64, 32, 4), (32, 64, 4)),
           64: ((64, 64, 4), (64, 32, 4), (32, 64, 4)),
           128: ((64, 32, 4), (64, 32, 8), (32, 64, 8))}
# float32 runs IEEE fp32 products on the FMA units (no tensor cores): smaller tiles keep
# its operands in registers.
FP32_CONFIGS = {d: ((32, 32, 4), (32, 32, 4), (32, 32, 4)) for d in CONFIGS}
NUM_STAGES = 2
MAX_D = 128

_STRIDES = ("q_sb", "q_sh", "q_sl", "k_sb", "k_sh", "k_sl", "v_sb", "v_sh", "v_sl")
_DO_STRIDES = ("do_sb", "do_sh", "do_sl")
_SCALARS = ("H", "L", "D", "radius", "dilation", "qk_scale")
_FWD_ARGS = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr") + _STRIDES + _SCALARS
_DQ_ARGS = (("q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dq_ptr")
            + _STRIDES + _DO_STRIDES + _SCALARS + ("scale",))
_DKV_ARGS = (("q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dk_ptr", "dv_ptr")
             + _STRIDES + _DO_STRIDES + _SCALARS + ("scale",))
_TYPES = {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "H": "i32", "L": "i32", "D": "i32",
          "radius": "i32", "dilation": "i32", "qk_scale": "fp32", "scale": "fp32"}
_TYPES.update({s: "i64" for s in _STRIDES + _DO_STRIDES})
_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_D")


def _signature(args, dt):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in _CONSTEXPRS})
    return sig


def variants(arch: int) -> list:
    # Aligned variants only: the C++ side hands the kernels 16-byte aligned q, k, v, dO with
    # head_dim and every stride a multiple of 16 elements (a padded or contiguous copy of an
    # input that is not), so that every tile loads as 16-byte vectors.
    out = []
    kernels = (("neighborhood_attention_fwd", "na_fwd_kernel", _FWD_ARGS),
               ("neighborhood_attention_bwd_dq", "na_bwd_dq_kernel", _DQ_ARGS),
               ("neighborhood_attention_bwd_dkv", "na_bwd_dkv_kernel", _DKV_ARGS))
    for dt in DTYPES:
        for block_d, configs in (FP32_CONFIGS if dt == "fp32" else CONFIGS).items():
            for (family, kernel, args), (bm, bn, warps) in zip(kernels, configs):
                sig = _signature(args, dt)
                extra = tuple(a for a in _STRIDES + _DO_STRIDES + ("D",) if a in sig)
                out.append(Variant(
                    family=family, kernel=kernel, dtype=dt, block=block_d, signature=sig,
                    constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": block_d},
                    num_warps=warps, num_stages=NUM_STAGES, flags=FLAG_ALIGNED,
                    divisible_by_16=aligned_args(sig, FLAG_ALIGNED, extra)))
    return out
