"""fk.rms_norm_fp8: RMSNorm with its output quantized to blockwise FP8, in one op.

The norm is fk.rms_norm's ``casting_mode="llama"`` with ``offset=0``: rstd in float32 (sum of
squares accumulated in float32), ``x * rstd`` rounded to x's dtype, times ``weight``, rounded
to x's dtype: ``y``. The quantization is fk.fp8_quantize's 1 x 128 format (its one
definition: python/fk/ops/fp8_quantize.py) applied to that ``y``.
"""
import torch

from . import _autograd, _checks as c
from .fp8_quantize import check_input_dtype, parse_layout, rowwise_shapes
from .rms_norm import check_rms_norm

_OP = "fk::rms_norm_fp8"


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                 layout: str = "rowwise", pow2_scales: bool = False,
                 return_norm: bool = False):
    """``y = fk.rms_norm(x, weight, eps)`` quantized to float8_e4m3fn in 1 x 128 blocks.

    Args:
        x: ``(..., K)``, float32, bfloat16 or float16, flattened to ``(M, K)`` (a
            non-contiguous ``x`` is copied once).
        weight: ``(K,)`` of x's dtype and device.
        eps: added to the mean of squares.
        layout: ``"rowwise"`` (the copy a forward GEMM reads), ``"columnwise"`` (the copy of
            ``y.T`` a weight-gradient GEMM reads) or ``"both"``.
        pow2_scales: round every scale up to a power of two.
        return_norm: also return ``y`` (x's shape and dtype), e.g. for a residual path; it
            is the output that carries the gradient.

    Returns:
        ``(data, scales)`` for ``"rowwise"``, ``(data_t, scales_t)`` for ``"columnwise"``,
        ``(data, scales, data_t, scales_t)`` for ``"both"``, then ``rstd`` (float32,
        ``(M,)``), then ``y`` when ``return_norm``. data ``(M, K)`` float8_e4m3fn, scales
        ``(ceil(K/128), M)``, data_t ``(K, M)``, scales_t ``(ceil(M/128), K)`` float32: what
        ``fk.fp8_quantize(y.reshape(M, K), layout=layout, pow2_scales=pow2_scales)``
        returns, bit for bit, for the ``y`` this op computes.

    ``y`` is fk.rms_norm's forward of the same inputs (``casting_mode="llama"``,
    ``offset=0``): bit for bit on CPU (the same reference). On CUDA the kernel accumulates
    the sum of squares in another order than fk.rms_norm's kernel, so ``rstd`` may differ in
    its last bits and ``y`` by one rounding of x's dtype in rare elements. A row holding an
    inf or NaN gives what fk.rms_norm gives (NaN rstd for NaN, rstd 0 and NaN at the inf
    for inf), quantized as the format says: NaN scale and data for blocks holding a NaN.

    Autograd: the gradient flows through ``y`` only, as fk.rms_norm's: the quantized
    copies are ``y`` for autograd (dequantization read as the identity, a straight-through
    estimator), so a consumer of the FP8 copies routes its input gradient into ``y`` (for
    example an FP8 GEMM whose autograd function takes ``y`` as its differentiable input and
    the copies as constants). data, scales, data_t, scales_t and rstd are not
    differentiable. Without ``return_norm`` no output carries a gradient: when grad mode is
    on and ``x`` or ``weight`` requires grad this raises instead of dropping the gradient.
    Gradients: to ``x`` in x's dtype, to ``weight`` summed in float32, as fk.rms_norm's.

    Raises:
        RuntimeError naming ``fk::rms_norm_fp8`` for a wrong dtype, shape or layout; on a
        CUDA GPU older than compute capability 9.0 (the FP8 kernels are built for sm_90 and
        newer).
    """
    # Without grad mode the operator itself (nothing to record); under torch.compile the
    # operator and its registered formula.
    if torch.jit.is_scripting() or not _autograd.eager() or not torch.is_grad_enabled():
        out = torch.ops.fk.rms_norm_fp8(x, weight, eps, layout, pow2_scales, return_norm)
    else:
        out = _eager(x, weight, eps, layout, pow2_scales, return_norm)
    q, s, qt, st, rstd, y = out
    copies = {"rowwise": (q, s), "columnwise": (qt, st)}.get(layout, (q, s, qt, st))
    return (*copies, rstd, y) if return_norm else (*copies, rstd)


@torch.jit.unused
def _eager(x, weight, eps: float, layout: str, pow2_scales: bool, return_norm: bool):
    return _rms_norm_fp8_eager(x, weight, eps, layout, pow2_scales, return_norm)


# --- checks and fake kernel (csrc/ops/rms_norm_fp8/rms_norm_fp8.cpp raises the same) -------

def check_rms_norm_fp8(x, weight, layout):
    c.check(x.dim() >= 1, _OP, ": x must have at least one dimension, got a scalar")
    check_input_dtype(_OP, x)
    check_rms_norm(x, weight, "llama", _OP)
    return parse_layout(_OP, layout)


@torch.library.register_fake("fk::rms_norm_fp8")
def _fake(x, weight, eps=1e-6, layout="rowwise", pow2_scales=False, return_norm=False):
    rowwise, columnwise = check_rms_norm_fp8(x, weight, layout)
    m, k = x.shape[:-1].numel(), x.shape[-1]
    qs, ss, qts, sts = rowwise_shapes(m, k)
    fp8 = torch.float8_e4m3fn
    q = x.new_empty(qs, dtype=fp8) if rowwise else None
    s = x.new_empty(ss, dtype=torch.float32) if rowwise else None
    qt = x.new_empty(qts, dtype=fp8) if columnwise else None
    st = x.new_empty(sts, dtype=torch.float32) if columnwise else None
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if return_norm else None
    return q, s, qt, st, x.new_empty((m,), dtype=torch.float32), y


# --- autograd: through y, as fk.rms_norm's (x, weight and the fp32 rstd saved) -------------

NO_GRADIENT = (": x or weight requires grad, but only y carries the gradient: pass "
               "return_norm=True (the quantized copies are y for autograd), or call under "
               "torch.no_grad()")


def _setup_context(ctx, inputs, output):
    x, weight, return_norm = inputs[0], inputs[1], inputs[5]
    # Autograd records this call (the wrapper takes this path in grad mode only): a call
    # whose gradient would be dropped is an error.
    c.check(return_norm or not any(ctx.needs_input_grad[:2]), _OP, NO_GRADIENT)
    ctx.save_for_backward(x, weight, output[4])
    ctx.mark_non_differentiable(*[t for t in output[:5] if t is not None])
    ctx.set_materialize_grads(False)


def _backward(ctx, _gq, _gs, _gqt, _gst, _grstd, grad_y):
    if grad_y is None:
        return None, None, None, None, None, None
    x, weight, rstd = ctx.saved_tensors
    # rstd (M,) in the shape fk.rms_norm's forward returns it: x.shape[:-1]
    dx, dw = torch.ops.fk._rms_norm_backward(grad_y, x, weight, rstd.view(x.shape[:-1]), 0.0,
                                             "llama",
                                             [True, ctx.needs_input_grad[1]])
    return dx if ctx.needs_input_grad[0] else None, dw, None, None, None, None


_rms_norm_fp8_eager = _autograd.register("fk::rms_norm_fp8", _backward, _setup_context)
