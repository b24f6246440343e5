"""The peak memory bandwidth the kernel picker reads for a GPU (variants tuned for GPUs below
4 TB/s run there: triton_src/_common.py FLAG_LOW_BANDWIDTH), and FK_MEMORY_BANDWIDTH_GBPS,
which replaces it for every device of a process."""
import os
import subprocess
import sys

import pytest
import torch

import fk  # noqa: F401  (loads libfk)


def _bandwidth_in_subprocess(value):
    code = "import torch, fk\nprint(torch.ops.fk._memory_bandwidth_gbps(0))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, FK_MEMORY_BANDWIDTH_GBPS=value))


def test_override_replaces_the_device_bandwidth():
    # Read before any device query, so this holds on a machine without a GPU too.
    for value, want in (("3000", 3000.0), ("4800.5", 4800.5), ("0", 0.0)):
        proc = _bandwidth_in_subprocess(value)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert float(proc.stdout.strip()) == want


@pytest.mark.parametrize("value", ["fast", "-1", "3000GB"])
def test_bad_override_is_a_clear_error(value):
    proc = _bandwidth_in_subprocess(value)
    assert proc.returncode != 0
    assert f"FK_MEMORY_BANDWIDTH_GBPS must be a number of GB/s, got '{value}'" in proc.stderr


@pytest.mark.cuda
def test_bandwidth_is_the_devices_peak():
    """Memory clock x bus width x 2 from the driver, against torch's own device properties
    (the CUDA runtime's); an H100 SXM reads about 3350 GB/s, an H200 about 4900."""
    if "FK_MEMORY_BANDWIDTH_GBPS" in os.environ:
        pytest.fail("unset FK_MEMORY_BANDWIDTH_GBPS for this test")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        want = 2 * p.memory_clock_rate * 1e3 * (p.memory_bus_width / 8) / 1e9
        got = torch.ops.fk._memory_bandwidth_gbps(i)
        assert want > 0
        assert got == pytest.approx(want, rel=1e-9), (p.name, got, want)
        print(f"cuda:{i} {p.name}: {got:.0f} GB/s")
