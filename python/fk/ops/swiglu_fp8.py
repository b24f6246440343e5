"""fk.swiglu_fp8, fk.swiglu_fp8_backward, fk.moe_swiglu_fp8, fk.moe_swiglu_fp8_backward:
SwiGLU fused with the blockwise FP8 quantization of its output (the format:
python/fk/ops/fp8_quantize.py), for the FP8 GEMM that follows it (the MLP's down projection).

Inputs: ``x (M, 2n)`` holds the gate projection then the up projection of each row
(Megatron's fused ``linear_fc1`` layout): ``gate = x[:, :n]``, ``up = x[:, n:]``.

What is quantized: ``h = silu(gate) * up`` (``* probs[:, None]`` in the MoE form), computed in
float32 (silu as ``g * sigmoid(g)``, as fk.swiglu and Liger do) and rounded once to x's dtype;
the FP8 copies are exactly ``fk.fp8_quantize`` of that rounded ``h`` (1 x 128 blocks). So the
fused op computes what the unfused pair ``fk.swiglu -> fk.fp8_quantize`` does, from one read
of x.

Gradients (straight-through): an FP8 tensor cannot carry a gradient (autograd would cast the
incoming gradient to float8), so the quantized copies are not differentiable. The gradient
enters through ``h``: with ``return_h=True`` the op also returns ``h`` (M, n) in x's dtype,
which is differentiable in x (and probs); the quantized copies are its values in FP8. A
consumer that multiplies the FP8 copies (an FP8 GEMM) passes its gradient with respect to
its activation input to ``h`` (for instance by taking ``h`` as an input of its autograd
Function next to the quantized copies), which treats the quantization as the identity in the
backward: ``dx = d(silu(gate) * up)/dx . dL/dh``. Writing ``h`` costs one more (M, n) store
in x's dtype (the unfused swiglu -> fp8_quantize pair writes it too). For example::

    class DownProjFp8(torch.autograd.Function):  # y = h @ w.T from h's FP8 copy
        @staticmethod
        def forward(ctx, h, q, s, w):
            ctx.save_for_backward(w)
            wq, ws = fk.fp8_quantize(w, block=(128, 128))
            return torch._scaled_mm(q, wq.t(), scale_a=s.t(), scale_b=ws.t(),
                                    out_dtype=h.dtype)

        @staticmethod
        def backward(ctx, dy):
            (w,) = ctx.saved_tensors
            return dy @ w, None, None, None  # dL/dh; dL/dw left out here

    q, s, h = fk.swiglu_fp8(x, return_h=True)
    y = DownProjFp8.apply(h, q, s, w)  # y.backward() reaches x through h

Without ``return_h`` (inference, or a hand-written backward), nothing is differentiable;
``fk.swiglu_fp8_backward`` and ``fk.moe_swiglu_fp8_backward`` are the backward as functions,
the first also quantizing dx in 1 x 128 blocks (``grad_layout``) for the FP8 GEMMs of the
backward, which autograd cannot return.

The MoE form's column-wise copy (the input of the per-expert weight-gradient GEMMs) is
quantized per expert segment; see ``moe_swiglu_fp8``.
"""
import torch

from . import _autograd, _checks as c
from .fp8_quantize import _FLOATS, parse_layout

_OPS = {"plain": "fk::swiglu_fp8", "bwd": "fk::swiglu_fp8_backward",
        "moe": "fk::moe_swiglu_fp8", "moe_bwd": "fk::moe_swiglu_fp8_backward"}


def _select(out, layout, return_h):
    q, s, qt, st, h = out
    copies = {"rowwise": (q, s), "columnwise": (qt, st)}.get(layout, (q, s, qt, st))
    return (*copies, h) if return_h else copies


def swiglu_fp8(x: torch.Tensor, layout: str = "rowwise", pow2_scales: bool = False,
               return_h: bool = False):
    """``silu(gate) * up`` of ``x = [gate | up]``, quantized to float8_e4m3fn in 1 x 128 blocks.

    Args:
        x: ``(M, 2n)``, float32, bfloat16 or float16; any strides (copied once when not
            contiguous). For more dims pass ``x.reshape(-1, 2 * n)``.
        layout: ``"rowwise"`` (``h``'s blocks of 128 along n, for the forward GEMM),
            ``"columnwise"`` (the copy of ``h.T``, for the weight-gradient GEMM) or
            ``"both"``, from one read of x.
        pow2_scales: round every scale up to a power of two.
        return_h: also return ``h`` (M, n) in x's dtype, the differentiable output (see the
            module docstring: the gradient enters through it).

    Returns:
        ``"rowwise"``: ``(data, scales)``: data ``(M, n)`` float8_e4m3fn, scales
        ``(ceil(n/128), M)`` float32; ``"columnwise"``: ``(data_t, scales_t)``: data_t
        ``(n, M)``, scales_t ``(ceil(M/128), n)``; ``"both"``: all four; then ``h`` when
        ``return_h``. Bit for bit ``fk.fp8_quantize(h, layout=layout)`` of the returned ``h``.
        Partial blocks (n or M not a multiple of 128) are handled as fk.fp8_quantize does;
        an inf / NaN in ``h`` (also a float16 ``h`` that overflows) makes its blocks NaN.

    Raises:
        RuntimeError naming ``fk::swiglu_fp8`` for a wrong shape (x not 2-D, odd last dim),
        dtype or layout; on a CUDA GPU older than compute capability 9.0.
    """
    if return_h and torch.is_grad_enabled() and x.requires_grad and _autograd.eager():
        out = _swiglu_fp8_eager(x, layout, pow2_scales, return_h)
    else:
        out = torch.ops.fk.swiglu_fp8(x, layout, pow2_scales, return_h)
    return _select(out, layout, return_h)


def swiglu_fp8_backward(grad_h: torch.Tensor, x: torch.Tensor, grad_layout=None,
                        pow2_scales: bool = False):
    """The backward of ``h = silu(gate) * up``: ``dx`` (M, 2n) given ``grad_h`` (M, n).

    Args:
        grad_h: ``(M, n)``, x's dtype and device.
        x: the forward's input ``(M, 2n)``.
        grad_layout: ``None``: return ``dx`` in x's dtype. ``"rowwise"`` / ``"columnwise"`` /
            ``"both"``: return dx (rounded to x's dtype) quantized in 1 x 128 blocks instead,
            fused in the backward kernel: ``(data (M, 2n), scales (2n/128, M))`` and / or
            ``(data_t (2n, M), scales_t (ceil(M/128), 2n))``, in that order (the operands of
            the backward GEMMs of the layer before). Needs n to be a multiple of 128 (so that
            no block straddles the gate and up halves); other n raise.
        pow2_scales: round the scales of a quantized dx up to powers of two.

    dx's gate half is ``grad_h * up * silu'(gate)``, its up half ``grad_h * silu(gate)``, in
    float32, rounded once to x's dtype. Not differentiable.

    Raises:
        RuntimeError naming ``fk::swiglu_fp8_backward`` for a wrong shape, dtype or
        grad_layout, a quantized dx with n not a multiple of 128; on a CUDA GPU older than
        compute capability 9.0 (as the forward).
    """
    gl = "none" if grad_layout is None else grad_layout
    dx, q, s, qt, st = torch.ops.fk.swiglu_fp8_backward(grad_h, x, gl, pow2_scales)
    if grad_layout is None:
        return dx
    return _select((q, s, qt, st, None), grad_layout, False)


def moe_swiglu_fp8(x: torch.Tensor, probs: torch.Tensor, tokens_per_expert: torch.Tensor,
                   layout: str = "rowwise", pow2_scales: bool = False, return_h: bool = False):
    """``silu(gate) * up * probs[:, None]`` over the concatenated expert segments of a grouped
    MoE layer, quantized to float8_e4m3fn in 1 x 128 blocks.

    Args:
        x: ``(M, 2n)``: the rows of expert 0, then expert 1, ... (the grouped GEMM's output).
        probs: ``(M,)`` float32, each row's router probability.
        tokens_per_expert: ``(E,)`` int32 / int64 on x's device, the segment sizes ``M_e``;
            they must be >= 0 and sum to M. They are read on the device (no host sync, CUDA
            graphs work), so the CUDA kernels cannot check them: there, negative counts read
            as 0 and rows past M are never touched; the CPU backend raises.
        layout, pow2_scales, return_h: as in :func:`swiglu_fp8`; ``h`` includes the
            probabilities and is differentiable in x and probs.

    Returns:
        The row-wise copy as in :func:`swiglu_fp8` (data ``(M, n)``, scales
        ``(ceil(n/128), M)``; its blocks lie within rows, so segments do not matter). The
        column-wise copy per segment: ``data_t (n, M)``, column ``r`` for row ``r`` of x
        (segments stay concatenated along M), and ``scales_t ((M + 127 E) // 128, n)``:
        segment e, which starts at row ``off_e = sum_{f<e} M_f``, has ``ceil(M_e / 128)``
        blocks of 128 consecutive tokens (the last one partial) starting at its own first
        token, whose scales are rows ``blk_e .. blk_e + ceil(M_e/128) - 1`` of scales_t with
        ``blk_e = sum_{f<e} ceil(M_f / 128)``; so block j of segment e covers tokens
        ``off_e + 128 j .. min(off_e + 128 (j + 1), off_e + M_e) - 1``. The rows after the
        last segment's (``(M + 127 E) // 128`` is the most E segments of M tokens can need)
        hold 1.0. With E = 1 this is :func:`swiglu_fp8`'s layout. Then ``h`` when
        ``return_h``.

    Raises:
        RuntimeError naming ``fk::moe_swiglu_fp8`` for a wrong shape, dtype or layout; on
        CUDA for a column-wise copy with more than 1024 experts.
    """
    if (return_h and torch.is_grad_enabled() and (x.requires_grad or probs.requires_grad)
            and _autograd.eager()):
        out = _moe_swiglu_fp8_eager(x, probs, tokens_per_expert, layout, pow2_scales,
                                    return_h)
    else:
        out = torch.ops.fk.moe_swiglu_fp8(x, probs, tokens_per_expert, layout, pow2_scales,
                                          return_h)
    return _select(out, layout, return_h)


def moe_swiglu_fp8_backward(grad_h: torch.Tensor, x: torch.Tensor, probs: torch.Tensor,
                            grad_layout=None, pow2_scales: bool = False):
    """The backward of ``h = silu(gate) * up * probs[:, None]``: ``(dx, dprobs)``: dx (M, 2n)
    in x's dtype (``grad_h * probs`` through silu(gate) * up as in
    :func:`swiglu_fp8_backward`), dprobs (M,) float32 = ``sum_j grad_h[:, j] * silu(gate) *
    up`` accumulated in float32. Not differentiable.

    ``grad_layout="rowwise"`` returns ``(data, scales, dprobs)`` instead: dx rounded to x's
    dtype and quantized in 1 x 128 blocks along 2n in the same kernel (data (M, 2n), scales
    (2n/128, M); blocks lie within rows, so segments do not matter), for the data-gradient
    GEMMs of the grouped layer before; n must be a multiple of 128. A column-wise copy per
    expert segment is not implemented (other grad_layout values raise).
    """
    gl = "none" if grad_layout is None else grad_layout
    dx, dp, q, s = torch.ops.fk.moe_swiglu_fp8_backward(grad_h, x, probs, gl, pow2_scales)
    return (dx, dp) if grad_layout is None else (q, s, dp)


# --- checks and fake kernels (csrc/ops/swiglu_fp8/swiglu_fp8.cpp raises the same) --------

def _check_x(op, x):
    c.check(x.dim() == 2, op, ": x must be 2-D (M, 2n), got shape ", c.shape_text(x),
            " (flatten the leading dims first)")
    c.check(x.dtype in _FLOATS, op, ": x has dtype ", c.dtype_name(x.dtype),
            ", which is not supported (supported: float32, bfloat16, float16)")
    c.check(x.shape[1] % 2 == 0, op, ": x's last dim must be even (gate then up), got ",
            x.shape[1])


def _check_grad_h(op, grad_h, x):
    c.check_same_device(op, "grad_h", grad_h, "x", x)
    c.check_same_dtype(op, "grad_h", grad_h, "x", x)
    want = (x.shape[0], x.shape[1] // 2)
    c.check(tuple(grad_h.shape) == want, op, ": grad_h must have shape [",
            ", ".join(str(w) for w in want), "] (M, n) for x of shape ", c.shape_text(x),
            ", got ", c.shape_text(grad_h))


def _check_probs(op, probs, x):
    c.check_same_device(op, "probs", probs, "x", x)
    c.check(probs.dtype == torch.float32, op, ": probs must be float32, got ",
            c.dtype_name(probs.dtype))
    c.check(tuple(probs.shape) == (x.shape[0],), op, ": probs must have shape [", x.shape[0],
            "] (one per row of x), got ", c.shape_text(probs))


def check_swiglu_fp8_backward(grad_h, x, grad_layout):
    op = _OPS["bwd"]
    _check_x(op, x)
    _check_grad_h(op, grad_h, x)
    c.check(grad_layout in ("none", "rowwise", "columnwise", "both"), op,
            ": grad_layout must be 'none', 'rowwise', 'columnwise' or 'both', got '",
            grad_layout, "'")
    if grad_layout == "none":
        return False, False
    n = x.shape[1] // 2
    c.check(n % 128 == 0, op, ": a quantized gradient (grad_layout '", grad_layout,
            "') needs n (x's last dim / 2) to be a multiple of 128, got n = ", n)
    return grad_layout != "columnwise", grad_layout != "rowwise"


def check_moe_swiglu_fp8(x, probs, tokens_per_expert, layout):
    op = _OPS["moe"]
    _check_x(op, x)
    _check_probs(op, probs, x)
    tpe = tokens_per_expert
    c.check_same_device(op, "tokens_per_expert", tpe, "x", x)
    c.check(tpe.dim() == 1 and tpe.dtype in (torch.int32, torch.int64), op,
            ": tokens_per_expert must be a 1-D int32 or int64 tensor, got dtype ",
            c.dtype_name(tpe.dtype), " and shape ", c.shape_text(tpe))
    c.check(tpe.shape[0] >= 1, op, ": tokens_per_expert must have at least one expert")
    return parse_layout(op, layout)


def _forward_fake(x, want, pow2_scales, return_h, scale_t_rows):
    rowwise, columnwise = want
    m, n = x.shape[0], x.shape[1] // 2
    fp8 = torch.float8_e4m3fn
    q = x.new_empty((m, n), dtype=fp8) if rowwise else None
    s = x.new_empty((-(-n // 128), m), dtype=torch.float32) if rowwise else None
    qt = x.new_empty((n, m), dtype=fp8) if columnwise else None
    st = x.new_empty((scale_t_rows, n), dtype=torch.float32) if columnwise else None
    h = x.new_empty((m, n)) if return_h else None
    return q, s, qt, st, h


@torch.library.register_fake("fk::swiglu_fp8")
def _swiglu_fp8_fake(x, layout="rowwise", pow2_scales=False, return_h=False):
    _check_x(_OPS["plain"], x)
    want = parse_layout(_OPS["plain"], layout)
    return _forward_fake(x, want, pow2_scales, return_h, -(-x.shape[0] // 128))


@torch.library.register_fake("fk::moe_swiglu_fp8")
def _moe_swiglu_fp8_fake(x, probs, tokens_per_expert, layout="rowwise", pow2_scales=False,
                         return_h=False):
    want = check_moe_swiglu_fp8(x, probs, tokens_per_expert, layout)
    rows = (x.shape[0] + 127 * tokens_per_expert.shape[0]) // 128
    return _forward_fake(x, want, pow2_scales, return_h, rows)


@torch.library.register_fake("fk::swiglu_fp8_backward")
def _backward_fake(grad_h, x, grad_layout="none", pow2_scales=False):
    rowwise, columnwise = check_swiglu_fp8_backward(grad_h, x, grad_layout)
    m, k = x.shape
    if not (rowwise or columnwise):
        return x.new_empty((m, k)), None, None, None, None
    fp8 = torch.float8_e4m3fn
    q = x.new_empty((m, k), dtype=fp8) if rowwise else None
    s = x.new_empty((k // 128, m), dtype=torch.float32) if rowwise else None
    qt = x.new_empty((k, m), dtype=fp8) if columnwise else None
    st = x.new_empty((-(-m // 128), k), dtype=torch.float32) if columnwise else None
    return None, q, s, qt, st


def check_moe_swiglu_fp8_backward(grad_h, x, probs, grad_layout):
    op = _OPS["moe_bwd"]
    _check_x(op, x)
    _check_grad_h(op, grad_h, x)
    _check_probs(op, probs, x)
    c.check(grad_layout in ("none", "rowwise"), op,
            ": grad_layout must be 'none' or 'rowwise' (a column-wise copy per expert segment "
            "is not implemented), got '", grad_layout, "'")
    if grad_layout == "none":
        return False
    n = x.shape[1] // 2
    c.check(n % 128 == 0, op, ": a quantized gradient (grad_layout '", grad_layout,
            "') needs n (x's last dim / 2) to be a multiple of 128, got n = ", n)
    return True


@torch.library.register_fake("fk::moe_swiglu_fp8_backward")
def _moe_backward_fake(grad_h, x, probs, grad_layout="none", pow2_scales=False):
    dp = probs.new_empty(probs.shape)
    if not check_moe_swiglu_fp8_backward(grad_h, x, probs, grad_layout):
        return x.new_empty(x.shape), dp, None, None
    m, k = x.shape
    return (None, dp, x.new_empty((m, k), dtype=torch.float8_e4m3fn),
            x.new_empty((k // 128, m), dtype=torch.float32))


# --- autograd: the gradient enters through h (the fifth output); the quantized copies are
# not differentiable ---------------------------------------------------------------------

def _setup(ctx, inputs, output, saved):
    ctx.save_for_backward(*saved)
    ctx.mark_non_differentiable(*(t for t in output[:4] if t is not None))
    ctx.set_materialize_grads(False)


def _setup_plain(ctx, inputs, output):
    _setup(ctx, inputs, output, (inputs[0],))


def _backward_plain(ctx, _gq, _gs, _gqt, _gst, grad_h):
    (x,) = ctx.saved_tensors
    if grad_h is None or not ctx.needs_input_grad[0]:
        return None, None, None, None
    dx = torch.ops.fk.swiglu_fp8_backward(grad_h, x, "none", False)[0]
    return dx, None, None, None


def _setup_moe(ctx, inputs, output):
    _setup(ctx, inputs, output, (inputs[0], inputs[1]))


def _backward_moe(ctx, _gq, _gs, _gqt, _gst, grad_h):
    x, probs = ctx.saved_tensors
    if grad_h is None or not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
        return None, None, None, None, None, None
    dx, dp, _, _ = torch.ops.fk.moe_swiglu_fp8_backward(grad_h, x, probs, "none", False)
    return (dx if ctx.needs_input_grad[0] else None, dp if ctx.needs_input_grad[1] else None,
            None, None, None, None)


_swiglu_fp8_eager = _autograd.register("fk::swiglu_fp8", _backward_plain, _setup_plain)
_moe_swiglu_fp8_eager = _autograd.register("fk::moe_swiglu_fp8", _backward_moe, _setup_moe)
