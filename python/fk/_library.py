"""Loads libfk, the C++ library that registers torch.ops.fk.*, from inside the package."""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

_PKG = Path(__file__).resolve().parent
LIB_PATH = _PKG / "lib" / "libfk.so"
_loaded = False


def _release(version: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _cuda_tag(version: str) -> str:
    m = re.search(r"\+(cu\d+)", version)
    return m.group(1)[:4] if m else ""  # cu13x -> "cu13": the CUDA major version


def _built_for() -> str | None:
    try:
        from . import _build_info

        return _build_info.torch_version
    except ImportError:
        return None


def load_library() -> Path:
    """Load libfk once. ``FK_LIBRARY`` may point at another build of it (development)."""
    global _loaded
    if _loaded:
        return LIB_PATH
    path = Path(os.environ.get("FK_LIBRARY", LIB_PATH))
    if not path.exists():
        raise ImportError(
            f"fk: the compiled library {path} is missing. fk must be installed from a wheel or "
            "built with `pip install .` (a source checkout alone has no libfk.so).")
    built = _built_for()
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        hint = (f" It was built for torch {built}; this is torch {torch.__version__}."
                if built else "")
        raise ImportError(f"fk: cannot load {path}: {e}.{hint} Install the fk wheel that "
                          "matches your torch, or rebuild fk against it.") from e
    info = torch.ops.fk._build_info()
    m = re.search(r"torch (\S+);", info)
    built = m.group(1) if m else (built or "unknown")
    now = torch.__version__
    if _release(built) != _release(now) or _cuda_tag(built) != _cuda_tag(now):
        raise ImportError(f"fk: {path} was built for torch {built}, but torch {now} is "
                          "installed. Install the fk wheel built for your torch.")
    _loaded = True
    return path


def build_info() -> str:
    """One line describing the loaded libfk: fk version, torch it was built for, GPU archs."""
    return torch.ops.fk._build_info()
