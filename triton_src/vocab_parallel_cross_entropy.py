"""Cross entropy over a vocabulary split across ranks (Megatron's vocabulary-parallel layout):
the local halves. Rank r holds the logits' columns [s, s + V_loc) of the V classes, s =
r * V_loc; the targets are global class ids, the same on every rank. Nothing here
communicates: the caller gathers the per-row statistics of kernel (a) from every rank and
hands all of them to kernel (b).

(a) vocab_parallel_ce_stats_kernel, one pass over the shard, per row i (softcap c: x ->
    c * tanh(x / c) first), six float32 values into stats (6, M), row-major:
      0 m   = max_j x_j                     (local max; -inf for a row of -inf)
      1 d   = sum_j exp(x_j - m)            (relative to the local max)
      2 x_y = x_{y - s} if s <= y < s + V_loc, else 0   (the target's logit, on one rank)
      3 w_y = its class weight (1 without weights) there, else 0
      4 sx  = sum_j w_j x_j                 (label smoothing only, else 0)
      5 sw  = sum_j w_j                     (label smoothing only, else 0)
    An ignored row reads nothing and gets (0, 1, 0, 0, 0, 0).

(b) vocab_parallel_ce_fwd_kernel, given the stats of all W ranks (W, 6, M) and the
    denominators den = (D_w, D_n) (sum of w_y over non-ignored rows and their count for a
    "mean", else ones), combines each row's stats (max of the m, sums of d rescaled to it,
    sums of the rest: lse = M + log(sum_r d_r exp(m_r - M))) and writes the row's loss
    (the same on every rank)

      ce   = (1 - ls) * w_y * (lse - x_y) + (ls / V) * (sw * lse - sx)
      loss = ce / D_w + s * lse^2 / D_n

    and, with write_grad, the gradient of the shard (in the logits' dtype, possibly into the
    logits' own memory: each element is read before the same thread overwrites it), times
    the row's grad_output g_i (a scalar, one per row, or 1 without has_scale):

      grad_j = g_i * (p_j * A - (ls / V) * w_j / D_w - [j == y - s] * (1 - ls) * w_y / D_w)
      p_j = exp(x_j - lse),  A = ((1 - ls) * w_y + (ls / V) * sw) / D_w + 2 * s * lse / D_n
      (times 1 - tanh^2(x_j / c) with a softcap)

    Ignored rows: loss 0 and a zero gradient row. A target outside [0, V) that is not
    ignore_index (the host op raises first) gives NaN.
All math is in fp32; offsets are int64.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant

# Variant flag: class weights, label smoothing or softcap (run-time switches inside).
FLAG_GENERAL = 2
NSTATS = tl.constexpr(6)

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _tanh(u):
    """tanh through exp2: exact at +-inf, absolute error about 1e-7 near 0."""
    return 1.0 - 2.0 / (tl.exp2(u * (2.0 * LOG2E)) + 1.0)


@triton.jit
def vocab_parallel_ce_stats_kernel(x_ptr, target_ptr, weight_ptr, stats_ptr, x_stride, M, V,
                                   vocab_start, ignore_index, label_smoothing, softcap,
                                   has_weight, has_softcap, BLOCK: tl.constexpr,
                                   GENERAL: tl.constexpr, PER_SM: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    smoothing = label_smoothing > 0.0
    inv_cap = 1.0 / softcap
    for row in range(pid, M, nprog):
        y = tl.load(target_ptr + row)
        m = tl.full((), 0.0, tl.float32)
        d = tl.full((), 1.0, tl.float32)
        x_y = tl.full((), 0.0, tl.float32)
        w_y = tl.full((), 0.0, tl.float32)
        sx = tl.full((), 0.0, tl.float32)
        sw = tl.full((), 0.0, tl.float32)
        if y != ignore_index:
            x_row = x_ptr + row * x_stride
            local = y - vocab_start
            here = (local >= 0) & (local < V)
            if here:
                x_y = tl.load(x_row + local).to(tl.float32)
                w_y = tl.full((), 1.0, tl.float32)
                if GENERAL:
                    if has_softcap != 0:
                        x_y = softcap * _tanh(x_y * inv_cap)
                    if has_weight != 0:
                        w_y = tl.load(weight_ptr + local)
            m = tl.full((), -float("inf"), tl.float32)
            d = tl.full((), 0.0, tl.float32)
            for start in range(0, V, BLOCK):
                cols = start + lanes
                mask = cols < V
                x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
                if GENERAL:
                    if has_softcap != 0:
                        x = tl.where(mask, softcap * _tanh(x * inv_cap), -float("inf"))
                    if smoothing:
                        w = mask.to(tl.float32)
                        if has_weight != 0:
                            w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
                        sx += tl.sum(tl.where(mask, w * x, 0.0), axis=0)
                        sw += tl.sum(w, axis=0)
                m_new = tl.maximum(m, tl.max(x, axis=0))
                m2 = tl.where(m_new == -float("inf"), 0.0, m_new) * LOG2E
                d = d * tl.exp2(m * LOG2E - m2) + tl.sum(tl.exp2(x * LOG2E - m2), axis=0)
                m = m_new
        tl.store(stats_ptr + row, m)
        tl.store(stats_ptr + M + row, d)
        tl.store(stats_ptr + 2 * M + row, x_y)
        tl.store(stats_ptr + 3 * M + row, w_y)
        tl.store(stats_ptr + 4 * M + row, sx)
        tl.store(stats_ptr + 5 * M + row, sw)


@triton.jit
def vocab_parallel_ce_fwd_kernel(x_ptr, grad_ptr, target_ptr, weight_ptr, stats_ptr, den_ptr,
                                 scale_ptr, loss_ptr, z_ptr, x_stride, grad_stride,
                                 scale_stride, M, V, vocab_start, vocab_size, world,
                                 ignore_index, label_smoothing, lse_square_scale, softcap,
                                 has_weight, has_softcap, has_scale, write_grad,
                                 BLOCK: tl.constexpr, GENERAL: tl.constexpr,
                                 PER_SM: tl.constexpr):
    gdtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    inv_dw = 1.0 / tl.load(den_ptr)
    inv_dn = 1.0 / tl.load(den_ptr + 1)
    smoothing = label_smoothing > 0.0
    inv_cap = 1.0 / softcap
    rank_stride = NSTATS * M
    for row in range(pid, M, nprog):
        y = tl.load(target_ptr + row)
        g_row = grad_ptr + row * grad_stride
        if y == ignore_index:
            if write_grad != 0:
                zero = tl.zeros((BLOCK,), dtype=gdtype)
                for start in range(0, V, BLOCK):
                    cols = start + lanes
                    tl.store(g_row + cols, zero, mask=cols < V)
            tl.store(loss_ptr + row, 0.0 * inv_dw)
            tl.store(z_ptr + row, 0.0 * inv_dn)
        else:
            # Combine the ranks' stats, in rank order (the same result on every rank).
            s_row = stats_ptr + row
            m = tl.load(s_row)
            for r in range(1, world):
                m = tl.maximum(m, tl.load(s_row + r * rank_stride))
            m2 = tl.where(m == -float("inf"), 0.0, m) * LOG2E
            d = tl.full((), 0.0, tl.float32)
            x_y = tl.full((), 0.0, tl.float32)
            w_y = tl.full((), 0.0, tl.float32)
            sx = tl.full((), 0.0, tl.float32)
            sw = tl.full((), 0.0, tl.float32)
            for r in range(0, world):
                p = s_row + r * rank_stride
                d += tl.load(p + M) * tl.exp2(tl.load(p) * LOG2E - m2)
                x_y += tl.load(p + 2 * M)
                w_y += tl.load(p + 3 * M)
                if GENERAL:
                    sx += tl.load(p + 4 * M)
                    sw += tl.load(p + 5 * M)
            valid = (y >= 0) & (y < vocab_size)
            x_y = tl.where(valid, x_y, float("nan"))
            w_y = tl.where(valid, w_y, float("nan"))
            lse = m + tl.log(d)

            ce = w_y * (lse - x_y)
            a = w_y * inv_dw
            c_w = tl.full((), 0.0, tl.float32)
            if GENERAL:
                if smoothing:
                    eps = label_smoothing / vocab_size
                    ce = (1.0 - label_smoothing) * ce + eps * (sw * lse - sx)
                    a = ((1.0 - label_smoothing) * w_y + eps * sw) * inv_dw
                    c_w = eps * inv_dw
            c_y = (1.0 - label_smoothing) * w_y * inv_dw
            z = lse_square_scale * lse * lse
            a = a + 2.0 * lse_square_scale * lse * inv_dn
            tl.store(loss_ptr + row, ce * inv_dw + z * inv_dn)
            tl.store(z_ptr + row, z * inv_dn)

            if write_grad != 0:
                g_out = tl.full((), 1.0, tl.float32)
                if has_scale != 0:
                    g_out = tl.load(scale_ptr + row * scale_stride)
                a = a * g_out
                c_y = c_y * g_out
                c_w = c_w * g_out
                lse2 = lse * LOG2E
                local = y - vocab_start
                x_row = x_ptr + row * x_stride
                for start in range(0, V, BLOCK):
                    cols = start + lanes
                    mask = cols < V
                    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
                    if GENERAL:
                        dcap = tl.full(x.shape, 1.0, tl.float32)
                        if has_softcap != 0:
                            t = _tanh(x * inv_cap)
                            x = softcap * t
                            dcap = 1.0 - t * t
                    g = tl.exp2(x * LOG2E - lse2) * a
                    if (local >= start) & (local < start + BLOCK):
                        g = g - tl.where(lanes == (local - start).to(tl.int32), c_y, 0.0)
                    if GENERAL:
                        if smoothing:
                            w = mask.to(tl.float32)
                            if has_weight != 0:
                                w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
                            g = g - c_w * w
                        g = g * dcap
                    tl.store(g_row + cols, g.to(gdtype), mask=mask)


# Launch configurations (not tuned on a GPU yet): one row per program, persistent grids of
# at most PER_SM programs per SM; per kind of variant and element size (BLOCK, warps). A
# shard row of Llama 3 (128256 classes) over 2-8 ranks is 16032-64128 elements: 16 KB steps.
#   stats / fwd: plain (aligned, no weights / smoothing / softcap); unaligned (scalar loads
#   hold more registers); general (weights, smoothing or softcap hold more values).
SMALL = 1024  # the small bucket; every longer row takes the large one
LARGE = 1 << 17  # label of the large bucket (rows of any length)
_CONFIG = {
    "small": {2: (1024, 4), 4: (1024, 4)},
    "plain": {2: (8192, 16), 4: (4096, 16)},
    "unaligned": {2: (4096, 16), 4: (2048, 16)},
    "general": {2: (4096, 16), 4: (2048, 16)},
}
PER_SM = 16
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}

_STATS_ARGS = ("x_ptr", "target_ptr", "weight_ptr", "stats_ptr", "x_stride", "M", "V",
               "vocab_start", "ignore_index", "label_smoothing", "softcap", "has_weight",
               "has_softcap")
_FWD_ARGS = ("x_ptr", "grad_ptr", "target_ptr", "weight_ptr", "stats_ptr", "den_ptr",
             "scale_ptr", "loss_ptr", "z_ptr", "x_stride", "grad_stride", "scale_stride", "M",
             "V", "vocab_start", "vocab_size", "world", "ignore_index", "label_smoothing",
             "lse_square_scale", "softcap", "has_weight", "has_softcap", "has_scale",
             "write_grad")
_TYPES = {"target_ptr": "*i64", "weight_ptr": "*fp32", "stats_ptr": "*fp32", "den_ptr": "*fp32",
          "scale_ptr": "*fp32", "loss_ptr": "*fp32", "z_ptr": "*fp32", "x_stride": "i64",
          "grad_stride": "i64", "scale_stride": "i64", "M": "i64", "V": "i32",
          "vocab_start": "i64", "vocab_size": "i64", "world": "i32", "ignore_index": "i64",
          "label_smoothing": "fp32", "lse_square_scale": "fp32", "softcap": "fp32",
          "has_weight": "i32", "has_softcap": "i32", "has_scale": "i32", "write_grad": "i32"}
# What an aligned variant assumes 16-byte aligned / a multiple of 16 (the C++ side checks
# exactly these: the logits' and the gradient's pointers, row strides and length).
_ALIGNED = ("x_ptr", "grad_ptr", "x_stride", "grad_stride", "V")


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for aligned in (0, FLAG_ALIGNED):
            for general in (0, FLAG_GENERAL):
                kind = "general" if general else ("plain" if aligned else "unaligned")
                for bucket, table in ((SMALL, _CONFIG["small"]), (LARGE, _CONFIG[kind])):
                    block, warps = table[_ELEM[dt]]
                    consts = {"BLOCK": block, "GENERAL": int(general != 0), "PER_SM": PER_SM}
                    for family, kernel, args in (
                            ("vocab_parallel_ce_stats", "vocab_parallel_ce_stats_kernel",
                             _STATS_ARGS),
                            ("vocab_parallel_ce_fwd", "vocab_parallel_ce_fwd_kernel",
                             _FWD_ARGS)):
                        sig = _signature(args, dt, consts)
                        hints = tuple(a for a in _ALIGNED if a in sig) if aligned else ()
                        out.append(Variant(family=family, kernel=kernel, dtype=dt,
                                           block=bucket, signature=sig, constexprs=consts,
                                           num_warps=warps, flags=aligned | general,
                                           divisible_by_16=hints))
    return out
