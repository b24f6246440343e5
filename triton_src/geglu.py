"""GeGLU: c = gelu(a) * b, elementwise, gelu and the product computed in fp32.

gelu is exact (``APPROX`` 0: 0.5 * a * (1 + erf(a / sqrt(2))), erf from libdevice) or the
tanh form (``APPROX`` 1, Gemma's gelu_pytorch_tanh: 0.5 * a * (1 + tanh(sqrt(2/pi) * (a +
0.044715 a^3)))). The tanh form is evaluated as a * sigmoid(2 * sqrt(2/pi) * (a + 0.044715
a^3)), the same function (1 + tanh(z) = 2 sigmoid(2z)) at the cost of one exp and one
division per element, like SwiGLU's sigmoid. The mode is a compile-time constant: each
mode is its own kernel family (``geglu_tanh_fwd``, ``geglu_erf_fwd``, ...), so the tanh
kernels carry no erf code and keep swiglu's register count (a runtime switch costs 8 more
registers in the forward, 8 instead of 6 blocks of 256 threads per SM on sm_90).

Forward reads a and b and writes c; backward reads dc, a and b and writes da and db (gelu
is recomputed, nothing else is kept). Offsets are int64, so tensors past 2^31 elements
work. Each program handles one BLOCK of the flattened tensor; full blocks take an unmasked
path so the loads and stores stay 16 bytes wide without a divisibility hint on n.
"""
import triton
import triton.language as tl

from _common import DTYPES, FLAG_ALIGNED, Variant, aligned_args

# Kernel families per value of the kernels' APPROX constant (csrc/ops/geglu/ names them).
MODES = {"erf": 0, "tanh": 1}

_TWO_K = tl.constexpr(1.5957691216057308)  # 2 * sqrt(2 / pi)
_TWO_KC = tl.constexpr(0.07135481627260025)  # 2 * sqrt(2 / pi) * 0.044715
_SQRT_HALF = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi): the normal density at 0


@triton.jit
def _gelu(a, APPROX: tl.constexpr):
    if APPROX:
        g = a * tl.sigmoid(a * (_TWO_K + _TWO_KC * a * a))
    else:
        g = 0.5 * a * (1.0 + tl.math.erf(a * _SQRT_HALF))
    return g


@triton.jit
def _gelu_and_derivative(a, APPROX: tl.constexpr):
    if APPROX:
        # g = a * s(u), u = 2k (a + c a^3): g' = s + a s (1 - s) u', u' = 2k (1 + 3c a^2).
        a2 = a * a
        s = tl.sigmoid(a * (_TWO_K + _TWO_KC * a2))
        g = a * s
        dg = s + g * (1.0 - s) * (_TWO_K + 3.0 * _TWO_KC * a2)
    else:
        # g = a Phi(a): g' = Phi(a) + a phi(a).
        cdf = 0.5 + 0.5 * tl.math.erf(a * _SQRT_HALF)
        g = a * cdf
        dg = cdf + a * _INV_SQRT_2PI * tl.exp(-0.5 * a * a)
    return g, dg


# One block of each kernel; mask and other are None on full blocks (unmasked accesses).

@triton.jit
def _fwd_block(a_ptr, b_ptr, c_ptr, offs, mask, other, APPROX: tl.constexpr):
    a = tl.load(a_ptr + offs, mask=mask, other=other).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=other).to(tl.float32)
    c = _gelu(a, APPROX) * b
    tl.store(c_ptr + offs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, mask, other, APPROX: tl.constexpr):
    dc = tl.load(dc_ptr + offs, mask=mask, other=other).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask, other=other).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=other).to(tl.float32)
    dcb = dc * b  # first: ptxas then issues all three loads before the erf code
    g, dg = _gelu_and_derivative(a, APPROX)
    tl.store(da_ptr + offs, (dcb * dg).to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + offs, (dc * g).to(db_ptr.dtype.element_ty), mask=mask)


@triton.jit
def geglu_fwd_kernel(a_ptr, b_ptr, c_ptr, n, APPROX: tl.constexpr, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        _fwd_block(a_ptr, b_ptr, c_ptr, offs, None, None, APPROX)
    else:
        _fwd_block(a_ptr, b_ptr, c_ptr, offs, offs < n, 0.0, APPROX)


@triton.jit
def geglu_bwd_kernel(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, APPROX: tl.constexpr,
                     BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        _bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, None, None, APPROX)
    else:
        _bwd_block(dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr, offs, offs < n, 0.0, APPROX)


# Block size and warps per arch: 16 bytes per thread per load for 2-byte types, as swiglu
# (the tanh kernels' instruction and register counts are within 10 % of swiglu's).
_CONFIG = {
    "default": {"block": 2048, "num_warps": 8},
}


def variants(arch: int) -> list:
    cfg = _CONFIG.get(arch, _CONFIG["default"])
    out = []
    for dt in DTYPES:
        fwd_sig = {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": f"*{dt}", "n": "i64",
                   "APPROX": "constexpr", "BLOCK": "constexpr"}
        bwd_sig = {"dc_ptr": f"*{dt}", "a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "da_ptr": f"*{dt}",
                   "db_ptr": f"*{dt}", "n": "i64", "APPROX": "constexpr", "BLOCK": "constexpr"}
        for mode, approx in MODES.items():
            for flags in (0, FLAG_ALIGNED):
                for pass_, kernel, sig in (("fwd", "geglu_fwd_kernel", fwd_sig),
                                           ("bwd", "geglu_bwd_kernel", bwd_sig)):
                    out.append(Variant(family=f"geglu_{mode}_{pass_}", kernel=kernel, dtype=dt,
                                       block=cfg["block"], signature=sig,
                                       constexprs={"APPROX": approx, "BLOCK": cfg["block"]},
                                       num_warps=cfg["num_warps"], flags=flags,
                                       divisible_by_16=aligned_args(sig, flags)))
    return out
