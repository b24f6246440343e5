"""benchmarks/_harness.py: the --modes list every op benchmark reads (a value that names no
mode is an error, not a run that times nothing)."""
import os
import subprocess
import sys

import pytest

from helpers import ROOT

BENCHMARKS = os.path.join(ROOT, "benchmarks")


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, BENCHMARKS)
    try:
        import _harness
    finally:
        sys.path.remove(BENCHMARKS)
    return _harness


@pytest.mark.parametrize("text,want", [("forward,full", ["forward", "full"]),
                                       ("full", ["full"]), (" forward , ", ["forward"])])
def test_modes_parsed(harness, text, want):
    assert harness.parse_modes(text) == want


@pytest.mark.parametrize("text", ["both", "", ",", "forward,both", "Forward"])
def test_unknown_mode_is_an_error(harness, text):
    with pytest.raises(SystemExit, match="give a comma-separated list of forward, full"):
        harness.parse_modes(text)


def test_benchmark_exits_on_an_unknown_mode():
    """A benchmark given --modes both stops with the message before it times anything."""
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "benchmark_rms_norm.py"),
                           "--device", "cpu", "--quick", "--tokens", "64", "--modes", "both",
                           "--out", ""], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode != 0
    assert "--modes 'both': give a comma-separated list of forward, full" in proc.stderr
