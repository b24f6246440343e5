"""A GPU whose arch is not in the build gets an error naming the GPU, its compute capability
and the archs the build has (never a crash or a wrong result).

Needs a libfk.so built without this GPU's arch: benchmarks/run_h200.sh builds none itself,
it installs the wheel made by `pip wheel . -C cmake.define.FK_CUDA_ARCHS=80
-C build-dir=build/sm80 -w dist-sm80` and sets FK_SM80_ONLY_LIBRARY to its libfk.so."""
import os
import subprocess
import sys

import pytest
import torch


@pytest.mark.cuda
def test_gpu_without_cubins_gets_a_clear_error():
    lib = os.environ.get("FK_SM80_ONLY_LIBRARY")
    if not lib:
        pytest.fail("set FK_SM80_ONLY_LIBRARY to a libfk.so built with FK_CUDA_ARCHS=80")
    major, minor = torch.cuda.get_device_capability()
    assert major != 8, "this test needs a GPU that sm_80 cubins do not serve"
    code = ("import torch, fk\n"
            "x = torch.ones(2, 8, device='cuda')\n"
            "print(fk.build_info())\n"
            "fk.rms_norm(x, torch.ones(8, device='cuda'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, FK_LIBRARY=lib))
    assert proc.returncode != 0, proc.stdout
    assert "archs 80;" in proc.stdout or "archs 80\n" in proc.stdout, proc.stdout
    err = proc.stderr
    name = torch.cuda.get_device_name()
    assert f"fk::rms_norm: this build of fk has no kernels for {name}" in err, err[-2000:]
    assert f"(compute capability {major}.{minor})" in err, err[-2000:]
    assert "it was built for sm_80" in err, err[-2000:]
