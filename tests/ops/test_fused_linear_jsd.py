"""fk.fused_linear_jsd at every test level: the Triton kernel under the interpreter, the CPU
backend against an independent reference (every chunking, beta, temperature, labels),
autograd (gradcheck in float64), opcheck, torch.compile, TorchScript, the module, bad input,
the distillation example, and the CUDA path (marker ``cuda``)."""
import math
import os
import subprocess
import sys

import pytest
import torch

import fk
from helpers import (DTYPES, ROOT, assert_close, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, round_toward_zero)

BETAS = (0.0, 0.5, 0.1, 1.0)


# --- the independent reference --------------------------------------------------------

def ref_jsd(s, t, labels=None, beta=0.5, ignore_index=-100, temperature=1.0):
    """The generalized JSD of log_softmax(s / T) (student, log q) and log_softmax(t / T)
    (teacher, log p), summed over counted rows and divided by their count (0 when none is
    counted), in s's dtype (differentiable in s)."""
    lq = torch.log_softmax(s / temperature, dim=-1)
    lp = torch.log_softmax(t / temperature, dim=-1)
    q, p = lq.exp(), lp.exp()
    if beta == 0.0:
        rows = (p * (lp - lq)).sum(-1)
    elif beta == 1.0:
        rows = (q * (lq - lp)).sum(-1)
    else:
        lm = torch.log(beta * p + (1 - beta) * q)
        rows = beta * (p * (lp - lm)).sum(-1) + (1 - beta) * (q * (lq - lm)).sum(-1)
    keep = torch.ones_like(rows, dtype=torch.bool) if labels is None else labels != ignore_index
    count = keep.sum()
    total = torch.where(keep, rows, torch.zeros_like(rows)).sum()
    return total / count if count > 0 else total * 0


def ref_fused_linear_jsd(xs, ws, xt, wt, labels=None, beta=0.5, ignore_index=-100,
                         temperature=1.0, round_logits=False):
    """The two heads and ref_jsd in float64; round_logits rounds the logits to the inputs'
    dtype first (the plain torch forward)."""
    s = xs.double() @ ws.double().t()
    t = xt.double() @ wt.double().t()
    if round_logits and xs.dtype != torch.float64:
        s, t = s.to(xs.dtype).double(), t.to(xs.dtype).double()
    return ref_jsd(s, t, labels, beta, ignore_index, temperature)


def _inputs(n, h, v, ht=None, dtype=torch.float32, device="cpu", ignore=(1,), seed=0,
            scale=1.0):
    """Student (x, w), teacher (x, w) with hidden ht, labels with rows `ignore` ignored."""
    g = torch.Generator().manual_seed(seed)
    ht = ht or h + 3
    xs = torch.randn(n, h, generator=g)
    ws = torch.randn(v, h, generator=g) * (scale * 2.0 / h ** 0.5)
    xt = torch.randn(n, ht, generator=g)
    wt = torch.randn(v, ht, generator=g) * (scale * 2.0 / ht ** 0.5)
    labels = torch.randint(0, v, (n,), generator=g)
    for i in ignore:
        if i < n:
            labels[i] = -100
    return [a.to(device=device, dtype=dtype) for a in (xs, ws, xt, wt)] + [labels.to(device)]


def _ref_grads(xs, ws, xt, wt, labels, g_out=1.0, **kw):
    """Reference loss and float64 gradients of the student's input and weight."""
    a = xs.detach().cpu().double().requires_grad_()
    b = ws.detach().cpu().double().requires_grad_()
    loss = ref_fused_linear_jsd(a, b, xt.cpu(), wt.cpu(),
                                None if labels is None else labels.cpu(), **kw)
    (loss * g_out).backward()
    return loss, a.grad, b.grad


def _ref_grads_rounded_logit_grad(xs, ws, xt, wt, labels, g_out=1.0, chunk_rows=None, **kw):
    """Float64 gradients of the student's input and weight where the gradient of the loss
    with respect to the student's logits is rounded to xs's dtype before the products (the
    precision a 16-bit gradient buffer holds), and the weight's gradient is summed over
    chunks of `chunk_rows` rows in xs's dtype (each partial sum rounded: the op adds each
    chunk's product into the 16-bit gradient, as Liger does)."""
    a, b = xs.detach().cpu().double(), ws.detach().cpu().double()
    s = (a @ b.t()).requires_grad_()
    t = xt.cpu().double() @ wt.cpu().double().t()
    labels = None if labels is None else labels.cpu()
    ref_jsd(s, t, labels, kw.get("beta", 0.5), -100, kw.get("temperature", 1.0)).backward()
    g = s.grad.to(xs.dtype).double()
    rows = chunk_rows or a.shape[0]
    gw = None
    for i in range(0, a.shape[0], rows):
        part = g[i:i + rows].t() @ a[i:i + rows]
        gw = (part if gw is None else gw + part).to(xs.dtype).double()
    return g_out * (g @ b), g_out * gw


# --- level 1: the Triton kernel under the interpreter -------------------------------------

def _run_kernel(mod, s, t, g_dtype, labels, beta, temperature, block, grid, write_grad=1):
    n, v = s.shape
    keep = torch.ones(n, dtype=torch.bool) if labels is None else labels != -100
    den = keep.sum().float().reshape(())
    loss = torch.full((n,), float("nan"))
    g = torch.full((n, v), float("nan")).to(g_dtype)
    mod.fused_linear_jsd_kernel[(grid,)](
        s, t, g, labels if labels is not None else loss, den, loss, v, v, v, n, v, -100, beta,
        1.0 / temperature, int(labels is not None), write_grad, BLOCK=block, PER_SM=1)
    return loss.sum(), g


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("g_dtype", DTYPES)
def test_interpreter(beta, g_dtype):
    mod = load_triton_src("fused_linear_jsd")
    n, v = 6, 37
    g = torch.Generator().manual_seed(1)
    s = torch.randn(n, v, generator=g) * 3
    t = s + torch.randn(n, v, generator=g)
    s[2, :20] = -1e4  # a first block far below the rest
    labels = torch.tensor([3, -100, 0, 5, -100, 7])
    for temperature in (1.0, 2.5):
        sd = s.double().requires_grad_()
        ref = ref_jsd(sd, t.double(), labels, beta, -100, temperature)
        ref.backward()
        for block, grid in ((16, 4), (64, n)):
            loss, grad = _run_kernel(mod, s, t, g_dtype, labels, beta, temperature, block, grid)
            assert_close(loss, ref, torch.float32, factor=4, what="loss")
            assert_close(grad, round_toward_zero(sd.grad.float(), g_dtype), g_dtype, factor=4,
                         what="grad")
            assert torch.equal(grad[1], torch.zeros(v, dtype=g_dtype))
            assert torch.equal(grad[4], torch.zeros(v, dtype=g_dtype))


def test_interpreter_no_labels_no_grad():
    mod = load_triton_src("fused_linear_jsd")
    n, v = 3, 40
    g = torch.Generator().manual_seed(2)
    s, t = torch.randn(n, v, generator=g), torch.randn(n, v, generator=g)
    ref = ref_jsd(s.double(), t.double(), None, 0.5)
    loss, grad = _run_kernel(mod, s, t, torch.float32, None, 0.5, 1.0, 16, 2, write_grad=0)
    assert_close(loss, ref, torch.float32, factor=4, what="loss")
    assert torch.isnan(grad).all()  # not written


def test_interpreter_identical_distributions():
    """Student = teacher: loss 0 and gradient 0 (up to rounding) for every beta."""
    mod = load_triton_src("fused_linear_jsd")
    s = torch.randn(2, 50, generator=torch.Generator().manual_seed(3)) * 4
    for beta in BETAS:
        loss, grad = _run_kernel(mod, s, s.clone(), torch.float32, None, beta, 1.0, 16, 2)
        assert abs(loss.item()) < 1e-6 and grad.abs().max().item() < 1e-7


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("chunk_size", [None, 1, 3])
def test_cpu_forward_backward(dtype, beta, chunk_size):
    n, h, v = 7, 16, 40
    xs, ws, xt, wt, labels = _inputs(n, h, v, dtype=dtype, ignore=(1, 5))
    temperature = 1.0 if chunk_size is None else 2.5
    a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    loss = fk.fused_linear_jsd(a, b, xt, wt, labels, beta=beta, temperature=temperature,
                               chunk_size=chunk_size)
    ref, gx, gw = _ref_grads(xs, ws, xt, wt, labels, 0.75, beta=beta, temperature=temperature)
    loss_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert loss.dtype == loss_dtype and loss.shape == ()
    # The logits are float32 products of the operands (no rounding to 16 bits).
    assert_close(loss, ref, loss_dtype, factor=3, what="loss")
    (loss * 0.75).backward()
    # The logits' gradient is rounded to the dtype, then goes through a matmul.
    assert_close(a.grad, gx, dtype, factor=4, what="grad_student_input")
    assert_close(b.grad, gw, dtype, factor=4, what="grad_student_weight")


@pytest.mark.parametrize("beta", BETAS)
def test_cpu_no_labels_and_teacher_frozen(beta):
    xs, ws, xt, wt, _ = _inputs(6, 8, 30, ht=12)
    a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    c, d = xt.clone().requires_grad_(), wt.clone().requires_grad_()
    loss = fk.fused_linear_jsd(a, b, c, d, beta=beta, chunk_size=4)
    ref, gx, gw = _ref_grads(xs, ws, xt, wt, None, beta=beta)
    assert_close(loss, ref, torch.float32, factor=3)
    loss.backward()
    assert_close(a.grad, gx, torch.float32, factor=4)
    assert_close(b.grad, gw, torch.float32, factor=4)
    assert c.grad is None and d.grad is None


def test_cpu_gradient_masks_and_no_grad():
    xs, ws, xt, wt, labels = _inputs(5, 8, 20)
    ref, gx, gw = _ref_grads(xs, ws, xt, wt, labels)
    a = xs.clone().requires_grad_()
    fk.fused_linear_jsd(a, ws, xt, wt, labels).backward()
    assert_close(a.grad, gx, torch.float32, factor=4)
    b = ws.clone().requires_grad_()
    fk.fused_linear_jsd(xs, b, xt, wt, labels).backward()
    assert_close(b.grad, gw, torch.float32, factor=4)
    with torch.no_grad():
        out = fk.fused_linear_jsd(xs.clone().requires_grad_(), ws, xt, wt, labels)
    assert not out.requires_grad
    assert_close(out, ref, torch.float32, factor=3)


def test_cpu_identical_heads_give_zero():
    xs, ws, _, _, labels = _inputs(4, 8, 25)
    for beta in BETAS:
        a = xs.clone().requires_grad_()
        loss = fk.fused_linear_jsd(a, ws, xs, ws, labels, beta=beta, temperature=0.7)
        loss.backward()
        assert abs(loss.item()) < 1e-6 and a.grad.abs().max().item() < 1e-6


def test_cpu_all_ignored_and_empty():
    xs, ws, xt, wt, _ = _inputs(3, 4, 9)
    labels = torch.full((3,), -7)
    a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    loss = fk.fused_linear_jsd(a, b, xt, wt, labels, ignore_index=-7)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(a.grad, torch.zeros_like(xs)) and torch.equal(b.grad, torch.zeros_like(ws))
    a = torch.zeros(0, 4, requires_grad=True)
    b = ws.clone().requires_grad_()
    loss = fk.fused_linear_jsd(a, b, torch.zeros(0, 5), wt[:, :5], torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and a.grad.shape == (0, 4)
    assert torch.equal(b.grad, torch.zeros_like(ws))


def test_cpu_large_logit_gap():
    """Far-apart distributions (log m from the larger term: finite where both underflow)."""
    xs, ws, xt, wt, labels = _inputs(4, 8, 30, scale=40.0)
    for beta in BETAS:
        a = xs.clone().requires_grad_()
        loss = fk.fused_linear_jsd(a, ws, xt, wt, labels, beta=beta)
        ref, gx, _ = _ref_grads(xs, ws, xt, wt, labels, beta=beta)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(a.grad).all()
        assert_close(loss, ref, torch.float32, factor=10)
        # A saturated JSD (beta in (0, 1), loss near its maximum) has a gradient far below
        # its terms (log q - log m - KL(q || m) cancels): a larger relative fp32 error.
        assert_close(a.grad, gx, torch.float32, factor=100 if beta in (0.0, 1.0) else 1000)


# --- bad input -----------------------------------------------------------------------------

def _bad(**over):
    def make(d):
        args = dict(xs=torch.ones(3, 4, device=d), ws=torch.ones(5, 4, device=d),
                    xt=torch.ones(3, 6, device=d), wt=torch.ones(5, 6, device=d),
                    labels=torch.zeros(3, dtype=torch.long, device=d), beta=0.5,
                    temperature=1.0, chunk_size=None)
        args.update({k: (v(d) if callable(v) else v) for k, v in over.items()})
        return args
    return make


BAD = [
    ("student 1d", _bad(xs=lambda d: torch.ones(4, device=d)), "student_input must have shape"),
    ("int input", _bad(xs=lambda d: torch.ones(3, 4, dtype=torch.int32, device=d),
                       ws=lambda d: torch.ones(5, 4, dtype=torch.int32, device=d)),
     "which is not supported"),
    ("weight dtype", _bad(ws=lambda d: torch.ones(5, 4, dtype=torch.float16, device=d)),
     "must have the same dtype"),
    ("weight shape", _bad(ws=lambda d: torch.ones(5, 3, device=d)),
     "student_weight must have shape"),
    ("no classes", _bad(ws=lambda d: torch.ones(0, 4, device=d),
                        wt=lambda d: torch.ones(0, 6, device=d)), "at least one class"),
    ("teacher dtype", _bad(xt=lambda d: torch.ones(3, 6, dtype=torch.float16, device=d)),
     "student_input and teacher_input must have the same dtype"),
    ("teacher rows", _bad(xt=lambda d: torch.ones(2, 6, device=d)),
     "teacher_input must have shape"),
    ("teacher weight", _bad(wt=lambda d: torch.ones(4, 6, device=d)),
     "teacher_weight must have shape"),
    ("teacher weight h", _bad(wt=lambda d: torch.ones(5, 4, device=d)),
     "teacher_weight must have shape"),
    ("labels dtype", _bad(labels=lambda d: torch.zeros(3, dtype=torch.int32, device=d)),
     "shift_labels must be int64"),
    ("labels shape", _bad(labels=lambda d: torch.zeros(4, dtype=torch.long, device=d)),
     "shift_labels must have shape"),
    ("beta", _bad(beta=1.5), "beta must be in"),
    ("beta nan", _bad(beta=float("nan")), "beta must be in"),
    ("temperature", _bad(temperature=0.0), "temperature must be positive"),
    ("temperature inf", _bad(temperature=float("inf")), "temperature must be positive"),
    ("chunk", _bad(chunk_size=0), "chunk_size must be positive"),
]


def _call_bad(make, device):
    a = make(device)
    return torch.ops.fk.fused_linear_jsd(a["xs"], a["ws"], a["xt"], a["wt"], a["labels"],
                                         a["beta"], -100, a["temperature"], a["chunk_size"])


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_device_pair():
    make = _bad(labels=lambda d: torch.zeros(3, dtype=torch.long, device="meta"))
    with pytest.raises(RuntimeError, match="student_input and shift_labels must be on the same"):
        _call_bad(make, "cpu")


# --- level 3: autograd, opcheck, torch.compile, TorchScript, the module -----------------------

@pytest.mark.parametrize("beta", BETAS)
def test_gradcheck(beta):
    xs, ws, xt, wt, labels = _inputs(5, 4, 7, dtype=torch.float64, ignore=(2,))
    args = (xs.requires_grad_(), ws.requires_grad_())
    assert torch.autograd.gradcheck(
        lambda a, b: fk.fused_linear_jsd(a, b, xt, wt, labels, beta=beta, temperature=1.5,
                                         chunk_size=2), args)


def test_gradcheck_against_independent_reference_float64():
    """The analytic gradient of the CPU backend equals autograd of the reference."""
    xs, ws, xt, wt, labels = _inputs(6, 5, 11, dtype=torch.float64, ignore=(0, 3))
    for beta in BETAS:
        a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        fk.fused_linear_jsd(a, b, xt, wt, labels, beta=beta, temperature=0.8,
                            chunk_size=4).backward()
        _, gx, gw = _ref_grads(xs, ws, xt, wt, labels, beta=beta, temperature=0.8)
        torch.testing.assert_close(a.grad, gx, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(b.grad, gw, rtol=1e-10, atol=1e-12)


def test_double_backward_raises():
    xs, ws, xt, wt, labels = _inputs(4, 4, 9)
    a = xs.clone().requires_grad_()
    loss = fk.fused_linear_jsd(a, ws, xt, wt, labels)
    (g,) = torch.autograd.grad(loss, a, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def test_opcheck():
    xs, ws, xt, wt, labels = _inputs(5, 6, 11)
    for beta, lab in ((0.5, labels), (0.0, None), (1.0, labels)):
        torch.library.opcheck(
            torch.ops.fk.fused_linear_jsd,
            (xs.clone().requires_grad_(), ws.clone().requires_grad_(), xt, wt, lab, beta, -100,
             2.0, 2))
    torch.library.opcheck(torch.ops.fk._fused_linear_jsd_forward,
                          (xs, ws, xt, wt, labels, 0.3, -100, 1.0, 3, [True, True]),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    def step(a, b, c, d, lab):
        return fk.fused_linear_jsd(a, b, c, d, lab, beta=0.3, temperature=2.0, chunk_size=4)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        xs, ws, xt, wt, labels = _inputs(rows, 8, 30, seed=rows)
        a1, b1 = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        a2, b2 = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        out, ref = compiled(a1, b1, xt, wt, labels), step(a2, b2, xt, wt, labels)
        assert_close(out, ref, torch.float32, factor=10)
        (out * 2).backward()
        (ref * 2).backward()
        assert_close(a1.grad, a2.grad, torch.float32, factor=10)
        assert_close(b1.grad, b2.grad, torch.float32, factor=10)


def test_module_flattens_leading_dims():
    xs, ws, xt, wt, labels = _inputs(6, 8, 20)
    m = fk.nn.FusedLinearJSD(jsd_beta=0.2, temperature=1.3)
    assert "jsd_beta=0.2" in repr(m)
    out = m(xs.view(2, 3, 8), ws, xt.view(2, 3, -1), wt, labels.view(2, 3))
    ref = ref_fused_linear_jsd(xs, ws, xt, wt, labels, beta=0.2, temperature=1.3)
    assert_close(out, ref, torch.float32, factor=3)
    assert_close(m(xs, ws, xt, wt), ref_fused_linear_jsd(xs, ws, xt, wt, None, beta=0.2,
                                                         temperature=1.3), torch.float32, 3)
    with pytest.raises(ValueError, match="jsd_beta"):
        fk.nn.FusedLinearJSD(jsd_beta=2.0)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_module(tmp_path):
    class Distill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.student = torch.nn.Linear(8, 20, bias=False)
            self.teacher = torch.nn.Linear(11, 20, bias=False).requires_grad_(False)
            self.loss = fk.nn.FusedLinearJSD(jsd_beta=0.4, temperature=2.0, chunk_size=3)

        def forward(self, h: torch.Tensor, ht: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
            return self.loss(h, self.student.weight, ht, self.teacher.weight, lab)

    torch.manual_seed(0)
    m = Distill()
    xs, _, xt, _, labels = _inputs(6, 8, 20, ht=11)
    path = tmp_path / "distill.pt"
    torch.jit.script(m).save(str(path))
    loaded = torch.jit.load(str(path))
    assert_close(loaded(xs, xt, labels), m(xs, xt, labels), torch.float32)
    loaded(xs, xt, labels).backward()
    m(xs, xt, labels).backward()
    assert_close(loaded.student.weight.grad, m.student.weight.grad, torch.float32)


# --- level 4: the distillation example ----------------------------------------------------

def test_distill_tiny_example_loss_falls():
    script = os.path.join(ROOT, "examples", "distill_tiny.py")
    env = dict(os.environ)  # the fk this test imports: the installed one, or PYTHONPATH's
    r = subprocess.run([sys.executable, script, "--device", "cpu", "--steps", "25",
                        "--tiny"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines()
              if line.startswith("step")]
    assert len(losses) == 25 and losses[-1] < 0.7 * losses[0], r.stdout


# --- level 5: CUDA ---------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64, 1000), (37, 64, 1001), (300, 128, 32000),
                                   (16, 96, 128256), (64, 80, 50257)])
def test_cuda_matches_reference(dtype, shape):
    n, h, v = shape
    for beta, temperature, chunk_size in ((0.5, 1.0, None), (0.0, 2.0, 16), (1.0, 0.7, 5),
                                          (0.25, 1.0, 7)):
        poison_cuda_cache()
        xs, ws, xt, wt, labels = _inputs(n, h, v, dtype=dtype, device="cuda", seed=v,
                                         ignore=(1, 30))
        a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        loss = fk.fused_linear_jsd(a, b, xt, wt, labels, beta=beta, temperature=temperature,
                                   chunk_size=chunk_size)
        ref, gx, gw = _ref_grads(xs, ws, xt, wt, labels, 1.7, beta=beta,
                                 temperature=temperature)
        if dtype == torch.float16:
            # The logits' gradient (about q / (T N) an element) is rounded to float16 before
            # the products, into its subnormal range at these widths: the reference rounds
            # its float64 logits' gradient to float16 the same way before the two products.
            # (chunk_size None: one chunk at these shapes, at least 1024 rows a chunk)
            gx, gw = _ref_grads_rounded_logit_grad(xs, ws, xt, wt, labels, 1.7, beta=beta,
                                                   temperature=temperature,
                                                   chunk_rows=chunk_size)
        assert loss.dtype == torch.float32
        # float32 logits (a float32 product of the operands on tensor cores: TF32 for
        # float32 inputs where torch allows it, not here by default)
        assert_close(loss, ref, torch.float32, factor=20, what="loss")
        loss.backward(torch.tensor(1.7, device="cuda"))
        # (float16: the products of subnormal logits' gradients land in the subnormal range)
        rounding = 2 if dtype == torch.float16 else 0
        assert_close(a.grad, gx, dtype, factor=4, what="grad_student_input", rounding=rounding)
        assert_close(b.grad, gw, dtype, factor=4, what="grad_student_weight", rounding=rounding)


@pytest.mark.cuda
def test_cuda_misaligned_and_no_labels():
    xs, ws, xt, wt, _ = _inputs(9, 64, 1003, dtype=torch.bfloat16, device="cuda")
    a = misaligned(xs).requires_grad_()
    loss = fk.fused_linear_jsd(a, misaligned(ws), misaligned(xt), misaligned(wt), None)
    ref, gx, _ = _ref_grads(xs, ws, xt, wt, None)
    loss.backward()
    assert_close(loss, ref, torch.float32, factor=20)
    assert_close(a.grad, gx, torch.bfloat16, factor=4)


@pytest.mark.cuda
def test_cuda_llama_shape_against_torch_and_memory():
    """BT 8192, H 4096, V 128256 bf16: against a float32 torch computation of the loss and
    the gradients, and the peak memory over the inputs: the gradients plus one chunk's
    buffers (1024 rows of the bf16 gradient + 2 x 256 rows of float32 logits)."""
    n, h, v = 8192, 4096, 128256
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=g)
    ws = (torch.randn(v, h, device="cuda", generator=g) * h ** -0.5).to(torch.bfloat16)
    xt = torch.randn(n, h, device="cuda", dtype=torch.bfloat16, generator=g)
    wt = (ws.float() + 0.5 * h ** -0.5 * torch.randn(v, h, device="cuda", generator=g)
          ).to(torch.bfloat16)
    labels = torch.randint(0, v, (n,), device="cuda", generator=g)
    labels[::7] = -100
    a, b = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = fk.fused_linear_jsd(a, b, xt, wt, labels)
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < v * h * 2 + n * h * 2 + 1024 * v * 2 + 512 * v * 4 + (64 << 20), peak / 2**20
    # Reference in float32, in chunks of rows (the (N, V) float32 logits would not fit twice).
    ref_loss = torch.zeros((), device="cuda", dtype=torch.float64)
    gx = torch.empty(n, h, device="cuda", dtype=torch.float32)
    gw = torch.zeros(v, h, device="cuda", dtype=torch.float32)
    w32, wt32 = ws.float().requires_grad_(), wt.float()
    count = (labels != -100).sum()
    for s0 in range(0, n, 512):
        x32 = xs[s0:s0 + 512].float().requires_grad_()
        part = ref_fused_linear_jsd(x32, w32, xt[s0:s0 + 512].float(), wt32,
                                    labels[s0:s0 + 512])
        part = part * (labels[s0:s0 + 512] != -100).sum() / count
        gxc, gwc = torch.autograd.grad(part, (x32, w32))
        gx[s0:s0 + 512] = gxc
        gw += gwc
        ref_loss += part.detach()
    assert_close(loss, ref_loss, torch.float32, factor=50)
    assert_close(a.grad, gx, torch.bfloat16, factor=4)
    assert_close(b.grad, gw, torch.bfloat16, factor=8)


@pytest.mark.cuda
def test_cuda_graph_capture_and_bad_input():
    xs, ws, xt, wt, labels = _inputs(256, 64, 5000, dtype=torch.bfloat16, device="cuda")
    sx, sw = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    sl = labels.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fk.fused_linear_jsd(sx, sw, xt, wt, sl, chunk_size=100).backward()
    torch.cuda.current_stream().wait_stream(s)
    sx.grad = sw.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sloss = fk.fused_linear_jsd(sx, sw, xt, wt, sl, chunk_size=100)
        sloss.backward()
    for seed in (1, 2):
        x2, _, _, _, l2 = _inputs(256, 64, 5000, dtype=torch.bfloat16, device="cuda",
                                  seed=seed, ignore=(seed, 7))
        with torch.no_grad():
            sx.copy_(x2)
        sl.copy_(l2)
        graph.replay()
        ref, gx, gw = _ref_grads(x2, ws, xt, wt, l2)
        assert_close(sloss, ref, torch.float32, factor=20)
        assert_close(sx.grad, gx, torch.bfloat16, factor=4)
        assert_close(sw.grad, gw, torch.bfloat16, factor=4)
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name


@pytest.mark.cuda
def test_cuda_more_than_2_31_logits():
    """N x V above 2^31 (the kernel's row offsets are int64): 17000 rows x 128256 classes,
    the chunks' buffers far smaller; only a few rows are checked against the reference."""
    n, h, v = 17000, 16, 128256
    xs, ws, xt, wt, labels = _inputs(n, h, v, dtype=torch.bfloat16, device="cuda", ignore=())
    labels[n - 3] = -100
    a = xs.clone().requires_grad_()
    loss = fk.fused_linear_jsd(a, ws, xt, wt, labels, chunk_size=n)
    loss.backward()
    rows = torch.tensor([0, n // 2, n - 1])
    ref_rows = [ref_fused_linear_jsd(xs[i:i + 1].cpu(), ws.cpu(), xt[i:i + 1].cpu(), wt.cpu())
                for i in rows.tolist()]
    assert torch.isfinite(loss)
    assert torch.equal(a.grad[n - 3], torch.zeros(h, dtype=torch.bfloat16, device="cuda"))
    count = n - 1
    for i, r in zip(rows.tolist(), ref_rows):
        x1 = xs[i:i + 1].cpu().double().requires_grad_()
        (ref_fused_linear_jsd(x1, ws.cpu(), xt[i:i + 1].cpu(), wt.cpu()) / count).backward()
        assert_close(a.grad[i:i + 1].cpu(), x1.grad, torch.bfloat16, factor=4, what=f"row {i}")
