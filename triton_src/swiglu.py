"""SwiGLU: c = silu(a) * b, elementwise, silu and the product computed in fp32.

Forward reads a and b and writes c; backward reads dc, a and b and writes da and db
(silu is recomputed, nothing else is kept). Offsets are int64, so tensors past 2^31
elements work. Each program handles one BLOCK of the flattened tensor; full blocks take an
unmasked path so the loads and stores stay 16 bytes wide without a divisibility hint on n.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args


@triton.jit
def swiglu_fwd_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        a = tl.load(a_ptr + offs).to(tl.float32)
        b = tl.load(b_ptr + offs).to(tl.float32)
        c = a * tl.sigmoid(a) * b
        tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty))
    else:
        mask = offs < n
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        c = a * tl.sigmoid(a) * b
        tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_grads(dc, a, b):
    s = tl.sigmoid(a)
    silu = a * s
    db = dc * silu
    da = dc * b * (s + silu * (1.0 - s))
    return da, db


@triton.jit
def swiglu_bwd_kernel(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        dc = tl.load(dc_ptr + offs).to(tl.float32)
        a = tl.load(a_ptr + offs).to(tl.float32)
        b = tl.load(b_ptr + offs).to(tl.float32)
        da, db = _swiglu_grads(dc, a, b)
        tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty))
        tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty))
    else:
        mask = offs < n
        dc = tl.load(dc_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        da, db = _swiglu_grads(dc, a, b)
        tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty), mask=mask)
        tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)


# Block size and warps per arch: 16 bytes per thread per load for 2-byte types.
_CONFIG = {
    "default": {"block": 2048, "num_warps": 8},
}


def variants(arch: int) -> list:
    cfg = _CONFIG.get(arch, _CONFIG["default"])
    out = []
    for dt in DTYPES:
        for flags in (0, FLAG_ALIGNED):
            fwd_sig = {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": f"*{dt}", "n": "i64",
                       "BLOCK": "constexpr"}
            bwd_sig = {"dc_ptr": f"*{dt}", "a_ptr": f"*{dt}", "b_ptr": f"*{dt}",
                       "da_ptr": f"*{dt}", "db_ptr": f"*{dt}", "n": "i64", "BLOCK": "constexpr"}
            for family, kernel, sig in (("swiglu_fwd", "swiglu_fwd_kernel", fwd_sig),
                                        ("swiglu_bwd", "swiglu_bwd_kernel", bwd_sig)):
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=cfg["block"],
                                   signature=sig, constexprs={"BLOCK": cfg["block"]},
                                   num_warps=cfg["num_warps"], flags=flags,
                                   divisible_by_16=aligned_args(sig, flags)))
    return out
