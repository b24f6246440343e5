"""The level-1 references model how Triton's interpreter rounds fp32 to bfloat16
(helpers.round_toward_zero); this pins that behaviour, so a Triton that changes it makes
this test fail instead of silently skewing the kernel comparisons."""
import torch
import triton
import triton.language as tl

from helpers import randn, round_nearest, round_toward_zero


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(y_ptr.dtype.element_ty), mask=mask)


def test_interpreter_fp32_to_low_precision_rounding():
    x = randn(4096)
    for dtype, model in ((torch.bfloat16, round_toward_zero), (torch.float16, round_nearest)):
        y = torch.empty(4096, dtype=dtype)
        _cast_kernel[(1,)](x, y, 4096, BLOCK=4096)
        assert torch.equal(y, model(x, dtype)), dtype
    # The bf16 model really differs from round-to-nearest (else this test proves nothing).
    assert not torch.equal(round_toward_zero(x, torch.bfloat16), x.bfloat16())
