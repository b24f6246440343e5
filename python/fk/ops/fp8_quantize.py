"""fk.fp8_quantize and fk.fp8_dequantize: blockwise FP8 quantization for FP8 GEMMs.

The format (this is its one definition; csrc/ops/fp8_quantize/ and
triton_src/fp8_quantize.py implement it):

* Data: ``torch.float8_e4m3fn`` (largest finite value 448). Scales: float32 *dequantization*
  multipliers (TransformerEngine's ``scale_inv``): ``x ~= data * scale``.
* Per block of ``x`` with ``amax = max |x|`` over the block:
  ``s = max(amax / 448, 2^-126)`` (one correctly rounded float32 division; the floor, the
  smallest normal float32, keeps scales out of the subnormal range, where a GPU may flush
  them to zero). An all-zero block gets ``s = 1.0`` (its data are zeros, which dequantize
  to exact zeros). With ``pow2_scales=True`` ``s`` is rounded *up* to a power of two, so
  that applying it is exact.
* ``q = x * r`` with ``r = 1 / s`` (the block's reciprocal, correctly rounded to float32;
  then one correctly rounded float32 product an element, as DeepSeek-V3's and
  TransformerEngine's quantizers multiply rather than divide), clamped to [-448, 448], then
  rounded to float8_e4m3fn to nearest (ties to even) as ``.to(torch.float8_e4m3fn)`` does.
  With power-of-two scales this is exactly ``x / s``; otherwise ``x * r`` and ``x / s``
  differ by at most one float32 rounding, which the float8 rounding hides but for values
  within that of a float8 rounding boundary.
* inf and NaN: a block holding any inf or NaN gets ``s = NaN`` and all its data NaN (so it
  dequantizes to NaN throughout); every other block is unaffected. The same on every
  backend, but for the NaN bytes' sign bit (0x7F on one backend may be 0xFF on another).
* Blocks:
  - ``block=(1, 128)`` (activations, gradients): 128 consecutive elements of a row.
    Row-wise copy: data ``(M, K)``, scales ``(ceil(K / 128), M)`` with ``scales[j, i]`` the
    scale of row ``i``'s ``j``-th block (MN-major, as DeepGEMM and ``torch._scaled_mm``'s
    blockwise 1 x 128 scaling read it after a transpose). Column-wise copy (for the
    weight-gradient GEMM): ``x.T`` quantized the same way, data ``(K, M)``, scales
    ``(ceil(M / 128), K)`` (blocks of 128 consecutive rows of one column of ``x``).
  - ``block=(128, 128)`` (weights): data ``(N, K)``, scales ``(ceil(N / 128),
    ceil(K / 128))``; the column-wise copy is ``data.T`` with ``scales.T``.
  - A dimension that is not a multiple of 128 ends in a partial block (its scale from the
    elements it has).
  - Per segment (the MoE ops, fk.moe_swiglu_fp8 and fk.moe_permute_fp8): x's M rows are E
    expert segments of ``M_e`` consecutive rows (in order; their sum at most M). The
    row-wise copy is as above (its blocks lie within rows). The column-wise copy, data
    ``(K, M)``, has ``ceil(M_e / 128)`` blocks of 128 rows per segment, from the segment's
    first row (the last one partial); their scales are rows ``blk_e .. blk_e +
    ceil(M_e / 128) - 1`` of scales ``((M + 127 E) // 128, K)`` with ``blk_e = sum_{f<e}
    ceil(M_f / 128)`` (``(M + 127 E) // 128`` is the most blocks there can be); the rows
    after the last block hold 1.0, the columns of rows after the last segment are zero.
    With E = 1 and M_0 = M it is the plain column-wise copy.

Quantization is not differentiable: no output requires grad, whatever ``x`` does
(gradients do not flow through it). The fake kernels exist, so both ops work under
torch.compile and export.
"""
import torch

from . import _autograd, _checks as c

_LAYOUTS = ("rowwise", "columnwise", "both")
_BLOCKS = {(1, 128): 1, (128, 128): 128}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _block_rows(op, block):
    block = tuple(block)
    c.check(block in _BLOCKS, op, ": block must be (1, 128) or (128, 128), got (",
            ", ".join(str(b) for b in block), ")")
    return _BLOCKS[block]


def fp8_quantize(x: torch.Tensor, block=(1, 128), layout: str = "rowwise",
                 pow2_scales: bool = False):
    """Quantizes a 2-D ``x`` to float8_e4m3fn with one float32 scale per block.

    Args:
        x: ``(M, K)``, float32, bfloat16 or float16; any strides (a non-contiguous ``x`` is
            copied once). For activations of more dims, pass ``x.reshape(-1, K)``.
        block: ``(1, 128)`` (activations and gradients) or ``(128, 128)`` (weights).
        layout: ``"rowwise"``, ``"columnwise"`` (the copy of ``x.T`` a weight-gradient GEMM
            reads) or ``"both"``, from one read of ``x``.
        pow2_scales: round every scale up to a power of two.

    Returns:
        ``"rowwise"``: ``(data, scales)``; ``"columnwise"``: ``(data_t, scales_t)``;
        ``"both"``: ``(data, scales, data_t, scales_t)``. Shapes for ``block=(1, 128)``:
        data ``(M, K)``, scales ``(ceil(K/128), M)``, data_t ``(K, M)``, scales_t
        ``(ceil(M/128), K)``; for ``block=(128, 128)``: data ``(M, K)``, scales
        ``(ceil(M/128), ceil(K/128))``, data_t ``data.T`` (contiguous), scales_t
        ``scales.T`` (contiguous). All contiguous; data float8_e4m3fn, scales float32. The
        format is this module's docstring.

    Raises:
        RuntimeError naming ``fk::fp8_quantize`` for a wrong shape, dtype, block or layout;
        on a CUDA GPU older than compute capability 9.0 (the kernels are built for sm_90
        and newer; 8.x GPUs, Ada's FP8 included, run the sm_80 cubins); on CUDA for K over
        8,388,480 (65535 column tiles, the grid's limit).
    """
    args = (x, _block_rows("fk::fp8_quantize", block), layout, pow2_scales)
    q, s, qt, st = (_fp8_quantize_eager(*args) if _autograd.eager()
                    else torch.ops.fk.fp8_quantize(*args))
    if layout == "rowwise":
        return q, s
    if layout == "columnwise":
        return qt, st
    return q, s, qt, st


def fp8_dequantize(data: torch.Tensor, scales: torch.Tensor, block=(1, 128),
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``data * scale`` of each element's block, in float32, rounded once to ``dtype``.

    ``data``, ``scales`` as :func:`fp8_quantize` returns them for ``block`` (the row-wise
    copy, or the column-wise one, which dequantizes to ``x.T``). Runs in ATen operators on
    CPU and CUDA (a checking and testing tool, not a fused kernel).
    """
    return torch.ops.fk.fp8_dequantize(data, scales, _block_rows("fk::fp8_dequantize", block),
                                       dtype)


# --- checks and fake kernels (csrc/ops/fp8_quantize/fp8_quantize.cpp raises the same) ----

def _check_block(op, block_rows):
    c.check(block_rows in (1, 128), op, ": block must be (1, 128) or (128, 128), got (",
            block_rows, ", 128)")


def check_input_dtype(op, x):
    c.check(x.dtype in _FLOATS, op, ": x has dtype ", c.dtype_name(x.dtype),
            ", which is not supported (supported: float32, bfloat16, float16)")


def parse_layout(op, layout):
    """(row-wise copy wanted, column-wise copy wanted) of a layout."""
    c.check(layout in _LAYOUTS, op, ": layout must be 'rowwise', 'columnwise' or 'both', got '",
            layout, "'")
    return layout != "columnwise", layout != "rowwise"


def check_fp8_quantize(x, block_rows, layout):
    op = "fk::fp8_quantize"
    c.check(x.dim() == 2, op, ": x must be 2-D (M, K), got shape ", c.shape_text(x),
            " (flatten the leading dims first)")
    check_input_dtype(op, x)
    _check_block(op, block_rows)
    return parse_layout(op, layout)


def rowwise_shapes(m, k):
    """Shapes of the 1 x 128 copies of an (m, k) x: data, scales, data_t, scales_t."""
    nm, nk = -(-m // 128), -(-k // 128)
    return (m, k), (nk, m), (k, m), (nm, k)


def check_fp8_dequantize(data, scales, block_rows, dtype):
    op = "fk::fp8_dequantize"
    c.check(data.dim() == 2, op, ": data must be 2-D, got shape ", c.shape_text(data))
    c.check(data.dtype == torch.float8_e4m3fn, op, ": data must be float8_e4m3fn, got ",
            c.dtype_name(data.dtype))
    c.check(scales.dtype == torch.float32, op, ": scales must be float32, got ",
            c.dtype_name(scales.dtype))
    c.check_same_device(op, "data", data, "scales", scales)
    _check_block(op, block_rows)
    c.check(dtype in _FLOATS, op, ": dtype must be float32, bfloat16 or float16, got ",
            c.dtype_name(dtype))
    r, k = data.shape
    want = ((-(-k // 128), r) if block_rows == 1 else (-(-r // 128), -(-k // 128)))
    c.check(tuple(scales.shape) == want, op, ": scales must have shape [",
            ", ".join(str(w) for w in want), "] for data of shape ", c.shape_text(data),
            " and block (", block_rows, ", 128), got ", c.shape_text(scales))


@torch.library.register_fake("fk::fp8_quantize")
def _quantize_fake(x, block_rows=1, layout="rowwise", pow2_scales=False):
    rowwise, columnwise = check_fp8_quantize(x, block_rows, layout)
    m, k = x.shape
    nm, nk = -(-m // 128), -(-k // 128)
    fp8 = torch.float8_e4m3fn

    def new(*shape, dtype=torch.float32):
        return x.new_empty(shape, dtype=dtype)

    weight = block_rows != 1
    q = new(m, k, dtype=fp8) if rowwise else None
    s = (new(nm, nk) if weight else new(nk, m)) if rowwise else None
    qt = new(k, m, dtype=fp8) if columnwise else None
    st = (new(nk, nm) if weight else new(nm, k)) if columnwise else None
    return q, s, qt, st


@torch.library.register_fake("fk::fp8_dequantize")
def _dequantize_fake(data, scales, block_rows, dtype):
    check_fp8_dequantize(data, scales, block_rows, dtype)
    return data.new_empty(data.shape, dtype=dtype)


_fp8_quantize_eager = _autograd.not_differentiable("fk::fp8_quantize")
