"""fk.tvd at every test level: Triton source (interpreter), CPU backend, autograd, opcheck,
torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, round_nearest, round_toward_zero)

REDUCTIONS = ("none", "sum", "mean", "batchmean")


def _probs(n, v, dtype=torch.float32, device="cpu", seed=0, ties=True):
    """Rows of p and q (softmax of random logits) with some equal entries (p == q)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(n, v, generator=g) * 2, -1)
    if ties:
        tie = torch.rand(n, v, generator=g) < 0.1
        q = torch.where(tie, p, q)
    return p.to(device=device, dtype=dtype), q.to(device=device, dtype=dtype)


def _labels(n, ignore=(1,), device="cpu", ignore_index=-100):
    t = torch.arange(n) % 7
    for i in ignore:
        if i < n:
            t[i] = ignore_index
    return t.to(device)


# --- the reference: Liger Kernel's LigerTVDLoss semantics, in float64 ----------------------

def ref_tvd(p, q, labels=None, reduction="batchmean", ignore_index=-100):
    """Loss (float64) of 0.5 * |p - q| per element; rows with label == ignore_index are 0 and
    not counted; "mean" divides by (counted rows * V), "batchmean" by the counted rows."""
    p64, q64 = p.double(), q.double()
    keep = (torch.ones(p.shape[0], dtype=torch.bool, device=p.device) if labels is None
            else labels != ignore_index)
    el = torch.where(keep[:, None], 0.5 * (p64 - q64).abs(), 0.0)
    n = keep.sum().double()
    if reduction == "none":
        return el
    if reduction == "sum":
        return el.sum()
    if reduction == "mean":
        return el.sum() / (n * p.shape[1])
    return el.sum() / n


def ref_grad(p, q, labels=None, reduction="batchmean", ignore_index=-100, cast=round_nearest):
    """d loss / d p for a grad_output of 1: 0.5 * s * sign(p - q) (0 where p == q), s the
    reduction's factor, 0 in ignored rows; rounded once to p's dtype with `cast`."""
    keep = (torch.ones(p.shape[0], dtype=torch.bool) if labels is None
            else labels.cpu() != ignore_index)
    n = keep.sum().double().clamp(min=1)  # no counted row: every row's gradient is 0
    s = {"none": 1.0, "sum": 1.0, "mean": 1.0 / (n * p.shape[1]), "batchmean": 1.0 / n}[reduction]
    g = torch.where(keep[:, None], 0.5 * torch.sign(p.cpu().double() - q.cpu().double()), 0.0)
    g = g * s
    return g if p.dtype == torch.float64 else cast(g.float(), p.dtype)


# --- level 1: the Triton source under the interpreter ---------------------------------------

def _run_fwd(mod, p, q, labels, reduction, block, steps, write_grad=True, ignore_index=-100):
    m, v = p.shape
    chunks = cdiv(v, block * steps)
    per_elem = reduction == "none"
    out = torch.full((m, v) if per_elem else (m * chunks,), float("nan"))
    grad = torch.full_like(p, float("nan"))
    scale_t = torch.full((), float("nan"))
    has_scale = reduction in ("mean", "batchmean") and labels is not None
    scale = 1.0
    if has_scale:
        mod.tvd_count_kernel[(1,)](labels, scale_t, m, ignore_index,
                                   float(v) if reduction == "mean" else 1.0, BLOCK=4)
    elif reduction in ("mean", "batchmean"):
        scale = 1.0 / (m * (v if reduction == "mean" else 1))
    mod.tvd_fwd_kernel[(m * chunks,)](
        p, q, grad, out, labels if labels is not None else out, scale_t, m, v, chunks,
        ignore_index, scale, int(labels is not None), int(has_scale), int(per_elem),
        int(write_grad), BLOCK=block, STEPS=steps)
    if per_elem:
        return out, grad
    loss = torch.full((), float("nan"))
    mod.tvd_reduce_kernel[(1,)](out, scale_t, loss, m * chunks, scale, int(has_scale), BLOCK=8)
    return loss, grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("labels", [False, True])
def test_interpreter_forward(dtype, reduction, labels):
    mod = load_triton_src("tvd")
    m, v = 5, 37  # chunks of 2 * 8 columns: 3 per row, the last one partly masked
    p, q = _probs(m, v, dtype)
    lab = _labels(m, ignore=(1, 3)) if labels else None
    loss, grad = _run_fwd(mod, p, q, lab, reduction, block=8, steps=2)
    assert_close(loss, ref_tvd(p, q, lab, reduction), torch.float32, what="loss")
    assert torch.equal(grad, ref_grad(p, q, lab, reduction, cast=round_toward_zero))


def test_interpreter_no_grad_all_ignored_and_nan():
    mod = load_triton_src("tvd")
    m, v = 3, 20
    p, q = _probs(m, v)
    lab = torch.full((m,), -7)
    loss, grad = _run_fwd(mod, p, q, lab, "batchmean", 16, 1, ignore_index=-7)
    assert torch.isnan(loss) and torch.equal(grad, torch.zeros_like(p))
    loss, grad = _run_fwd(mod, p, q, None, "sum", 16, 1, write_grad=False)
    assert_close(loss, ref_tvd(p, q, None, "sum"), torch.float32)
    assert torch.isnan(grad).all()  # untouched
    p[0, 3] = float("nan")
    loss, grad = _run_fwd(mod, p, q, None, "none", 16, 1)
    assert torch.isnan(loss[0, 3]) and grad[0, 3] == -0.5 and not torch.isnan(grad).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_elem", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_interpreter_scale(dtype, per_elem, in_place):
    mod = load_triton_src("tvd")
    src = torch.randn(6, 13).to(dtype)
    g = torch.randn(6, 13) if per_elem else torch.tensor(1.0)
    dst = src.clone() if in_place else torch.full_like(src, float("nan"))
    mod.tvd_scale_kernel[(2,)](dst if in_place else src, dst, g, int(per_elem), src.numel(),
                               int(in_place), BLOCK=16, PER_SM=1)
    ref = round_toward_zero(src.float() * g, dtype)
    assert torch.equal(dst, ref)


# --- level 2: the CPU backend against the reference -----------------------------------------

SHAPES = [(1, 1), (1, 9), (4, 37), (9, 300)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("labels", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_forward_backward(dtype, reduction, labels, shape):
    m, v = shape
    p, q = _probs(m, v, dtype)
    lab = _labels(m, ignore=(1, 2)) if labels else None
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, lab, reduction)
    ref = ref_tvd(p, q, lab, reduction)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert loss.shape == ref.shape
    assert_close(loss, ref, torch.float32 if dtype != torch.float64 else dtype)
    go = torch.rand(loss.shape, dtype=loss.dtype) + 0.5
    loss.backward(go)
    stored = ref_grad(p, q, lab, reduction)
    ref_g = (stored.double() * go.double())
    assert_close(pa.grad, ref_g if dtype == torch.float64 else ref_g.to(dtype), dtype,
                 factor=2)


def test_gradient_is_exactly_liger_s_for_grad_output_1():
    p, q = _probs(6, 50)
    p[0, :5] = q[0, :5]  # ties: sign(0) = 0
    lab = _labels(6, ignore=(4,))
    for reduction in REDUCTIONS:
        pa = p.clone().requires_grad_()
        loss = fk.tvd(pa, q, lab, reduction)
        loss.backward(torch.ones_like(loss))
        assert torch.equal(pa.grad, ref_grad(p, q, lab, reduction)), reduction
        assert (pa.grad[0, :5] == 0).all() and (pa.grad[4] == 0).all()


def test_q_gets_no_gradient():
    p, q = _probs(3, 8)
    pa, qa = p.clone().requires_grad_(), q.clone().requires_grad_()
    fk.tvd(pa, qa).backward()
    assert pa.grad is not None and qa.grad is None
    qb = q.clone().requires_grad_()
    loss = fk.tvd(p, qb)  # p needs no grad: nothing to differentiate
    assert not loss.requires_grad


def test_reductions_relate_as_liger_defines_them():
    p, q = _probs(8, 30)
    lab = _labels(8, ignore=(0, 5, 6))
    none = fk.tvd(p, q, lab, "none")
    assert (none[[0, 5, 6]] == 0).all()
    total = none.double().sum()
    n = 5
    assert_close(fk.tvd(p, q, lab, "sum"), total, torch.float32)
    assert_close(fk.tvd(p, q, lab, "batchmean"), total / n, torch.float32)
    assert_close(fk.tvd(p, q, lab, "mean"), total / (n * 30), torch.float32)
    assert_close(fk.tvd(p, q, None, "batchmean"), fk.tvd(p, q, None, "none").double().sum() / 8,
                 torch.float32)
    # A custom ignore_index.
    lab2 = torch.where(lab == -100, torch.tensor(3), torch.tensor(0))
    assert_close(fk.tvd(p, q, lab2, "batchmean", ignore_index=3), total / n, torch.float32)


def test_all_ignored_and_empty():
    p, q = _probs(3, 5)
    lab = torch.full((3,), -100)
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, lab)
    assert torch.isnan(loss)
    loss.backward()
    assert torch.equal(pa.grad, torch.zeros_like(p))
    assert fk.tvd(p, q, lab, "sum") == 0
    e = torch.empty(0, 5)
    assert fk.tvd(e, e, reduction="none").shape == (0, 5)
    assert fk.tvd(e, e, reduction="sum") == 0
    assert torch.isnan(fk.tvd(e, e))
    z = torch.empty(3, 0)
    assert fk.tvd(z, z) == 0 and torch.isnan(fk.tvd(z, z, reduction="mean"))
    ea = e.clone().requires_grad_()
    fk.tvd(ea, e, reduction="sum").backward()
    assert ea.grad.shape == (0, 5)


def test_nan_propagates():
    p, q = _probs(2, 6)
    p[1, 2] = float("nan")
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, reduction="sum")
    assert torch.isnan(loss)
    loss.backward()
    assert pa.grad[1, 2] == -0.5  # neither p == q nor p > q holds
    assert torch.isnan(fk.tvd(p, q, reduction="none")[1, 2])


def test_non_contiguous_inputs():
    p, q = _probs(10, 12)
    pt, qt = p.t(), q.t()  # (12, 10) views
    pa = pt.clone().requires_grad_()
    out = fk.tvd(pt, qt, reduction="sum")
    assert_close(out, ref_tvd(pt, qt, None, "sum"), torch.float32)
    fk.tvd(pa.t().t(), qt).backward()
    assert torch.equal(pa.grad, ref_grad(pt, qt))


def test_module():
    p, q = _probs(4, 10)
    lab = _labels(4)
    m = fk.nn.TVDLoss(reduction="mean", ignore_index=-100)
    assert "mean" in repr(m)
    assert_close(m(p, q, lab), ref_tvd(p, q, lab, "mean"), torch.float32)
    assert_close(fk.nn.TVDLoss()(p, q), ref_tvd(p, q), torch.float32)
    with pytest.raises(ValueError, match="reduction"):
        fk.nn.TVDLoss(reduction="avg")


def test_retain_graph_backward_twice():
    p, q = _probs(3, 9)
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, reduction="sum")
    loss.backward(torch.tensor(3.0), retain_graph=True)
    loss.backward(torch.tensor(3.0))
    assert torch.equal(pa.grad, ref_grad(p, q, None, "sum") * 6)


def test_double_backward_is_a_clear_error():
    p, q = _probs(3, 9)
    pa = p.clone().requires_grad_()
    (g,) = torch.autograd.grad(fk.tvd(pa * 1, q), pa, create_graph=True)
    assert torch.equal(g, ref_grad(p, q))
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.pow(2).sum().backward()


# --- bad input -------------------------------------------------------------------------------

def _bad(**over):
    def make(d):
        args = dict(p=torch.ones(3, 5, device=d), q=torch.ones(3, 5, device=d),
                    shift_labels=None, reduction="batchmean")
        args.update({k: (v(d) if callable(v) else v) for k, v in over.items()})
        return args
    return make


BAD = [
    ("p 1d", _bad(p=lambda d: torch.ones(5, device=d), q=lambda d: torch.ones(5, device=d)),
     "p must have shape"),
    ("p int", _bad(p=lambda d: torch.ones(3, 5, dtype=torch.int32, device=d),
                   q=lambda d: torch.ones(3, 5, dtype=torch.int32, device=d)), "not supported"),
    ("dtypes differ", _bad(q=lambda d: torch.ones(3, 5, dtype=torch.float16, device=d)),
     "must have the same dtype"),
    ("shapes differ", _bad(q=lambda d: torch.ones(3, 6, device=d)), "must have the same shape"),
    ("labels int32", _bad(shift_labels=lambda d: torch.zeros(3, dtype=torch.int32, device=d)),
     "shift_labels must be int64"),
    ("labels shape", _bad(shift_labels=lambda d: torch.zeros(4, dtype=torch.long, device=d)),
     "shift_labels must have shape"),
    ("reduction", _bad(reduction="avg"), "reduction must be one of"),
]


def _call_bad(make, device):
    a = make(device)
    return torch.ops.fk.tvd(a["p"], a["q"], a["shift_labels"], a["reduction"], -100)


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_backward_input():
    g = torch.ones(3, 5)
    for call in (torch.ops.fk._tvd_backward, torch.ops.fk._tvd_backward_):
        for d in ("cpu", "meta"):
            with pytest.raises(RuntimeError, match="grad_loss must be a scalar or have"):
                call(g.to(d), torch.ones(3, device=d))
            with pytest.raises(RuntimeError, match="grad_loss must be Float"):
                call(g.to(d), torch.ones((), dtype=torch.float64, device=d))


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.tvd(torch.ones(2, 4), torch.ones(2, 4, device="meta"))


# --- level 3: autograd, opcheck, torch.compile, TorchScript ---------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("labels", [False, True])
def test_gradcheck(reduction, labels):
    # Away from p == q the loss is linear in p, so finite differences match exactly.
    p, q = _probs(4, 7, torch.float64, ties=False)
    lab = _labels(4, ignore=(2,)) if labels else None
    p.requires_grad_()
    assert torch.autograd.gradcheck(lambda p: fk.tvd(p, q, lab, reduction), (p,), eps=1e-7)


def test_opcheck():
    p, q = _probs(5, 11, ties=False)
    lab = _labels(5)
    for args in ((p.clone().requires_grad_(), q, lab, "batchmean", -100),
                 (p.clone().requires_grad_(), q, None, "none", -100),
                 (p.clone().requires_grad_(), q, lab, "mean", -100),
                 (p.clone(), q, None, "sum", -100)):
        torch.library.opcheck(torch.ops.fk.tvd, args)
    internal = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.fk._tvd_forward, (p, q, lab, "mean", -100, True),
                          test_utils=internal + ("test_aot_dispatch_dynamic",))
    g = torch.randn(5, 11)
    torch.library.opcheck(torch.ops.fk._tvd_backward, (g, torch.tensor(2.0)),
                          test_utils=internal + ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.fk._tvd_backward_, (g.clone(), torch.rand(5, 11)),
                          test_utils=internal)


def test_torch_compile_fullgraph():
    def step(h, w, q, lab):  # (any values work: no softmax, so Inductor generates little)
        return fk.tvd(h @ w, q, lab)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        g = torch.Generator().manual_seed(rows)
        h = torch.randn(rows, 16, generator=g).requires_grad_()
        w = torch.randn(16, 40, generator=g).requires_grad_()
        q = torch.softmax(torch.randn(rows, 40, generator=g), -1)
        lab = _labels(rows, ignore=(0,))
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = compiled(h, w, q, lab), step(h2, w2, q, lab)
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
            self.loss = fk.nn.TVDLoss()

        def forward(self, h: torch.Tensor, q: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
            return self.loss(torch.softmax(self.proj(h), -1), q, lab)

    torch.manual_seed(0)
    m = Head()
    h = torch.randn(6, 8)
    q = torch.softmax(torch.randn(6, 20), -1)
    lab = _labels(6)
    scripted = torch.jit.script(m)
    path = tmp_path / "head.pt"
    scripted.save(str(path))
    loaded = torch.jit.load(str(path))
    assert_close(loaded(h, q, lab), m(h, q, lab), torch.float32)
    assert_close(loaded(h, q, lab), m(h, q, lab), torch.float32)  # optimized on the 2nd call
    loaded(h, q, lab).backward()
    g = loaded.proj.weight.grad.clone()
    m.zero_grad()
    m(h, q, lab).backward()
    assert_close(g, m.proj.weight.grad, torch.float32)


# --- level 5: CUDA kernels -------------------------------------------------------------------

CUDA_V = [1, 7, 100, 1000, 1024, 1025, 4097, 16384, 16385, 32000, 128256]


def _check_cuda(p, q, lab, reduction, grad_output=None, factor=1.0):
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, lab, reduction)
    ref = ref_tvd(p.cpu(), q.cpu(), None if lab is None else lab.cpu(), reduction)
    assert loss.device == p.device and loss.dtype == torch.float32
    assert_close(loss, ref, torch.float32, factor=factor, what="loss")
    go = torch.ones_like(loss) if grad_output is None else grad_output
    loss.backward(go)
    stored = ref_grad(p.cpu(), q.cpu(), None if lab is None else lab.cpu(), reduction)
    if grad_output is None:
        assert torch.equal(pa.grad.cpu(), stored)
    else:
        ref_g = (stored.float() * go.cpu().float()).to(p.dtype)
        assert_close(pa.grad, ref_g, p.dtype, factor=2, what="grad")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", CUDA_V)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cuda_matches_reference(dtype, v, reduction):
    poison_cuda_cache()
    for m, labels in ((1, False), (5, True), (33, True)):
        p, q = _probs(m, v, dtype, "cuda", seed=m + v)
        lab = _labels(m, ignore=(1, 4), device="cuda") if labels else None
        _check_cuda(p, q, lab, reduction, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cuda_grad_output_not_one(dtype, reduction):
    p, q = _probs(17, 1000, dtype, "cuda")
    lab = _labels(17, device="cuda")
    shape = (17, 1000) if reduction == "none" else ()
    go = torch.rand(shape, device="cuda") * 3 - 1
    _check_cuda(p, q, lab, reduction, grad_output=go)
    # Retained graph: the stored gradient is scaled out of place, twice alike.
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, lab, reduction)
    loss.backward(go, retain_graph=True)
    first = pa.grad.clone()
    pa.grad = None
    loss.backward(go)
    assert torch.equal(pa.grad, first)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_llama_shape_misaligned_non_contiguous(dtype):
    v = 128256
    p, q = _probs(3, v, dtype, "cuda", seed=3)
    lab = _labels(3, ignore=(1,), device="cuda")
    _check_cuda(misaligned(p), misaligned(q), lab, "batchmean")
    _check_cuda(p, q, lab, "mean")
    wide_p = torch.zeros(3, v + 8, dtype=dtype, device="cuda")
    wide_p[:, :v] = p
    _check_cuda(wide_p[:, :v], q, None, "sum")
    pm = misaligned(p[:, :1001].contiguous())
    _check_cuda(pm, q[:, :1001].contiguous(), lab, "none")


@pytest.mark.cuda
def test_cuda_all_ignored_inference_and_empty():
    p, q = _probs(4, 300, device="cuda")
    lab = torch.full((4,), -100, device="cuda")
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, lab)
    assert torch.isnan(loss)
    loss.backward()
    assert torch.equal(pa.grad, torch.zeros_like(p))
    with torch.no_grad():
        assert_close(fk.tvd(p, q, _labels(4, device="cuda"), "mean"),
                     ref_tvd(p.cpu(), q.cpu(), _labels(4), "mean"), torch.float32)
    e = torch.empty(0, 300, device="cuda")
    assert fk.tvd(e, e, reduction="none").shape == (0, 300)
    assert torch.isnan(fk.tvd(e, e)) and fk.tvd(e, e, reduction="sum") == 0


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 4095, 4097, 20000])
def test_cuda_row_count_over_many_label_blocks(n):
    p, q = _probs(n, 64, torch.bfloat16, "cuda", seed=n)
    lab = _labels(n, ignore=range(0, n, 3), device="cuda")
    for reduction in ("mean", "batchmean"):
        _check_cuda(p, q, lab, reduction, factor=4)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.tvd(torch.ones(2, 4, dtype=torch.float64, device="cuda"),
               torch.ones(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.tvd(torch.ones(2, 4, device="cuda"), torch.ones(2, 4, device="cuda"),
               torch.zeros(2, dtype=torch.long))


@pytest.mark.cuda
@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_cuda_graph_capture(reduction):
    n, v = 64, 5000
    p, q = _probs(n, v, torch.bfloat16, "cuda")
    static_p = p.clone().requires_grad_()
    static_q, static_lab = q.clone(), _labels(n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (loads the kernels) outside the capture
        out = fk.tvd(static_p * 1, static_q, static_lab, reduction)
        out.backward(torch.ones_like(out))
    torch.cuda.current_stream().wait_stream(s)
    static_p.grad = None
    shape = (n, v) if reduction == "none" else ()
    go = torch.full(shape, 2.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = fk.tvd(static_p * 1, static_q, static_lab, reduction)
        static_loss.backward(go)
    for seed in (1, 2):
        p2, q2 = _probs(n, v, torch.bfloat16, "cuda", seed=seed)
        lab2 = _labels(n, ignore=range(seed, n, 5), device="cuda")
        with torch.no_grad():
            static_p.copy_(p2)
        static_q.copy_(q2)
        static_lab.copy_(lab2)
        graph.replay()
        assert_close(static_loss, ref_tvd(p2.cpu(), q2.cpu(), lab2.cpu(), reduction),
                     torch.float32, factor=2)
        ref_g = (ref_grad(p2.cpu(), q2.cpu(), lab2.cpu(), reduction).float() * 2).bfloat16()
        assert torch.equal(static_p.grad.cpu(), ref_g)


@pytest.mark.cuda
def test_cuda_opcheck_compile():
    p, q = _probs(5, 33, device="cuda", ties=False)
    lab = _labels(5, device="cuda")
    torch.library.opcheck(torch.ops.fk.tvd, (p.clone().requires_grad_(), q, lab, "mean", -100))
    f = torch.compile(lambda p, q, lab: fk.tvd(p * 2, q, lab), fullgraph=True,
                      backend="aot_eager")
    pa = p.clone().requires_grad_()
    f(pa, q, lab).backward()
    assert_close(pa.grad, 2 * ref_grad(p * 2, q, lab), torch.float32)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    v = 128256
    n = (1 << 31) // v + 3
    p = torch.rand(n, v, device="cuda", dtype=torch.bfloat16)
    q = torch.rand(n, v, device="cuda", dtype=torch.bfloat16)
    lab = _labels(n, ignore=(0, n - 1), device="cuda")
    pa = p.clone().requires_grad_()
    loss = fk.tvd(pa, q, lab, "sum")
    loss.backward()
    for rows in (slice(1, 3), slice(n - 3, n)):
        assert torch.equal(pa.grad[rows].cpu(), ref_grad(p[rows].cpu(), q[rows].cpu(),
                                                          lab[rows].cpu(), "sum"))
    assert (pa.grad[n - 1] == 0).all()
    ref = torch.zeros((), dtype=torch.float64, device="cuda")
    keep = lab != -100
    for r in range(0, n, 2048):  # in slices: float32 copies of all of p would take 8.6 GB
        el = 0.5 * (p[r:r + 2048].float() - q[r:r + 2048].float()).abs()
        ref += (el.sum(1).double() * keep[r:r + 2048]).sum()
    assert_close(loss, ref, torch.float32, factor=10)
    del pa, loss
    with torch.no_grad():
        none = fk.tvd(p[n - 2:], q[n - 2:], None, "none")
    assert_close(none, ref_tvd(p[n - 2:].cpu(), q[n - 2:].cpu(), None, "none"), torch.float32)
