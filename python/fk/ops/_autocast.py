"""Autocast rules of the ops that carry matmuls (torch.autocast, e.g. ``Trainer(bf16=True)``
over float32 weights).

torch's autocast runs ``F.linear`` / ``matmul`` in the autocast dtype and losses such as
``cross_entropy`` in float32. The fused ops follow the same policy: their matmul inputs (the
hidden states and the weights) are cast to the autocast dtype, the math inside stays in
float32 (accumulators, softmax, loss), and the losses come back in float32.

``lower_precision(name, cast, float32_outputs)`` registers that rule on the operator
``fk::<name>`` for the AutocastCPU and AutocastCUDA dispatch keys (above Autograd, so the casts
are recorded by autograd and the gradients reach float32 weights in float32), both in the C++
dispatcher (eager calls, TorchScript, C++) and as Python-dispatcher kernels (what
torch.compile traces). Like torch's own rules (``cached_cast``), a tensor is cast only when it
is floating point, not float64, and on the autocast's device type; everything else passes
through unchanged. The op then runs with autocast off.
"""
from typing import Dict, Iterable, Optional

import torch

_KEYS = {"cpu": torch._C.DispatchKey.AutocastCPU, "cuda": torch._C.DispatchKey.AutocastCUDA}
_EXCLUDE = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
            | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA))

_lib = torch.library.Library("fk", "IMPL")

#: {op name: tuple of argument names cast to the autocast dtype}; read by the tests.
RULES = {}


def _cast(t, device_type, dtype):
    if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type == device_type and t.dtype != dtype):
        return t.to(dtype)
    return t


def _to_float32(t):
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype not in (
            torch.float32, torch.float64):
        return t.float()
    return t


def lower_precision(name: str, cast: Iterable[str], float32_outputs: Iterable[int] = (),
                    none_defaults: Optional[Dict[str, object]] = None):
    """Autocast rule for ``fk::<name>``: the arguments named in ``cast`` go to the autocast
    dtype; the outputs at the indices in ``float32_outputs`` come back at least float32; when the
    first cast argument runs in 16 bits, the arguments in ``none_defaults`` that are None (or
    not given) take the value there (e.g. a loss computed and returned in float32, not
    rounded to the autocast dtype first)."""
    overload = getattr(torch.ops.fk, name).default
    names = [a.name for a in overload._schema.arguments]
    cast = tuple(cast)
    positions = [names.index(n) for n in cast]
    fills = [(names.index(n), n, v) for n, v in (none_defaults or {}).items()]
    outs = tuple(float32_outputs)
    RULES[name] = cast

    def make(device_type):
        def kernel(*args, **kwargs):
            dtype = torch.get_autocast_dtype(device_type)
            args = list(args)
            for i in positions:
                if i < len(args):
                    args[i] = _cast(args[i], device_type, dtype)
                elif names[i] in kwargs:
                    kwargs[names[i]] = _cast(kwargs[names[i]], device_type, dtype)
            first = (args[positions[0]] if positions[0] < len(args)
                     else kwargs.get(names[positions[0]]))
            lowered = isinstance(first, torch.Tensor) and first.dtype in (torch.float16,
                                                                          torch.bfloat16)
            for i, n, v in (fills if lowered else ()):
                if i < len(args):
                    if args[i] is None:
                        args[i] = v
                elif kwargs.get(n) is None:
                    kwargs[n] = v
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                out = overload(*args, **kwargs)
            if not outs:
                return out
            if isinstance(out, tuple):
                return tuple(_to_float32(o) if i in outs else o for i, o in enumerate(out))
            return _to_float32(out) if 0 in outs else out

        return kernel

    for device_type, key in _KEYS.items():
        kernel = make(device_type)

        def boxed(_keyset, *args, _kernel=kernel, **kwargs):
            return _kernel(*args, **kwargs)

        _lib.impl(name, boxed, key.name, with_keyset=True)
        if overload.has_kernel_for_dispatch_key(key) and key in overload.py_kernels:
            overload.py_kernels.pop(key)
        overload.py_impl(key)(kernel)
