"""Top-k routing of mixture-of-experts router logits in one pass over each row: the scores,
the top-k selection and the routing probabilities, and its backward.

Score functions (``score``, a run-time argument; the orders of Megatron's
topk_softmax_with_capacity and DeepSeek-V3's gate):
    0  softmax after top-k: select the k largest logits, probs = softmax over those k
    1  softmax before top-k (pre_softmax): p = softmax over all E, select the k largest p,
       probs = p there
    2  sigmoid: s = sigmoid(logits), select the k largest s + expert_bias (the bias only
       steers the selection), probs = s / (sum of the selected s + 1e-20) when
       ``normalize`` (k > 1), else s
probs is zero off the selection and is multiplied by ``scaling_factor``; the routing map
(int8 0 / 1, a bool tensor's bytes) marks the selection. Selection: k rounds of "the
largest remaining score, the lowest column among equals"; NaN counts as larger than any
number (as torch.topk orders it).

One program handles ROWS rows of BLOCK_E >= E columns (a power of two), all in registers;
everything in float32.

Backward (the selection held fixed; g = grad_probs * scaling_factor on the selection):
    0  dl = q (g - sum(g q))        q: the probs before scaling (softmax over the k)
    1  dl = p (g - sum(g p))        p: softmax over all E
    2  ds = g / S - sum(g s) / S^2 (normalize; else ds = g), dl = ds s (1 - s), S = sum of
       the selected s + 1e-20
"""
import triton
import triton.language as tl

from _common import DTYPES, Variant

SOFTMAX_AFTER, SOFTMAX_BEFORE, SIGMOID = 0, 1, 2
NORM_EPS = 1e-20


@triton.jit
def _row_tile(logits_ptr, T, E, ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_E)
    valid = (rows < T)[:, None] & (cols < E)[None, :]
    offs = rows[:, None] * E + cols[None, :]
    l = tl.load(logits_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
    return cols, valid, offs, l


@triton.jit
def _softmax(l, valid):
    m = tl.max(tl.where(valid, l, float("-inf")), axis=1)
    e = tl.where(valid, tl.exp(l - m[:, None]), 0.0)
    return e / tl.sum(e, axis=1)[:, None]


@triton.jit
def router_topk_fwd_kernel(logits_ptr, bias_ptr, probs_ptr, map_ptr, T, E, k, score,
                           has_bias, normalize, scaling, ROWS: tl.constexpr,
                           BLOCK_E: tl.constexpr):
    cols, valid, offs, l = _row_tile(logits_ptr, T, E, ROWS, BLOCK_E)
    p = _softmax(l, valid)
    s = tl.sigmoid(l)
    bias = tl.load(bias_ptr + cols, mask=(cols < E) & (has_bias != 0), other=0.0)
    key = tl.where(score == 1, p, tl.where(score == 2, s + bias.to(tl.float32)[None, :], l))
    key = tl.where(key != key, float("inf"), key)  # NaN first, as torch.topk
    chosen = tl.zeros((ROWS, BLOCK_E), dtype=tl.int1)
    for _ in range(k):
        open_ = valid & ~chosen
        best = tl.max(tl.where(open_, key, float("-inf")), axis=1)
        hit = open_ & (key == best[:, None])
        first = tl.min(tl.where(hit, cols[None, :], BLOCK_E), axis=1)
        chosen = chosen | (cols[None, :] == first[:, None])
    chosen = chosen & valid
    if score == 0:
        probs = _softmax(l, chosen)
    elif score == 1:
        probs = tl.where(chosen, p, 0.0)
    else:
        probs = tl.where(chosen, s, 0.0)
        if normalize != 0:
            probs = probs / (tl.sum(probs, axis=1)[:, None] + 1e-20)
    tl.store(probs_ptr + offs, probs * scaling, mask=valid)
    tl.store(map_ptr + offs, chosen.to(tl.int8), mask=valid)


@triton.jit
def router_topk_bwd_kernel(grad_ptr, logits_ptr, map_ptr, dlogits_ptr, T, E, score,
                           normalize, scaling, ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    cols, valid, offs, l = _row_tile(logits_ptr, T, E, ROWS, BLOCK_E)
    chosen = (tl.load(map_ptr + offs, mask=valid, other=0) != 0) & valid
    g = tl.load(grad_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    g = tl.where(chosen, g * scaling, 0.0)
    if score == 2:
        s = tl.sigmoid(l)
        if normalize != 0:
            ssum = tl.sum(tl.where(chosen, s, 0.0), axis=1)[:, None] + 1e-20
            gs = tl.sum(g * tl.where(chosen, s, 0.0), axis=1)[:, None]
            ds = g / ssum - gs / (ssum * ssum)
        else:
            ds = g
        dl = tl.where(chosen, ds * s * (1.0 - s), 0.0)
    else:
        if score == 0:
            q = _softmax(l, chosen)
        else:
            q = _softmax(l, valid)
        dl = q * (g - tl.sum(g * q, axis=1)[:, None])
        dl = tl.where(valid, dl, 0.0)
    tl.store(dlogits_ptr + offs, dl.to(dlogits_ptr.dtype.element_ty), mask=valid)


# --- AOT variants ----------------------------------------------------------------------
#
# One variant per dtype (of the logits; probs are float32) and BLOCK_E (the expert count
# rounded up to a power of two, 32 .. 1024); ROWS rows a program so that a program holds
# about 2048 elements (16 per thread of 4 warps). The score function and its options are
# run-time arguments (uniform branches), so they add no variants.
BLOCKS = (32, 64, 128, 256, 512, 1024)
TILE_ELEMS, WARPS = 2048, 4


def rows_for(block_e: int) -> int:
    return max(1, TILE_ELEMS // block_e)


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        fwd_sig = {"logits_ptr": f"*{dt}", "bias_ptr": "*fp32", "probs_ptr": "*fp32",
                   "map_ptr": "*i8", "T": "i32", "E": "i32", "k": "i32", "score": "i32",
                   "has_bias": "i32", "normalize": "i32", "scaling": "fp32",
                   "ROWS": "constexpr", "BLOCK_E": "constexpr"}
        bwd_sig = {"grad_ptr": "*fp32", "logits_ptr": f"*{dt}", "map_ptr": "*i8",
                   "dlogits_ptr": f"*{dt}", "T": "i32", "E": "i32", "score": "i32",
                   "normalize": "i32", "scaling": "fp32", "ROWS": "constexpr",
                   "BLOCK_E": "constexpr"}
        for block in BLOCKS:
            cx = {"ROWS": rows_for(block), "BLOCK_E": block}
            out.append(Variant(family="router_topk_fwd", kernel="router_topk_fwd_kernel",
                               dtype=dt, block=block, signature=fwd_sig, constexprs=cx,
                               num_warps=WARPS))
            out.append(Variant(family="router_topk_bwd", kernel="router_topk_bwd_kernel",
                               dtype=dt, block=block, signature=bwd_sig, constexprs=cx,
                               num_warps=WARPS))
    return out
