"""The generalized Jensen-Shannon divergence between a student's and a teacher's logits, with
the gradient of the student's logits, for one chunk of rows of fk.fused_linear_jsd.

Per row, with student logits s and teacher logits t (fp32, V columns), temperature T:

  log q = log_softmax(s / T)   (student, the input)
  log p = log_softmax(t / T)   (teacher, the target)
  beta in (0, 1):  m = beta p + (1 - beta) q
                   loss = beta KL(p || m) + (1 - beta) KL(q || m)
                   dloss / ds_j = (1 - beta) q_j (log q_j - log m_j - KL(q || m)) / T
  beta = 0:        loss = KL(p || q),  dloss / ds_j = (q_j - p_j) / T
  beta = 1:        loss = KL(q || p),  dloss / ds_j = q_j (log q_j - log p_j - KL(q || p)) / T

(the gradient through the log-softmax: with g = dloss / dlog q, dloss / ds_j = (g_j - q_j
sum_i g_i) / T; for beta in (0, 1), g_j = (1 - beta) q_j (log q_j - log m_j), whose sum is
(1 - beta) KL(q || m)). Each counted row's loss and gradient are divided by den[0], the
number of counted rows (on the device); a row whose label equals ignore_index gets loss 0
and a zero gradient row. log m is computed from the larger of the two log-probabilities,
log m = hi + log(c_hi + c_lo exp(lo - hi)), so that it stays finite where both underflow.

Kernel:
  fused_linear_jsd_kernel  a persistent grid (PER_SM programs per multiprocessor), each
                           program walking rows pid, pid + P, ... in BLOCK-column steps:
                           pass 1 (forward) the online max and sum of exp of both rows;
                           pass 2 (last block first, the blocks pass 1 read last are the
                           likeliest still in L2) the divergence sums, and for beta = 0 the
                           gradient; pass 3 (first block first) the gradient for beta > 0.
                           Bytes per element: 8 read per pass (fp32 s and t) + the gradient
                           written once in the gradient's dtype.
All math is in fp32 and base 2 (log2 / exp2, converted to natural logs at the end); offsets
are int64.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _log2_probs(s_row, t_row, cols, mask, k, lse_s, lse_t):
    """log2 q and log2 p of the block (0 on masked lanes): k = log2(e) / T, lse_* the rows'
    log2-sum-exp2 of the scaled logits."""
    s = tl.load(s_row + cols, mask=mask, other=0.0)
    t = tl.load(t_row + cols, mask=mask, other=0.0)
    u = tl.where(mask, s * k - lse_s, 0.0)
    w = tl.where(mask, t * k - lse_t, 0.0)
    return u, w


@triton.jit
def _log2_mix(u, w, beta):
    """log2(beta 2^w + (1 - beta) 2^u), from the larger exponent."""
    p_hi = w >= u
    hi = tl.where(p_hi, w, u)
    lo = tl.where(p_hi, u, w)
    c_hi = tl.where(p_hi, beta, 1.0 - beta)
    return hi + tl.log2(c_hi + (1.0 - c_hi) * tl.exp2(lo - hi))


@triton.jit
def fused_linear_jsd_kernel(s_ptr, t_ptr, g_ptr, label_ptr, den_ptr, loss_ptr, s_stride,
                            t_stride, g_stride, M, V, ignore_index, beta, inv_temp, has_label,
                            write_grad, BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    gdtype = g_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    inv_den = 1.0 / tl.load(den_ptr)
    k = inv_temp * LOG2E
    # The gradient's factor: 1 / T / den, and ln 2 for the base-2 logs of the beta > 0 forms.
    c0 = inv_temp * inv_den
    c1 = c0 * LN2
    forward_kl = beta == 0.0
    reverse_kl = beta == 1.0
    nblk = tl.cdiv(V, BLOCK)
    for row in range(pid, M, nprog):
        s_row = s_ptr + row * s_stride
        t_row = t_ptr + row * t_stride
        g_row = g_ptr + row * g_stride
        # label_ptr is not read without labels (has_label == 0).
        y = tl.load(label_ptr + row, mask=has_label != 0, other=0)
        if (has_label != 0) & (y == ignore_index):
            tl.store(loss_ptr + row, tl.full((), 0.0, tl.float32))
            if write_grad != 0:
                zero = tl.zeros((BLOCK,), dtype=gdtype)
                for start in range(0, V, BLOCK):
                    cols = start + lanes
                    tl.store(g_row + cols, zero, mask=cols < V)
        else:
            # Pass 1: online max and sum of exp2 of s * k and t * k.
            ms = -float("inf")
            ds = 0.0
            mt = -float("inf")
            dt = 0.0
            for start in range(0, V, BLOCK):
                cols = start + lanes
                mask = cols < V
                a = tl.load(s_row + cols, mask=mask, other=-float("inf")) * k
                b = tl.load(t_row + cols, mask=mask, other=-float("inf")) * k
                ms_new = tl.maximum(ms, tl.max(a, axis=0))
                mt_new = tl.maximum(mt, tl.max(b, axis=0))
                # Shifted by 0 while a row's maximum is still -inf (adds 0, not NaN).
                ss = tl.where(ms_new == -float("inf"), 0.0, ms_new)
                st = tl.where(mt_new == -float("inf"), 0.0, mt_new)
                ds = ds * tl.exp2(ms - ss) + tl.sum(tl.exp2(a - ss), axis=0)
                dt = dt * tl.exp2(mt - st) + tl.sum(tl.exp2(b - st), axis=0)
                ms = ms_new
                mt = mt_new
            lse_s = ms + tl.log2(ds)
            lse_t = mt + tl.log2(dt)

            # Pass 2: the divergence sums (base 2), last block first.
            acc_a = tl.zeros((BLOCK,), tl.float32)
            acc_b = tl.zeros((BLOCK,), tl.float32)
            for i in range(0, nblk):
                cols = (nblk - 1 - i) * BLOCK + lanes
                mask = cols < V
                u, w = _log2_probs(s_row, t_row, cols, mask, k, lse_s, lse_t)
                q = tl.exp2(u)
                p = tl.exp2(w)
                if forward_kl:
                    acc_a += tl.where(mask, p * (w - u), 0.0)
                    if write_grad != 0:
                        tl.store(g_row + cols, ((q - p) * c0).to(gdtype), mask=mask)
                elif reverse_kl:
                    acc_a += tl.where(mask, q * (u - w), 0.0)
                else:
                    lm = _log2_mix(u, w, beta)
                    acc_a += tl.where(mask, p * (w - lm), 0.0)
                    acc_b += tl.where(mask, q * (u - lm), 0.0)
            kl_a = tl.sum(acc_a, axis=0)
            kl_b = tl.sum(acc_b, axis=0)
            if forward_kl | reverse_kl:
                loss = kl_a * LN2
            else:
                loss = (beta * kl_a + (1.0 - beta) * kl_b) * LN2
            tl.store(loss_ptr + row, loss * inv_den)

            # Pass 3 (beta > 0): the gradient, centred by the divergence of q.
            if (write_grad != 0) & (beta != 0.0):
                for i in range(0, nblk):
                    cols = i * BLOCK + lanes
                    mask = cols < V
                    u, w = _log2_probs(s_row, t_row, cols, mask, k, lse_s, lse_t)
                    q = tl.exp2(u)
                    if reverse_kl:
                        g = q * (u - w - kl_a) * c1
                    else:
                        lm = _log2_mix(u, w, beta)
                        g = q * (u - lm - kl_b) * ((1.0 - beta) * c1)
                    tl.store(g_row + cols, g.to(gdtype), mask=mask)


# Launch configuration (not tuned yet): BLOCK columns of both rows per step (2 x 16 KB of
# fp32 in flight per program), 16 warps, up to PER_SM programs per multiprocessor.
_CONFIG = {"default": (4096, 16, 4)}

_ARGS = ("s_ptr", "t_ptr", "g_ptr", "label_ptr", "den_ptr", "loss_ptr", "s_stride", "t_stride",
         "g_stride", "M", "V", "ignore_index", "beta", "inv_temp", "has_label", "write_grad")
_TYPES = {"s_ptr": "*fp32", "t_ptr": "*fp32", "label_ptr": "*i64", "den_ptr": "*fp32",
          "loss_ptr": "*fp32", "s_stride": "i64", "t_stride": "i64", "g_stride": "i64",
          "M": "i64", "V": "i32", "ignore_index": "i64", "beta": "fp32", "inv_temp": "fp32",
          "has_label": "i32", "write_grad": "i32"}
# Integer arguments that are multiples of 16 in an aligned variant.
_ALIGNED_INTS = ("s_stride", "t_stride", "g_stride", "V")


def variants(arch: int) -> list:
    block, warps, per_sm = _CONFIG.get(arch, _CONFIG["default"])
    out = []
    for dt in DTYPES:
        for aligned in (0, FLAG_ALIGNED):
            sig = {a: _TYPES.get(a, f"*{dt}") for a in _ARGS}
            sig.update({"BLOCK": "constexpr", "PER_SM": "constexpr"})
            out.append(Variant(family="fused_linear_jsd", kernel="fused_linear_jsd_kernel",
                               dtype=dt, block=block, signature=sig,
                               constexprs={"BLOCK": block, "PER_SM": per_sm}, num_warps=warps,
                               flags=aligned,
                               divisible_by_16=aligned_args(sig, aligned, _ALIGNED_INTS)))
    return out
