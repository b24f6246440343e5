"""Total variation distance between rows of probabilities p and q, (M, V):

  loss[i, j] = 0.5 * |p[i, j] - q[i, j]|          (reduction "none")
  grad[i, j] = 0.5 * s * sign(p[i, j] - q[i, j])  (d loss / d p for a grad_output of 1)

with sign(0) = 0 (p == q), and -1 where either value is NaN (neither p == q nor p > q holds).
Rows whose label equals ignore_index have loss 0 and gradient 0. The scale s is 1 for "none"
and "sum", 1 / n for "batchmean" and 1 / (n * V) for "mean", n the number of rows not
ignored. All math is in fp32; the gradient is rounded once to p's dtype.

Kernels:
  tvd_count_kernel   one program: n from the labels, writes s = 1 / (n * den_mul) to a
                     float32 on the device (inf when n is 0), so no host waits for n.
                     The forward kernel reads it before it writes the gradient.
  tvd_fwd_kernel     one program per (row, chunk of BLOCK * STEPS columns): reads p and q
                     once, writes the gradient (write_grad) and either the elementwise loss
                     (per_elem, "none") or the chunk's sum of 0.5 * |p - q| into a partial
                     per program. Splitting rows over programs keeps the GPU full at any
                     number of rows; each byte of p, q and the gradient moves once.
  tvd_reduce_kernel  one program: the partials summed in a fixed order, times s.
  tvd_scale_kernel   backward: dst = src * g (g a scalar, or one value per element for
                     "none"), persistent; in place with a scalar g of 1 it returns at once.
Row offsets are int64, so tensors past 2^31 elements work.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args


@triton.jit
def tvd_count_kernel(labels_ptr, scale_ptr, M, ignore_index, den_mul, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, M, BLOCK):
        rows = start + lanes
        lab = tl.load(labels_ptr + rows, mask=rows < M, other=ignore_index)
        acc += (lab != ignore_index).to(tl.int32)
    # In fp64, so that s is 1 / (n * den_mul) rounded once to fp32 (fp32's default division
    # is approximate, and n * V may not be exact in fp32).
    den = tl.sum(acc, axis=0).to(tl.float64) * den_mul
    tl.store(scale_ptr, (1.0 / den).to(tl.float32))


@triton.jit
def tvd_fwd_kernel(p_ptr, q_ptr, grad_ptr, out_ptr, labels_ptr, scale_ptr, M, V, chunks,
                   ignore_index, scale, has_labels, has_scale_ptr, per_elem, write_grad,
                   BLOCK: tl.constexpr, STEPS: tl.constexpr):
    dtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks
    start = (pid - row * chunks) * (BLOCK * STEPS)
    rem = (V - start).to(tl.int32)  # columns of this row from the chunk's start on
    offset = row * V + start
    p_row = p_ptr + offset
    q_row = q_ptr + offset
    g_row = grad_ptr + offset
    o_row = out_ptr + offset
    lanes = tl.arange(0, BLOCK)
    label = tl.load(labels_ptr + row, mask=has_labels != 0, other=0)
    keep = (has_labels == 0) | (label != ignore_index)
    s = scale * tl.load(scale_ptr, mask=has_scale_ptr != 0, other=1.0)
    h = 0.5 * s
    acc = tl.zeros((BLOCK,), tl.float32)
    if keep:
        for i in tl.static_range(STEPS):
            cols = i * BLOCK + lanes
            mask = cols < rem
            p = tl.load(p_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            q = tl.load(q_row + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            p = p.to(tl.float32)
            q = q.to(tl.float32)
            d = 0.5 * tl.abs(p - q)
            if per_elem != 0:
                tl.store(o_row + cols, d, mask=mask, eviction_policy="evict_first")
            else:
                acc += d
            if write_grad != 0:
                g = tl.where(p == q, 0.0, tl.where(p > q, h, -h))
                tl.store(g_row + cols, g.to(dtype), mask=mask, eviction_policy="evict_first")
    else:
        zero = tl.zeros((BLOCK,), tl.float32)
        for i in tl.static_range(STEPS):
            cols = i * BLOCK + lanes
            mask = cols < rem
            if per_elem != 0:
                tl.store(o_row + cols, zero, mask=mask, eviction_policy="evict_first")
            if write_grad != 0:
                tl.store(g_row + cols, zero.to(dtype), mask=mask, eviction_policy="evict_first")
    if per_elem == 0:
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def tvd_reduce_kernel(part_ptr, scale_ptr, loss_ptr, n, scale, has_scale_ptr,
                      BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        idx = start + lanes
        acc += tl.load(part_ptr + idx, mask=idx < n, other=0.0)
    s = scale * tl.load(scale_ptr, mask=has_scale_ptr != 0, other=1.0)
    tl.store(loss_ptr, tl.sum(acc, axis=0) * s)


@triton.jit
def tvd_scale_kernel(src_ptr, dst_ptr, g_ptr, g_per_elem, n, in_place, BLOCK: tl.constexpr,
                     PER_SM: tl.constexpr):
    dtype = dst_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    g0 = tl.load(g_ptr)
    g_all = tl.where(g_per_elem != 0, 1.0, g0)
    if (in_place == 0) | (g_per_elem != 0) | (g0 != 1.0):
        for t in range(pid, tl.cdiv(n, BLOCK), nprog):
            idx = t * BLOCK + lanes
            mask = idx < n
            x = tl.load(src_ptr + idx, mask=mask, other=0.0, eviction_policy="evict_first")
            # One value per element (masked off for a scalar g, which the lanes take).
            g = tl.load(g_ptr + idx, mask=mask & (g_per_elem != 0), other=1.0,
                        eviction_policy="evict_first") * g_all
            tl.store(dst_ptr + idx, (x.to(tl.float32) * g).to(dtype), mask=mask,
                     eviction_policy="evict_first")


# Floor at the target shapes (forward with the gradient: read p and q, write the gradient;
# the partial sums are 4 bytes per program): 4096 x 128256 fp32 moves 6.30 GB, 2.10 ms at
# H100's 3.0 TB/s copy bandwidth; 8192 x 128256 bf16 the same bytes. The backward is one
# launch returning at once for grad_output 1 (the gradient is scaled in place), else one
# more read and write of the gradient (plus a read of grad_output for "none").
#
# fwd: per element size, (BLOCK, STEPS, warps) for the large bucket (chunks of BLOCK * STEPS
# columns, two 16-byte loads per thread and tensor per step) and the small one (rows of at
# most SMALL columns, one program each).
SMALL = 1024
_FWD = {4: (2048, 8, 8), 2: (4096, 4, 8)}
_FWD_SMALL = {4: (1024, 1, 4), 2: (1024, 1, 4)}
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}
_SCALE = (4096, 8, 8)  # (BLOCK, warps, programs per SM)
_ONE = (4096, 8)  # count / reduce: (BLOCK, warps), one program

_FWD_ARGS = ("p_ptr", "q_ptr", "grad_ptr", "out_ptr", "labels_ptr", "scale_ptr", "M", "V",
             "chunks", "ignore_index", "scale", "has_labels", "has_scale_ptr", "per_elem",
             "write_grad")
_COUNT_ARGS = ("labels_ptr", "scale_ptr", "M", "ignore_index", "den_mul")
_REDUCE_ARGS = ("part_ptr", "scale_ptr", "loss_ptr", "n", "scale", "has_scale_ptr")
_SCALE_ARGS = ("src_ptr", "dst_ptr", "g_ptr", "g_per_elem", "n", "in_place")
_TYPES = {"out_ptr": "*fp32", "labels_ptr": "*i64", "scale_ptr": "*fp32", "part_ptr": "*fp32",
          "loss_ptr": "*fp32", "g_ptr": "*fp32", "M": "i64", "V": "i32", "chunks": "i64",
          "ignore_index": "i64", "scale": "fp32", "den_mul": "fp32", "n": "i64",
          "has_labels": "i32", "has_scale_ptr": "i32", "per_elem": "i32", "write_grad": "i32",
          "g_per_elem": "i32", "in_place": "i32"}
_ALIGNED_INTS = ("V",)


def _variant(family, kernel, args, dt, block, constexprs, warps, flags=0):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    extra = tuple(a for a in _ALIGNED_INTS if a in sig)
    return Variant(family=family, kernel=kernel, dtype=dt, block=block, signature=sig,
                   constexprs=constexprs, num_warps=warps, flags=flags,
                   divisible_by_16=aligned_args(sig, flags, extra))


def variants(arch: int) -> list:
    """Per dtype and alignment: tvd_fwd (a small bucket of SMALL columns and a large one whose
    block is its chunk, BLOCK * STEPS) and tvd_scale; one tvd_count and one tvd_reduce. The
    same configs on every arch."""
    out = []
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            for table in (_FWD_SMALL, _FWD):
                block, steps, warps = table[_ELEM[dt]]
                out.append(_variant("tvd_fwd", "tvd_fwd_kernel", _FWD_ARGS, dt, block * steps,
                                    {"BLOCK": block, "STEPS": steps}, warps, flags))
            block, warps, per_sm = _SCALE
            out.append(_variant("tvd_scale", "tvd_scale_kernel", _SCALE_ARGS, dt, block,
                                {"BLOCK": block, "PER_SM": per_sm}, warps, flags))
    block, warps = _ONE
    out.append(_variant("tvd_count", "tvd_count_kernel", _COUNT_ARGS, "fp32", block,
                        {"BLOCK": block}, warps))
    out.append(_variant("tvd_reduce", "tvd_reduce_kernel", _REDUCE_ARGS, "fp32", block,
                        {"BLOCK": block}, warps))
    return out
