"""examples/train_fsdp.py launched as users launch it (torchrun, 2 processes): fk under FSDP2
follows the unpatched model's loss, with gradient accumulation. gloo on CPU;
NCCL with bf16 parameters on 2 GPUs (marker cuda)."""
import os
import re
import subprocess
import sys

import pytest
import torch

from helpers import ROOT

EXAMPLE = os.path.join(ROOT, "examples", "train_fsdp.py")


def _run(device, *args):
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the example picks gloo on CPU where no GPU is seen
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", EXAMPLE, "--compare", "--steps", "4", "--every", "1", "--batch", "4",
           "--context", "32", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=(pytest.mark.cuda, pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")))])
def test_example_trains_under_fsdp_and_follows_hf(device):
    # With gradient accumulation (2 micro-batches per process, num_items_in_batch); without
    # it, tests/distributed/test_fsdp.py covers the same path.
    proc = _run(device, "--accumulate", "2")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-4000:]
    backend = "gloo, cpu" if device == "cpu" else "nccl, cuda"
    assert f"2 processes ({backend})" in out, out
    assert "OK: fk's loss follows Hugging Face's under FSDP2" in out, out
    # Rank 0 alone prints: one line per step for each of the two runs.
    losses = [float(v) for v in re.findall(r"^step +\d+ +loss ([\d.]+)$", out, re.M)]
    assert len(losses) == 8, out
    assert "fused_linear_cross_entropy" in out
