"""SwiGLU: c = silu(a) * b, elementwise, silu and the product computed in fp32; the SCALED
variants compute silu(a * gate_mult) * b * down_mult (Falcon-H1's MLP multipliers), the
plain ones ignore the two multipliers (1.0 at every call that picks them).

Forward reads a and b and writes c; backward reads dc, a and b and writes da and db
(silu is recomputed, nothing else is kept). Offsets are int64, so tensors past 2^31
elements work. Each program handles one BLOCK of the flattened tensor; full blocks take an
unmasked path so the loads and stores stay 16 bytes wide without a divisibility hint on n.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

# Variant flag: the multipliers apply.
FLAG_SCALED = 2


@triton.jit
def _swiglu(a, b, gate_mult, down_mult, SCALED: tl.constexpr):
    if SCALED:
        u = a * gate_mult
        return u * tl.sigmoid(u) * b * down_mult
    return a * tl.sigmoid(a) * b


@triton.jit
def swiglu_fwd_kernel(a_ptr, b_ptr, c_ptr, n, gate_mult, down_mult, BLOCK: tl.constexpr,
                      SCALED: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        a = tl.load(a_ptr + offs).to(tl.float32)
        b = tl.load(b_ptr + offs).to(tl.float32)
        c = _swiglu(a, b, gate_mult, down_mult, SCALED)
        tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty))
    else:
        mask = offs < n
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        c = _swiglu(a, b, gate_mult, down_mult, SCALED)
        tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_grads(dc, a, b, gate_mult, down_mult, SCALED: tl.constexpr):
    """(da, db): with u = a * gate_mult and g = dc * down_mult, db = g * silu(u) and
    da = g * b * silu'(u) * gate_mult."""
    if SCALED:
        a = a * gate_mult
        dc = dc * down_mult
    s = tl.sigmoid(a)
    silu = a * s
    db = dc * silu
    da = dc * b * (s + silu * (1.0 - s))
    if SCALED:
        da = da * gate_mult
    return da, db


@triton.jit
def swiglu_bwd_kernel(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, gate_mult, down_mult,
                      BLOCK: tl.constexpr, SCALED: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        dc = tl.load(dc_ptr + offs).to(tl.float32)
        a = tl.load(a_ptr + offs).to(tl.float32)
        b = tl.load(b_ptr + offs).to(tl.float32)
        da, db = _swiglu_grads(dc, a, b, gate_mult, down_mult, SCALED)
        tl.store(da_ptr + offs, da.to(da_ptr.dtype.element_ty))
        tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty))
    else:
        mask = offs < n
        dc = tl.load(dc_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        da, db = _swiglu_grads(dc, a, b, gate_mult, down_mult, SCALED)
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
        for flags in (0, FLAG_ALIGNED, FLAG_SCALED, FLAG_ALIGNED | FLAG_SCALED):
            scalars = {"gate_mult": "fp32", "down_mult": "fp32", "BLOCK": "constexpr",
                       "SCALED": "constexpr"}
            fwd_sig = {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": f"*{dt}", "n": "i64",
                       **scalars}
            bwd_sig = {"dc_ptr": f"*{dt}", "a_ptr": f"*{dt}", "b_ptr": f"*{dt}",
                       "da_ptr": f"*{dt}", "db_ptr": f"*{dt}", "n": "i64", **scalars}
            for family, kernel, sig in (("swiglu_fwd", "swiglu_fwd_kernel", fwd_sig),
                                        ("swiglu_bwd", "swiglu_bwd_kernel", bwd_sig)):
                out.append(Variant(family=family, kernel=kernel, dtype=dt, block=cfg["block"],
                                   signature=sig,
                                   constexprs={"BLOCK": cfg["block"],
                                               "SCALED": int((flags & FLAG_SCALED) != 0)},
                                   num_warps=cfg["num_warps"], flags=flags,
                                   divisible_by_16=aligned_args(sig, flags)))
    return out
