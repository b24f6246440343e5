"""fk.fused_linear_cross_entropy at every test level: CPU backend against the reference
(every chunking, reduction, option and gradient mask), autograd, opcheck, torch.compile,
TorchScript, bad input, and the CUDA path (marker ``cuda``). Its cross entropy kernels are
tested in test_cross_entropy.py."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import fk
from helpers import (DTYPES, assert_close, error_lines, ref_cross_entropy,
                     ref_fused_linear_cross_entropy)

REDUCTIONS = ("mean", "sum", "none")
# (ce_weight?, label_smoothing, lse_square_scale, softcap)
OPTIONS = {
    "plain": (False, 0.0, 0.0, None),
    "all": (True, 0.1, 1e-2, 5.0),
}


def _inputs(n, h, v, dtype=torch.float32, device="cpu", bias=True, ignore=(1,), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(v, h, generator=g) * (2.0 / h ** 0.5)).to(device=device, dtype=dtype)
    b = (torch.randn(v, generator=g) * 0.5).to(device=device, dtype=dtype) if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    for i in ignore:
        if i < n:
            t[i] = -100
    cw = (torch.rand(v, generator=g) + 0.5).to(device)
    return x, w, b, t.to(device), cw


def _kwargs(option, cw, reduction):
    has_w, ls, s, cap = OPTIONS[option]
    return dict(ce_weight=cw if has_w else None, label_smoothing=ls, reduction=reduction,
                lse_square_scale=s, softcap=cap)


def _ref(x, w, b, t, kw, g_out, need=(True, True, True)):
    """Reference loss, z_loss and float64 gradients (x, weight, bias)."""
    leaves = [None if a is None else a.detach().cpu().double().requires_grad_(r)
              for a, r in zip((x, w, b), need)]
    kw = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    xd, wd, bd = leaves
    # Round the logits as the dtype's matmul returns them.
    logits = xd @ wd.t() + (bd if bd is not None else 0)
    if x.dtype != torch.float64:
        logits = logits.to(x.dtype).double()
    loss, z = ref_cross_entropy(logits, t.cpu(), kw.pop("ce_weight"), **kw)
    loss.backward(g_out.cpu().double())
    return loss, z, [None if a is None or not a.requires_grad else a.grad for a in leaves]


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("chunk_size", [None, 1, 3])
def test_cpu_forward_backward(dtype, option, reduction, chunk_size):
    n, h, v = 7, 16, 40
    x, w, b, t, cw = _inputs(n, h, v, dtype)
    kw = _kwargs(option, cw, reduction)
    xa, wa, ba = (a.clone().requires_grad_() for a in (x, w, b))
    loss_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    loss, z = fk.fused_linear_cross_entropy(xa, wa, t, ba, chunk_size=chunk_size,
                                            return_z_loss=True, loss_dtype=loss_dtype, **kw)
    g_out = torch.randn(loss.shape, generator=torch.Generator().manual_seed(5)).to(loss.dtype)
    ref_loss, ref_z, (gx, gw, gb) = _ref(x, w, b, t, kw, g_out)
    assert loss.dtype == loss_dtype and loss.shape == ref_loss.shape
    assert_close(loss, ref_loss, loss_dtype, factor=3, what="loss")
    assert_close(z, ref_z, loss_dtype, factor=3, what="z")
    loss.backward(g_out)
    # The logits' gradient is rounded to the dtype, then goes through a matmul.
    assert_close(xa.grad, gx, dtype, factor=4, what="grad_x")
    assert_close(wa.grad, gw, dtype, factor=4, what="grad_weight")
    assert_close(ba.grad, gb, dtype, factor=4, what="grad_bias")
    # By default the losses come in x's dtype (as torch's linear + cross_entropy): the
    # float32 values rounded once.
    with torch.no_grad():
        loss_d, z_d = fk.fused_linear_cross_entropy(x, w, t, b, chunk_size=chunk_size,
                                                    return_z_loss=True, **kw)
    assert loss_d.dtype == z_d.dtype == dtype
    assert torch.equal(loss_d, loss.detach().to(dtype)) and torch.equal(z_d, z.to(dtype))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bad_target_raises_and_loss_dtype(reduction):
    x, w, b, t, cw = _inputs(6, 8, 20, ignore=(0,))
    t[3] = 20
    msg = re.escape("fk::fused_linear_cross_entropy: target 20 (row 3) is out of range: each "
                    "target must be in [0, 20) (V = 20) or ignore_index (-100)")
    for grad in (False, True):
        with pytest.raises(RuntimeError, match=msg):
            fk.fused_linear_cross_entropy(x, w.clone().requires_grad_(grad), t, b,
                                          reduction=reduction, chunk_size=2)
    t[3] = 1
    xb, wb = x.to(torch.bfloat16).requires_grad_(), w.to(torch.bfloat16).requires_grad_()
    loss = fk.fused_linear_cross_entropy(xb, wb, t, reduction=reduction)
    assert loss.dtype == torch.bfloat16
    assert loss.dtype == F.cross_entropy(F.linear(xb, wb), t, reduction=reduction).dtype
    loss32 = fk.fused_linear_cross_entropy(xb, wb, t, reduction=reduction,
                                           loss_dtype=torch.float32)
    assert loss32.dtype == torch.float32 and torch.equal(loss.detach(), loss32.detach().to(
        torch.bfloat16))
    loss.sum().backward()
    g16 = xb.grad.clone()
    xb.grad = None
    loss32.sum().backward()
    assert torch.equal(xb.grad, g16)
    with pytest.raises(RuntimeError, match="fk::fused_linear_cross_entropy: loss_dtype must be "
                       "None, float32, float64, bfloat16 or float16, got Int"):
        fk.fused_linear_cross_entropy(x, w, t, loss_dtype=torch.int32)
    m = fk.nn.FusedLinearCrossEntropyLoss(loss_dtype=torch.float32)
    assert m(wb, xb, t).dtype == torch.float32


@pytest.mark.parametrize("need", [(True, False, False), (False, True, True), (False, True, False)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_only_some_inputs_need_grad(need, reduction):
    x, w, b, t, cw = _inputs(6, 8, 30)
    xa, wa, ba = (a.clone().requires_grad_(r) for a, r in zip((x, w, b), need))
    loss = fk.fused_linear_cross_entropy(xa, wa, t, ba, chunk_size=4, reduction=reduction)
    g_out = torch.rand(loss.shape) + 0.5
    loss.backward(g_out)
    _, _, refs = _ref(x, w, b, t, dict(ce_weight=None, reduction=reduction), g_out, need)
    for a, r, ref in zip((xa, wa, ba), need, refs):
        if r:
            assert_close(a.grad, ref, torch.float32, factor=3)
        else:
            assert a.grad is None


def test_no_bias_no_grad_and_module():
    x, w, _, t, cw = _inputs(9, 12, 25, bias=False)
    ref = ref_fused_linear_cross_entropy(x, w, t, None, cw, label_smoothing=0.2)[0]
    with torch.no_grad():
        out = fk.fused_linear_cross_entropy(x, w.requires_grad_(), t, ce_weight=cw,
                                            label_smoothing=0.2)
    assert not out.requires_grad
    assert_close(out, ref, torch.float32, factor=2)
    m = fk.nn.FusedLinearCrossEntropyLoss(ce_weight=cw, label_smoothing=0.2, chunk_size=4)
    x3 = x.reshape(3, 3, 12)
    assert_close(m(w, x3, t.reshape(3, 3)), ref, torch.float32, factor=2)
    with pytest.raises(ValueError, match="reduction"):
        fk.nn.FusedLinearCrossEntropyLoss(reduction="avg")


def test_accum_dtype_float32_is_more_accurate_in_bf16():
    x, w, _, t, _ = _inputs(64, 32, 50, torch.bfloat16, bias=False, ignore=())
    _, _, (_, gw_ref, _) = _ref(x, w, None, t, dict(ce_weight=None, reduction="sum"),
                                torch.tensor(1.0), (False, True, False))
    errs = {}
    for accum in (None, torch.float32):
        wa = w.clone().requires_grad_()
        fk.fused_linear_cross_entropy(x, wa, t, reduction="sum", chunk_size=1,
                                      accum_dtype=accum).backward()
        assert wa.grad.dtype == torch.bfloat16
        errs[accum] = (wa.grad.double() - gw_ref).norm().item()
    assert errs[torch.float32] < errs[None]
    assert_close(torch.tensor(errs[torch.float32]), torch.tensor(0.0), torch.bfloat16,
                 scale=gw_ref.norm().item() / 1.5)


def test_grad_output_scaling_retain_graph_and_double_backward():
    x, w, b, t, _ = _inputs(5, 8, 20)
    for reduction, g in (("mean", torch.tensor(2.5)), ("none", torch.rand(5) - 0.5)):
        xa, wa, ba = (a.clone().requires_grad_() for a in (x, w, b))
        loss = fk.fused_linear_cross_entropy(xa, wa, t, ba, reduction=reduction, chunk_size=2)
        loss.backward(g, retain_graph=True)
        first = [a.grad.clone() for a in (xa, wa, ba)]
        _, _, refs = _ref(x, w, b, t, dict(ce_weight=None, reduction=reduction), g)
        for got, ref in zip(first, refs):
            assert_close(got, ref, torch.float32, factor=3)
        loss.backward(g)
        for a, f in zip((xa, wa, ba), first):
            assert_close(a.grad, 2 * f, torch.float32)
        xa.grad = None
        (gx,) = torch.autograd.grad(
            fk.fused_linear_cross_entropy(xa, wa, t, ba, reduction=reduction).sum(), xa,
            create_graph=True)
        with pytest.raises(RuntimeError, match="differentiate twice"):
            gx.sum().backward()


def test_z_loss_output_and_empty():
    x, w, b, t, _ = _inputs(6, 8, 20, ignore=(0,))
    loss, z = fk.fused_linear_cross_entropy(x, w, t, b, lse_square_scale=1e-2,
                                            return_z_loss=True)
    ref_loss, ref_z = ref_fused_linear_cross_entropy(x, w, t, b, lse_square_scale=1e-2)
    assert_close(loss, ref_loss, torch.float32, factor=2)
    assert_close(z, ref_z, torch.float32, factor=2)
    xe = torch.empty(0, 8, requires_grad=True)
    we = w.clone().requires_grad_()
    out = fk.fused_linear_cross_entropy(xe, we, torch.empty(0, dtype=torch.long),
                                        reduction="sum")
    out.backward()
    assert out.item() == 0 and xe.grad.shape == (0, 8)
    assert torch.equal(we.grad, torch.zeros_like(w))
    assert math.isnan(fk.fused_linear_cross_entropy(xe, we, torch.empty(0, dtype=torch.long)))


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_cpu_token_scaling(dtype, option, reduction, chunk_size):
    """use_token_scaling: each row's loss (smoothing and z-loss included) times its
    predicted probability of the target, a constant of the gradient; "mean" keeps its
    denominators; "none" weighs each row by its grad_output before the products."""
    n, h, v = 7, 16, 40
    x, w, b, t, cw = _inputs(n, h, v, dtype, ignore=(1, 4))
    kw = _kwargs(option, cw, reduction)
    xa, wa, ba = (a.clone().requires_grad_() for a in (x, w, b))
    loss_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    loss, z = fk.fused_linear_cross_entropy(xa, wa, t, ba, chunk_size=chunk_size,
                                            return_z_loss=True, loss_dtype=loss_dtype,
                                            use_token_scaling=True, **kw)
    g_out = torch.rand(loss.shape, generator=torch.Generator().manual_seed(5)).to(loss.dtype)
    ref_loss, ref_z, (gx, gw, gb) = _ref(x, w, b, t, dict(kw, token_scaling=True), g_out + 0.5)
    unscaled, _, _ = _ref(x, w, b, t, kw, g_out + 0.5)
    assert not torch.allclose(ref_loss, unscaled)  # the option changes the loss
    assert_close(loss, ref_loss, loss_dtype, factor=3, what="loss")
    assert_close(z, ref_z, loss_dtype, factor=3, what="z")
    loss.backward(g_out + 0.5)
    assert_close(xa.grad, gx, dtype, factor=4, what="grad_x")
    assert_close(wa.grad, gw, dtype, factor=4, what="grad_weight")
    assert_close(ba.grad, gb, dtype, factor=4, what="grad_bias")
    with torch.no_grad():
        loss_ng = fk.fused_linear_cross_entropy(x, w, t, b, chunk_size=chunk_size,
                                                loss_dtype=loss_dtype, use_token_scaling=True,
                                                **kw)
    assert torch.equal(loss_ng, loss.detach())
    m = fk.nn.FusedLinearCrossEntropyLoss(cw if kw["ce_weight"] is not None else None,
                                          reduction=reduction,
                                          label_smoothing=kw["label_smoothing"],
                                          lse_square_scale=kw["lse_square_scale"],
                                          softcap=kw["softcap"], chunk_size=chunk_size,
                                          loss_dtype=loss_dtype, use_token_scaling=True)
    assert torch.equal(m(w, x, t, b), loss.detach())


def _clear_rows(x, w, b, gap):
    """Rows whose largest logit (float64) beats the second by more than gap: the argmax a
    low-precision matmul must agree on."""
    logits = x.double() @ w.double().t() + (0 if b is None else b.double())
    top2 = logits.topk(2, -1).values
    return top2[:, 0] - top2[:, 1] > gap, logits.argmax(-1)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("scaling", [False, True])
def test_cpu_extra_outputs(dtype, reduction, scaling):
    """Predicted tokens (the argmax of each row of x @ w.T + b, -100 for ignored rows) and
    the token accuracy; the loss and gradients are those of the call without them."""
    n, h, v = 40, 16, 30
    x, w, b, t, cw = _inputs(n, h, v, dtype, ignore=(1, 4))
    x[::3] = (w[t[::3].clamp(min=0)].float() * 4.0).to(dtype)  # rows predicted right
    kw = _kwargs("all", cw, reduction)
    xa, wa, ba = (a.clone().requires_grad_() for a in (x, w, b))
    xb, wb, bb = (a.clone().requires_grad_() for a in (x, w, b))
    out = fk.fused_linear_cross_entropy(xa, wa, t, ba, chunk_size=7, use_token_scaling=scaling,
                                        return_token_accuracy=True,
                                        return_predicted_tokens=True, **kw)
    assert isinstance(out, fk.CrossEntropyOutput) and out.z_loss is None
    keep = t != -100
    clear, ref_pred = _clear_rows(x, w, b, 0.3 if dtype in (torch.bfloat16, torch.float16)
                                  else 1e-4)
    assert clear.sum() >= n // 2
    pred = out.predicted_tokens
    assert pred.dtype == torch.int64 and torch.equal(pred[~keep], torch.full((2,), -100))
    assert torch.equal(pred[keep & clear], ref_pred[keep & clear])
    right = ((pred == t) & keep).float()
    want_acc = right if reduction == "none" else right.sum() / keep.sum()
    assert out.token_accuracy.dtype == torch.float32
    assert_close(out.token_accuracy, want_acc, torch.float32)
    assert right.sum() >= n // 3 - 1
    plain = fk.fused_linear_cross_entropy(xb, wb, t, bb, chunk_size=7,
                                          use_token_scaling=scaling, **kw)
    assert torch.equal(out.loss.detach(), plain.detach())
    out.loss.sum().backward()
    plain.sum().backward()
    for a, b_ in ((xa, xb), (wa, wb), (ba, bb)):
        assert torch.equal(a.grad, b_.grad)
    with torch.no_grad():
        only = fk.fused_linear_cross_entropy(x, w, t, b, chunk_size=7, return_z_loss=True,
                                             return_predicted_tokens=True, **kw)
    assert torch.equal(only.predicted_tokens, pred) and only.token_accuracy is None
    assert only.z_loss is not None
    e = fk.fused_linear_cross_entropy(x[:0], w, t[:0], b, reduction=reduction,
                                      return_token_accuracy=True, return_predicted_tokens=True)
    assert e.predicted_tokens.shape == (0,)
    assert (e.token_accuracy.shape == (0,) if reduction == "none"
            else math.isnan(e.token_accuracy.item()))


def test_non_contiguous_inputs():
    x, w, b, t, _ = _inputs(6, 10, 20)
    xt = x.t().contiguous().t().requires_grad_()
    wt = w.t().contiguous().t().requires_grad_()
    loss = fk.fused_linear_cross_entropy(xt, wt, t, b, chunk_size=4)
    loss.backward()
    ref_loss, _, (gx, gw, _) = _ref(x, w, b, t, dict(ce_weight=None, reduction="mean"),
                                    torch.tensor(1.0))
    assert_close(loss, ref_loss, torch.float32, factor=2)
    assert_close(xt.grad, gx, torch.float32, factor=3)
    assert_close(wt.grad, gw, torch.float32, factor=3)


# --- bad input -----------------------------------------------------------------------------

def _bad(**over):
    def make(d):
        args = dict(x=torch.ones(3, 4, device=d), weight=torch.ones(5, 4, device=d),
                    target=torch.zeros(3, dtype=torch.long, device=d), bias=None,
                    ce_weight=None, label_smoothing=0.0, reduction="mean", softcap=None,
                    chunk_size=None, accum_dtype=None)
        args.update({k: (v(d) if callable(v) else v) for k, v in over.items()})
        return args
    return make


BAD = [
    ("x 1d", _bad(x=lambda d: torch.ones(4, device=d)), "x must have shape"),
    ("weight dtype", _bad(weight=lambda d: torch.ones(5, 4, dtype=torch.float16, device=d)),
     "must have the same dtype"),
    ("weight shape", _bad(weight=lambda d: torch.ones(5, 3, device=d)), "weight must have shape"),
    ("no classes", _bad(weight=lambda d: torch.ones(0, 4, device=d)), "at least one class"),
    ("bias shape", _bad(bias=lambda d: torch.ones(4, device=d)), "bias must have shape"),
    ("target dtype", _bad(target=lambda d: torch.zeros(3, dtype=torch.int32, device=d)),
     "target must be int64"),
    ("target shape", _bad(target=lambda d: torch.zeros(2, dtype=torch.long, device=d)),
     "target must have shape"),
    ("ce_weight shape", _bad(ce_weight=lambda d: torch.ones(4, device=d)),
     "ce_weight must have shape"),
    ("chunk", _bad(chunk_size=0), "chunk_size must be positive"),
    ("accum", _bad(accum_dtype=torch.float16), "accum_dtype must be"),
    ("reduction", _bad(reduction="avg"), "reduction must be one of"),
    ("smoothing", _bad(label_smoothing=-0.1), "label_smoothing must be in"),
]


def _call_bad(make, device):
    a = make(device)
    return torch.ops.fk.fused_linear_cross_entropy(
        a["x"], a["weight"], a["target"], a["bias"], a["ce_weight"], -100, a["label_smoothing"],
        a["reduction"], 0.0, a["softcap"], a["chunk_size"], a["accum_dtype"])


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta


# --- level 3: autograd, opcheck, torch.compile, TorchScript ---------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck(reduction):
    x, w, b, t, cw = _inputs(5, 4, 6, torch.float64, ignore=(2,))
    kw = _kwargs("all", cw.double(), reduction)
    args = tuple(a.requires_grad_() for a in (x, w, b))
    assert torch.autograd.gradcheck(
        lambda x, w, b: fk.fused_linear_cross_entropy(x, w, t, b, chunk_size=2, **kw), args)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_token_scaling_gradients_in_float64(reduction):
    x, w, b, t, cw = _inputs(5, 4, 6, torch.float64, ignore=(2,))
    kw = _kwargs("all", cw.double(), reduction)
    args = tuple(a.requires_grad_() for a in (x, w, b))
    # The scale is a constant of the gradient: gradcheck differentiates the loss with p
    # held where the forward found it, so compare against the reference's autograd instead.
    g_out = torch.rand(() if reduction != "none" else (5,), dtype=torch.float64) + 0.5
    loss = fk.fused_linear_cross_entropy(*args[:2], t, args[2], chunk_size=2,
                                         use_token_scaling=True, **kw)
    got = torch.autograd.grad(loss, args, g_out)
    _, _, want = _ref(x, w, b, t, dict(kw, token_scaling=True), g_out)
    for g, r in zip(got, want):
        assert_close(g, r, torch.float64, factor=4)


def test_opcheck():
    x, w, b, t, cw = _inputs(5, 6, 11)
    for red in REDUCTIONS:
        torch.library.opcheck(
            torch.ops.fk.fused_linear_cross_entropy,
            (x.clone().requires_grad_(), w.clone().requires_grad_(), t, b.clone().requires_grad_(),
             cw, -100, 0.1, red, 1e-3, 4.0, 2, None))
        torch.library.opcheck(
            torch.ops.fk.fused_linear_cross_entropy,
            (x.clone().requires_grad_(), w.clone().requires_grad_(), t, b.clone().requires_grad_(),
             cw, -100, 0.1, red, 1e-3, 4.0, 2, None, torch.float32, True, True, True))
    for extras in (False, True):
        torch.library.opcheck(torch.ops.fk._fused_linear_cross_entropy_forward,
                              (x, w, t, b, None, -100, 0.0, "sum", 0.0, None, 3, torch.float32,
                               [True, True, True], None, extras, extras),
                              test_utils=("test_schema", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    def step(h, w, t):
        return fk.fused_linear_cross_entropy(h, w, t, chunk_size=4, lse_square_scale=1e-3)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        x, w, _, t, _ = _inputs(rows, 8, 30, seed=rows, bias=False)
        h, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
        h2, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
        out, ref = compiled(h, wa, t), step(h2, wb, t)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        assert_close(h.grad, h2.grad, torch.float32, factor=10)
        assert_close(wa.grad, wb.grad, torch.float32, factor=10)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_module(tmp_path):
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(8, 20, bias=False)
            self.loss = fk.nn.FusedLinearCrossEntropyLoss(lse_square_scale=1e-3, chunk_size=3)

        def forward(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return self.loss(self.lm_head.weight, h, t)

    torch.manual_seed(0)
    m = Head()
    x, _, _, t, _ = _inputs(6, 8, 20)
    path = tmp_path / "head.pt"
    torch.jit.script(m).save(str(path))
    loaded = torch.jit.load(str(path))
    assert_close(loaded(x, t), m(x, t), torch.float32)
    loaded(x, t).backward()
    m(x, t).backward()
    assert_close(loaded.lm_head.weight.grad, m.lm_head.weight.grad, torch.float32)


# --- level 5: CUDA ---------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 64, 1000), (300, 128, 32000), (64, 96, 50257)])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_cuda_matches_reference(dtype, shape, option):
    n, h, v = shape
    for reduction in REDUCTIONS:
        for chunk_size in (None, 16):
            x, w, b, t, cw = _inputs(n, h, v, dtype, "cuda", seed=v)
            kw = _kwargs(option, cw, reduction)
            xa, wa, ba = (a.clone().requires_grad_() for a in (x, w, b))
            loss, z = fk.fused_linear_cross_entropy(xa, wa, t, ba, chunk_size=chunk_size,
                                                    return_z_loss=True,
                                                    loss_dtype=torch.float32, **kw)
            g_out = torch.rand(loss.shape, device="cuda") + 0.5
            ref_loss, ref_z, (gx, gw, gb) = _ref(x, w, b, t, kw, g_out)
            assert_close(loss, ref_loss, torch.float32, factor=3, what="loss")
            assert_close(z, ref_z, torch.float32, factor=3, what="z")
            loss.backward(g_out)
            assert_close(xa.grad, gx, dtype, factor=4, what="grad_x")
            assert_close(wa.grad, gw, dtype, factor=4, what="grad_weight")
            assert_close(ba.grad, gb, dtype, factor=4, what="grad_bias")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 64, 1000), (64, 96, 50257), (70, 128, 128256)])
def test_cuda_token_scaling_and_extra_outputs(dtype, shape):
    """The EXTRA cross entropy variants under the chunked matmuls: token scaling against
    the reference (loss and gradients), predicted tokens and accuracy against the float64
    argmax where it is clear."""
    n, h, v = shape
    for reduction in REDUCTIONS:
        for chunk_size in (None, 16):
            x, w, b, t, cw = _inputs(n, h, v, dtype, "cuda", seed=v, ignore=(1, 5))
            x[::3] = (w[t[::3].clamp(min=0)].float() * 4.0).to(dtype)
            kw = _kwargs("all", cw, reduction)
            xa, wa, ba = (a.clone().requires_grad_() for a in (x, w, b))
            t_given = t.clone()
            out = fk.fused_linear_cross_entropy(
                xa, wa, t, ba, chunk_size=chunk_size, return_z_loss=True,
                loss_dtype=torch.float32, use_token_scaling=True, return_token_accuracy=True,
                return_predicted_tokens=True, **kw)
            # (float16: rows scaled by their probability of the target, ~1/V for the random
            # rows, put their logits' gradients into float16's subnormal range. The kernel
            # stores them in the forward and the backward scales them by grad_output: with a
            # grad_output other than 1 that rounds them twice, which a reference rounding once
            # cannot follow there; bfloat16 and float32 test that scaling.)
            g_out = torch.rand(out.loss.shape, device="cuda") + 0.5
            if dtype == torch.float16:
                g_out = torch.ones_like(g_out)
            ref_loss, ref_z, (gx, gw, gb) = _ref(x, w, b, t, dict(kw, token_scaling=True),
                                                 g_out)
            assert_close(out.loss, ref_loss, torch.float32, factor=3, what="loss")
            assert_close(out.z_loss, ref_z, torch.float32, factor=3, what="z")
            out.loss.backward(g_out)
            # (float16: the gradients themselves lie in the subnormal range: their rounding,
            # once for x's, once per chunk for the weight's and the bias's, which add up the
            # chunks in the dtype)
            fp16 = dtype == torch.float16
            rounding = int(fp16) * (1 if chunk_size is None else -(-n // chunk_size))
            assert_close(xa.grad, gx, dtype, factor=4, what="grad_x", rounding=int(fp16))
            assert_close(wa.grad, gw, dtype, factor=4, what="grad_weight", rounding=rounding)
            assert_close(ba.grad, gb, dtype, factor=4, what="grad_bias", rounding=rounding)
            # the backward of "none" reruns the chunks with token scaling and no predictions
            # asked for: nothing may be written into target
            assert torch.equal(t, t_given)
            keep = (t != -100).cpu()
            clear, ref_pred = _clear_rows(x.cpu(), w.cpu(), b.cpu(),
                                          0.3 if dtype != torch.float32 else 1e-3)
            pred = out.predicted_tokens.cpu()
            assert torch.equal(pred[~keep], torch.full((int((~keep).sum()),), -100))
            assert torch.equal(pred[keep & clear], ref_pred[keep & clear])
            right = ((pred == t.cpu()) & keep).float()
            want_acc = right if reduction == "none" else right.sum() / keep.sum()
            assert_close(out.token_accuracy.cpu(), want_acc, torch.float32)


@pytest.mark.cuda
def test_cuda_llama_shape_against_torch_and_memory():
    n, h, v = 8192, 4096, 128256
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (torch.randn(v, h, device="cuda", generator=g) * h ** -0.5).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[::7] = -100
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy((xr @ wr.t()).float(), t)
    ref.backward()
    gxr, gwr = xr.grad, wr.grad
    del xr, wr, ref
    torch.cuda.empty_cache()
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = fk.fused_linear_cross_entropy(xa, wa, t, accum_dtype=torch.float32,
                                         loss_dtype=torch.float32)
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    # grad_weight in float32 while summing, its bf16 copy, grad_x, one chunk of logits:
    # well under one full (N, V) bf16 logits tensor on top of the gradients.
    assert peak < v * h * 6 + n * h * 2 + 2048 * v * 2 + (64 << 20), peak / 2**20
    ref_loss = torch.nn.functional.cross_entropy((x.float() @ w.float().t()), t)
    assert_close(loss, ref_loss, torch.float32, factor=200)  # bf16 logits vs float32 ones
    assert_close(xa.grad, gxr, torch.bfloat16, factor=3)
    assert_close(wa.grad, gwr, torch.bfloat16, factor=3)


@pytest.mark.cuda
def test_cuda_graph_capture_and_bad_input():
    x, w, b, t, _ = _inputs(256, 64, 5000, torch.bfloat16, "cuda")
    sx, sw = x.clone().requires_grad_(), w.clone().requires_grad_()
    st = t.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fk.fused_linear_cross_entropy(sx, sw, st, chunk_size=100).backward()
    torch.cuda.current_stream().wait_stream(s)
    sx.grad = sw.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sloss = fk.fused_linear_cross_entropy(sx, sw, st, chunk_size=100,
                                              loss_dtype=torch.float32)
        sloss.backward()
    for seed in (1, 2):
        x2, _, _, t2, _ = _inputs(256, 64, 5000, torch.bfloat16, "cuda", seed=seed)
        with torch.no_grad():
            sx.copy_(x2)
        st.copy_(t2)
        graph.replay()
        ref_loss, _, (gx, gw, _) = _ref(x2, w, None, t2, dict(ce_weight=None, reduction="mean"),
                                        torch.tensor(1.0), (True, True, False))
        assert_close(sloss, ref_loss, torch.float32, factor=3)
        assert_close(sx.grad, gx, torch.bfloat16, factor=4)
        assert_close(sw.grad, gw, torch.bfloat16, factor=4)
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
