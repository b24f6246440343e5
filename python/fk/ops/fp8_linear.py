"""fk.fp8_linear: ``y = x @ W.T + b`` with the forward and both backward GEMMs in blockwise
FP8 (the DeepSeek-V3 recipe), on torch's own scaled matmul, fed by :func:`fk.fp8_quantize`.

The recipe (the FP8 format is :mod:`fk.ops.fp8_quantize`'s docstring):

======  ==========================  ==============================  =====================
GEMM    product                     first operand (1 x 128)         second operand
======  ==========================  ==============================  =====================
fprop   ``y  = x  @ W.T``  (M, N)   x: data (M, K), scales (K/128,   W: 128 x 128, data
                                    M)                              (N, K), scales
                                                                    (N/128, K/128)
dgrad   ``dx = dy @ W``    (M, K)   dy: data (M, N), scales          W.T: 128 x 128, data_t
                                    (N/128, M)                      (K, N), scales_t
                                                                    (K/128, N/128)
wgrad   ``dW = dy.T @ x``  (N, K)   dy.T: data_t (N, M), scales_t    x.T: 1 x 128, data_t
                                    (M/128, N)                      (K, M), scales_t
                                                                    (M/128, K)
======  ==========================  ==============================  =====================

Every GEMM is ``a @ b.T`` with ``a`` and ``b`` row-major in fk's format (the contraction
dim last), which is what :func:`scaled_gemm` takes. ``x`` and ``dy`` are each quantized once
(``layout="both"``: the row-wise copy and the column-wise one from one read); the weight
once per step (below).

What torch 2.11 offers (read from its sources: ``torch.nn.functional.scaled_mm``, the meta
checks ``_check_scaled_mm_sizes`` / ``_check_scaled_mm_sizes_v2`` in
``torch/_meta_registrations.py``, the messages of ATen's ``ScaledBlas.cpp`` in
``libtorch_cuda.so`` and the ``_scaled_mm_v2`` OpInfo samples in
``torch/testing/_internal/common_methods_invocations.py``):

* ``torch.nn.functional.scaled_mm(mat_a, mat_b, scale_a, scale_recipe_a, scale_b,
  scale_recipe_b, swizzle_a, swizzle_b, bias, output_dtype, contraction_dim,
  use_fast_accum)`` (``aten::_scaled_mm_v2``) names the recipes explicitly
  (``ScalingType``: TensorWise, RowWise, BlockWise1x16, BlockWise1x32, BlockWise1x128,
  BlockWise128x128; ``SwizzleType``: NO_SWIZZLE, SWIZZLE_32_4_4). The DeepSeek pairs
  (BlockWise1x128, BlockWise128x128), (BlockWise1x128, BlockWise1x128) and
  (BlockWise128x128, BlockWise1x128) run on cuBLASLt (>= 12.9) **on sm_90 only**
  ("DeepSeek style (1x128, 128x128) scaling only supported in CUDA for SM90"): all three
  GEMMs above are supported on H100 / H200; sm_100 / sm_120 get MX / NVFP4 block scaling
  instead, and there is no CPU kernel.
* ``mat_a`` (M, K) row-major, ``mat_b`` (K, N) column-major (the ``.t()`` view of an
  (N, K) row-major tensor), float8; K and N multiples of 16. Scales float32, NO_SWIZZLE:

  - BlockWise1x128 of ``mat_a``: shape (M, K/128), strides (1, M) ("outer-dim-major"):
    fk's scales (K/128, M) viewed ``.t()``, no copy.
  - BlockWise1x128 of ``mat_b``: shape (N, K/128), strides (1, N): fk's (K/128, N)
    scales of the (N, K) data, ``.t()``, no copy.
  - BlockWise128x128 of ``mat_b``: shape (L4, N/128), strides (1, L4) with L4 = K/128
    rounded up to a multiple of 4 ("near-inner-dim-major with 16-byte aligned strides"):
    an (N/128, L4) row-major tensor viewed ``.t()``; fk's weight scales (N/128, K/128)
    are that when K/128 is a multiple of 4 (K a multiple of 512: every Llama width), else
    they are copied once into a padded (N/128, L4) tensor (a few KB).
  - Output dtype: ``output_dtype`` (the input's dtype here).
* ``torch._scaled_mm`` (v1) infers the recipe from the scales' shapes ((M, K/128) with
  (K/128, N/128) for 1x128 x 128x128; (M, K/128) with (K/128, N) for 1x128 x 1x128),
  which is ambiguous (K = 128 reads as row-wise); fk uses ``scaled_mm`` with explicit
  recipes. No per-row fallback was needed.
* ``use_fast_accum`` stays False (its default); not measured with True.

Shapes: ``in_features`` and ``out_features`` must be positive multiples of 128 on every
backend (an error names the multiple). Any token count M: on CUDA, when M is not a multiple
of 128, ``x`` and ``dy`` are padded with zero rows to the next multiple (one copy each; the
zero rows change no scale, so the numerics are those of the unpadded layer).

Backends: on an sm_90 GPU the GEMMs run in ``scaled_mm``. Elsewhere (CPU, other GPUs) each
GEMM is the *reference path*: both operands dequantized (:func:`fk.fp8_dequantize`) to
float32 and multiplied in float32, then rounded to the output dtype; it computes what the
FP8 GEMM computes up to float32 accumulation order, slowly. The quantization is fk's on
every backend.

The weight (kept in its own dtype, bf16 or fp32) is quantized in 128 x 128 blocks, with its
transposed copy for dgrad, once and cached per weight tensor, keyed on
``(weight._version, weight.data_ptr(), dtype, shape, pow2_scales)``: repeated forwards
within one optimizer step (gradient accumulation, activation recomputation) reuse it, and an
optimizer step (an in-place update, which bumps ``_version``) or a new storage invalidates
it. The cache holds one quantized copy per weight (2 bytes per element with the transposed
copy) and is dropped with the weight. A write the version counter does not see (through
``weight.data``, or by code writing the storage directly) is not noticed: pass
``cache_weight=False`` there, or call :func:`clear_fp8_weight_cache`.
"""
from __future__ import annotations

import functools
import warnings
from typing import NamedTuple, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _checks as c
from .fp8_quantize import fp8_dequantize, fp8_quantize

OP = "fk.fp8_linear"
BLOCK = 128
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_FP8 = torch.float8_e4m3fn


class FP8Tensor(NamedTuple):
    """A 2-D tensor quantized in fk's format: ``data``, ``scales`` (row-wise copy) and,
    where the backward needs it, ``data_t``, ``scales_t`` (column-wise copy), as
    :func:`fk.fp8_quantize` returns them with ``layout="both"``."""
    data: Optional[torch.Tensor]
    scales: Optional[torch.Tensor]
    data_t: Optional[torch.Tensor] = None
    scales_t: Optional[torch.Tensor] = None


# --- the GEMM -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _has_blockwise_scaled_mm(index: int) -> bool:
    """torch 2.11 runs the DeepSeek-style blockwise scaled matmul on sm_90 only; elsewhere
    the reference path runs, with one warning per GPU (it is correct but slow)."""
    cap = torch.cuda.get_device_capability(index)
    if cap != (9, 0):
        warnings.warn(f"{OP}: torch's blockwise FP8 scaled matmul runs on sm_90 only; on "
                      f"cuda:{index} (sm_{cap[0]}{cap[1]}) the FP8 GEMMs run as the float32 "
                      f"reference path (dequantize + matmul), which is slow", stacklevel=3)
    return cap == (9, 0)


def uses_scaled_mm(device: torch.device) -> bool:
    """Whether :func:`scaled_gemm` runs torch's FP8 scaled matmul on ``device`` (else the
    float32 reference path)."""
    device = torch.device(device)
    return device.type == "cuda" and _has_blockwise_scaled_mm(
        device.index if device.index is not None else torch.cuda.current_device())


def _mm_scales_128x128(s: torch.Tensor) -> torch.Tensor:
    """fk's 128 x 128 scales (N/128, K/128) as scaled_mm's BlockWise128x128 scale of
    ``mat_b``: (L4, N/128) with strides (1, L4), L4 = K/128 rounded up to a multiple of 4."""
    nb, kb = s.shape
    l4 = -(-kb // 4) * 4
    if l4 != kb:
        padded = s.new_ones(nb, l4)
        padded[:, :kb] = s
        s = padded
    return s.t()


def _scaled_mm(a, sa, b, sb, b_block, out_dtype):
    F = torch.nn.functional
    st = F.ScalingType
    if b_block == (1, BLOCK):
        scale_b, recipe_b = sb.t(), st.BlockWise1x128
    else:
        scale_b, recipe_b = _mm_scales_128x128(sb), st.BlockWise128x128
    return F.scaled_mm(a, b.t(), sa.t(), st.BlockWise1x128, scale_b, recipe_b,
                       swizzle_a=F.SwizzleType.NO_SWIZZLE, swizzle_b=F.SwizzleType.NO_SWIZZLE,
                       output_dtype=out_dtype)


def reference_gemm(a, sa, b, sb, b_block=(BLOCK, BLOCK), out_dtype=torch.bfloat16):
    """:func:`scaled_gemm`'s reference path: both operands dequantized to float32, one
    float32 product, one rounding to ``out_dtype``."""
    a32 = fp8_dequantize(a, sa, (1, BLOCK), torch.float32)
    b32 = fp8_dequantize(b, sb, tuple(b_block), torch.float32)
    return (a32 @ b32.t()).to(out_dtype)


def scaled_gemm(a, sa, b, sb, b_block=(BLOCK, BLOCK), out_dtype=torch.bfloat16):
    """``dequant(a) @ dequant(b).T`` on FP8 operands in fk's format.

    ``a``: data (M, K), 1 x 128 scales (K/128, M). ``b``: data (N, K) with, for
    ``b_block=(1, 128)``, scales (K/128, N), for ``(128, 128)`` scales (N/128, K/128). K a
    multiple of 128 (and N, M multiples of 16 on CUDA). Returns (M, N) of ``out_dtype``.
    torch's scaled matmul on sm_90, the float32 reference path elsewhere.
    """
    m, n = a.shape[0], b.shape[0]
    if m == 0 or n == 0 or a.shape[1] == 0:
        return torch.zeros(m, n, dtype=out_dtype, device=a.device)
    with torch.autocast(a.device.type, enabled=False):
        if uses_scaled_mm(a.device):
            return _scaled_mm(a, sa, b, sb, tuple(b_block), out_dtype)
        return reference_gemm(a, sa, b, sb, b_block, out_dtype)


# --- the weight cache -----------------------------------------------------------------------

_WEIGHT_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def clear_fp8_weight_cache() -> None:
    """Drops every cached quantized weight (they are quantized again on next use)."""
    _WEIGHT_CACHE.clear()


def _weight_key(weight, pow2_scales):
    try:
        version = weight._version
    except RuntimeError:  # inference tensors have no version counter: no caching
        return None
    return (version, weight.data_ptr(), weight.dtype, tuple(weight.shape), pow2_scales)


def quantize_weight(weight: torch.Tensor, transposed: bool = True, pow2_scales: bool = False,
                    cache: bool = True) -> FP8Tensor:
    """``weight`` (N, K) in 128 x 128 blocks (with the transposed copy when ``transposed``),
    from the cache when the weight has not changed since it was quantized."""
    key = _weight_key(weight, pow2_scales) if cache else None
    if key is not None:
        hit = _WEIGHT_CACHE.get(weight)
        if hit is not None and hit[0] == key and (hit[1].data_t is not None or not transposed):
            return hit[1]
    with torch.no_grad():
        out = FP8Tensor(*fp8_quantize(weight.detach(), block=(BLOCK, BLOCK),
                                      layout="both" if transposed else "rowwise",
                                      pow2_scales=pow2_scales))
    if key is not None:
        _WEIGHT_CACHE[weight] = (key, out)
    return out


# --- checks ----------------------------------------------------------------------------------

def check_fp8_linear(x, weight, bias):
    c.check(x.dim() >= 1, OP, ": x must have at least one dimension, got a scalar")
    c.check(weight.dim() == 2, OP, ": weight must be 2-D (out_features, in_features), got shape ",
            c.shape_text(weight))
    for name, t in (("x", x), ("weight", weight)) + ((("bias", bias),) if bias is not None else ()):
        c.check(t.dtype in _FLOATS, OP, ": ", name, " has dtype ", c.dtype_name(t.dtype),
                ", which is not supported (supported: float32, bfloat16, float16)")
    c.check_same_device(OP, "x", x, "weight", weight)
    n, k = weight.shape
    c.check(x.shape[-1] == k, OP, ": the last dim of x (", x.shape[-1],
            ") must equal in_features, weight.shape[1] (", k, ")")
    c.check(k > 0 and n > 0 and k % BLOCK == 0 and n % BLOCK == 0, OP,
            ": in_features and out_features must be positive multiples of 128 (128 x 128 "
            "weight blocks), got weight of shape ", c.shape_text(weight))
    if bias is not None:
        c.check_same_device(OP, "x", x, "bias", bias)
        c.check(bias.dim() == 1 and bias.shape[0] == n, OP, ": bias must have shape [", n,
                "], got ", c.shape_text(bias))


def _check_quantized(name, q, rows, cols):
    """q: FP8 data (rows, cols) with 1 x 128 scales (ceil(cols/128), rows)."""
    data, scales = q
    c.check(data.dtype == _FP8 and data.shape == (rows, cols) and data.is_contiguous(), OP,
            ": ", name, " data must be contiguous float8_e4m3fn of shape [", rows, ", ", cols,
            "], got ", c.dtype_name(data.dtype), " ", c.shape_text(data))
    want = (-(-cols // BLOCK), rows)
    c.check(scales.dtype == torch.float32 and scales.shape == want and scales.is_contiguous(),
            OP, ": ", name, " scales must be contiguous float32 of shape [", want[0], ", ",
            want[1], "], got ", c.dtype_name(scales.dtype), " ", c.shape_text(scales))


def _check_x_fp8(x_fp8, m, k, need_t, device):
    c.check(isinstance(x_fp8, (tuple, list)) and len(x_fp8) in (2, 4), OP,
            ": x_fp8 must be (data, scales) or (data, scales, data_t, scales_t)")
    q = FP8Tensor(*x_fp8)
    _check_quantized("x_fp8", (q.data, q.scales), m, k)
    c.check(not need_t or q.data_t is not None, OP, ": x_fp8 must include the column-wise "
            "copy (data_t, scales_t) when the weight requires grad")
    if need_t:
        _check_quantized("x_fp8 column-wise", (q.data_t, q.scales_t), k, m)
    for t in q:
        if t is not None:
            c.check(t.device == device, OP, ": x_fp8 must be on x's device (",
                    c.device_name(device), "), got ", c.device_name(t.device))
    c.check(m % BLOCK == 0 or not uses_scaled_mm(device), OP, ": with x_fp8 on this GPU the "
            "token count (x.numel() / in_features) must be a multiple of 128, got ", m)
    return q


# --- autograd ----------------------------------------------------------------------------------

def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return t if t.shape[0] == rows else torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[0]))


def _layout(rowwise: bool, columnwise: bool) -> str:
    return "both" if rowwise and columnwise else ("columnwise" if columnwise else "rowwise")


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, x_fp8, need, out_dtype, pow2_scales, cache_weight):
        # need: which of (x, weight, bias) get gradients, decided by the caller (under
        # torch.compile's tracing ctx.needs_input_grad does not tell).
        n, k = weight.shape
        m = x.numel() // k
        need_dx, need_dw = need[0], need[1]
        # Rows padded to a multiple of 128 where scaled_mm runs (its 1 x 128 scales of the
        # weight-gradient GEMM's operands need whole blocks along M).
        mp = -(-m // BLOCK) * BLOCK if uses_scaled_mm(x.device) else m
        w = quantize_weight(weight, transposed=need_dx, pow2_scales=pow2_scales,
                            cache=cache_weight)
        if x_fp8 is None:
            xq = FP8Tensor(*fp8_quantize(_pad_rows(x.reshape(m, k), mp), (1, BLOCK),
                                         _layout(True, need_dw), pow2_scales))
        else:
            xq = x_fp8
        y = scaled_gemm(xq.data, xq.scales, w.data, w.scales, (BLOCK, BLOCK), out_dtype)
        if bias is not None:
            y.add_(bias.to(out_dtype))
        ctx.save_for_backward(xq.data_t if need_dw else None, xq.scales_t if need_dw else None,
                              w.data_t if need_dx else None, w.scales_t if need_dx else None)
        ctx.dims = (m, mp, n, k, x.shape, x.dtype, weight.dtype,
                    bias.dtype if bias is not None else None, pow2_scales)
        ctx.need = need
        # (m, n), not a view: a custom Function's output that is a view of one of its
        # intermediates cannot be modified in place. The padded case pays a copy.
        return y if mp == m else y[:m].clone()

    @staticmethod
    def backward(ctx, grad_y):
        xq_t, sx_t, wq_t, sw_t = ctx.saved_tensors
        m, mp, n, k, x_shape, x_dtype, w_dtype, b_dtype, pow2_scales = ctx.dims
        need_dx, need_dw, need_db = ctx.need
        dx = dw = db = None
        g = grad_y.reshape(m, n)
        if need_dx or need_dw:
            gq = FP8Tensor(*fp8_quantize(_pad_rows(g, mp), (1, BLOCK),
                                         _layout(need_dx, need_dw), pow2_scales))
            if not need_dx:  # columnwise only: fp8_quantize returned (data_t, scales_t)
                gq = FP8Tensor(None, None, gq.data, gq.scales)
            if need_dx:
                dx = scaled_gemm(gq.data, gq.scales, wq_t, sw_t, (BLOCK, BLOCK), x_dtype)
                dx = dx[:m].view(x_shape)
            if need_dw:
                dw = scaled_gemm(gq.data_t, gq.scales_t, xq_t, sx_t, (1, BLOCK), w_dtype)
        if need_db:
            db = g.sum(0, dtype=torch.float32).to(b_dtype)
        return dx, dw, db, None, None, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
               x_fp8=None, pow2_scales: bool = False, cache_weight: bool = True) -> torch.Tensor:
    """``x @ weight.T + bias`` with the forward, input-gradient and weight-gradient GEMMs in
    blockwise FP8 (1 x 128 activations and gradients, 128 x 128 weights), like
    ``torch.nn.functional.linear``.

    Args:
        x: ``(..., in_features)``, float32, bfloat16 or float16.
        weight: ``(out_features, in_features)``, float32, bfloat16 or float16 (kept in its
            dtype: the master copy the optimizer updates), both dims positive multiples of
            128. Quantized in 128 x 128 blocks once per change (the module docstring's
            cache).
        bias: optional ``(out_features,)``; added in the output dtype after the GEMM.
        x_fp8: ``x`` already quantized in fk's 1 x 128 format, as the fused producers
            (``fk.fp8_quantize``, and norms / activations that quantize their output)
            return it: ``(data, scales)``, plus ``(data_t, scales_t)`` when the weight
            requires grad, for the 2-D ``x.reshape(-1, in_features)``. Then ``x``'s values
            are not read: ``x`` gives the shape, dtype, device and the autograd edge its
            gradient flows to (a producer may pass a stride-0 ``expand`` of a scalar). On
            an sm_90 GPU the token count must then be a multiple of 128.
        pow2_scales: round every scale up to a power of two (as :func:`fk.fp8_quantize`).
        cache_weight: reuse the quantized weight while ``weight`` is unchanged.

    Returns:
        ``(..., out_features)`` of ``x``'s dtype (of the autocast dtype inside
        ``torch.autocast``, as ``F.linear``). Differentiable in ``x``, ``weight`` and
        ``bias``: ``grad_x = q(dy) @ q(W)`` and ``grad_W = q(dy).T @ q(x)`` in FP8 (``dy``
        quantized once, both layouts), in ``x``'s and ``weight``'s dtype; ``grad_b`` is
        ``dy`` summed in float32. Only the needed gradients are formed. Saved for the
        backward: the column-wise FP8 copy of ``x`` (1 byte per element) and the quantized
        weight's transposed copy.

    Under ``torch.compile`` the checks are traced and the layer itself runs eagerly (a
    graph break): torch 2.11's dynamo gives all-zero gradients for an autograd Function
    whose output aliases one of its intermediates (here the reference path's no-op
    ``.to(float32)``; every backend, eager included), so it is kept out of the graph.

    Raises:
        RuntimeError naming ``fk.fp8_linear`` for wrong shapes, dtypes or devices, and
        in_features / out_features not multiples of 128.
    """
    check_fp8_linear(x, weight, bias)
    out_dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        out_dtype = torch.get_autocast_dtype(x.device.type)
    grad = torch.is_grad_enabled()
    need = (grad and x.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad)
    if x_fp8 is not None:
        k = weight.shape[1]
        x_fp8 = _check_x_fp8(x_fp8, x.numel() // k, k, need[1], x.device)
    y = _apply(x, weight, bias, x_fp8, need, out_dtype, pow2_scales, cache_weight)
    return y.view(*x.shape[:-1], weight.shape[0])


@torch.compiler.disable
def _apply(*args):
    """The autograd Function, run eagerly under torch.compile (a graph break; see
    :func:`fp8_linear`)."""
    return _FP8Linear.apply(*args)
