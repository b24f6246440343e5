"""fk's kernels launched from a thread that has made no CUDA call yet (marker ``cuda``).

Autograd runs CUDA backwards on a thread of its own, where torch's device guard skips
cudaSetDevice for the device already selected, so that thread may have no current CUDA
context when fk's driver launch runs. A kernel loaded by a forward on the main thread and
launched again by the backward there must still run (csrc/runtime/kernels.cpp,
ensure_context)."""
import threading

import pytest
import torch

import fk


def _in_fresh_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 (handed back to the test's thread)
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.cuda
def test_cuda_kernel_loaded_on_one_thread_runs_on_a_fresh_one():
    x = torch.randn(64, 256, device="cuda")
    w = torch.randn(256, device="cuda")
    ref = fk.rms_norm(x, w)  # loads the kernel on this thread
    got = _in_fresh_thread(lambda: fk.rms_norm(x, w))
    torch.cuda.synchronize()
    assert torch.equal(got, ref)


@pytest.mark.cuda
def test_cuda_rope_backward_on_autograd_thread_after_forward():
    """rope's backward runs the forward's kernel (rotating by -sin) on autograd's thread."""
    q = torch.randn(2, 4, 16, 64, device="cuda", requires_grad=True)
    k = torch.randn(2, 2, 16, 64, device="cuda", requires_grad=True)
    pos = torch.arange(16, device="cuda", dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, device="cuda") / 64))
    ang = torch.outer(pos, inv)
    cos = torch.cat([ang, ang], -1).cos()[None]
    sin = torch.cat([ang, ang], -1).sin()[None]
    qo, ko = fk.rope(q, k, cos, sin)
    (qo.sum() + ko.sum()).backward()
    # d(sum of the rotation)/dq: the rotation's transpose applied to ones.
    half = 32
    ones = torch.ones(2, 4, 16, 64, device="cuda")
    rot_t = ones * cos[:, None] + torch.cat([ones[..., half:], -ones[..., :half]], -1) * sin[:, None]
    torch.testing.assert_close(q.grad, rot_t)
