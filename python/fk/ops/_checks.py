"""The input checks of csrc/runtime/checks.h for the fake (meta) kernels, with the same
messages, so that torch.compile and export report a mistake as the CPU and CUDA kernels do.
Sizes may be SymInts."""
from __future__ import annotations

import torch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.bfloat16: "BFloat16",
          torch.float16: "Half", torch.int64: "Long", torch.int32: "Int", torch.uint8: "Byte",
          torch.bool: "Bool", torch.int8: "Char", torch.int16: "Short",
          torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
          torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2"}


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as torch's C++ prints it ("Float", "BFloat16", ...)."""
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def device_name(device: torch.device) -> str:
    return "cuda:%d" % (device.index or 0) if device.type == "cuda" else device.type


def shape_text(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def fail(msg: str):
    raise RuntimeError(msg)


def check(cond, *parts) -> None:
    if not cond:
        fail("".join(str(p) for p in parts))


def check_float(op: str, name: str, t: torch.Tensor) -> None:
    floating = t.dtype in _FLOATS
    check(floating or t.dtype == torch.float64, op, ": ", name, " has dtype ",
          dtype_name(t.dtype), ", which is not supported (supported: float32, bfloat16, "
          "float16; float64 on CPU only)")
    check(floating or t.device.type != "cuda", op, ": ", name, " has dtype Double, which is "
          "not supported on CUDA (supported: float32, bfloat16, float16; float64 on CPU only)")


def check_same_device(op: str, na: str, a: torch.Tensor, nb: str, b: torch.Tensor) -> None:
    check(a.device == b.device, op, ": ", na, " and ", nb, " must be on the same device, got ",
          device_name(a.device), " and ", device_name(b.device))


def check_same_dtype(op: str, na: str, a: torch.Tensor, nb: str, b: torch.Tensor) -> None:
    check(a.dtype == b.dtype, op, ": ", na, " and ", nb, " must have the same dtype, got ",
          dtype_name(a.dtype), " and ", dtype_name(b.dtype))


def check_same_shape(op: str, na: str, a: torch.Tensor, nb: str, b: torch.Tensor) -> None:
    check(a.shape == b.shape, op, ": ", na, " and ", nb, " must have the same shape, got ",
          shape_text(a), " and ", shape_text(b))


def check_pair(op: str, na: str, a: torch.Tensor, nb: str, b: torch.Tensor) -> None:
    check_same_device(op, na, a, nb, b)
    check_same_dtype(op, na, a, nb, b)
    check_float(op, na, a)


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype of the reference: float64 for float64 inputs, else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32
