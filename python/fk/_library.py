"""Loads libfk, the C++ library that registers torch.ops.fk.*, from inside the package.

libfk is built on PyTorch's stable C ABI for torch 2.11 (TORCH_TARGET_VERSION), so the same
library loads in every torch from 2.11 on; an older torch is refused with a clear message.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

_PKG = Path(__file__).resolve().parent
LIB_PATH = _PKG / "lib" / "libfk.so"
#: The oldest torch libfk runs on: the stable ABI version it is built for.
MIN_TORCH = (2, 11)
_loaded = False


def _release(version: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_torch_version(version: str) -> None:
    """Raise ImportError naming both versions when `version` is older than MIN_TORCH."""
    if _release(version) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(f"fk needs torch >= {need} (its library is built on PyTorch's "
                          f"stable ABI of torch {need}), but torch {version} is installed. "
                          f"Upgrade torch: pip install 'torch>={need}'.")


def load_library() -> Path:
    """Load libfk once. ``FK_LIBRARY`` may point at another build of it (development)."""
    global _loaded
    if _loaded:
        return LIB_PATH
    check_torch_version(torch.__version__)
    path = Path(os.environ.get("FK_LIBRARY", LIB_PATH))
    if not path.exists():
        raise ImportError(
            f"fk: the compiled library {path} is missing. fk must be installed from a wheel or "
            "built with `pip install .` (a source checkout alone has no libfk.so).")
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        raise ImportError(f"fk: cannot load {path} into torch {torch.__version__}: "
                          f"{e.__cause__ or e}") from e
    _loaded = True
    return path


def build_info() -> str:
    """One line describing the loaded libfk: fk version, the torch it was built against and
    the oldest it runs on, the GPU archs, the Triton and ptxas that compiled the kernels."""
    return torch.ops.fk._build_info()
