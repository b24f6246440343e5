"""fk.vocab_parallel_cross_entropy and fk.vocab_parallel_fused_linear_cross_entropy: the
Triton sources (interpreter) and the CPU ops on shards of one process's full logits, the
wrapper with one rank, opcheck, bad input, and 2-process runs (gloo on CPU; NCCL on 2 GPUs,
marker ``cuda``) against the full-vocabulary reference."""
import math
import os
import re
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fk
from helpers import (CE_OPTIONS as OPTIONS, ce_inputs as _inputs, ce_kwargs as _kwargs,
                     DTYPES, assert_close, error_lines, load_triton_src, ref_cross_entropy,
                     ref_fused_linear_cross_entropy, round_toward_zero)

REDUCTIONS = ("mean", "sum", "none")
NSTATS = 6


def _ref(x, t, kw, grad_out=None):
    """Reference (loss, z_loss, gradient of the full logits) in float64, from torch's
    cross entropy over the full vocabulary."""
    xd = x.detach().double().requires_grad_()
    kw = {k: (a.double() if isinstance(a, torch.Tensor) else a) for k, a in kw.items()}
    loss, z = ref_cross_entropy(xd, t, **kw)
    loss.backward(torch.ones_like(loss) if grad_out is None else grad_out.double())
    return loss.detach(), z.detach(), xd.grad


def _den(t, w, reduction, ignore_index=-100):
    """(D_w, D_n) from the full class weights: torch's weighted-mean denominator, the count."""
    keep = t != ignore_index
    if reduction != "mean":
        return torch.ones(2, dtype=torch.float64)
    count = keep.sum().double()
    dw = w.double()[torch.where(keep, t, 0)][keep].sum() if w is not None else count
    return torch.stack([dw, count])


def _reduce(rows, reduction):
    return rows if reduction == "none" else rows.sum()


# --- level 1: the Triton sources under the interpreter ------------------------------------

def _run_kernels(mod, x, t, w, kw, world, block, grid, in_place, scale=None):
    """Shards of x over `world` ranks, the stats kernel on each, the stats stacked in rank
    order, then the loss kernel on each: (loss rows, z rows, the shards' gradients joined)."""
    n, V = x.shape
    vl = V // world
    has_w, cap, ls = kw["weight"] is not None, kw["softcap"], kw["label_smoothing"]
    general = int(has_w or ls > 0 or cap is not None)
    shards = [x[:, r * vl:(r + 1) * vl].contiguous() for r in range(world)]
    ws = [(w[r * vl:(r + 1) * vl] if has_w else torch.zeros(1)).float().contiguous()
          for r in range(world)]
    stats = []
    for r in range(world):
        st = torch.full((NSTATS, n), float("nan"))
        mod.vocab_parallel_ce_stats_kernel[(grid,)](
            shards[r], t, ws[r], st, vl, n, vl, r * vl, -100, ls, cap or 1.0, int(has_w),
            int(cap is not None), BLOCK=block, GENERAL=general, PER_SM=1)
        stats.append(st)
    gathered = torch.stack(stats)
    den = _den(t, w if has_w else None, kw["reduction"]).float()
    grads, loss, z = [], None, None
    for r in range(world):
        g = shards[r] if in_place else torch.full_like(shards[r], float("nan"))
        loss, z = torch.full((n,), float("nan")), torch.full((n,), float("nan"))
        sc = den if scale is None else scale.float().contiguous()
        mod.vocab_parallel_ce_fwd_kernel[(grid,)](
            shards[r], g, t, ws[r], gathered, den, sc, loss, z, vl, vl,
            0 if scale is None or scale.dim() == 0 else 1, n, vl, r * vl, V, world, -100, ls,
            kw["lse_square_scale"], cap or 1.0, int(has_w), int(cap is not None),
            int(scale is not None), 1, BLOCK=block, GENERAL=general, PER_SM=1)
        grads.append(g)
    return loss, z, torch.cat(grads, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("option,reduction", [("plain", "mean"), ("zloss", "none"),
                                              ("weight_smooth_z", "sum"), ("all", "mean"),
                                              ("all", "none"), ("softcap", "mean")])
def test_interpreter_forward(dtype, option, reduction):
    mod = load_triton_src("vocab_parallel_cross_entropy")
    n, V = 7, 96
    x, t, w = _inputs(n, V, dtype, ignore=(1, 4))
    t[0], t[2], t[3] = 0, V - 1, V // 3  # first class, last class, a shard's first class
    kw = _kwargs(option, w, reduction)
    ref_loss, ref_z, ref_g = _ref(x, t, kw)
    for world, block, grid, in_place in ((3, 8, 2, True), (2, 64, n, False), (1, 32, 3, True)):
        loss, z, grad = _run_kernels(mod, x.clone(), t, w, kw, world, block, grid, in_place)
        assert_close(_reduce(loss, reduction), ref_loss, torch.float32, factor=2, what="loss")
        assert_close(_reduce(z, reduction), ref_z, torch.float32, factor=2, what="z")
        assert_close(grad, round_toward_zero(ref_g.float(), dtype), dtype, factor=2,
                     what="grad")
        assert torch.equal(grad[1], torch.zeros(V, dtype=dtype))  # ignored rows
        assert torch.equal(grad[4], torch.zeros(V, dtype=dtype))


def test_interpreter_stats_values():
    """The six stats of one shard against their definitions."""
    mod = load_triton_src("vocab_parallel_cross_entropy")
    n, V, world = 5, 60, 3
    x, t, w = _inputs(n, V, ignore=(2,), seed=4)
    t[0], t[1], t[3] = 20, 39, 40  # shard 1 is [20, 40)
    kw = _kwargs("all", w, "mean")
    cap = kw["softcap"]
    xs, ws = x[:, 20:40].contiguous(), w[20:40].contiguous()
    st = torch.full((NSTATS, n), float("nan"))
    mod.vocab_parallel_ce_stats_kernel[(2,)](xs, t, ws, st, 20, n, 20, 20, -100, 0.1, cap, 1, 1,
                                             BLOCK=8, GENERAL=1, PER_SM=1)
    xc = cap * torch.tanh(xs.double() / cap)
    m = xc.max(1).values
    here = (t >= 20) & (t < 40)
    loc = torch.where(here, t - 20, 0)
    ref = torch.stack([m, torch.exp(xc - m[:, None]).sum(1),
                       torch.where(here, xc.gather(1, loc[:, None])[:, 0], 0.0),
                       torch.where(here, ws.double()[loc], 0.0), (xc * ws).sum(1),
                       ws.double().sum().expand(n)])
    ref[:, 2] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # ignored
    assert_close(st, ref, torch.float32, factor=2)
    assert torch.equal(st[:, 2], torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0]))


def test_interpreter_grad_scale_and_bad_target():
    mod = load_triton_src("vocab_parallel_cross_entropy")
    n, V = 6, 40
    x, t, w = _inputs(n, V, ignore=(1,), seed=2)
    kw = _kwargs("weight_smooth_z", w, "none")
    g_out = torch.rand(n) + 0.5
    _, _, ref_g = _ref(x, t, kw, g_out)
    _, _, grad = _run_kernels(mod, x.clone(), t, w, kw, 2, 16, 3, True, scale=g_out)
    assert_close(grad, ref_g, torch.float32, factor=2)
    _, _, ref_g = _ref(x, t, kw, torch.full((n,), 2.5))
    _, _, grad = _run_kernels(mod, x.clone(), t, w, kw, 2, 16, 3, False,
                              scale=torch.tensor(2.5))
    assert_close(grad, ref_g, torch.float32, factor=2)
    t[3] = V  # out of range: NaN row (the host op raises before the kernels run)
    loss, _, grad = _run_kernels(mod, x.clone(), t, w, _kwargs("plain", w, "none"), 2, 16, 3,
                                 False)
    assert math.isnan(loss[3]) and torch.isnan(grad[3]).all()
    assert not torch.isnan(loss[[0, 1, 2, 4, 5]]).any()


# --- level 2: the CPU ops on shards of one process --------------------------------------

def _ops_on_shards(x, t, w, kw, world, in_place=False, scale=None):
    """The kernels of every rank run in this process, combined as the wrapper combines them:
    the stats stacked in rank order, the denominators from them (the wrapper's formula)."""
    n, V = x.shape
    vl = V // world
    has_w, ls, cap = kw["weight"] is not None, kw["label_smoothing"], kw["softcap"]
    shards = [x[:, r * vl:(r + 1) * vl].contiguous() for r in range(world)]
    ws = [w[r * vl:(r + 1) * vl] if has_w else None for r in range(world)]
    stats = torch.stack([torch.ops.fk._vocab_parallel_cross_entropy_stats(
        shards[r], t, ws[r], r * vl, V, -100, ls, cap) for r in range(world)])
    acc = stats.dtype
    den = _den(t, w if has_w else None, kw["reduction"]).to(device=x.device, dtype=acc)
    if kw["reduction"] == "mean":  # the wrapper's: from the stats, not from w
        assert_close(torch.stack([stats[:, 3].sum(), den[1]]), den, acc)
    grads = []
    for r in range(world):
        args = (t, ws[r], stats, den, scale, r * vl, V, -100, ls, kw["lse_square_scale"], cap)
        if in_place:
            loss, z = torch.ops.fk._vocab_parallel_cross_entropy_loss_(shards[r], *args)
            grads.append(shards[r])
        else:
            loss, z, g = torch.ops.fk._vocab_parallel_cross_entropy_loss(shards[r], *args, True)
            grads.append(g)
    return loss, z, torch.cat(grads, 1)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cpu_ops_on_shards(dtype, option, reduction):
    n, V = 9, 120
    x, t, w = _inputs(n, V, dtype, ignore=(1, 7))
    t[0], t[2], t[3] = 0, V - 1, 40
    kw = _kwargs(option, w, reduction)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    g_out = (torch.rand(n) + 0.5).to(acc) if reduction == "none" else None
    ref_loss, ref_z, ref_g = _ref(x, t, kw, g_out)
    for world in (1, 3, 4):
        for in_place in (False, True):
            loss, z, grad = _ops_on_shards(x.clone(), t, w, kw, world, in_place, g_out)
            assert loss.dtype == acc and grad.dtype == dtype
            assert_close(_reduce(loss, reduction), ref_loss, acc, factor=2, what="loss")
            assert_close(_reduce(z, reduction), ref_z, acc, factor=2, what="z")
            assert_close(grad, ref_g, dtype, factor=2, what="grad")
            assert torch.equal(grad[1], torch.zeros(V, dtype=dtype))


def _masked_and_nan(run):
    """A row of -inf over a whole shard (masked classes: that rank adds nothing) matches the
    reference; a NaN logit makes its row NaN. run(x, t, w, kw) -> (loss, z, grad)."""
    x, t, w = _inputs(5, 60, ignore=())
    x[1, 20:40] = -float("inf")
    t[1] = 45
    x[3, 50] = float("nan")
    kw = _kwargs("zloss", w, "none")
    ref_loss, _, _ = _ref(x, t, kw)
    assert torch.isfinite(ref_loss[1]) and torch.isnan(ref_loss[3])
    loss, _, grad = run(x.clone(), t, w, kw)
    assert_close(loss, ref_loss, torch.float32, factor=2)
    assert torch.isnan(grad[3]).all() and not torch.isnan(grad[[0, 1, 2, 4]]).any()
    assert torch.equal(grad[1, 20:40], torch.zeros(20))


def test_cpu_masked_shard_rows_and_nan_propagate():
    _masked_and_nan(lambda x, t, w, kw: _ops_on_shards(x, t, w, kw, 3))


def test_interpreter_masked_shard_rows_and_nan_propagate():
    mod = load_triton_src("vocab_parallel_cross_entropy")
    _masked_and_nan(lambda x, t, w, kw: _run_kernels(mod, x, t, w, kw, 3, 8, 2, False))


def test_cpu_one_rank_equals_fk_cross_entropy():
    x, t, w = _inputs(8, 50, ignore=(3,))
    for option in OPTIONS:
        for reduction in REDUCTIONS:
            kw = _kwargs(option, w, reduction)
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            a, za = fk.vocab_parallel_cross_entropy(xa, t, return_z_loss=True, **kw)
            b, zb = fk.cross_entropy(xb, t, return_z_loss=True, **kw)
            assert_close(a, b, torch.float32, what=f"{option} {reduction}")
            assert_close(za, zb, torch.float32)
            g = torch.rand_like(a) + 0.5
            a.backward(g)
            b.backward(g)
            assert_close(xa.grad, xb.grad, torch.float32, factor=2)


def test_cpu_wrapper_options():
    x, t, w = _inputs(6, 30, torch.bfloat16, ignore=(0,))
    ref = fk.vocab_parallel_cross_entropy(x, t, loss_dtype=torch.float32)
    assert ref.dtype == torch.float32
    assert fk.vocab_parallel_cross_entropy(x, t).dtype == torch.bfloat16
    assert torch.equal(fk.vocab_parallel_cross_entropy(x, t), ref.to(torch.bfloat16))
    # grad_in_logits=False leaves the logits untouched; True writes the gradient there.
    xa = x.clone().requires_grad_()
    fk.vocab_parallel_cross_entropy(xa, t, grad_in_logits=False).backward()
    assert torch.equal(xa.detach(), x)
    xb = x.clone().requires_grad_()
    fk.vocab_parallel_cross_entropy(xb, t).backward()
    assert torch.equal(xb.grad, xa.grad)
    assert xb.grad.data_ptr() == xb.data_ptr()
    # Empty input, all rows ignored: as torch.
    e = torch.empty(0, 10)
    te = torch.empty(0, dtype=torch.long)
    assert math.isnan(fk.vocab_parallel_cross_entropy(e, te).item())
    assert fk.vocab_parallel_cross_entropy(e, te, reduction="sum").item() == 0
    assert math.isnan(fk.vocab_parallel_cross_entropy(x, torch.full((6,), -100)).item())
    # Non-contiguous logits: copied once, not written.
    xt = x.float().t().contiguous().t().requires_grad_()
    before = xt.detach().clone()
    fk.vocab_parallel_cross_entropy(xt, t).backward()
    assert torch.equal(xt.detach(), before)
    assert_close(xt.grad, _ref(x.float(), t, dict())[2], torch.float32, factor=2)
    # Double backward raises.
    xd = x.float().requires_grad_()
    (g,) = torch.autograd.grad(fk.vocab_parallel_cross_entropy(xd * 1, t), xd,
                               create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.pow(2).sum().backward()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("bad", [10, 11, -5, -101])
def test_bad_target_raises(reduction, bad):
    x, t, w = _inputs(4, 10, ignore=(1,))
    t[2] = bad
    msg = re.escape(f"fk::vocab_parallel_cross_entropy: target {bad} (row 2) is out of range: "
                    "each target must be in [0, 10) (V = 10) or ignore_index (-100)")
    with pytest.raises(RuntimeError, match=msg):
        fk.vocab_parallel_cross_entropy(x, t, reduction=reduction)
    with pytest.raises(RuntimeError, match=msg):
        fk.vocab_parallel_cross_entropy(x.clone().requires_grad_(), t, reduction=reduction,
                                        weight=w, label_smoothing=0.1)
    # A shard: targets are global ids, checked against the whole vocabulary.
    msg = re.escape(f"target {bad} (row 2) is out of range: each target must be in [0, 30)")
    if bad >= 30 or bad < 0:
        with pytest.raises(RuntimeError, match=msg):
            torch.ops.fk._vocab_parallel_cross_entropy_stats(x, t, None, 10, 30, -100, 0.0, None)
    flce = re.escape(f"fk::vocab_parallel_fused_linear_cross_entropy: target {bad} (row 2) is "
                     "out of range: each target must be in [0, 10)")
    with pytest.raises(RuntimeError, match=flce):
        fk.vocab_parallel_fused_linear_cross_entropy(torch.randn(4, 3), torch.randn(10, 3), t,
                                                     reduction=reduction)
    t[1] = 0
    assert not torch.isnan(fk.vocab_parallel_cross_entropy(x, t, ignore_index=bad))


def _bad(**over):
    def make(d):
        args = dict(logits=torch.ones(3, 5, device=d),
                    target=torch.zeros(3, dtype=torch.long, device=d), weight=None,
                    vocab_start=5, vocab_size=10, ignore_index=-100, label_smoothing=0.0,
                    softcap=None, stats=torch.ones(2, NSTATS, 3, device=d),
                    den=torch.ones(2, device=d), grad_scale=None)
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
    ("weight shape", _bad(weight=lambda d: torch.ones(10, device=d)), "weight must have shape"),
    ("shard past V", _bad(vocab_start=6), re.escape("classes [6, 11) must lie in")),
    ("negative start", _bad(vocab_start=-1), "must lie in"),
    ("smoothing", _bad(label_smoothing=1.5), "label_smoothing must be in"),
    ("softcap", _bad(softcap=-1.0), "softcap must be positive"),
    ("stats shape", _bad(stats=lambda d: torch.ones(2, 5, 3, device=d)),
     re.escape("stats must have shape (world, 6, 3)")),
    ("stats dtype", _bad(stats=lambda d: torch.ones(2, 6, 3, dtype=torch.float64, device=d)),
     "stats must be Float, got Double"),
    ("den", _bad(den=lambda d: torch.ones(3, device=d)), "den must be a"),
    ("grad_scale", _bad(grad_scale=lambda d: torch.ones(4, device=d)),
     "grad_scale must be a scalar"),
]


def _call_bad(make, device, which):
    a = make(device)
    if which == "stats":
        return torch.ops.fk._vocab_parallel_cross_entropy_stats(
            a["logits"], a["target"], a["weight"], a["vocab_start"], a["vocab_size"],
            a["ignore_index"], a["label_smoothing"], a["softcap"])
    return torch.ops.fk._vocab_parallel_cross_entropy_loss(
        a["logits"], a["target"], a["weight"], a["stats"], a["den"], a["grad_scale"],
        a["vocab_start"], a["vocab_size"], a["ignore_index"], a["label_smoothing"], 0.0,
        a["softcap"], True)


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    for which in ("stats", "loss"):
        if which == "stats" and name in ("stats shape", "stats dtype", "den", "grad_scale"):
            continue
        cpu, meta = error_lines(lambda d: _call_bad(make, d, which), ("cpu", "meta"), msg)
        assert cpu == meta


def test_wrapper_bad_input():
    x, t, _ = _inputs(3, 8)
    with pytest.raises(RuntimeError, match="reduction must be one of"):
        fk.vocab_parallel_cross_entropy(x, t, reduction="avg")
    with pytest.raises(RuntimeError, match="loss_dtype must be None"):
        fk.vocab_parallel_cross_entropy(x, t, loss_dtype=torch.int64)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        fk.vocab_parallel_cross_entropy(x, t, group=object())
    with pytest.raises(RuntimeError, match=re.escape("weight must have shape (V_local, 4)")):
        fk.vocab_parallel_fused_linear_cross_entropy(torch.ones(3, 4), torch.ones(8, 5), t)


# --- level 3: autograd and opcheck ----------------------------------------------------------

@pytest.mark.parametrize("option", ["plain", "all"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_one_rank(option, reduction):
    x, t, w = _inputs(4, 7, torch.float64, ignore=(2,))
    kw = _kwargs(option, w.double(), reduction)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fk.vocab_parallel_cross_entropy(x * 1, t, **kw),
                                    (x,))
    h = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    wt = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    kw = dict(kw, ce_weight=kw.pop("weight"))
    assert torch.autograd.gradcheck(
        lambda h, wt, b: fk.vocab_parallel_fused_linear_cross_entropy(h, wt, t, bias=b,
                                                                      chunk_size=3, **kw),
        (h, wt, b))


def test_torch_compile_fullgraph_one_rank():
    def step(h, w, t):
        return fk.vocab_parallel_cross_entropy(h @ w, t, lse_square_scale=1e-4, softcap=20.0)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        h = torch.randn(rows, 16).requires_grad_()
        w = torch.randn(16, 40).requires_grad_()
        t = torch.randint(0, 40, (rows,))
        t[0] = -100
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = compiled(h, w, t), step(h2, w2, t)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        assert_close(h.grad, h2.grad, torch.float32, factor=10)
        assert_close(w.grad, w2.grad, torch.float32, factor=10)


def test_opcheck():
    x, t, w = _inputs(5, 12, ignore=(1,))
    internal = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    stats = torch.ops.fk._vocab_parallel_cross_entropy_stats(x, t, w, 12, 36, -100, 0.1, 5.0)
    torch.library.opcheck(torch.ops.fk._vocab_parallel_cross_entropy_stats,
                          (x, t, w, 12, 36, -100, 0.1, 5.0), test_utils=internal)
    gathered = torch.stack([stats, stats, stats])
    den = torch.tensor([3.0, 4.0])
    torch.library.opcheck(torch.ops.fk._vocab_parallel_cross_entropy_loss,
                          (x, t, w, gathered, den, torch.rand(5), 12, 36, -100, 0.1, 1e-3, 5.0,
                           True), test_utils=internal)
    torch.library.opcheck(torch.ops.fk._vocab_parallel_cross_entropy_loss_,
                          (x.clone(), t, None, gathered, den, None, 12, 36, -100, 0.0, 0.0,
                           None), test_utils=("test_schema", "test_faketensor"))


# --- the fused linear head on one rank ------------------------------------------------------

def _ref_linear(hidden, weight, bias, t, kw, g_out):
    """Reference loss and float64 gradients (hidden, weight, bias) of the full head: torch's
    cross entropy of the logits formed in float64 and rounded to the dtype."""
    leaves = [a.detach().cpu().double().requires_grad_() for a in (hidden, weight, bias)]
    kw = {k: (a.cpu() if isinstance(a, torch.Tensor) else a) for k, a in kw.items()}
    logits_dtype = hidden.dtype

    class Rounded(torch.autograd.Function):  # the logits as the dtype's matmul returns them
        @staticmethod
        def forward(ctx, a):
            return a.to(logits_dtype).double()

        @staticmethod
        def backward(ctx, g):
            return g

    logits = Rounded.apply(leaves[0] @ leaves[1].t() + leaves[2])
    loss, _ = ref_cross_entropy(logits, t.cpu(), kw.pop("ce_weight", None), **kw)
    loss.backward(g_out.cpu().double())
    return loss.detach(), [a.grad for a in leaves]


def _linear_one_rank(dtype, reduction, device, n=10, hdim=8, v=24, chunk_size=4):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(n, hdim, generator=g).to(device, dtype)
    wt = (torch.randn(v, hdim, generator=g) * (2.0 / hdim ** 0.5)).to(device, dtype)
    b = torch.randn(v, generator=g).to(device, dtype)
    t = torch.randint(0, v, (n,), generator=g)
    t[3] = -100
    t = t.to(device)
    cw = (torch.rand(v, generator=g) + 0.5).to(device)
    for kw in (dict(), dict(ce_weight=cw, label_smoothing=0.1, lse_square_scale=1e-2,
                            softcap=5.0)):
        ins = [a.clone().requires_grad_() for a in (hidden, wt, b)]
        out = fk.vocab_parallel_fused_linear_cross_entropy(
            ins[0], ins[1], t, bias=ins[2], reduction=reduction, chunk_size=chunk_size,
            loss_dtype=torch.float32, **kw)
        go = torch.rand(out.shape, generator=torch.Generator().manual_seed(2)) + 0.5
        ref, ref_grads = _ref_linear(hidden, wt, b, t, dict(kw, reduction=reduction), go)
        assert_close(out, ref, torch.float32, factor=3)
        out.backward(go.to(device))
        for a, r, name in zip(ins, ref_grads, ("hidden", "weight", "bias")):
            assert_close(a.grad, r, dtype, factor=4, what=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cpu_linear_one_rank_matches_reference(dtype, reduction):
    _linear_one_rank(dtype, reduction, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cuda_linear_one_rank_matches_reference(dtype, reduction):
    _linear_one_rank(dtype, reduction, "cuda", n=300, hdim=64, v=1000, chunk_size=128)


# --- 2 processes: gloo on CPU, NCCL on 2 GPUs -----------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _linear_inputs(dtype, device):
    g = torch.Generator().manual_seed(11)
    n, h, V = 21, 16, 64
    hidden = torch.randn(n, h, generator=g).to(dtype)
    weight = (torch.randn(V, h, generator=g) * 0.3).to(dtype)
    bias = torch.randn(V, generator=g).to(dtype)
    t = torch.randint(0, V, (n,), generator=g)
    t[[2, 9]] = -100
    cw = torch.rand(V, generator=g) + 0.5
    return [a.to(device) for a in (hidden, weight, bias, t, cw)]


def _megatron_reference(shard, t, group, rank, ignore_index=-100):
    """Megatron-LM's vocabulary-parallel cross entropy in float64 torch operations and
    collectives: the max over ranks, the target's logit from the rank holding it, the sum
    of exp over ranks; the mean over non-ignored rows."""
    x = shard.double()
    m = x.max(1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    x = x - m[:, None]
    vl = x.shape[1]
    local = t - rank * vl
    here = (local >= 0) & (local < vl) & (t != ignore_index)
    pred = torch.where(here, x.gather(1, torch.where(here, local, 0)[:, None])[:, 0], 0.0)
    dist.all_reduce(pred, group=group)
    sum_exp = x.exp().sum(1)
    dist.all_reduce(sum_exp, group=group)
    keep = t != ignore_index
    return (torch.log(sum_exp) - pred)[keep].mean()


def _check_ce(rank, world, device, group):
    V = 96 * world
    vl = V // world
    for i, dtype in enumerate(DTYPES):
        for j, option in enumerate(("plain", "weight_smooth_z", "all")):
            for reduction in REDUCTIONS:
                # (the same inputs on every rank)
                x, t, w = _inputs(13, V, dtype, ignore=(1, 6), seed=10 * i + j)
                t[0], t[2] = vl - 1, vl  # the last class of rank 0, the first of rank 1
                kw = _kwargs(option, w, reduction)
                g_out = torch.rand(13, generator=torch.Generator().manual_seed(5)) + 0.5
                if reduction != "none":
                    g_out = torch.tensor(1.7)
                ref_loss, ref_z, ref_g = _ref(x, t, kw, g_out)
                local_kw = dict(kw, weight=None if kw["weight"] is None else
                                kw["weight"][rank * vl:(rank + 1) * vl].to(device))
                shard = x[:, rank * vl:(rank + 1) * vl].to(device).requires_grad_()
                loss, z = fk.vocab_parallel_cross_entropy(
                    shard * 1, t.to(device), group, return_z_loss=True,
                    loss_dtype=torch.float32, **local_kw)
                what = f"rank {rank} {dtype} {option} {reduction}"
                assert_close(loss, ref_loss, torch.float32, factor=2, what=what + " loss")
                assert_close(z, ref_z, torch.float32, factor=2, what=what + " z")
                loss.backward(g_out.to(device))
                assert_close(shard.grad, ref_g[:, rank * vl:(rank + 1) * vl], dtype, factor=3,
                             what=what + " grad")
                if option == "plain" and reduction == "mean":
                    mega = _megatron_reference(shard.detach(), t.to(device), group, rank)
                    assert_close(loss, mega, torch.float32, factor=2, what=what + " megatron")
                # The same loss on every rank, bit for bit.
                everyone = [torch.empty_like(loss) for _ in range(world)]
                dist.all_gather(everyone, loss.detach().contiguous(), group=group)
                assert all(torch.equal(e, everyone[0]) for e in everyone), what


def _check_linear(rank, world, device, group):
    for dtype in DTYPES:
        hidden, weight, bias, t, cw = _linear_inputs(dtype, device)
        V = weight.shape[0]
        vl = V // world
        sl = slice(rank * vl, (rank + 1) * vl)
        for kw in (dict(), dict(ce_weight=cw, label_smoothing=0.1, lse_square_scale=1e-2,
                                softcap=5.0)):
            for reduction in REDUCTIONS:
                go = torch.rand(t.shape[0] if reduction == "none" else (),
                                generator=torch.Generator().manual_seed(3)) + 0.5
                ref, ref_grads = _ref_linear(hidden, weight, bias, t,
                                             dict(kw, reduction=reduction), go)
                ins = [hidden.clone().requires_grad_(), weight[sl].clone().requires_grad_(),
                       bias[sl].clone().requires_grad_()]
                local = dict(kw)
                if "ce_weight" in kw:
                    local["ce_weight"] = kw["ce_weight"][sl]
                out = fk.vocab_parallel_fused_linear_cross_entropy(
                    ins[0], ins[1], t, group, bias=ins[2], reduction=reduction, chunk_size=8,
                    loss_dtype=torch.float32, **local)
                what = f"rank {rank} {dtype} {sorted(kw)} {reduction}"
                assert_close(out, ref, torch.float32, factor=3, what=what + " loss")
                out.backward(go.to(device))
                assert_close(ins[0].grad, ref_grads[0], dtype, factor=4, what=what + " gh")
                assert_close(ins[1].grad, ref_grads[1][sl], dtype, factor=4, what=what + " gw")
                assert_close(ins[2].grad, ref_grads[2][sl], dtype, factor=4, what=what + " gb")


def _check_compile(rank, world, device, group):
    """torch.compile(fullgraph=True) of the wrapper, its all-gather traced, against eager."""
    def step(s, t):
        return fk.vocab_parallel_cross_entropy(s * 1, t, group, lse_square_scale=1e-3,
                                               label_smoothing=0.1)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    x, t, _ = _inputs(6, 20 * world, ignore=(2,))
    shard = x[:, rank * 20:(rank + 1) * 20].to(device)
    a, b = shard.clone().requires_grad_(), shard.clone().requires_grad_()
    out, ref = compiled(a, t.to(device)), step(b, t.to(device))
    assert_close(out, ref, torch.float32, factor=2)
    out.backward()
    ref.backward()
    assert_close(a.grad, b.grad, torch.float32, factor=2)


def _worker(rank, world, port, backend, checks):
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        group = dist.new_group(list(range(world)))  # an explicit group; None is WORLD
        for check in checks:
            globals()[check](rank, world, device, group)
        # group=None: the default group.
        x, t, _ = _inputs(5, 40 * world, ignore=(2,))
        shard = x[:, rank * 40:(rank + 1) * 40].to(device)
        loss = fk.vocab_parallel_cross_entropy(shard, t.to(device))
        assert_close(loss, _ref(x, t, dict())[0], torch.float32, factor=2)
        # A group of rank 0 alone: rank 0 computes fk.cross_entropy, rank 1 is no member.
        solo = dist.new_group([0])
        if rank == 0:
            x0 = x[:, :40].to(device)
            assert_close(fk.vocab_parallel_cross_entropy(x0, t.to(device) % 40, solo),
                         _ref(x[:, :40], t % 40, dict())[0], torch.float32, factor=2)
        else:
            with pytest.raises(RuntimeError, match="not a member of the process group"):
                fk.vocab_parallel_cross_entropy(shard, t.to(device), solo)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(backend, checks, world=2):
    mp.spawn(_worker, args=(world, _free_port(), backend, checks), nprocs=world, join=True)


@pytest.mark.parametrize("checks", [("_check_ce",), ("_check_linear",), ("_check_compile",)])
def test_two_processes_gloo(checks):
    _spawn("gloo", checks)


@pytest.mark.cuda
@pytest.mark.parametrize("checks", [("_check_ce",), ("_check_linear",), ("_check_compile",)])
def test_two_processes_nccl(checks):
    if torch.cuda.device_count() < 2 or not dist.is_nccl_available():
        pytest.skip("needs 2 GPUs and NCCL")
    _spawn("nccl", checks)


# --- level 5: CUDA kernels in one process -----------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vl", [1, 7, 100, 1000, 1025, 16032, 32000, 64128])
@pytest.mark.parametrize("option", ["plain", "zloss", "weight_smooth_z", "all"])
def test_cuda_ops_on_shards_match_reference(dtype, vl, option):
    from helpers import poison_cuda_cache
    world = 2
    n = 37 if vl <= 16032 else 9
    for reduction in REDUCTIONS:
        x, t, w = _inputs(n, world * vl, dtype, ignore=(1, 5), seed=vl)
        kw = _kwargs(option, w, reduction)
        g_out = (torch.rand(n) + 0.5) if reduction == "none" else None
        ref_loss, ref_z, ref_g = _ref(x, t, kw, g_out)
        poison_cuda_cache()
        kw_cuda = dict(kw, weight=None if kw["weight"] is None else kw["weight"].cuda())
        for in_place in (False, True):
            loss, z, grad = _ops_on_shards(x.cuda(), t.cuda(), kw_cuda["weight"], kw_cuda,
                                           world, in_place,
                                           None if g_out is None else g_out.cuda())
            assert not torch.isnan(grad).any(), "unwritten gradient elements"
            assert_close(_reduce(loss, reduction), ref_loss, torch.float32, factor=2)
            assert_close(_reduce(z, reduction), ref_z, torch.float32, factor=2)
            assert_close(grad, ref_g, dtype, factor=3)


@pytest.mark.cuda
def test_cuda_one_rank_matches_cross_entropy_and_is_graph_capturable():
    x, t, _ = _inputs(64, 1000, torch.bfloat16, "cuda", ignore=(3,))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a = fk.vocab_parallel_cross_entropy(xa, t, loss_dtype=torch.float32)
    b = fk.cross_entropy(xb, t, loss_dtype=torch.float32)
    assert_close(a, b, torch.float32)
    a.backward()
    b.backward()
    assert_close(xa.grad, xb.grad, torch.bfloat16, factor=2)
    sx = x.clone().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fk.vocab_parallel_cross_entropy(sx * 1, t).backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = fk.vocab_parallel_cross_entropy(sx * 1, t, loss_dtype=torch.float32)
    graph.replay()
    assert_close(loss, b, torch.float32)


_BAD_TARGET_SCRIPT = """
import sys, torch, fk
op, bad = sys.argv[1], int(sys.argv[2])
t = torch.randint(0, 64, (16,), device="cuda")
t[5] = bad
if op == "ce":
    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    loss = fk.vocab_parallel_cross_entropy(x * 1, t)
else:
    h = torch.randn(16, 8, device="cuda", requires_grad=True)
    loss = fk.vocab_parallel_fused_linear_cross_entropy(h, torch.randn(64, 8, device="cuda"), t)
loss.backward()
torch.cuda.synchronize()
print("NO ERROR", loss.item())
"""


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["ce", "linear"])
def test_cuda_bad_target_is_a_device_assert(op):
    """An out-of-range target raises through a device-side assert (no host
    synchronisation); each case runs in a fresh process (the assert ends the context)."""
    import subprocess
    import sys
    for bad, expect_error in ((64, True), (-1, True), (63, False)):
        r = subprocess.run([sys.executable, "-c", _BAD_TARGET_SCRIPT, op, str(bad)],
                           capture_output=True, text=True, env=dict(os.environ), timeout=300)
        out = r.stdout + r.stderr
        if expect_error:
            assert r.returncode != 0 and "NO ERROR" not in out, out
            assert "device-side assert" in out, out
        else:
            assert r.returncode == 0 and "NO ERROR" in out and "nan" not in out, out


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        for which in ("stats", "loss"):
            if which == "stats" and name in ("stats shape", "stats dtype", "den", "grad_scale"):
                continue
            cpu, cuda = error_lines(lambda d: _call_bad(make, d, which), ("cpu", "cuda"), msg)
            assert cpu == cuda


def test_variants_cover_every_dtype():
    mod = load_triton_src("vocab_parallel_cross_entropy")
    for arch in (80, 90):
        keys = {(v.family, v.dtype, v.flags, v.block) for v in mod.variants(arch)}
        for fam in ("vocab_parallel_ce_stats", "vocab_parallel_ce_fwd"):
            for dt in ("fp32", "bf16", "fp16"):
                for flags in (0, 1, 2, 3):
                    assert (fam, dt, flags, mod.SMALL) in keys
                    assert (fam, dt, flags, mod.LARGE) in keys
