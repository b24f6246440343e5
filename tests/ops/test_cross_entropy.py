"""fk.cross_entropy at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, the gradient-in-logits contract, and the
CUDA kernels (marker ``cuda``)."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import fk
from helpers import (CE_OPTIONS as OPTIONS, ce_inputs as _inputs, ce_kwargs as _kwargs,
                     DTYPES, assert_close, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_cross_entropy, ref_token_accuracy,
                     round_nearest, round_toward_zero)

REDUCTIONS = ("mean", "sum", "none")


def _ref_grad(x, t, kw, grad_out):
    """float64 gradient of the reference loss with respect to the logits."""
    xd = x.detach().double().requires_grad_()
    loss, _ = ref_cross_entropy(xd, t, **kw)
    loss.backward(grad_out.double())
    return xd.grad


def _with_ties(x, seed=0):
    """x with each row's maximum raised by 1 (a clear argmax, even under a softcap), then in
    every third row that maximum copied to a later column too (an exact tie: the first one
    is the argmax)."""
    x = x.clone()
    n, v = x.shape
    g = torch.Generator().manual_seed(seed)
    top = x.float().argmax(-1)
    for i in range(n):
        x[i, top[i]] = x[i, top[i]].float() + 1.0
        if i % 3 == 0 and v > 1:
            j = int(torch.randint(0, v, (1,), generator=g))
            if j != top[i]:
                first, second = min(j, int(top[i])), max(j, int(top[i]))
                x[i, second] = x[i, first] = x[i, top[i]]
    return x


# --- level 1: the Triton source under the interpreter ---------------------------------

class _ClusterSums:
    """Stands in for _cluster_exchange under the interpreter, which runs programs one after
    another, so a program cannot wait at the meeting for the rest of its cluster: each call
    keeps the caller's sums under (row, rank) and returns the sums kept for every rank of
    that row (NaN where none are kept yet), flat as the kernel expects. (The hardware's
    slot and first arguments have no meaning here.)"""

    def __init__(self):
        self.kept = {}

    def __call__(self, row, rank, m, d, sx, sw, slot, first, chunks, general):
        def key(t):
            return int(t.handle.data.item()) if hasattr(t, "handle") else int(t)

        import triton.language as tl

        def value(t):
            return float(t.handle.data.item()) if hasattr(t, "handle") else float(t)

        chunks, general = getattr(chunks, "value", chunks), getattr(general, "value", general)
        values = tuple(map(value, (m, d, sx, sw) if general else (m, d)))
        self.kept[key(row), key(rank)] = values
        missing = (float("nan"),) * len(values)
        # Kept as floats and returned as tensors made in this launch (newer Triton interpreters
        # take neither a tensor of an earlier launch nor a float mixed with tensors here).
        return tuple(tl.full([], self.kept.get((key(row), j), missing)[k], tl.float32)
                     for k in range(len(values)) for j in range(chunks))


def _run_den_kernel(mod, t, wt, v, kw):
    """(D_w, D_n): ones unless the reduction is "mean", else from the den kernel."""
    if kw["reduction"] != "mean":
        return torch.ones(2)
    den = torch.zeros(2)  # the programs add into it
    mod.cross_entropy_den_kernel[(2,)](t, wt, den, t.shape[0], v, -100,
                                       int(kw["weight"] is not None), BLOCK=4, PER_SM=1)
    return den


def _run_fwd_kernel(mod, x, t, w, kw, block, general, grid, in_place, write_grad=True,
                    chunks=1, pred=None, token_scaling=False, lse=None):
    """grid: programs (chunks == 1) or rows at once (chunks > 1: chunks programs a row).
    With chunks > 1 the cluster exchange is emulated (_ClusterSums) and the kernel runs
    twice, the first time without the gradient: the first launch leaves every chunk's sums
    behind, and the second, which keeps them again identically, finds them all. With `pred`
    (an (n,) int64 buffer) the EXTRA variant runs: it writes the predictions there and
    scales the rows with token_scaling. With `lse` (an (n,) float32 buffer) each row's
    logsumexp is written there (write_lse)."""
    n, v = x.shape
    wt = (w if kw["weight"] is not None else torch.zeros(1)).float()
    den = _run_den_kernel(mod, t, wt, v, kw)
    loss, z = torch.full((n,), float("nan")), torch.full((n,), float("nan"))
    grad = x if in_place else torch.full_like(x, float("nan"))
    cap = kw["softcap"]
    for wg in ((0,) if chunks > 1 else ()) + (int(write_grad),):
        mod.cross_entropy_fwd_kernel[(grid * chunks,)](
            x, grad, t, wt, den, loss, z, v, v, n, v, -100, kw["label_smoothing"],
            kw["lse_square_scale"], cap or 1.0, int(kw["weight"] is not None),
            int(cap is not None), wg, t if pred is None else pred, int(token_scaling),
            loss if lse is None else lse, int(lse is not None), BLOCK=block, GENERAL=general,
            PER_SM=1, CHUNKS=chunks, EXTRA=int(pred is not None))
    if kw["reduction"] != "none":
        loss, z = loss.sum(), z.sum()
    return loss, z, grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option,reduction", [("plain", "mean"), ("zloss", "none"),
                                              ("weight_smooth_z", "sum"), ("all", "mean"),
                                              ("all", "none")])
def test_interpreter_forward(dtype, option, reduction):
    mod = load_triton_src("cross_entropy")
    n, v = 7, 100
    general = int(option not in ("plain", "zloss"))
    x, t, w = _inputs(n, v, dtype, ignore=(1, 4))
    kw = _kwargs(option, w, reduction)
    ref_loss, ref_z = ref_cross_entropy(x, t, **kw)
    g_out = torch.ones_like(ref_loss) if reduction != "none" else torch.ones(n)
    ref_g = _ref_grad(x, t, kw, g_out)
    for block, grid, in_place in ((32, 3, True), (128, n, False)):
        x_in = x.clone()
        loss, z, grad = _run_fwd_kernel(mod, x_in, t, w, kw, block, general, grid, in_place)
        assert_close(loss, ref_loss, torch.float32, factor=2, what="loss")
        assert_close(z, ref_z, torch.float32, factor=2, what="z")
        assert_close(grad, round_toward_zero(ref_g.float(), dtype), dtype, factor=2, what="grad")
        assert torch.equal(grad[1], torch.zeros(v, dtype=dtype))  # ignored row


@pytest.mark.parametrize("option,reduction", [("plain", "mean"), ("zloss", "none"),
                                              ("all", "mean"), ("all", "sum")])
def test_interpreter_rows_split_into_chunks(option, reduction, monkeypatch):
    """Each row split over CHUNKS programs, each covering whole blocks (100 columns in
    blocks of 8: 4 chunks of 32, the last 4 long; 8 chunks of 16, the last empty), the
    chunks' sums exchanged in an emulation of the cluster (see _run_fwd_kernel), targets
    on chunk edges, ignored rows, and rows walked by fewer clusters than rows."""
    mod = load_triton_src("cross_entropy")
    monkeypatch.setattr(mod, "_cluster_exchange", _ClusterSums())
    monkeypatch.setattr(mod, "_cluster_arrive", lambda rank: rank)
    n, v, block = 9, 100, 8
    x, t, w = _inputs(n, v, ignore=(1, 6), seed=5)
    t[2:6] = torch.tensor([31, 32, 96, 99])
    t[7:9] = torch.tensor([0, 95])
    kw = _kwargs(option, w, reduction)
    general = int(option not in ("plain", "zloss"))
    ref_loss, ref_z = ref_cross_entropy(x, t, **kw)
    ref_g = _ref_grad(x, t, kw, torch.ones_like(ref_loss))
    for chunks, grid, in_place in ((4, n, True), (8, 4, False), (2, 3, True)):
        x_in = x.clone()
        loss, z, grad = _run_fwd_kernel(mod, x_in, t, w, kw, block, general, grid, in_place,
                                        chunks=chunks)
        assert_close(loss, ref_loss, torch.float32, factor=2, what=f"loss, {chunks} chunks")
        assert_close(z, ref_z, torch.float32, factor=2, what=f"z, {chunks} chunks")
        assert_close(grad, ref_g.float(), torch.float32, factor=2, what=f"grad, {chunks} chunks")
        assert torch.equal(grad[1], torch.zeros(v))


@pytest.mark.parametrize("option", ["plain", "all"])
def test_interpreter_targets_at_block_edges(option):
    """The one-hot term is added only in the block that holds the target (pass 2 walks the
    blocks last to first): targets on the first and last column of a block, in the short
    last block, and on the row's first and last column."""
    mod = load_triton_src("cross_entropy")
    v, block = 100, 32
    edges = [0, 31, 32, 63, 64, 95, 96, 99]
    x, _, w = _inputs(len(edges), v, ignore=())
    t = torch.tensor(edges)
    kw = _kwargs(option, w, "none")
    ref_loss, _ = ref_cross_entropy(x, t, **kw)
    ref_g = _ref_grad(x, t, kw, torch.ones(len(edges)))
    loss, _, grad = _run_fwd_kernel(mod, x.clone(), t, w, kw, block, int(option == "all"), 3,
                                    True)
    assert_close(loss, ref_loss, torch.float32, factor=2, what="loss")
    assert_close(grad, ref_g.float(), torch.float32, factor=2, what="grad")


def test_interpreter_no_grad_leaves_logits_and_all_ignored_mean_is_nan():
    mod = load_triton_src("cross_entropy")
    x, t, w = _inputs(4, 50)
    kw = _kwargs("plain", w, "mean")
    x_in = x.clone()
    loss, _, _ = _run_fwd_kernel(mod, x_in, t, w, kw, 16, 0, 2, True, write_grad=False)
    assert torch.equal(x_in, x)
    assert_close(loss, ref_cross_entropy(x, t)[0], torch.float32)
    t_all = torch.full((4,), -100)
    loss, _, grad = _run_fwd_kernel(mod, x.clone(), t_all, w, kw, 16, 0, 4, False)
    assert math.isnan(loss.item()) and math.isnan(F.cross_entropy(x, t_all).item())
    assert torch.equal(grad, torch.zeros_like(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option,reduction", [("plain", "mean"), ("zloss", "none"),
                                              ("all", "sum"), ("all", "none")])
def test_interpreter_extra_outputs_and_token_scaling(dtype, option, reduction):
    """The EXTRA variant: each row's argmax tracked over the blocks of pass 1 (ties within a
    block and across blocks go to the first column), -100 for ignored rows, the losses and
    gradient unchanged; with token_scaling, each row scaled by its probability of the
    target."""
    mod = load_triton_src("cross_entropy")
    n, v = 7, 100
    x, t, w = _inputs(n, v, dtype, ignore=(1, 4))
    x = _with_ties(x)
    # A row whose max is in its first and last block, a row whose target is its argmax.
    x[2, 3] = x[2, 97] = x[2].float().max() + 2.0
    x[5, t[5]] = x[5].float().max() + 1.0
    kw = _kwargs(option, w, reduction)
    _, ref_pred = ref_token_accuracy(x, t, reduction=reduction, softcap=kw["softcap"])
    assert int(ref_pred[2]) == 3 and int(ref_pred[5]) == int(t[5])
    g_out = torch.ones(n) if reduction == "none" else torch.tensor(1.0)
    for scaling in (False, True):
        ref_loss, ref_z = ref_cross_entropy(x, t, token_scaling=scaling, **kw)
        ref_g = _ref_grad(x, t, dict(kw, token_scaling=scaling), g_out)
        # the EXTRA variants are general ones where the options need it, else plain ones
        general = int(option not in ("plain", "zloss"))
        for block, grid, in_place in ((32, 3, True), (128, n, False)):
            pred = torch.full((n,), 12345)
            loss, z, grad = _run_fwd_kernel(mod, x.clone(), t, w, kw, block, general, grid,
                                            in_place, pred=pred, token_scaling=scaling)
            assert torch.equal(pred, ref_pred), (block, pred, ref_pred)
            what = f"scaling={scaling}, block {block}"
            assert_close(loss, ref_loss, torch.float32, factor=2, what=f"loss, {what}")
            assert_close(z, ref_z, torch.float32, factor=2, what=f"z, {what}")
            assert_close(grad, round_toward_zero(ref_g.float(), dtype), dtype, factor=2,
                         what=f"grad, {what}")


def test_interpreter_bad_target_is_nan():
    mod = load_triton_src("cross_entropy")
    x, t, w = _inputs(5, 40)
    t[3] = 40  # out of range
    for option in ("plain", "weight"):
        loss, _, grad = _run_fwd_kernel(mod, x.clone(), t, w, _kwargs(option, w, "none"), 16,
                                        int(option != "plain"), 5, False)
        assert torch.isnan(loss[3]) and torch.isnan(grad[3]).all()
        assert not torch.isnan(loss[[0, 2, 4]]).any() and loss[1] == 0
        den = torch.zeros(2)
        mod.cross_entropy_den_kernel[(2,)](t, w, den, 5, 40, -100, int(option != "plain"),
                                           BLOCK=2, PER_SM=1)
        assert torch.isnan(den).all()


@pytest.mark.parametrize("has_weight", [False, True])
@pytest.mark.parametrize("programs", [1, 3, 5])
def test_interpreter_denominators(has_weight, programs):
    """37 targets in blocks of 8: one program walks all 5 blocks, 3 programs take 2, 2 and 1,
    5 programs one each; their partial sums add up in den."""
    mod = load_triton_src("cross_entropy")
    x, t, w = _inputs(37, 10, ignore=(0, 5, 6, 36))
    den = torch.zeros(2)
    mod.cross_entropy_den_kernel[(programs,)](t, w, den, 37, 10, -100, int(has_weight), BLOCK=8,
                                              PER_SM=1)
    keep = t != -100
    ref_w = w[t[keep]].double().sum() if has_weight else keep.sum().double()
    assert_close(den[0], ref_w.float(), torch.float32)
    assert den[1].item() == keep.sum().item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_scale(dtype):
    mod = load_triton_src("cross_entropy")
    m, v = 5, 70
    src = randn(m, v, dtype=dtype, seed=1)

    def scale(s, g, dst, in_place):
        mod.cross_entropy_scale_kernel[(3,)](s, dst, g, 0 if g.dim() == 0 else 1, v, v, m, v,
                                             int(in_place), BLOCK=32, PER_SM=1)

    # In place with a scalar 1: untouched (a NaN-filled tensor stays NaN, nothing is read).
    nan = torch.full((m, v), float("nan"), dtype=dtype)
    scale(nan, torch.tensor(1.0), nan, True)
    assert torch.isnan(nan).all()
    for g in (torch.tensor(1.0), torch.tensor(-2.5), torch.tensor([1.0, 0.5, 1.0, -3.0, 0.0])):
        ref = round_toward_zero(src.float() * (g if g.dim() == 0 else g[:, None]), dtype)
        out = torch.full_like(src, float("nan"))
        scale(src, g, out, False)
        assert torch.equal(out, ref)
        inp = src.clone()
        scale(inp, g, inp, True)
        assert torch.equal(inp, ref)


def _run_bwd_kernel(mod, x, t, w, kw, lse, den, g_out, block, general, programs, in_place):
    """The deferred backward: the gradient of the loss times g_out (a scalar, or (n,)) from
    the logits x, each row's lse and den, into x itself or a new (NaN-filled) tensor."""
    n, v = x.shape
    has_w = kw["weight"] is not None
    wt = (w if has_w else torch.zeros(1)).float()
    grad = x if in_place else torch.full_like(x, float("nan"))
    cap = kw["softcap"]
    mod.cross_entropy_bwd_kernel[(programs,)](
        x, grad, t, wt, den, lse, g_out.float(), wt.sum().reshape(1),
        0 if g_out.dim() == 0 else 1, v, v, n, v, -100, kw["label_smoothing"],
        kw["lse_square_scale"], cap or 1.0, int(has_w), int(cap is not None), BLOCK=block,
        GENERAL=general, PER_SM=1)
    return grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option,reduction", [("plain", "mean"), ("zloss", "none"),
                                              ("weight", "mean"), ("smooth", "sum"),
                                              ("softcap", "none"), ("weight_smooth_z", "mean"),
                                              ("all", "mean"), ("all", "none")])
def test_interpreter_deferred_backward(dtype, option, reduction):
    """The forward without the gradient writes each row's logsumexp (write_lse; 0 for
    ignored rows); the backward kernel then computes the gradient times grad_output in one
    pass over tiles of the rows (tiles on and off row ends, fewer programs than tiles), in
    place and out of place: the reference's gradient, a zero row where ignored."""
    mod = load_triton_src("cross_entropy")
    n, v = 7, 100
    general = int(option not in ("plain", "zloss"))
    x, t, w = _inputs(n, v, dtype, ignore=(1, 4))
    t[2], t[3] = 0, v - 1
    kw = _kwargs(option, w, reduction)
    ref_loss, ref_z = ref_cross_entropy(x, t, **kw)
    lse = torch.full((n,), float("nan"))
    x_in = x.clone()
    loss, z, _ = _run_fwd_kernel(mod, x_in, t, w, kw, 32, general, 3, True, write_grad=False,
                                 lse=lse)
    assert torch.equal(x_in, x)  # no gradient written
    assert_close(loss, ref_loss, torch.float32, factor=2, what="loss")
    assert_close(z, ref_z, torch.float32, factor=2, what="z")
    xc = x.double() if kw["softcap"] is None else kw["softcap"] * torch.tanh(
        x.double() / kw["softcap"])
    keep = t != -100
    assert_close(lse[keep], torch.logsumexp(xc, -1)[keep].float(), torch.float32, what="lse")
    assert torch.equal(lse[~keep], torch.zeros(2))
    wt = (w if kw["weight"] is not None else torch.zeros(1)).float()
    den = _run_den_kernel(mod, t, wt, v, kw)
    gen = torch.Generator().manual_seed(4)
    outs = [torch.tensor(1.0), torch.tensor(1 / 7)] if reduction != "none" else [
        torch.rand(n, generator=gen) - 0.25, torch.ones(n)]
    for g_out in outs:
        ref_g = _ref_grad(x, t, kw, g_out.double())
        for block, programs, in_place in ((32, 5, True), (128, n, False), (16, 1, False)):
            grad = _run_bwd_kernel(mod, x.clone(), t, w, kw, lse, den, g_out, block, general,
                                   programs, in_place)
            assert_close(grad, round_toward_zero(ref_g.float(), dtype), dtype, factor=2,
                         what=f"grad, block {block}, grad_output {g_out}")
            assert torch.equal(grad[1], torch.zeros(v, dtype=dtype))  # ignored row


def test_interpreter_deferred_backward_bad_target_is_nan():
    """A target outside [0, V) that is not ignored: a NaN gradient row (as the forward's)."""
    mod = load_triton_src("cross_entropy")
    x, t, w = _inputs(5, 40)
    t[3] = 40
    for option, general in (("plain", 0), ("weight", 1)):
        kw = _kwargs(option, w, "none")
        lse = torch.logsumexp(x, -1)
        grad = _run_bwd_kernel(mod, x.clone(), t, w, kw, lse, torch.ones(2), torch.ones(5), 16,
                               general, 3, False)
        assert torch.isnan(grad[3]).all() and not torch.isnan(grad[[0, 1, 2, 4]]).any()


def test_variants_cover_every_dtype_and_flag():
    """The deferred backward has one variant per dtype, alignment and GENERAL flag (the C++
    launcher picks by those, any block), on every arch; the forward keeps one per dtype,
    flags and bucket."""
    mod = load_triton_src("cross_entropy")
    for arch in (80, 90, 100, 120):
        variants = mod.variants(arch)
        bwd = [(v.dtype, v.flags) for v in variants if v.family == "cross_entropy_bwd"]
        fwd = {(v.dtype, v.flags, v.block) for v in variants if v.family == "cross_entropy_fwd"}
        aligned, general = mod.FLAG_ALIGNED, mod.FLAG_GENERAL
        for dt in ("fp32", "bf16", "fp16"):
            for flags in (0, aligned, general, aligned | general):
                assert bwd.count((dt, flags)) == 1, (arch, dt, flags)
                for extra in (0, mod.FLAG_EXTRA):
                    for bucket in (mod.SMALL, mod.LARGE):
                        assert (dt, flags | extra, bucket) in fwd, (arch, dt, flags, extra)


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cpu_forward_backward(dtype, option, reduction):
    n, v = 9, 130
    x, t, w = _inputs(n, v, dtype, ignore=(1, 7))
    kw = _kwargs(option, w, reduction)
    ref_loss, ref_z = ref_cross_entropy(x, t, **kw)
    xa = x.clone().requires_grad_()
    loss_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    loss, z = fk.cross_entropy(xa, t, return_z_loss=True, loss_dtype=loss_dtype, **kw)
    assert loss.dtype == loss_dtype and loss.shape == ref_loss.shape and z.shape == ref_z.shape
    assert_close(loss, ref_loss, loss_dtype, factor=2, what="loss")
    assert_close(z, ref_z, loss_dtype, factor=2, what="z")
    assert not z.requires_grad
    g_out = torch.randn(ref_loss.shape, generator=torch.Generator().manual_seed(3)).to(loss_dtype)
    loss.backward(g_out)
    # The gradient is rounded to the dtype in the forward and once more when scaled.
    assert_close(xa.grad, _ref_grad(x, t, kw, g_out), dtype, factor=3, what="grad")
    # By default the losses come in the logits' dtype: the float32 values rounded once; the
    # gradient is the same.
    xb = x.clone().requires_grad_()
    loss_d, z_d = fk.cross_entropy(xb, t, return_z_loss=True, **kw)
    assert loss_d.dtype == dtype and z_d.dtype == dtype
    assert torch.equal(loss_d, loss.detach().to(dtype)) and torch.equal(z_d, z.to(dtype))
    loss_d.backward(g_out.to(dtype))
    if dtype in (torch.float32, torch.float64) or torch.equal(g_out.to(dtype).to(loss_dtype),
                                                              g_out):
        assert torch.equal(xb.grad, xa.grad)


def test_cpu_grad_loss_with_a_storage_offset():
    """A contiguous grad_loss that starts inside its storage (a slice of a larger buffer) is
    read from its own first element: fk's views keep the storage offset."""
    x, t, _ = _inputs(6, 40)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    buf = torch.rand(7, generator=torch.Generator().manual_seed(5)) + 0.5
    g = buf[1:]
    assert g.storage_offset() == 1 and g.is_contiguous()
    fk.cross_entropy(xa, t, reduction="none").backward(g)
    F.cross_entropy(xb, t, reduction="none").backward(g.clone())
    assert_close(xa.grad, xb.grad, torch.float32, factor=2)


def test_cpu_matches_torch_exactly_enough_in_fp32():
    x, t, w = _inputs(16, 1000, ignore=(3, 4))
    t5 = torch.where(t == -100, 5, t)
    for tt, kw in ((t, dict()), (t, dict(weight=w)), (t, dict(label_smoothing=0.3)),
                   (t, dict(weight=w, label_smoothing=0.1, reduction="sum")),
                   (t5, dict(reduction="none", ignore_index=5))):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = fk.cross_entropy(xa, tt, **kw), F.cross_entropy(xb, tt, **kw)
        assert_close(out, ref, torch.float32)
        g = torch.rand_like(ref) + 0.5
        out.backward(g)
        ref.backward(g)
        assert_close(xa.grad, xb.grad, torch.float32, factor=2)


def test_softcap_is_tanh_capping():
    x, t, _ = _inputs(6, 64, scale=10.0)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = fk.cross_entropy(xa, t, softcap=5.0)
    ref = F.cross_entropy(5.0 * torch.tanh(xb / 5.0), t)
    assert_close(out, ref, torch.float32)
    out.backward()
    ref.backward()
    assert_close(xa.grad, xb.grad, torch.float32, factor=2)


def test_z_loss_values():
    x, t, _ = _inputs(8, 32, ignore=(2,))
    keep = t != -100
    lse = torch.logsumexp(x.double(), -1)
    loss, z = fk.cross_entropy(x, t, lse_square_scale=1e-2, return_z_loss=True)
    assert_close(z, 1e-2 * (lse[keep] ** 2).mean(), torch.float32)
    assert_close(loss, F.cross_entropy(x.double(), t) + z.double(), torch.float32)
    _, z_none = fk.cross_entropy(x, t, lse_square_scale=1e-2, reduction="none",
                                 return_z_loss=True)
    assert z_none[2] == 0
    assert_close(z_none, torch.where(keep, 1e-2 * lse ** 2, 0.0), torch.float32)


def test_empty_and_degenerate():
    x = torch.empty(0, 10, requires_grad=True)
    t = torch.empty(0, dtype=torch.long)
    assert math.isnan(fk.cross_entropy(x, t).item())  # torch: the mean of nothing is NaN
    assert fk.cross_entropy(x, t, reduction="sum").item() == 0
    out = fk.cross_entropy(x, t, reduction="none")
    assert out.shape == (0,)
    out.sum().backward()
    assert x.grad.shape == (0, 10)
    x1, t1, _ = _inputs(3, 1, ignore=())  # one class: loss 0, gradient 0
    assert fk.cross_entropy(x1, t1).item() == 0
    all_ignored = torch.full((3,), -100)
    assert math.isnan(fk.cross_entropy(x1, all_ignored).item())
    assert math.isnan(F.cross_entropy(x1, all_ignored).item())


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("bad", [10, 11, -5, -101])
def test_bad_target_raises(reduction, bad):
    x, t, w = _inputs(4, 10, ignore=(1,))
    t[2] = bad
    msg = re.escape(f"fk::cross_entropy: target {bad} (row 2) is out of range: each target "
                    "must be in [0, 10) (V = 10) or ignore_index (-100)")
    for kw in (dict(), dict(weight=w, label_smoothing=0.1)):
        with pytest.raises(RuntimeError, match=msg):
            fk.cross_entropy(x, t, reduction=reduction, **kw)
        with pytest.raises(RuntimeError, match=msg):
            fk.cross_entropy(x.clone().requires_grad_(), t, reduction=reduction, **kw)
    # The same value as ignore_index is not out of range.
    t[1] = 0
    assert not torch.isnan(fk.cross_entropy(x, t, ignore_index=bad))


def test_loss_dtype_option():
    x, t, _ = _inputs(5, 33, torch.bfloat16, ignore=(2,))
    ref = fk.cross_entropy(x, t, loss_dtype=torch.float32)
    assert ref.dtype == torch.float32
    assert_close(ref, ref_cross_entropy(x, t)[0], torch.float32, factor=2)
    for d in (torch.float64, torch.float16, torch.bfloat16):
        assert torch.equal(fk.cross_entropy(x, t, loss_dtype=d), ref.to(d))
    assert fk.cross_entropy(x, t).dtype == torch.bfloat16
    assert fk.cross_entropy(x.float(), t).dtype == torch.float32
    # torch's dtype for the same call
    assert fk.cross_entropy(x, t).dtype == F.cross_entropy(x, t).dtype
    with pytest.raises(RuntimeError, match="fk::cross_entropy: loss_dtype must be None, "
                       "float32, float64, bfloat16 or float16, got Long"):
        fk.cross_entropy(x, t, loss_dtype=torch.int64)
    with pytest.raises(RuntimeError, match="loss_dtype must be None"):
        fk.cross_entropy(x.clone().requires_grad_(), t, loss_dtype=torch.int64)
    with torch.no_grad(), pytest.raises(RuntimeError, match="loss_dtype must be None"):
        torch.ops.fk.cross_entropy(x.to("meta"), t.to("meta"), loss_dtype=torch.int32)
    m = fk.nn.CrossEntropyLoss(loss_dtype=torch.float32)
    assert m(x, t).dtype == torch.float32 and fk.nn.CrossEntropyLoss()(x, t).dtype == x.dtype


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", ["plain", "zloss", "weight_smooth_z", "softcap", "all"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cpu_extra_outputs(dtype, option, reduction):
    """return_token_accuracy / return_predicted_tokens: the argmax of each row (first of
    ties; -100 where ignored) and the accuracy against plain torch; the loss and gradient
    are those of the call without them; neither extra output has a gradient."""
    n, v = 10, 130
    x, t, w = _inputs(n, v, dtype, ignore=(1, 7))
    x = _with_ties(x)
    t[4] = int(x[4].float().argmax())  # at least one row predicted right
    kw = _kwargs(option, w, reduction)
    ref_acc, ref_pred = ref_token_accuracy(x, t, reduction=reduction, softcap=kw["softcap"])
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = fk.cross_entropy(xa, t, return_token_accuracy=True, return_predicted_tokens=True,
                           **kw)
    assert isinstance(out, fk.CrossEntropyOutput) and out.z_loss is None
    assert out.predicted_tokens.dtype == torch.int64 and out.token_accuracy.dtype == F32
    assert torch.equal(out.predicted_tokens, ref_pred)
    assert out.token_accuracy.shape == ref_acc.shape
    assert_close(out.token_accuracy, ref_acc, F32)
    assert not out.token_accuracy.requires_grad and not out.predicted_tokens.requires_grad
    plain = fk.cross_entropy(xb, t, **kw)
    assert torch.equal(out.loss.detach(), plain.detach())
    g_out = torch.rand(plain.shape, generator=torch.Generator().manual_seed(2)).to(dtype) + 0.5
    out.loss.backward(g_out)
    plain.backward(g_out)
    assert torch.equal(xa.grad, xb.grad)
    # Without a gradient (no_grad), and each output alone.
    with torch.no_grad():
        acc = fk.cross_entropy(x, t, return_token_accuracy=True, **kw)
        pred = fk.cross_entropy(x, t, return_predicted_tokens=True, return_z_loss=True, **kw)
    assert acc.predicted_tokens is None and acc.z_loss is None
    assert torch.equal(acc.token_accuracy, out.token_accuracy)
    assert pred.token_accuracy is None and pred.z_loss is not None
    assert torch.equal(pred.predicted_tokens, ref_pred)


def test_extra_outputs_edge_cases():
    """Rows of one class, every row ignored, no rows, -inf rows and an ignore_index other
    than -100."""
    x = torch.randn(4, 1)
    t = torch.zeros(4, dtype=torch.long)
    out = fk.cross_entropy(x, t, return_token_accuracy=True, return_predicted_tokens=True)
    assert out.token_accuracy.item() == 1.0 and torch.equal(out.predicted_tokens, t)
    ign = torch.full((4,), -100)
    for reduction in ("mean", "sum"):  # no non-ignored row: 0 / 0, like the mean loss
        out = fk.cross_entropy(x, ign, reduction=reduction, return_token_accuracy=True,
                               return_predicted_tokens=True)
        assert math.isnan(out.token_accuracy.item())
        assert torch.equal(out.predicted_tokens, ign)
    out = fk.cross_entropy(x, ign, reduction="none", return_token_accuracy=True)
    assert torch.equal(out.token_accuracy, torch.zeros(4))
    e = torch.empty(0, 5, requires_grad=True)
    te = torch.empty(0, dtype=torch.long)
    out = fk.cross_entropy(e, te, return_token_accuracy=True, return_predicted_tokens=True)
    assert math.isnan(out.token_accuracy.item()) and out.predicted_tokens.shape == (0,)
    out = fk.cross_entropy(e, te, reduction="none", return_token_accuracy=True)
    assert out.token_accuracy.shape == (0,)
    x = torch.randn(3, 6)
    x[1] = -float("inf")  # torch.argmax of an all -inf row: 0
    t = torch.tensor([2, 3, 5])
    out = fk.cross_entropy(x, t, ignore_index=5, reduction="none",
                           return_token_accuracy=True, return_predicted_tokens=True)
    assert torch.equal(out.predicted_tokens,
                       torch.tensor([int(x[0].argmax()), 0, -100]))
    assert torch.equal(out.token_accuracy,
                       torch.tensor([float(int(x[0].argmax()) == 2), 0.0, 0.0]))


def test_return_forms():
    """Nothing extra: the loss; return_z_loss alone: (loss, z_loss), as before; an extra
    output: a CrossEntropyOutput whose fields not asked for are None."""
    x, t, _ = _inputs(5, 9)
    loss = fk.cross_entropy(x, t)
    assert isinstance(loss, torch.Tensor)
    pair = fk.cross_entropy(x, t, return_z_loss=True)
    assert type(pair) is tuple and len(pair) == 2 and torch.equal(pair[0], loss)
    out = fk.cross_entropy(x, t, return_z_loss=True, return_token_accuracy=True)
    assert isinstance(out, tuple) and out._fields == ("loss", "z_loss", "token_accuracy",
                                                      "predicted_tokens")
    loss2, z, acc, pred = out
    assert torch.equal(loss2, loss) and z is not None and acc is not None and pred is None
    m = fk.nn.CrossEntropyLoss()
    assert torch.equal(m(x, t), loss)


def test_nan_inf_propagate_like_torch():
    x, t, _ = _inputs(4, 16, ignore=())
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, :] = -float("inf")
    out = fk.cross_entropy(x, t, reduction="none")
    ref = F.cross_entropy(x, t, reduction="none")
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert_close(out[3], ref[3], torch.float32)


def test_non_contiguous_logits_are_copied_not_written():
    x, t, _ = _inputs(40, 12)
    xt = x.t().contiguous().t().requires_grad_()  # (40, 12) with strides (1, 40)
    before = xt.detach().clone()
    loss = fk.cross_entropy(xt, t)
    loss.backward()
    assert torch.equal(xt.detach(), before)
    assert_close(xt.grad, _ref_grad(x, t, dict(), torch.tensor(1.0)), torch.float32, factor=2)


def test_class_weights_get_no_gradient():
    x, t, w = _inputs(5, 20)
    w.requires_grad_()
    xa = x.clone().requires_grad_()
    fk.cross_entropy(xa, t, weight=w).backward()
    assert w.grad is None and xa.grad is not None


def test_module():
    x, t, w = _inputs(6, 30, ignore=(0,))
    m = fk.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1, reduction="sum")
    ref = torch.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1, reduction="sum")
    assert_close(m(x, t), ref(x, t), torch.float32)
    assert "weight" in dict(m.named_buffers())
    with pytest.raises(ValueError, match="reduction"):
        fk.nn.CrossEntropyLoss(reduction="avg")
    z = fk.nn.CrossEntropyLoss(lse_square_scale=1e-3, softcap=30.0)
    assert_close(z(x, t), ref_cross_entropy(x, t, lse_square_scale=1e-3, softcap=30.0)[0],
                 torch.float32)
    d = fk.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1, defer_grad=True)
    assert "defer_grad=True" in repr(d)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (d(xa * 1, t) / 3).backward()
    (torch.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)(xb, t) / 3).backward()
    assert_close(xa.grad, xb.grad, torch.float32, factor=2)


# --- the gradient-in-logits contract -----------------------------------------------------

def test_grad_in_logits_writes_the_gradient_into_logits():
    x, t, _ = _inputs(6, 40)
    ref_g = _ref_grad(x, t, dict(), torch.tensor(1.0)).float()
    h = x.clone().requires_grad_()
    logits = h * 1                    # an intermediate, as the output of an lm_head
    v0 = logits._version
    loss = fk.cross_entropy(logits, t)
    assert logits._version > v0
    assert_close(logits.detach(), ref_g, torch.float32, factor=2)  # its memory holds the grad
    loss.backward()
    assert_close(h.grad, ref_g, torch.float32, factor=2)
    # Opt out: logits untouched, same gradient.
    h2 = x.clone().requires_grad_()
    logits2 = h2 * 1
    fk.cross_entropy(logits2, t, grad_in_logits=False).backward()
    assert torch.equal(logits2.detach(), x)
    assert torch.equal(h2.grad, h.grad)


def test_logits_without_grad_are_not_written():
    x, t, _ = _inputs(6, 40)
    xc = x.clone()
    fk.cross_entropy(xc, t)
    with torch.no_grad():
        fk.cross_entropy(xc.requires_grad_(), t)
    assert torch.equal(xc.detach(), x)


def test_grad_output_scaling_and_leaf_grad_reuses_the_logits_memory():
    x, t, _ = _inputs(6, 40)
    xa = x.clone().requires_grad_()
    ptr = xa.data_ptr()
    (fk.cross_entropy(xa, t) * 2.5).backward()
    assert xa.grad.data_ptr() == ptr  # no second logits-sized buffer
    assert_close(xa.grad, _ref_grad(x, t, dict(), torch.tensor(2.5)), torch.float32, factor=2)
    g = torch.tensor([1.0, 0.0, -2.0, 1.0, 3.0, 1.0])
    xb = x.clone().requires_grad_()
    fk.cross_entropy(xb, t, reduction="none").backward(g)
    assert_close(xb.grad, _ref_grad(x, t, dict(reduction="none"), g), torch.float32, factor=2)


def test_other_saved_use_of_logits_fails_loudly():
    x, t, _ = _inputs(4, 16)
    h = x.clone().requires_grad_()
    logits = h * 2
    side = logits.sin()               # saves logits for its backward
    loss = fk.cross_entropy(logits, t)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss + side.sum()).backward()


def test_overwriting_logits_before_backward_fails_loudly():
    x, t, _ = _inputs(4, 16)
    logits = x.clone().requires_grad_()
    loss = fk.cross_entropy(logits * 1, t)
    loss2 = fk.cross_entropy(logits, t)      # fine: its own saved gradient
    inter = logits * 1
    loss3 = fk.cross_entropy(inter, t)
    inter.add_(1.0)                          # clobbers loss3's stored gradient
    (loss + loss2).backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss3.backward()


def test_retain_graph_backward_twice():
    x, t, _ = _inputs(5, 20)
    xa = x.clone().requires_grad_()
    loss = fk.cross_entropy(xa * 1, t)
    loss.backward(torch.tensor(3.0), retain_graph=True)
    first = xa.grad.clone()
    loss.backward(torch.tensor(3.0))
    assert_close(xa.grad, 2 * first, torch.float32)
    assert_close(first, _ref_grad(x, t, dict(), torch.tensor(3.0)), torch.float32, factor=2)


def test_double_backward_is_a_clear_error():
    x, t, _ = _inputs(4, 16)
    xa = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(fk.cross_entropy(xa * 1, t), xa, create_graph=True)
    assert_close(g, _ref_grad(x, t, dict(), torch.tensor(1.0)), torch.float32, factor=2)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.pow(2).sum().backward()


# --- mean_denominator and defer_grad ------------------------------------------------------

def _grad_outputs(shape, seed=7):
    """grad_output 1, 1 / 7 (a loss divided for gradient accumulation) and random values
    (per row for "none"), in float32."""
    g = torch.Generator().manual_seed(seed)
    return [torch.ones(shape), torch.full(shape, 1 / 7),
            torch.rand(shape, generator=g) * 3 - 1]


def _ref_sum_over(x, t, kw, den):
    """(loss, z) of the reference's "sum" divided by den, and its float64 gradient function
    of grad_output: what reduction "mean" with mean_denominator=den computes."""
    kw_sum = dict(kw, reduction="sum")
    loss, z = ref_cross_entropy(x, t, **kw_sum)
    return loss / den, z / den, lambda g: _ref_grad(x, t, kw_sum, g.double() / den)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("defer", [False, True])
def test_cpu_mean_denominator(dtype, option, defer):
    """reduction="mean" with mean_denominator: the reference's sum (losses and z-losses)
    divided by it, for a float tensor, an int64 tensor, a Python number and an int; the
    gradient that of the divided sum, times grad_output."""
    n, v = 9, 130
    x, t, w = _inputs(n, v, dtype, ignore=(1, 7))
    kw = _kwargs(option, w, "mean")
    loss_dtype = torch.float64 if dtype == torch.float64 else F32
    for den in (torch.tensor(23.0), torch.tensor(5, dtype=torch.int64), 3.5, 40):
        d = float(den)
        ref_loss, ref_z, ref_g = _ref_sum_over(x, t, kw, d)
        for g_out in _grad_outputs(()):
            xa = x.clone().requires_grad_()
            loss, z = fk.cross_entropy(xa, t, return_z_loss=True, loss_dtype=loss_dtype,
                                       mean_denominator=den, defer_grad=defer, **kw)
            assert loss.shape == () and not z.requires_grad
            assert_close(loss, ref_loss, loss_dtype, factor=2, what=f"loss, den {den}")
            assert_close(z, ref_z, loss_dtype, factor=2, what=f"z, den {den}")
            loss.backward(g_out.to(loss_dtype))
            assert_close(xa.grad, ref_g(g_out), dtype, factor=3, rounding=2,
                         what=f"grad, den {den}, grad_output {g_out}")
        with torch.no_grad():  # the forward alone (the op below autograd)
            assert_close(fk.cross_entropy(x, t, loss_dtype=loss_dtype, mean_denominator=den,
                                          **kw), ref_loss, loss_dtype, factor=2)


def test_mean_denominator_is_the_divided_sum():
    """mean_denominator=n is cross_entropy(reduction="sum") / n (the loss to rounding, the
    gradient too), without a scaling pass in the backward: the in-logits gradient of a
    plain loss.backward() is the forward's; the denominator gets no gradient."""
    x, t, w = _inputs(12, 50, ignore=(0, 3))
    for kw in (dict(), dict(weight=w, label_smoothing=0.1, lse_square_scale=1e-3)):
        den = torch.tensor(17.0, requires_grad=True)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss = fk.cross_entropy(xa, t, mean_denominator=den, **kw)
        ref = fk.cross_entropy(xb, t, reduction="sum", **kw) / den.detach()
        assert_close(loss, ref, F32)
        ptr = xa.data_ptr()
        loss.backward()
        ref.backward()
        assert xa.grad.data_ptr() == ptr
        assert_close(xa.grad, xb.grad, F32, factor=2)
        assert den.grad is None


def test_mean_denominator_edge_cases():
    """No rows: 0 (the sum of nothing); every row ignored: 0 (where the count would be
    0 / 0); a denominator of any shape of one element; with extra outputs (the accuracy is
    not affected)."""
    e = torch.empty(0, 5, requires_grad=True)
    te = torch.empty(0, dtype=torch.long)
    for defer in (False, True):
        loss = fk.cross_entropy(e, te, mean_denominator=4.0, defer_grad=defer)
        assert loss.item() == 0
        loss.backward()
        assert e.grad.shape == (0, 5)
        e.grad = None
    x, t, _ = _inputs(4, 10, ignore=range(4))
    assert fk.cross_entropy(x, t, mean_denominator=3).item() == 0
    x, t, _ = _inputs(6, 10, ignore=(2,))
    ref = fk.cross_entropy(x, t, reduction="sum") / 9
    for den in (torch.tensor([9.0]), torch.tensor([[9]], dtype=torch.int32),
                torch.tensor(9.0, dtype=torch.bfloat16)):
        assert_close(fk.cross_entropy(x, t, mean_denominator=den), ref, F32)
    out = fk.cross_entropy(x, t, mean_denominator=9, return_token_accuracy=True)
    assert_close(out.loss, ref, F32)
    assert torch.equal(out.token_accuracy, fk.cross_entropy(x, t, return_token_accuracy=True)
                       .token_accuracy)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cpu_defer_grad(dtype, option, reduction):
    """defer_grad: the same losses as the default (the same forward), the gradient of the
    reference times grad_output (1, 1 / 7, random; per row for "none") rounded once, and
    the default's gradient within rounding; in place (the logits' memory) and not."""
    n, v = 9, 130
    x, t, w = _inputs(n, v, dtype, ignore=(1, 7))
    kw = _kwargs(option, w, reduction)
    loss_dtype = torch.float64 if dtype == torch.float64 else F32
    shape = (n,) if reduction == "none" else ()
    for g_out in _grad_outputs(shape):
        g_out = g_out.to(loss_dtype)
        ref_g = _ref_grad(x, t, kw, g_out)
        grads = []
        for defer, in_logits in ((False, True), (True, True), (True, False)):
            xa = x.clone().requires_grad_()
            logits = xa * 1
            loss, z = fk.cross_entropy(logits, t, return_z_loss=True, loss_dtype=loss_dtype,
                                       defer_grad=defer, grad_in_logits=in_logits, **kw)
            if defer:
                assert torch.equal(logits.detach(), x)  # the forward leaves the logits
            loss.backward(g_out)
            grads.append((loss.detach(), z, xa.grad))
            if defer:
                # in the logits' memory with grad_in_logits, else a new buffer
                assert torch.equal(logits.detach(), x) != in_logits
                # rounded once: as close as the rounded reference
                assert_close(xa.grad, ref_g, dtype, factor=2, rounding=1,
                             what=f"grad, in_logits={in_logits}, grad_output {g_out}")
        (l0, z0, g0), (l1, z1, g1), (l2, z2, g2) = grads
        assert torch.equal(l0, l1) and torch.equal(l1, l2)
        assert torch.equal(z0, z1) and torch.equal(z1, z2)
        assert torch.equal(g1, g2)
        assert_close(g1, g0, dtype, factor=3, rounding=2)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_defer_grad_extra_outputs(reduction):
    """The token accuracy and predicted tokens come from the deferred forward too."""
    x, t, w = _inputs(10, 60, ignore=(1,))
    x = _with_ties(x)
    kw = _kwargs("all", w, reduction)
    ref_acc, ref_pred = ref_token_accuracy(x, t, reduction=reduction, softcap=kw["softcap"])
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = fk.cross_entropy(xa * 1, t, return_token_accuracy=True, return_predicted_tokens=True,
                           defer_grad=True, **kw)
    assert torch.equal(out.predicted_tokens, ref_pred)
    assert_close(out.token_accuracy, ref_acc, F32)
    assert not out.token_accuracy.requires_grad
    plain = fk.cross_entropy(xb * 1, t, **kw)
    assert torch.equal(out.loss.detach(), plain.detach())
    g = torch.rand(plain.shape) + 0.5
    out.loss.backward(g)
    plain.backward(g)
    assert_close(xa.grad, xb.grad, F32, factor=2)


def test_defer_grad_contract():
    """The deferred gradient in the logits' memory: an intermediate holds it after the
    backward (its version bumped), a leaf's .grad reuses its memory, non-contiguous logits
    are copied and never written, a write into the logits before the backward and a later
    read of them by another op's backward raise, retain_graph keeps them, and only the
    loss's grad_output counts."""
    x, t, _ = _inputs(6, 40)
    ref_g = _ref_grad(x, t, dict(), torch.tensor(0.5)).float()
    h = x.clone().requires_grad_()
    logits = h * 1
    loss = fk.cross_entropy(logits, t, defer_grad=True)
    v0 = logits._version
    (loss / 2).backward()
    assert logits._version > v0
    assert_close(logits.detach(), ref_g, F32, factor=2)
    assert_close(h.grad, ref_g, F32, factor=2)
    xa = x.clone().requires_grad_()
    ptr = xa.data_ptr()
    (fk.cross_entropy(xa, t, defer_grad=True) * 0.5).backward()
    assert xa.grad.data_ptr() == ptr
    assert_close(xa.grad, ref_g, F32, factor=2)
    xt = x.t().contiguous().t().requires_grad_()
    (fk.cross_entropy(xt, t, defer_grad=True) / 2).backward()
    assert torch.equal(xt.detach(), x)
    assert_close(xt.grad, ref_g, F32, factor=2)
    # written before the backward: the saved logits are checked
    logits = x.clone().requires_grad_() * 1
    loss = fk.cross_entropy(logits, t, defer_grad=True)
    logits.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    # read by another op's backward after this one's: raises instead of reading gradients
    h = x.clone().requires_grad_()
    logits = h * 2
    side = logits.sin()  # saves logits; its backward runs after the loss's here
    loss = fk.cross_entropy(logits, t, defer_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss + side.sum()).backward()
    # retain_graph: twice the same gradient
    xa = x.clone().requires_grad_()
    loss = fk.cross_entropy(xa * 1, t, defer_grad=True)
    loss.backward(torch.tensor(0.5), retain_graph=True)
    first = xa.grad.clone()
    loss.backward(torch.tensor(0.5))
    assert_close(first, ref_g, F32, factor=2)
    assert_close(xa.grad, 2 * first, F32)
    # no gradient through the z-loss output
    xa = x.clone().requires_grad_()
    loss, z = fk.cross_entropy(xa * 1, t, lse_square_scale=1e-2, return_z_loss=True,
                               defer_grad=True)
    assert not z.requires_grad
    # double backward raises
    xa = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(fk.cross_entropy(xa * 1, t, defer_grad=True) / 2, xa,
                               create_graph=True)
    assert_close(g, ref_g, F32, factor=2)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.pow(2).sum().backward()


def test_defer_grad_other_grad_output_paths():
    """No grad wanted: the losses only (defer_grad has no effect); a backward through the
    z-loss only: no gradient."""
    x, t, _ = _inputs(5, 20)
    with torch.no_grad():
        assert torch.equal(fk.cross_entropy(x, t, defer_grad=True), fk.cross_entropy(x, t))
    xa = x.clone().requires_grad_()
    out = fk.cross_entropy(xa * 1, t, defer_grad=True, return_token_accuracy=True)
    assert out.token_accuracy.grad_fn is None


_BAD_DENOMINATOR = [
    ("two elements", dict(mean_denominator=lambda d: torch.ones(2, device=d)),
     "mean_denominator must have one element"),
    ("empty", dict(mean_denominator=lambda d: torch.ones(0, device=d)),
     "mean_denominator must have one element"),
    ("bool", dict(mean_denominator=lambda d: torch.ones((), dtype=torch.bool, device=d)),
     "mean_denominator must be float32, float64"),
    ("sum", dict(mean_denominator=lambda d: torch.ones((), device=d), reduction="sum"),
     "mean_denominator is only used with reduction='mean'"),
    ("none", dict(mean_denominator=lambda d: torch.ones((), device=d), reduction="none"),
     "mean_denominator is only used with reduction='mean'"),
]


@pytest.mark.parametrize("name,over,msg", _BAD_DENOMINATOR, ids=[b[0] for b in _BAD_DENOMINATOR])
def test_bad_mean_denominator_cpu_and_meta_agree(name, over, msg):
    """The same message from the C++ check and the fake kernel, through the op below
    autograd, with a gradient wanted, deferred or not, and from the internal ops."""
    def call(d, requires_grad=False, defer=False):
        kw = {k: (v(d) if callable(v) else v) for k, v in over.items()}
        x = torch.ones(3, 5, device=d, requires_grad=requires_grad)
        t = torch.zeros(3, dtype=torch.long, device=d)
        return fk.cross_entropy(x * 1, t, defer_grad=defer, **kw)

    for rg, defer in ((False, False), (True, False), (True, True)):
        cpu, meta = error_lines(lambda d: call(d, rg, defer), ("cpu", "meta"), msg)
        assert cpu == meta and cpu.startswith("fk::cross_entropy: "), (rg, defer)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.cross_entropy(torch.ones(2, 4), torch.zeros(2, dtype=torch.long),
                         mean_denominator=torch.ones((), device="meta"))


def test_bad_deferred_backward_inputs_cpu_and_meta_agree():
    x, t, _ = _inputs(3, 5)
    lse, den, g = torch.zeros(3), torch.ones(2), torch.tensor(1.0)
    cases = [(dict(lse=torch.zeros(4)), "lse must be Float of shape \\(3,\\)"),
             (dict(lse=torch.zeros(3, dtype=torch.float64)), "lse must be Float"),
             (dict(den=torch.ones(3)), "den must be Float of shape \\(2,\\)"),
             (dict(grad_loss=torch.ones(2)), "grad_loss must be a scalar or have shape"),
             (dict(grad_loss=torch.tensor(1.0, dtype=torch.float64)), "grad_loss must be Float"),
             (dict(t=torch.zeros(2, dtype=torch.long)), "target must have shape")]
    for over, msg in cases:
        def call(d, inplace, over=over):
            a = dict(x=x, t=t, lse=lse, den=den, grad_loss=g)
            a.update(over)
            a = {k: v.to(d) for k, v in a.items()}
            op = (torch.ops.fk._cross_entropy_deferred_backward_ if inplace
                  else torch.ops.fk._cross_entropy_deferred_backward)
            return op(a["x"], a["t"], None, a["lse"], a["den"], a["grad_loss"], -100, 0.0, 0.0,
                      None)
        for inplace in (False, True):
            cpu, meta = error_lines(lambda d: call(d, inplace), ("cpu", "meta"), msg)
            assert cpu == meta, over


# --- bad input -----------------------------------------------------------------------------

def _bad(**over):
    def make(d):
        args = dict(logits=torch.ones(3, 5, device=d), target=torch.zeros(3, dtype=torch.long,
                                                                            device=d),
                    weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                    lse_square_scale=0.0, softcap=None)
        args.update({k: (v(d) if callable(v) else v) for k, v in over.items()})
        return args
    return make


BAD = [
    ("logits 1d", _bad(logits=lambda d: torch.ones(5, device=d)), "logits must have shape"),
    ("logits int", _bad(logits=lambda d: torch.ones(3, 5, dtype=torch.int32, device=d)),
     "not supported"),
    ("no classes", _bad(logits=lambda d: torch.ones(3, 0, device=d)), "at least one class"),
    ("target int32", _bad(target=lambda d: torch.zeros(3, dtype=torch.int32, device=d)),
     "target must be int64"),
    ("target shape", _bad(target=lambda d: torch.zeros(4, dtype=torch.long, device=d)),
     "target must have shape"),
    ("weight shape", _bad(weight=lambda d: torch.ones(4, device=d)), "weight must have shape"),
    ("weight int", _bad(weight=lambda d: torch.ones(5, dtype=torch.long, device=d)),
     "not supported"),
    ("smoothing", _bad(label_smoothing=1.5), "label_smoothing must be in"),
    ("softcap", _bad(softcap=0.0), "softcap must be positive"),
    ("reduction", _bad(reduction="avg"), "reduction must be one of"),
]


def _call_bad(make, device):
    a = make(device)
    return torch.ops.fk.cross_entropy(a["logits"], a["target"], a["weight"], a["ignore_index"],
                                      a["label_smoothing"], a["reduction"],
                                      a["lse_square_scale"], a["softcap"], True)


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.cross_entropy(torch.ones(2, 4), torch.zeros(2, dtype=torch.long, device="meta"))


# --- level 3: autograd, opcheck, torch.compile, TorchScript ---------------------------------

@pytest.mark.parametrize("option", ["plain", "all"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("in_logits", [True, False])
def test_gradcheck(option, reduction, in_logits):
    x, t, w = _inputs(4, 7, torch.float64, ignore=(2,))
    kw = _kwargs(option, w.double(), reduction)
    x.requires_grad_()
    # grad_in_logits consumes its input: pass an intermediate so gradcheck's x survives.
    assert torch.autograd.gradcheck(
        lambda x: fk.cross_entropy(x * 1, t, grad_in_logits=in_logits, **kw), (x,))


def test_opcheck():
    x, t, w = _inputs(5, 11, ignore=(1,))
    for args in ((x.clone().requires_grad_(), t, w, -100, 0.1, "mean", 1e-3, 5.0, False),
                 (x.clone().requires_grad_(), t, None, -100, 0.0, "none", 0.0, None, False),
                 (x.clone(), t, None, -100, 0.0, "sum", 0.0, None, True),
                 (x.clone().requires_grad_(), t, w, -100, 0.1, "mean", 1e-3, 5.0, False, None,
                  True, True),
                 (x.clone().requires_grad_(), t, None, -100, 0.0, "none", 0.0, None, False,
                  torch.float32, False, True),
                 (x.clone(), t, None, -100, 0.0, "sum", 0.0, None, True, None, True, False)):
        torch.library.opcheck(torch.ops.fk.cross_entropy, args)
    internal = ("test_schema", "test_faketensor")
    for extras in (False, True):
        torch.library.opcheck(torch.ops.fk._cross_entropy_forward,
                              (x, t, w, -100, 0.0, "mean", 0.0, None, True, extras),
                              test_utils=internal + ("test_aot_dispatch_dynamic",))
        torch.library.opcheck(torch.ops.fk._cross_entropy_forward_,
                              (x.clone(), t, None, -100, 0.0, "sum", 0.0, 2.0, extras),
                              test_utils=internal)
    g = randn(5, 11)
    torch.library.opcheck(torch.ops.fk._cross_entropy_backward, (g, torch.tensor(2.0)),
                          test_utils=internal + ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.fk._cross_entropy_backward_, (g.clone(), torch.rand(5)),
                          test_utils=internal)


@pytest.mark.parametrize("option", ["plain", "all"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("in_logits", [True, False])
def test_gradcheck_defer_grad(option, reduction, in_logits):
    x, t, w = _inputs(4, 7, torch.float64, ignore=(2,))
    kw = _kwargs(option, w.double(), reduction)
    if reduction == "mean":
        kw["mean_denominator"] = torch.tensor(2.5, dtype=torch.float64)
    x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: fk.cross_entropy(x * 1, t, grad_in_logits=in_logits, defer_grad=True, **kw),
        (x,))


def test_opcheck_mean_denominator_and_defer_grad():
    x, t, w = _inputs(5, 11, ignore=(1,))
    den = torch.tensor(7.0)
    for args in ((x.clone().requires_grad_(), t, w, -100, 0.1, "mean", 1e-3, 5.0, False, None,
                  False, False, den, False),
                 (x.clone().requires_grad_(), t, w, -100, 0.1, "mean", 1e-3, 5.0, False, None,
                  True, True, den, True),
                 (x.clone().requires_grad_(), t, None, -100, 0.0, "none", 0.0, None, False,
                  torch.float32, False, False, None, True),
                 (x.clone().requires_grad_(), t, None, -100, 0.0, "sum", 0.0, None, True,
                  None, False, False, None, True),
                 (x.clone(), t, None, -100, 0.0, "mean", 0.0, None, True, None, False, False,
                  torch.tensor(3, dtype=torch.int64), False)):
        torch.library.opcheck(torch.ops.fk.cross_entropy, args)
    internal = ("test_schema", "test_faketensor")
    for extras in (False, True):
        torch.library.opcheck(torch.ops.fk._cross_entropy_forward,
                              (x, t, w, -100, 0.0, "mean", 0.0, None, True, extras, den),
                              test_utils=internal + ("test_aot_dispatch_dynamic",))
        torch.library.opcheck(torch.ops.fk._cross_entropy_forward_,
                              (x.clone(), t, None, -100, 0.0, "mean", 0.0, 2.0, extras, den),
                              test_utils=internal)
        for reduction, d in (("mean", den), ("mean", None), ("none", None)):
            torch.library.opcheck(torch.ops.fk._cross_entropy_deferred_forward,
                                  (x, t, w, -100, 0.1, reduction, 1e-3, 3.0, extras, d),
                                  test_utils=internal + ("test_aot_dispatch_dynamic",))
    loss, _, lse, dn, _, _ = torch.ops.fk._cross_entropy_deferred_forward(
        x, t, w, -100, 0.1, "none", 1e-3, 3.0, False)
    for g in (torch.tensor(2.0), torch.rand(5)):
        bw = (t, w, lse, dn, g, -100, 0.1, 1e-3, 3.0)
        torch.library.opcheck(torch.ops.fk._cross_entropy_deferred_backward, (x,) + bw,
                              test_utils=internal + ("test_aot_dispatch_dynamic",))
        torch.library.opcheck(torch.ops.fk._cross_entropy_deferred_backward_, (x.clone(),) + bw,
                              test_utils=internal)


def test_torch_compile_mean_denominator_and_defer_grad():
    def step(h, w, t, den):
        return fk.cross_entropy(h @ w, t, lse_square_scale=1e-4, mean_denominator=den,
                                defer_grad=True) / 3

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        h, w = randn(rows, 16, seed=rows).requires_grad_(), randn(16, 40, seed=1).requires_grad_()
        t = torch.randint(0, 40, (rows,))
        t[0] = -100
        den = torch.tensor(float(rows + 2))
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out = compiled(h, w, t, den)
        ref = fk.cross_entropy(h2 @ w2, t, lse_square_scale=1e-4, reduction="sum") / den / 3
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        assert_close(h.grad, h2.grad, torch.float32, factor=10)
        assert_close(w.grad, w2.grad, torch.float32, factor=10)


def test_grad_in_logits_under_opcheck_autograd():
    # Under tracing / dispatch modes the forward uses a separate buffer, so even the default
    # passes every opcheck test (the eager calls write into the intermediate clones).
    x, t, _ = _inputs(5, 11, ignore=(1,))
    torch.library.opcheck(torch.ops.fk.cross_entropy,
                          (x.clone().requires_grad_(), t, None, -100, 0.0, "mean", 0.0, None,
                           True), test_utils=("test_schema", "test_faketensor",
                                              "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_with_extra_outputs(reduction):
    x, t, w = _inputs(4, 7, torch.float64, ignore=(2,))
    kw = _kwargs("all", w.double(), reduction)
    x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: fk.cross_entropy(x * 1, t, return_token_accuracy=True,
                                   return_predicted_tokens=True, **kw).loss, (x,))


def test_torch_compile_extra_outputs():
    def step(h, w, t):
        out = fk.cross_entropy(h @ w, t, return_token_accuracy=True, return_predicted_tokens=True)
        return out.loss, out.token_accuracy, out.predicted_tokens

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        h, w = randn(rows, 16, seed=rows).requires_grad_(), randn(16, 40, seed=1)
        t = torch.randint(0, 40, (rows,))
        t[0] = -100
        t[1] = int((h[1] @ w).argmax())
        loss, acc, pred = compiled(h, w, t)
        ref_acc, ref_pred = ref_token_accuracy((h @ w).detach(), t)
        assert torch.equal(pred, ref_pred)
        assert_close(acc, ref_acc, torch.float32)
        loss.backward()
        assert h.grad is not None


def test_torch_compile_fullgraph():
    def step(h, w, t):
        return fk.cross_entropy(h @ w, t, lse_square_scale=1e-4)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        h, w = randn(rows, 16, seed=rows).requires_grad_(), randn(16, 40, seed=1).requires_grad_()
        t = torch.randint(0, 40, (rows,))
        t[0] = -100
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = compiled(h, w, t), step(h2, w2, t)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        assert_close(h.grad, h2.grad, torch.float32, factor=10)
        assert_close(w.grad, w2.grad, torch.float32, factor=10)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_module(tmp_path):
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 20)
            self.loss = fk.nn.CrossEntropyLoss(label_smoothing=0.1, lse_square_scale=1e-3)
            self.capped = fk.nn.CrossEntropyLoss(softcap=5.0, reduction="sum", defer_grad=True)

        def forward(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            # The JIT may merge the two identical projections into one tensor: the module
            # then keeps its gradient out of the logits, or the second loss would read
            # gradients.
            return self.loss(self.proj(h), t) + self.capped(self.proj(h), t)

    torch.manual_seed(0)
    m = Head()
    h, t = randn(6, 8, seed=2), torch.randint(0, 20, (6,))
    scripted = torch.jit.script(m)
    path = tmp_path / "head.pt"
    scripted.save(str(path))
    loaded = torch.jit.load(str(path))
    assert_close(loaded(h, t), m(h, t), torch.float32)
    assert_close(loaded(h, t), m(h, t), torch.float32)  # optimized on the second call
    loaded(h, t).backward()
    g = loaded.proj.weight.grad.clone()
    m.zero_grad()
    m(h, t).backward()
    assert_close(g, m.proj.weight.grad, torch.float32)


# --- level 5: CUDA kernels -----------------------------------------------------------------

F32 = torch.float32
CUDA_V = [1, 7, 100, 1000, 1024, 1025, 4097, 32000, 50257, 128256]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", CUDA_V)
@pytest.mark.parametrize("option", ["plain", "zloss", "weight_smooth_z", "all"])
def test_cuda_matches_reference(dtype, v, option):
    n = 37 if v <= 32000 else 9
    for reduction in REDUCTIONS:
        x, t, w = _inputs(n, v, dtype, "cuda", ignore=(1, 5), seed=v)
        kw = _kwargs(option, w, reduction)
        ref_loss, ref_z = ref_cross_entropy(x.cpu(), t.cpu(), **{
            k: (a.cpu() if isinstance(a, torch.Tensor) else a) for k, a in kw.items()})
        poison_cuda_cache()
        xa = x.clone().requires_grad_()
        loss, z = fk.cross_entropy(xa * 1, t, return_z_loss=True, loss_dtype=F32, **kw)
        assert_close(loss, ref_loss, torch.float32, factor=2, what="loss")
        assert_close(z, ref_z, torch.float32, factor=2, what="z")
        g_out = torch.rand(ref_loss.shape, device="cuda") + 0.5
        if reduction == "none":
            g_out[::3] = 1.0
        loss.backward(g_out)
        assert not torch.isnan(xa.grad).any(), "unwritten gradient elements"
        ref_g = _ref_grad(x.cpu(), t.cpu(), {k: (a.cpu() if isinstance(a, torch.Tensor) else a)
                                             for k, a in kw.items()}, g_out.cpu())
        assert_close(xa.grad, ref_g, dtype, factor=3, what="grad")
        # Out of place and without a gradient: the same losses.
        xb = x.clone().requires_grad_()
        loss_b = fk.cross_entropy(xb, t, grad_in_logits=False, loss_dtype=F32, **kw)
        assert torch.equal(xb.detach(), x)
        assert_close(loss_b, ref_loss, torch.float32, factor=2)
        with torch.no_grad():
            assert_close(fk.cross_entropy(x, t, loss_dtype=F32, **kw), ref_loss, torch.float32,
                         factor=2)
            # The default: the logits' dtype, the float32 value rounded once.
            assert torch.equal(fk.cross_entropy(x, t, **kw),
                               fk.cross_entropy(x, t, loss_dtype=F32, **kw).to(dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", [1, 7, 100, 1024, 1025, 4097, 50257, 128256])
@pytest.mark.parametrize("option", ["plain", "all"])
def test_cuda_extra_outputs(dtype, v, option):
    """The EXTRA kernel variants (aligned and not, small and large rows): predicted tokens
    and accuracy against plain torch, losses and gradients as without them, no host
    synchronisation needed (the same calls run under CUDA graph capture in
    test_cuda_graph_capture_extra_outputs)."""
    n = 37 if v <= 4097 else 9
    for reduction in REDUCTIONS:
        x, t, w = _inputs(n, v, dtype, "cuda", ignore=(1, 5), seed=v)
        x = _with_ties(x.cpu()).cuda()
        t[3] = int(x[3].float().argmax())
        kw = _kwargs(option, w, reduction)
        cpu_kw = {k: (a.cpu() if isinstance(a, torch.Tensor) else a) for k, a in kw.items()}
        ref_acc, ref_pred = ref_token_accuracy(x.cpu(), t.cpu(), reduction=reduction,
                                               softcap=kw["softcap"])
        ref_loss, _ = ref_cross_entropy(x.cpu(), t.cpu(), **cpu_kw)
        poison_cuda_cache()
        xa = x.clone().requires_grad_()
        out = fk.cross_entropy(xa * 1, t, loss_dtype=F32, return_token_accuracy=True,
                               return_predicted_tokens=True, **kw)
        assert torch.equal(out.predicted_tokens.cpu(), ref_pred)
        assert_close(out.token_accuracy.cpu(), ref_acc, F32)
        assert_close(out.loss, ref_loss, F32, factor=2, what="loss")
        g_out = torch.rand(ref_loss.shape, device="cuda") + 0.5
        out.loss.backward(g_out)
        ref_g = _ref_grad(x.cpu(), t.cpu(), cpu_kw, g_out.cpu())
        assert_close(xa.grad, ref_g, dtype, factor=3, what="grad")
        # Misaligned logits take the unaligned EXTRA variant.
        xm = misaligned(x)
        with torch.no_grad():
            outm = fk.cross_entropy(xm, t, return_predicted_tokens=True, **kw)
        assert torch.equal(outm.predicted_tokens.cpu(), ref_pred)
    assert sys.modules.get("triton") is None  # never imported (None: blocked by conftest)


@pytest.mark.cuda
def test_cuda_graph_capture_extra_outputs():
    x, t, _ = _inputs(64, 4096, torch.bfloat16, "cuda", ignore=(3,))
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fk.cross_entropy(static_x.clone(), t, return_token_accuracy=True,
                         return_predicted_tokens=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fk.cross_entropy(static_x, t, return_token_accuracy=True,
                               return_predicted_tokens=True)
    static_x.copy_(x)
    graph.replay()
    ref_acc, ref_pred = ref_token_accuracy(x.cpu(), t.cpu())
    assert torch.equal(out.predicted_tokens.cpu(), ref_pred)
    assert_close(out.token_accuracy.cpu(), ref_acc, F32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_llama_shape_one_row_misaligned_non_contiguous(dtype):
    for n, v in ((1, 128256), (8192, 128256), (3, 151936)):
        x, t, _ = _inputs(n, v, dtype, "cuda", ignore=(1,), seed=n)
        rows = sorted({0, min(1, n - 1), n // 2, n - 1})
        xs, ts = x[rows].cpu(), t[rows].cpu()
        ref_rows = ref_cross_entropy(xs, ts, reduction="none")[0]
        ref_g = _ref_grad(xs, ts, dict(reduction="none"), torch.ones(len(rows)))
        xa = x.clone().requires_grad_()
        loss = fk.cross_entropy(xa, t, reduction="none", loss_dtype=F32)
        loss.backward(torch.ones_like(loss))
        assert_close(loss[rows], ref_rows, torch.float32, factor=2)
        assert_close(xa.grad[rows], ref_g, dtype, factor=3)
        del xa, loss
        xb = x.clone().requires_grad_()
        loss = fk.cross_entropy(xb, t, loss_dtype=F32)
        assert_close(loss, F.cross_entropy(x.float(), t), torch.float32, factor=2)
        loss.backward()
        # The stored gradient is p / N in the logits' dtype: fp16 flushes the smallest
        # values to its subnormals or zero, so compare with the reference rounded likewise.
        ref_mean = round_nearest(ref_g / (t != -100).sum().item(), dtype)
        assert_close(xb.grad[rows], ref_mean, dtype, factor=3)
        del xb, x, loss
    x, t, _ = _inputs(5, 1001, dtype, "cuda")
    xm = misaligned(x).requires_grad_()
    loss = fk.cross_entropy(xm, t, reduction="none", loss_dtype=F32)
    assert_close(loss, ref_cross_entropy(x.cpu(), t.cpu(), reduction="none")[0], torch.float32,
                 factor=2)
    xt = x.t().contiguous().t().requires_grad_()
    fk.cross_entropy(xt, t).backward()
    assert torch.equal(xt.detach(), x)
    assert_close(xt.grad, _ref_grad(x.cpu(), t.cpu(), dict(), torch.tensor(1.0)), dtype,
                 factor=3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_rows_split_over_a_cluster(dtype):
    """Where the plain 16-bit variant splits each row over a cluster of programs (sm_90: 8
    chunks of whole 4096-column blocks), every split shape gives the reference: chunks left
    empty (2064 columns: one block; 36880: four chunks of 8192, one of a block and 16
    columns, three empty), targets on chunk and block edges, ignored rows, and more rows
    than clusters at once (9000 rows of 2064 on 132 SMs: 8448 clusters, 552 of them walk a
    second row, exchanging through the other slot; row 1 is ignored, so its cluster's first
    exchange is at its second row)."""
    for n, v, edges in ((9000, 2064, (0, 2063, 2047, 2048)),
                        (23, 36880, (0, 8191, 8192, 16383, 32767, 32768, 36864, 36879)),
                        (9, 128256, (0, 16383, 16384, 114687, 128255))):
        x, t, _ = _inputs(n, v, dtype, "cuda", ignore=(1, n - 2), seed=v)
        t[2:2 + len(edges)] = torch.tensor(edges, device="cuda")
        rows = sorted({0, 1, *range(2, 2 + len(edges)), n // 2, n - 2, n - 1})
        xs, ts = x[rows].cpu(), t[rows].cpu()
        for reduction in ("none", "mean"):
            xa = x.clone().requires_grad_()
            loss, z = fk.cross_entropy(xa, t, reduction=reduction, lse_square_scale=1e-3,
                                       return_z_loss=True, loss_dtype=F32)
            loss.backward(torch.ones_like(loss))
            ref_loss, ref_z = ref_cross_entropy(x.cpu(), t.cpu(), reduction=reduction,
                                                lse_square_scale=1e-3)
            assert_close(loss, ref_loss, torch.float32, factor=2, what="loss")
            assert_close(z, ref_z, torch.float32, factor=2, what="z")
            ref_g = _ref_grad(xs, ts, dict(reduction="none", lse_square_scale=1e-3),
                              torch.ones(len(rows)))
            if reduction == "mean":  # p / N in the logits' dtype (fp16: subnormals)
                ref_g = round_nearest(ref_g / (t != -100).sum().item(), dtype)
            assert_close(xa.grad[rows], ref_g, dtype, factor=3, what="grad")
            assert torch.equal(xa.grad[1].cpu(), torch.zeros(v, dtype=dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("n", [255, 257, 8192, 40000])
def test_cuda_mean_denominator_over_many_programs(n):
    """The mean's denominators come from many programs (blocks of 256 targets, at most one
    program per multiprocessor, 40000 rows: several blocks each) adding atomically; every
    7th row is ignored, so each block has its own count."""
    v = 64
    x, t, w = _inputs(n, v, torch.float32, "cuda", ignore=range(0, n, 7), seed=n)
    for weight in (None, w):
        xa = x.clone().requires_grad_()
        loss = fk.cross_entropy(xa, t, weight=weight)
        loss.backward()
        xr = x.cpu().double().requires_grad_()
        ref = F.cross_entropy(xr, t.cpu(), weight=None if weight is None else w.cpu().double())
        ref.backward()
        assert_close(loss, ref.float(), torch.float32, factor=2, what="loss")
        assert_close(xa.grad, xr.grad.float(), torch.float32, factor=3, what="grad")


@pytest.mark.cuda
def test_cuda_all_ignored_and_empty():
    x, t, w = _inputs(6, 300, device="cuda", ignore=())
    assert torch.isnan(fk.cross_entropy(x, torch.full_like(t, -100)))
    assert torch.isnan(fk.cross_entropy(x, torch.full_like(t, -100), weight=w))
    e = fk.cross_entropy(torch.empty(0, 8, device="cuda"), torch.empty(0, dtype=torch.long,
                                                                       device="cuda"))
    assert torch.isnan(e)


_BAD_TARGET_SCRIPT = """
import sys, torch, fk
op, reduction, bad = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = torch.Generator(device="cuda").manual_seed(0)
t = torch.randint(0, 1000, (300,), device="cuda", generator=g)
t[::5] = -100
t[123] = bad
if op in ("ce", "ce_defer"):
    x = torch.randn(300, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    loss = fk.cross_entropy(x * 1, t, reduction=reduction, defer_grad=op == "ce_defer")
else:
    x = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    loss = fk.fused_linear_cross_entropy(x, w, t, reduction=reduction, chunk_size=128)
torch.cuda.synchronize()
print("NO ERROR", loss.float().sum().item())
"""


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["ce", "ce_defer", "flce"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cuda_bad_target_is_a_device_assert(op, reduction):
    """An out-of-range target raises through a device-side assert (no host synchronisation
    in the op); the assert leaves the CUDA context unusable, so each case runs in a fresh
    process."""
    for bad, expect_error in ((1000, True), (-1, True), (999, False)):
        r = subprocess.run([sys.executable, "-c", _BAD_TARGET_SCRIPT, op, reduction, str(bad)],
                           capture_output=True, text=True, env=dict(os.environ), timeout=300)
        out = r.stdout + r.stderr
        if expect_error:
            assert r.returncode != 0 and "NO ERROR" not in out, out
            # the op's own assert message, printed by the device (what surfaces afterwards
            # as the Python error depends on the next CUDA call: the fused op's is cuBLAS)
            assert "a target is out of range" in out, out
        else:
            assert r.returncode == 0 and "NO ERROR" in out and "nan" not in out, out


@pytest.mark.cuda
def test_cuda_bad_target_check_is_graph_capturable():
    """The device-side check (for every reduction) is captured with the op and checks the
    replayed targets."""
    x, t, _ = _inputs(64, 500, torch.bfloat16, "cuda", ignore=(3,))
    for reduction in REDUCTIONS:
        sx = x.clone().requires_grad_()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fk.cross_entropy(sx * 1, t, reduction=reduction).sum().backward()
        torch.cuda.current_stream().wait_stream(s)
        sx.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = fk.cross_entropy(sx * 1, t, reduction=reduction, loss_dtype=F32)
            loss.sum().backward()
        graph.replay()
        ref = ref_cross_entropy(x.cpu(), t.cpu(), reduction=reduction)[0]
        assert_close(loss, ref, torch.float32, factor=2)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.cross_entropy(torch.ones(2, 4, dtype=torch.float64, device="cuda"),
                         torch.zeros(2, dtype=torch.long, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.cross_entropy(torch.ones(2, 4, device="cuda"), torch.zeros(2, dtype=torch.long))


@pytest.mark.cuda
def test_cuda_graph_capture():
    n, v = 64, 5000
    x, t, _ = _inputs(n, v, torch.bfloat16, "cuda")
    static_x = x.clone().requires_grad_()
    static_t = t.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (loads the kernels) outside the capture
        fk.cross_entropy(static_x * 1, static_t).backward()
    torch.cuda.current_stream().wait_stream(s)
    static_x.grad = None
    two = torch.tensor(2.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = fk.cross_entropy(static_x * 1, static_t, loss_dtype=F32)
        static_loss.backward(two)
    for seed in (1, 2):
        x2, t2, _ = _inputs(n, v, torch.bfloat16, "cuda", seed=seed, ignore=(seed,))
        with torch.no_grad():
            static_x.copy_(x2)
        static_t.copy_(t2)
        graph.replay()
        assert_close(static_loss, ref_cross_entropy(x2.cpu(), t2.cpu())[0], torch.float32,
                     factor=2)
        assert_close(static_x.grad, _ref_grad(x2.cpu(), t2.cpu(), dict(), torch.tensor(2.0)),
                     torch.bfloat16, factor=3)


@pytest.mark.cuda
@pytest.mark.parametrize("defer", [False, True])
def test_cuda_grad_in_logits_saves_memory(defer):
    """No second logits-sized buffer with grad_in_logits: with defer_grad the gradient goes
    into the logits' memory in the backward, here of a scaled loss."""
    n, v = 2048, 32000
    size = n * v * 2

    def peak(in_logits):
        h = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(256, v, device="cuda", dtype=torch.bfloat16)
        t = torch.randint(0, v, (n,), device="cuda")
        logits = h @ w
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = fk.cross_entropy(logits, t, grad_in_logits=in_logits, defer_grad=defer)
        del logits
        (loss / 7 if defer else loss).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    assert peak(False) >= size
    assert peak(True) < size // 4


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    x, t, _ = _inputs(5, 33, device="cuda", ignore=(2,))
    torch.library.opcheck(torch.ops.fk.cross_entropy,
                          (x.clone().requires_grad_(), t, None, -100, 0.1, "mean", 1e-3, None,
                           False))
    f = torch.compile(lambda x, t: fk.cross_entropy(x * 2, t), fullgraph=True,
                      backend="aot_eager")
    xa = x.clone().requires_grad_()
    f(xa, t).backward()
    xr = x.clone().requires_grad_()
    F.cross_entropy(xr * 2, t).backward()
    assert_close(xa.grad, xr.grad, torch.float32, factor=2)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    v = 128256
    n = (1 << 31) // v + 3
    x = torch.randn(n, v, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda")
    xa = x.clone().requires_grad_()
    loss = fk.cross_entropy(xa, t, reduction="none", loss_dtype=F32)
    loss.backward(torch.ones_like(loss))
    for rows in (slice(0, 2), slice(n - 2, n)):
        xs, ts = x[rows].cpu(), t[rows].cpu()
        assert_close(loss[rows], ref_cross_entropy(xs, ts, reduction="none")[0], torch.float32,
                     factor=2)
        assert_close(xa.grad[rows], _ref_grad(xs, ts, dict(reduction="none"), torch.ones(2)),
                     torch.bfloat16, factor=3)
    del x, xa, loss
    torch.cuda.empty_cache()


# --- level 5: mean_denominator and defer_grad on CUDA --------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", [1, 7, 1000, 1025, 4097, 50257, 128256])
@pytest.mark.parametrize("option", ["plain", "zloss", "weight_smooth_z", "softcap", "all"])
def test_cuda_defer_grad_matches_reference(dtype, v, option):
    """The deferred backward kernel (plain and general, aligned and misaligned logits,
    rows of one and several tiles): the reference's gradient times grad_output (1 / 7,
    random per row; NaN-poisoned outputs), and the default path's gradient within rounding;
    the losses equal to the default path's; extra outputs from the deferred forward."""
    n = 37 if v <= 4097 else 9
    for reduction in REDUCTIONS:
        x, t, w = _inputs(n, v, dtype, "cuda", ignore=(1, 5), seed=v)
        kw = _kwargs(option, w, reduction)
        cpu_kw = {k: (a.cpu() if isinstance(a, torch.Tensor) else a) for k, a in kw.items()}
        ref_loss, _ = ref_cross_entropy(x.cpu(), t.cpu(), **cpu_kw)
        if reduction == "none":
            g_out = torch.rand(n, device="cuda") * 2 - 0.5
        else:
            g_out = torch.tensor(1 / 7, device="cuda")
        ref_g = _ref_grad(x.cpu(), t.cpu(), cpu_kw, g_out.cpu())
        # The size of the terms that cancel in a row's gradient (p * A against the target's
        # term: all of it for V = 1), about grad_output / rows for a mean: the scale errors
        # are measured against where the gradient itself is near zero.
        terms = float(g_out.abs().max()) / n
        for make, in_logits in ((lambda a: a.clone(), True), (misaligned, True),
                                (lambda a: a.clone(), False)):
            poison_cuda_cache()
            xa = make(x).requires_grad_()  # the logits themselves (a misaligned one too)
            out = fk.cross_entropy(xa, t, loss_dtype=F32, defer_grad=True,
                                   grad_in_logits=in_logits, return_predicted_tokens=True, **kw)
            assert_close(out.loss, ref_loss, F32, factor=2, what="loss")
            out.loss.backward(g_out)
            assert not torch.isnan(xa.grad).any(), "unwritten gradient elements"
            # factor 4: p = exp(x - lse) from the stored float32 logsumexp carries a few
            # ulps of |lse| (about 1e-6 relative at |lse| ~ 10), where the forward's own
            # gradient divides exp(x - max) by the row's sum; it shows where the row's
            # gradient cancels (V = 1, float32 on the GPU: 2.15e-5 against 2e-5 at factor 2).
            assert_close(xa.grad, ref_g, dtype, factor=4, rounding=1, what="deferred grad",
                         scale=terms)
        assert torch.equal(out.predicted_tokens.cpu(),
                           ref_token_accuracy(x.cpu(), t.cpu(), softcap=kw["softcap"])[1])
        xb = x.clone().requires_grad_()
        loss_b = fk.cross_entropy(xb * 1, t, loss_dtype=F32, **kw)
        # The same losses up to the order of the row sums (the default forward may split a
        # row over a cluster of programs where the deferred one does not).
        assert_close(out.loss.detach(), loss_b.detach(), F32, what="deferred vs default loss")
        loss_b.backward(g_out)
        assert_close(xa.grad, xb.grad, dtype, factor=3, rounding=2, what="deferred vs default",
                     scale=terms)
        assert torch.equal(xa.grad[1].cpu(), torch.zeros(v, dtype=dtype))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_mean_denominator(dtype):
    """mean_denominator as a CUDA float tensor, an int64 tensor and a number: the
    reference's sum divided by it, deferred or not; the gradient of a plain backward in the
    logits' memory without a scaling pass (the forward's, for a grad_output of 1)."""
    n, v = 300, 32000
    x, t, w = _inputs(n, v, dtype, "cuda", ignore=range(0, n, 9), seed=3)
    for option in ("plain", "all"):
        kw = _kwargs(option, w, "mean")
        cpu_kw = {k: (a.cpu() if isinstance(a, torch.Tensor) else a) for k, a in kw.items()}
        for den in (torch.tensor(123.0, device="cuda"),
                    torch.tensor(77, dtype=torch.int64, device="cuda"), 250):
            ref_loss, ref_z, ref_g = _ref_sum_over(x.cpu(), t.cpu(), cpu_kw, float(den))
            for defer in (False, True):
                xa = x.clone().requires_grad_()
                loss, z = fk.cross_entropy(xa, t, loss_dtype=F32, return_z_loss=True,
                                           mean_denominator=den, defer_grad=defer, **kw)
                assert_close(loss, ref_loss, F32, factor=2, what="loss")
                assert_close(z, ref_z, F32, factor=2, what="z")
                loss.backward()
                assert_close(xa.grad, ref_g(torch.tensor(1.0)), dtype, factor=3, rounding=2,
                             what=f"grad, den {den}, defer {defer}")


@pytest.mark.cuda
def test_cuda_no_host_sync_and_graph_capture_with_mean_denominator_and_defer_grad():
    """Neither option makes the host wait (torch's sync debug mode raises on a
    synchronisation), and both are captured in a CUDA graph: the replays read the new
    denominator and logits."""
    n, v = 64, 5000
    x, t, _ = _inputs(n, v, torch.bfloat16, "cuda", ignore=(3,))
    den = torch.tensor(10.0, device="cuda")
    sx = x.clone().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (loads the kernels) outside the capture
        for defer in (False, True):
            (fk.cross_entropy(sx * 1, t, mean_denominator=den, defer_grad=defer) / 3).backward()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for defer in (False, True):
            (fk.cross_entropy(sx * 1, t, mean_denominator=den, defer_grad=defer) / 3).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for defer in (False, True):
        sx.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = fk.cross_entropy(sx * 1, t, loss_dtype=F32, mean_denominator=den,
                                    defer_grad=defer)
            (loss / 3).backward()
        for d, seed in ((10.0, 1), (37.0, 2)):
            x2, _, _ = _inputs(n, v, torch.bfloat16, "cuda", seed=seed)
            with torch.no_grad():
                sx.copy_(x2)
            den.fill_(d)
            graph.replay()
            ref_loss, _, ref_g = _ref_sum_over(x2.cpu(), t.cpu(), dict(), d)
            assert_close(loss, ref_loss, F32, factor=2, what=f"loss, defer {defer}")
            assert_close(sx.grad, ref_g(torch.tensor(1 / 3)), torch.bfloat16, factor=3,
                         rounding=2, what=f"grad, defer {defer}")


@pytest.mark.cuda
def test_cuda_defer_grad_more_than_2_31_elements():
    v = 128256
    n = (1 << 31) // v + 3
    x = torch.randn(n, v, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda")
    xa = x.clone().requires_grad_()
    loss = fk.cross_entropy(xa, t, reduction="none", loss_dtype=F32, defer_grad=True)
    g = torch.full_like(loss, 0.5)
    loss.backward(g)
    for rows in (slice(0, 2), slice(n - 2, n)):
        xs, ts = x[rows].cpu(), t[rows].cpu()
        assert_close(loss[rows], ref_cross_entropy(xs, ts, reduction="none")[0], torch.float32,
                     factor=2)
        assert_close(xa.grad[rows], _ref_grad(xs, ts, dict(reduction="none"),
                                              torch.full((2,), 0.5)),
                     torch.bfloat16, factor=2, rounding=1)
    del x, xa, loss
    torch.cuda.empty_cache()
