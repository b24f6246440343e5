"""KL divergence loss, torch.nn.functional.kl_div's pointwise terms, its gradient computed in
the forward pass.

Per element, with x the input (log-probabilities) and t the target, in fp32:

  loss = t * log(max(t, eps)) - t * x        (t * log(...) taken as 0 where t == 0)
  loss = exp(t) * (t - x)                    (log_target: t holds log-probabilities)
  d loss / d x = -t, or -exp(t)

The kernels see the tensors as flat arrays of N elements (contiguous), so a reduction does
not care about rows: every element is one term of one sum.

Kernels:
  kl_div_fwd_kernel    the reductions: a persistent grid of programs, each walking tiles
                       pid, pid + nprog, ... of BLOCK elements (full tiles unmasked, the one
                       partial tile by the last program), summing the loss in a BLOCK-wide
                       fp32 accumulator and storing its total into part[pid]; with
                       write_grad it also stores scale * d loss / d x in the input's dtype
                       (scale: the reduction's factor, 1, 1 / N or 1 / size(0)). One pass:
                       read x and t, write the gradient.
  kl_div_sum_kernel    one program: loss = scale * sum(part), in a fixed order
                       (deterministic, no atomics).
  kl_div_pointwise_kernel  reduction "none": out = loss (the forward, backward == 0) or
                       out = a * d loss / d x (the backward, a = grad_output), both in the
                       input's dtype; the same persistent walk.
All math is in fp32; offsets are int64.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args


@triton.jit
def _term(x, t, eps, log_target):
    """The pointwise loss of fp32 input x and target t."""
    if log_target != 0:
        out = tl.exp(t) * (t - x)
    else:
        xlogt = tl.where(t == 0.0, 0.0, t * tl.log(tl.maximum(t, eps)))
        out = xlogt - t * x
    return out


@triton.jit
def _slope(t, log_target):
    """d term / d x for fp32 target t."""
    if log_target != 0:
        out = -tl.exp(t)
    else:
        out = -t
    return out


@triton.jit
def kl_div_fwd_kernel(x_ptr, t_ptr, grad_ptr, part_ptr, N, eps, scale, log_target, write_grad,
                      BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    gdtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    full = N // BLOCK
    for tile in range(pid, full, nprog):
        offs = tile * BLOCK + lanes
        x = tl.load(x_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        t = tl.load(t_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        acc += _term(x, t, eps, log_target)
        if write_grad != 0:
            tl.store(grad_ptr + offs, (_slope(t, log_target) * scale).to(gdtype),
                     eviction_policy="evict_first")
    if pid == nprog - 1:
        # The partial tile (if any): masked lanes read as t = 0, x = 0 and add nothing.
        offs = full * BLOCK + lanes
        mask = offs < N
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        acc += tl.where(mask, _term(x, t, eps, log_target), 0.0)
        if write_grad != 0:
            tl.store(grad_ptr + offs, (_slope(t, log_target) * scale).to(gdtype), mask=mask)
    tl.store(part_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def kl_div_sum_kernel(part_ptr, loss_ptr, P, scale, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, P, BLOCK):
        acc += tl.load(part_ptr + start + lanes, mask=start + lanes < P, other=0.0)
    tl.store(loss_ptr, tl.sum(acc, axis=0) * scale)


@triton.jit
def kl_div_pointwise_kernel(a_ptr, t_ptr, out_ptr, N, eps, log_target, backward,
                            BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    odtype = out_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    full = N // BLOCK
    for tile in range(pid, full, nprog):
        offs = tile * BLOCK + lanes
        a = tl.load(a_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        t = tl.load(t_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        if backward != 0:
            out = a * _slope(t, log_target)
        else:
            out = _term(a, t, eps, log_target)
        tl.store(out_ptr + offs, out.to(odtype), eviction_policy="evict_first")
    if pid == nprog - 1:
        offs = full * BLOCK + lanes
        mask = offs < N
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if backward != 0:
            out = a * _slope(t, log_target)
        else:
            out = _term(a, t, eps, log_target)
        tl.store(out_ptr + offs, out.to(odtype), mask=mask)


# Floor at the Llama-3 shapes: 4096 x 128256 fp32 is 2.1 GB a tensor, so the forward with
# the gradient moves 6.3 GB (read x, read t, write the gradient), 2.1 ms at 3.0 TB/s (H100)
# and 1.5 ms at 4.2 TB/s (H200); 8192 x 128256 bf16 the same bytes. The backward is the
# cross entropy scaling kernel, which returns at once for a grad_output of 1 (the stored
# gradient is the answer). The sum of the partial sums reads a few KB.
#
# Launch configurations (not tuned on a GPU yet): per element size, (BLOCK, warps, programs
# per SM). Every thread loads 16 elements of each stream per tile (four 16-byte vectors in
# fp32, two in 16 bits), several programs per SM keep enough bytes in flight.
_CONFIG = {
    "fwd": {4: (4096, 8, 4), 2: (8192, 8, 4)},
    "pointwise": {4: (4096, 8, 4), 2: (8192, 8, 4)},
    "sum": (1024, 4),
}
_ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}

_FWD_ARGS = ("x_ptr", "t_ptr", "grad_ptr", "part_ptr", "N", "eps", "scale", "log_target",
             "write_grad")
_POINTWISE_ARGS = ("a_ptr", "t_ptr", "out_ptr", "N", "eps", "log_target", "backward")
_SUM_ARGS = ("part_ptr", "loss_ptr", "P", "scale")
_TYPES = {"part_ptr": "*fp32", "loss_ptr": "*fp32", "N": "i64", "P": "i32", "eps": "fp32",
          "scale": "fp32", "log_target": "i32", "write_grad": "i32", "backward": "i32"}


def _signature(args, dt, constexprs):
    sig = {a: _TYPES.get(a, f"*{dt}") for a in args}
    sig.update({c: "constexpr" for c in constexprs})
    return sig


def variants(arch: int) -> list:
    out = []
    for dt in DTYPES:
        for aligned in (0, FLAG_ALIGNED):
            for family, kernel, args in (("kl_div_fwd", "kl_div_fwd_kernel", _FWD_ARGS),
                                         ("kl_div_pointwise", "kl_div_pointwise_kernel",
                                          _POINTWISE_ARGS)):
                block, warps, per_sm = _CONFIG[family.split("_")[-1]][_ELEM[dt]]
                constexprs = {"BLOCK": block, "PER_SM": per_sm}
                sig = _signature(args, dt, constexprs)
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=block,
                                   signature=sig, constexprs=constexprs, num_warps=warps,
                                   flags=aligned, divisible_by_16=aligned_args(sig, aligned)))
    block, warps = _CONFIG["sum"]
    out.append(Variant(family="kl_div_sum", kernel="kl_div_sum_kernel", dtype="fp32",
                       block=block, signature=_signature(_SUM_ARGS, "fp32", ("BLOCK",)),
                       constexprs={"BLOCK": block}, num_warps=warps))
    return out
