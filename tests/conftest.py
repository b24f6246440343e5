import os
import sys
import tempfile

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "tests"))


if os.environ.get("FK_BLOCK_TRITON") == "1":
    # Triton made unimportable, as on a machine without it: `import triton` raises
    # ModuleNotFoundError and importlib.util.find_spec("triton") returns None.
    sys.modules["triton"] = None
else:
    # Level-1 tests run the Triton sources on the CPU. Triton reads this flag when it is
    # first imported, so it is set for the whole run; fk itself never imports Triton.
    os.environ["TRITON_INTERPRET"] = "1"

# torch.compile tests get a fresh Inductor cache: its cache keys do not cover the fk library,
# so graphs cached against an earlier build (an op renamed or re-registered since) would be
# replayed and fail with a missing operator.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fk-inductor-"))


_FIRST_TRITON_IMPORT = []


def pytest_runtest_teardown(item):
    if not _FIRST_TRITON_IMPORT and "triton" in sys.modules:
        _FIRST_TRITON_IMPORT.append(item.nodeid)


def pytest_sessionfinish(session, exitstatus):
    # FK_CHECK_NO_TRITON=1 (with Triton installed and importable): fail the run if anything
    # imported it, naming the first test after which it was loaded. Use with tests that do
    # not import Triton themselves (marker cuda, no torch.compile).
    if os.environ.get("FK_CHECK_NO_TRITON") == "1" and "triton" in sys.modules:
        where = _FIRST_TRITON_IMPORT[0] if _FIRST_TRITON_IMPORT else "collection"
        print(f"\nerror: triton was imported during this run (first seen after {where})")
        session.exitstatus = 1


def _has_cuda():
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
