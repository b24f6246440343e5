"""Generalized Jensen-Shannon divergence between rows of log-probabilities, with the
gradient computed in the forward pass.

x = log q (the student, the input), y = log p (the teacher, the target), one row a token,
m = beta p + (1 - beta) q; per element, in fp32:

  mode 0 (0 < beta < 1): l = beta p (y - log m) + (1 - beta) q (x - log m)
                         g = (1 - beta) q (x - log m)
  mode 1 (beta == 0):    l = p (y - x)          (forward KL(p || q)),  g = -p
  mode 2 (beta == 1):    l = q (x - y)          (reverse KL(q || p)),  g = l + q

g is the exact derivative of l with respect to x (the terms from log m cancel). log m is
taken as s + log(w_s + w_o exp(o - s)) with s = max(x, y), o = min(x, y) and w the weights
of the larger / smaller term, so it never underflows; q and p come from the same two
exponentials (exp(s) and exp(s) * exp(o - s)): two exponentials and one logarithm an
element. A -inf log-probability (or NaN) makes its terms NaN, as the plain formula does.

The loss is sum over counted rows of sum_j l_j, divided by the number of counted rows n
(rows whose label is ignore_index count nothing; without labels every row counts); the
gradient is g / n, written in the input's dtype (0 in ignored rows). When no row counts,
the loss and the gradient are 0.

Kernels:
  jsd_count_kernel   programs over blocks of labels, each adding its count of counted rows
                     to a zeroed int32 counter atomically (exact and order-independent).
  jsd_fwd_kernel     one program per (row, chunk of CHUNK columns): a single pass over its
                     chunk in BLOCK steps reads x and y once, writes g / n (when write_grad)
                     and stores the chunk's fp32 loss sum in partial[pid]. Rows split into
                     chunks keep the GPU full when there are few rows; the scale 1 / n comes
                     from the counter (labels) or the argument inv_n (no labels). FAST
                     (the 16-bit variants): the same formulas in base 2 with the GPU's
                     approximate ex2 / lg2 (_terms_base2); the interpreter runs FAST = 0.
  jsd_reduce_kernel  one program: the sum of the partial sums in a fixed order, times 1 / n,
                     stored in the loss dtype.
Offsets are int64, so tensors past 2^31 elements work.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _scale(count_ptr, inv_n, has_labels):
    """1 / n: from the counter when rows are counted on the device (1 when none counts),
    else inv_n."""
    n = tl.load(count_ptr, mask=has_labels != 0, other=0).to(tl.float32)
    return tl.where(has_labels != 0, 1.0 / tl.maximum(n, 1.0), inv_n)


@triton.jit
def jsd_count_kernel(labels_ptr, count_ptr, N, ignore_index, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    lab = tl.load(labels_ptr + i, mask=i < N, other=0)
    cnt = tl.sum(((i < N) & (lab != ignore_index)).to(tl.int32), axis=0)
    tl.atomic_add(count_ptr, cnt)


@triton.jit
def _ex2(u):
    """2^u by ex2.approx.ftz.f32 (2 ulp; results below 2^-126 flush to 0): one MUFU op."""
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [u],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _lg2(u):
    """log2(u) by lg2.approx.ftz.f32 (2 ulp for a normal u): one MUFU op."""
    return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [u],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _terms(x, y, beta, mode):
    """(l, g) of one block, in natural logarithms (libdevice exp / log)."""
    if mode == 1:
        p = tl.exp(y)
        l = p * (y - x)
        g = -p
    elif mode == 2:
        q = tl.exp(x)
        l = q * (x - y)
        g = l + q
    else:
        y_big = y >= x
        s = tl.maximum(x, y)
        e = tl.exp(tl.minimum(x, y) - s)
        es = tl.exp(s)
        w_s = tl.where(y_big, beta, 1.0 - beta)
        log_m = s + tl.log(w_s + (1.0 - w_s) * e)
        q = tl.where(y_big, es * e, es)
        p = tl.where(y_big, es, es * e)
        g = (1.0 - beta) * q * (x - log_m)
        l = beta * p * (y - log_m) + g
    return l, g


@triton.jit
def _terms_base2(x, y, beta, mode):
    """(l, g) as _terms, in base 2 with the MUFU's approximate ex2 / lg2 (GPU only: inline
    PTX): u = x log2(e), v = y log2(e), and ln 2 folded into the constants. Three MUFU
    operations an element where libdevice's logf costs a long FMA-pipe sequence; the
    scaling by log2(e) rounds once per input, and p or q below 2^-126 flush to 0."""
    u = x * LOG2E
    v = y * LOG2E
    if mode == 1:
        p = _ex2(v)
        l = (p * (v - u)) * LN2
        g = -p
    elif mode == 2:
        q = _ex2(u)
        l = (q * (u - v)) * LN2
        g = l + q
    else:
        y_big = v >= u
        s = tl.maximum(u, v)
        e = _ex2(tl.minimum(u, v) - s)
        es = _ex2(s)
        w_s = tl.where(y_big, beta, 1.0 - beta)
        lm = s + _lg2(w_s + (1.0 - w_s) * e)
        q = tl.where(y_big, es * e, es)
        p = tl.where(y_big, es, es * e)
        g = ((1.0 - beta) * LN2) * (q * (u - lm))
        l = (beta * LN2) * (p * (v - lm)) + g
    return l, g


@triton.jit
def jsd_fwd_kernel(x_ptr, y_ptr, grad_ptr, labels_ptr, count_ptr, partial_ptr, x_stride,
                   y_stride, grad_stride, V, chunk, n_chunks, ignore_index, beta, inv_n, mode,
                   has_labels, write_grad, BLOCK: tl.constexpr, FAST: tl.constexpr = 0):
    dtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_chunks
    start = (pid - row * n_chunks) * chunk
    end = tl.minimum(start + chunk, V)
    lanes = tl.arange(0, BLOCK)
    g_row = grad_ptr + row * grad_stride
    # without labels, labels_ptr is any valid pointer and is not read
    lab = tl.load(labels_ptr + row, mask=has_labels != 0, other=0)
    if (has_labels == 0) | (lab != ignore_index):
        scale = _scale(count_ptr, inv_n, has_labels)
        x_row = x_ptr + row * x_stride
        y_row = y_ptr + row * y_stride
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for i in range(start, end, BLOCK):
            cols = i + lanes
            mask = cols < V  # the chunk's end is a block boundary or V
            x = tl.load(x_row + cols, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            y = tl.load(y_row + cols, mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32)
            if FAST:
                l, g = _terms_base2(x, y, beta, mode)
            else:
                l, g = _terms(x, y, beta, mode)
            acc += tl.where(mask, l, 0.0)
            if write_grad != 0:
                tl.store(g_row + cols, (g * scale).to(dtype), mask=mask,
                         eviction_policy="evict_first")
        tl.store(partial_ptr + pid, tl.sum(acc, axis=0))
    else:
        if write_grad != 0:
            zero = tl.zeros((BLOCK,), dtype=dtype)
            for i in range(start, end, BLOCK):
                cols = i + lanes
                tl.store(g_row + cols, zero, mask=cols < V)
        tl.store(partial_ptr + pid, 0.0)


@triton.jit
def jsd_reduce_kernel(partial_ptr, count_ptr, loss_ptr, P, inv_n, has_labels,
                      BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, P, BLOCK):
        idx = i + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + idx, mask=idx < P, other=0.0)
    total = tl.sum(acc, axis=0) * _scale(count_ptr, inv_n, has_labels)
    tl.store(loss_ptr, total.to(loss_ptr.dtype.element_ty))


# Launch configurations (all archs) per element size: (BLOCK, CHUNK, warps, FAST). A program
# covers a chunk of CHUNK columns, so a 128256-column row is 8 programs (fp32) or 4 (16-bit)
# and even a few hundred rows fill the GPU. 16-bit inputs take the base-2 MUFU form: on an
# H100 at 8192 x 128256 bf16 (loss and gradient, benchmarks/tune_jsd.py) it ran at 93 % of
# copy bandwidth against 70 % for the libdevice form at (4096, 32768, 8); fp32 keeps the
# libdevice form (97 % already, and its full precision).
_FWD = {4: (2048, 16384, 8, 0), 2: (2048, 32768, 8, 1)}
_COUNT = (1024, 4)
_REDUCE = (4096, 8)
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}

_FWD_ARGS = ("x_ptr", "y_ptr", "grad_ptr", "labels_ptr", "count_ptr", "partial_ptr",
             "x_stride", "y_stride", "grad_stride", "V", "chunk", "n_chunks", "ignore_index",
             "beta", "inv_n", "mode", "has_labels", "write_grad")
_TYPES = {"labels_ptr": "*i64", "count_ptr": "*i32", "partial_ptr": "*fp32",
          "x_stride": "i64", "y_stride": "i64", "grad_stride": "i64", "V": "i32",
          "chunk": "i32", "n_chunks": "i32", "ignore_index": "i64", "beta": "fp32",
          "inv_n": "fp32", "mode": "i32", "has_labels": "i32", "write_grad": "i32",
          "N": "i64", "P": "i32"}
# Integer arguments that are multiples of 16 in an aligned variant (chunk always is: a
# multiple of BLOCK).
_ALIGNED_INTS = ("x_stride", "y_stride", "grad_stride", "V", "chunk")


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    """jsd_fwd per dtype and alignment; jsd_reduce per loss dtype; one jsd_count. The
    block field of jsd_fwd is CHUNK (the C++ side reads BLOCK and CHUNK back)."""
    out = []
    for dt in DTYPES:
        block, chunk, warps, fast = _FWD[_ELEM[dt]]
        for flags in (0, FLAG_ALIGNED):
            constexprs = {"BLOCK": block, "FAST": fast}
            sig = _signature(_FWD_ARGS, dt, constexprs)
            out.append(Variant(family="jsd_fwd", kernel="jsd_fwd_kernel", dtype=dt,
                               block=chunk, signature=sig, constexprs=constexprs,
                               num_warps=warps, flags=flags,
                               divisible_by_16=aligned_args(sig, flags, _ALIGNED_INTS)))
        block, warps = _REDUCE
        sig = _signature(("partial_ptr", "count_ptr", "loss_ptr", "P", "inv_n", "has_labels"),
                         dt, ("BLOCK",))
        out.append(Variant(family="jsd_reduce", kernel="jsd_reduce_kernel", dtype=dt,
                           block=block, signature=sig, constexprs={"BLOCK": block},
                           num_warps=warps))
    block, warps = _COUNT
    sig = _signature(("labels_ptr", "count_ptr", "N", "ignore_index"), "fp32", ("BLOCK",))
    out.append(Variant(family="jsd_count", kernel="jsd_count_kernel", dtype="fp32",
                       block=block, signature=sig, constexprs={"BLOCK": block},
                       num_warps=warps))
    return out
