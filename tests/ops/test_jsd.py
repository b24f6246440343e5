"""fk.jsd at every test level: Triton source (interpreter), CPU backend, autograd, opcheck,
torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, ref_jsd, round_toward_zero)

BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)
MODES = {0.0: 1, 1.0: 2}  # triton_src/jsd.py mode; 0 for any other beta


def _inputs(n, v, dtype=torch.float32, device="cpu", ignore=(1,), seed=0, labels=True):
    """Student / teacher log-probabilities (rounded to dtype) and shift labels with the rows
    in `ignore` set to -100 (None without labels)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.log_softmax(torch.randn(n, v, generator=g) * 2, -1).to(device=device, dtype=dtype)
    y = torch.log_softmax(torch.randn(n, v, generator=g) * 3, -1).to(device=device, dtype=dtype)
    lab = torch.randint(0, v, (n,), generator=g)
    for i in ignore:
        if i < n:
            lab[i] = -100
    return x, y, (lab.to(device) if labels else None)


def _ref_grad(x, y, lab, beta, grad_out=1.0, ignore_index=-100):
    xd = x.detach().cpu().double().requires_grad_()
    loss = ref_jsd(xd, y.cpu(), None if lab is None else lab.cpu(), beta, ignore_index)
    (loss * grad_out).backward()
    return loss.detach(), xd.grad


# --- level 1: the Triton source under the interpreter ---------------------------------

def _run_kernels(mod, x, y, lab, beta, block, chunk_target, write_grad=True):
    n, v = x.shape
    n_chunks = -(-v // chunk_target)
    chunk = -(-(-(-v // n_chunks)) // block) * block
    count = torch.zeros(1, dtype=torch.int32)
    has = int(lab is not None)
    labels = lab if has else count
    if has:
        mod.jsd_count_kernel[(-(-n // 4),)](labels, count, n, -100, BLOCK=4)
    grad = torch.full_like(x, float("nan"))
    part = torch.full((n * n_chunks,), float("nan"))
    mod.jsd_fwd_kernel[(n * n_chunks,)](x, y, grad, labels, count, part, v, v, v, v, chunk,
                                        n_chunks, -100, beta, 1.0 / n, MODES.get(beta, 0), has,
                                        int(write_grad), BLOCK=block)
    loss = torch.full((), float("nan"), dtype=x.dtype)
    mod.jsd_reduce_kernel[(1,)](part, count, loss, n * n_chunks, 1.0 / n, has, BLOCK=8)
    return loss, grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("labels", [True, False])
def test_interpreter(dtype, beta, labels):
    """Rows of 100 columns in blocks of 16: one chunk a row, and chunks of 32 (4 a row, the
    last one short); ignored rows get a zero gradient."""
    mod = load_triton_src("jsd")
    x, y, lab = _inputs(5, 100, dtype, ignore=(1, 4), labels=labels)
    ref_loss, ref_g = _ref_grad(x, y, lab, beta)
    for chunk_target in (100, 32):
        loss, grad = _run_kernels(mod, x, y, lab, beta, 16, chunk_target)
        assert loss.dtype == dtype
        assert_close(loss.float(), round_toward_zero(ref_loss.float(), dtype), dtype, factor=2,
                     what="loss")
        assert_close(grad, round_toward_zero(ref_g.float(), dtype), dtype, factor=2,
                     what="grad")
        if labels:
            assert torch.equal(grad[1], torch.zeros(100, dtype=dtype))


def test_interpreter_all_ignored_and_no_grad():
    mod = load_triton_src("jsd")
    x, y, lab = _inputs(3, 40, ignore=(0, 1, 2))
    loss, grad = _run_kernels(mod, x, y, lab, 0.5, 16, 16)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(x))
    x, y, lab = _inputs(3, 40)
    loss, grad = _run_kernels(mod, x, y, lab, 0.5, 16, 16, write_grad=False)
    assert torch.isnan(grad).all()  # not written
    assert_close(loss, ref_jsd(x, y, lab).float(), torch.float32, factor=2)


def test_variants_cover_every_dtype_and_alignment():
    mod = load_triton_src("jsd")
    vs = mod.variants(90)
    for dt in ("fp32", "bf16", "fp16"):
        assert {v.flags for v in vs if v.family == "jsd_fwd" and v.dtype == dt} == {0, 1}
        assert any(v.family == "jsd_reduce" and v.dtype == dt for v in vs)
    assert sum(v.family == "jsd_count" for v in vs) == 1
    for v in vs:
        if v.family == "jsd_fwd":
            assert v.block % v.constexprs["BLOCK"] == 0


# --- level 2: the CPU backend ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("labels", [True, False])
def test_cpu_forward_backward(dtype, beta, labels):
    x, y, lab = _inputs(7, 33, dtype, ignore=(1, 5), labels=labels)
    xa = x.clone().requires_grad_()
    loss = fk.jsd(xa, y, lab, beta)
    assert loss.dtype == dtype and loss.shape == ()
    loss.backward(torch.tensor(1.5, dtype=dtype))
    ref_loss, ref_g = _ref_grad(x, y, lab, beta, 1.5)
    assert_close(loss, ref_loss, dtype, factor=2, what="loss")
    assert xa.grad.dtype == dtype
    assert_close(xa.grad, ref_g, dtype, factor=3, what="grad")
    if labels:
        assert torch.equal(xa.grad[1], torch.zeros(33, dtype=dtype))


def test_beta_ends_are_the_kl_divergences():
    x, y, _ = _inputs(4, 20, torch.float64)
    p, q = y.exp(), x.exp()
    fwd = (p * (y - x)).sum() / 4
    rev = (q * (x - y)).sum() / 4
    assert torch.allclose(fk.jsd(x, y, beta=0.0), fwd)
    assert torch.allclose(fk.jsd(x, y, beta=1.0), rev)
    assert torch.allclose(fk.jsd(x, y, beta=0.0),
                          torch.nn.functional.kl_div(x, y, reduction="sum", log_target=True) / 4)
    # the symmetric JSD is symmetric, and 0 for equal distributions
    assert torch.allclose(fk.jsd(x, y), fk.jsd(y, x))
    assert fk.jsd(x, x).abs().item() < 1e-12


def test_ignore_index_and_counted_rows():
    x, y, lab = _inputs(6, 10, torch.float64, ignore=())
    lab[:] = torch.tensor([3, 7, 7, 0, 7, 1])
    full = fk.jsd(x, y, lab, ignore_index=7)
    keep = torch.tensor([0, 3, 5])
    assert torch.allclose(full, fk.jsd(x[keep], y[keep]))
    assert torch.allclose(fk.jsd(x, y, lab, ignore_index=-100), fk.jsd(x, y))


def test_all_ignored_and_empty_give_zero():
    x, y, lab = _inputs(3, 8, ignore=(0, 1, 2))
    xa = x.clone().requires_grad_()
    loss = fk.jsd(xa, y, lab)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(xa.grad, torch.zeros_like(x))
    for shape in ((0, 8), (3, 0)):
        e = torch.empty(shape).requires_grad_()
        loss = fk.jsd(e, torch.empty(shape))
        assert loss.item() == 0.0 and loss.shape == ()
        loss.backward()
        assert e.grad.shape == shape
    assert fk.jsd(torch.empty(0, 8), torch.empty(0, 8),
                  torch.empty(0, dtype=torch.long)).item() == 0.0


def test_nan_propagates_and_neg_inf_is_nan_like_the_formula():
    x, y, _ = _inputs(3, 8)
    x[0, 2] = float("nan")
    assert torch.isnan(fk.jsd(x, y))
    x, y, lab = _inputs(3, 8, ignore=(0,))
    x[0, 2] = float("nan")  # in an ignored row: counts nothing
    assert torch.isfinite(fk.jsd(x, y, lab))
    x, y, _ = _inputs(3, 8)
    x[1, 3] = float("-inf")
    assert torch.isnan(fk.jsd(x, y)) and torch.isnan(ref_jsd(x, y))


def test_target_gets_no_gradient_and_non_contiguous_inputs():
    x, y, lab = _inputs(5, 12, torch.float64)
    xt = x.t().contiguous().t().requires_grad_()  # non-contiguous
    yt = y.t().contiguous().t().requires_grad_()
    loss = fk.jsd(xt, yt, lab, 0.3)
    loss.backward()
    assert yt.grad is None
    assert_close(xt.grad, _ref_grad(x, y, lab, 0.3)[1], torch.float64)


def test_no_grad_and_inputs_not_requiring_grad():
    x, y, lab = _inputs(4, 9)
    with torch.no_grad():
        a = fk.jsd(x.clone().requires_grad_(), y, lab)
    b = fk.jsd(x, y, lab)
    assert a.grad_fn is None and b.grad_fn is None and torch.equal(a, b)


def test_module():
    m = fk.nn.JSD(beta=0.25, ignore_index=3)
    assert "beta=0.25" in repr(m) and "ignore_index=3" in repr(m)
    x, y, lab = _inputs(5, 9, torch.float64)
    lab[2] = 3
    assert torch.allclose(m(x, y, lab), ref_jsd(x, y, lab, 0.25, 3))
    assert torch.allclose(m(x, y), ref_jsd(x, y, None, 0.25))
    with pytest.raises(ValueError, match="beta"):
        fk.nn.JSD(beta=1.5)


def test_retain_graph_backward_twice():
    x, y, lab = _inputs(4, 9)
    xa = x.clone().requires_grad_()
    loss = fk.jsd(xa * 1, y, lab)
    loss.backward(torch.tensor(3.0), retain_graph=True)
    g1 = xa.grad.clone()
    loss.backward(torch.tensor(3.0))
    assert_close(xa.grad, 2 * g1, torch.float32)
    assert_close(g1, _ref_grad(x, y, lab, 0.5, 3.0)[1], torch.float32, factor=2)


def test_double_backward_is_a_clear_error():
    x, y, lab = _inputs(4, 16)
    xa = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(fk.jsd(xa * 1, y, lab), xa, create_graph=True)
    assert_close(g, _ref_grad(x, y, lab, 0.5)[1], torch.float32, factor=2)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.pow(2).sum().backward()


# --- bad input -----------------------------------------------------------------------------

def _bad(**over):
    def make(d):
        args = dict(input=torch.zeros(3, 5, device=d), target=torch.zeros(3, 5, device=d),
                    shift_labels=None, beta=0.5)
        args.update({k: (v(d) if callable(v) else v) for k, v in over.items()})
        return args
    return make


BAD = [
    ("input 1d", _bad(input=lambda d: torch.zeros(5, device=d)), "input must have shape"),
    ("input int", _bad(input=lambda d: torch.zeros(3, 5, dtype=torch.int32, device=d)),
     "not supported"),
    ("target dtype", _bad(target=lambda d: torch.zeros(3, 5, dtype=torch.float16, device=d)),
     "must have the same dtype"),
    ("target shape", _bad(target=lambda d: torch.zeros(3, 6, device=d)),
     "must have the same shape"),
    ("labels int32", _bad(shift_labels=lambda d: torch.zeros(3, dtype=torch.int32, device=d)),
     "shift_labels must be int64"),
    ("labels shape", _bad(shift_labels=lambda d: torch.zeros(4, dtype=torch.long, device=d)),
     "shift_labels must have shape"),
    ("beta", _bad(beta=1.5), "beta must be in"),
    ("beta negative", _bad(beta=-0.25), "beta must be in"),
]


def _call_bad(make, device):
    a = make(device)
    return torch.ops.fk.jsd(a["input"], a["target"], a["shift_labels"], a["beta"], -100)


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: _call_bad(make, d), ("cpu", "meta"), msg)
    assert cpu == meta
    assert cpu.startswith("fk::jsd: ")


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.jsd(torch.zeros(2, 4), torch.zeros(2, 4, device="meta"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.jsd(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2, dtype=torch.long,
                                                                  device="meta"))


# --- level 3: autograd, opcheck, torch.compile, TorchScript ---------------------------------

@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("labels", [True, False])
def test_gradcheck(beta, labels):
    x, y, lab = _inputs(4, 7, torch.float64, ignore=(2,), labels=labels)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fk.jsd(x, y, lab, beta), (x,))


def test_opcheck():
    x, y, lab = _inputs(5, 11, ignore=(1,))
    for args in ((x.clone().requires_grad_(), y, lab, 0.5, -100),
                 (x.clone().requires_grad_(), y, None, 0.0, -100),
                 (x.clone().requires_grad_(), y, lab, 1.0, 4),
                 (x.clone(), y, lab, 0.3, -100)):
        torch.library.opcheck(torch.ops.fk.jsd, args)
    torch.library.opcheck(torch.ops.fk._jsd_forward, (x, y, lab, 0.5, -100, True),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    def step(h, w, t, lab):
        return fk.jsd(torch.log_softmax(h @ w, -1), t, lab, beta=0.4)

    torch._dynamo.reset()
    # aot_eager: the fake kernel and the autograd kernel under AOTAutograd without
    # Inductor's code generation (test_cuda_opcheck_compile uses Inductor)
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    for rows in (6, 11):
        g = torch.Generator().manual_seed(rows)
        h = torch.randn(rows, 16, generator=g).requires_grad_()
        w = torch.randn(16, 40, generator=g).requires_grad_()
        t = torch.log_softmax(torch.randn(rows, 40, generator=g), -1)
        lab = torch.randint(0, 40, (rows,), generator=g)
        lab[0] = -100
        h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = compiled(h, w, t, lab), step(h2, w2, t, lab)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        assert_close(h.grad, h2.grad, torch.float32, factor=10)
        assert_close(w.grad, w2.grad, torch.float32, factor=10)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_module(tmp_path):
    class Distill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 20)
            self.loss = fk.nn.JSD(beta=0.3)

        def forward(self, h: torch.Tensor, t: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
            return self.loss(torch.log_softmax(self.proj(h), -1), t, lab)

    torch.manual_seed(0)
    m = Distill()
    h = torch.randn(6, 8)
    t = torch.log_softmax(torch.randn(6, 20), -1)
    lab = torch.tensor([1, -100, 2, 3, 4, -100])
    scripted = torch.jit.script(m)
    path = tmp_path / "distill.pt"
    scripted.save(str(path))
    loaded = torch.jit.load(str(path))
    assert_close(loaded(h, t, lab), m(h, t, lab), torch.float32)
    assert_close(loaded(h, t, lab), m(h, t, lab), torch.float32)  # optimized on the 2nd call
    loaded(h, t, lab).backward()
    g = loaded.proj.weight.grad.clone()
    m.zero_grad()
    m(h, t, lab).backward()
    assert_close(g, m.proj.weight.grad, torch.float32)


# --- level 5: CUDA kernels -----------------------------------------------------------------

CUDA_V = [1, 7, 100, 1000, 2048, 2049, 16383, 16385, 32000, 50257, 128256]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", CUDA_V)
@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 1.0])
def test_cuda_matches_reference(dtype, v, beta):
    for n, labels in ((1, False), (1, True), (9, True), (6, False)):
        x, y, lab = _inputs(n, v, dtype, "cuda", ignore=(1, 5), seed=v, labels=labels)
        ref_loss, ref_g = _ref_grad(x, y, lab, beta, 2.5)
        poison_cuda_cache()
        xa = x.clone().requires_grad_()
        loss = fk.jsd(xa, y, lab, beta)
        loss.backward(torch.tensor(2.5, device="cuda", dtype=dtype))
        assert loss.dtype == dtype
        assert_close(loss, ref_loss, dtype, factor=2, what=f"loss n={n}")
        # One column: log-probabilities 0, a gradient of exactly 0 that the float64 reference
        # leaves at 1e-17: measured against the size of its terms (grad_output * q / rows).
        # float16 at wide rows: gradients of q / rows lie in the subnormal range.
        terms = 2.5 * x.float().exp().norm().item() / n if v == 1 else None
        assert_close(xa.grad, ref_g, dtype, factor=4, what=f"grad n={n}", scale=terms,
                     rounding=2 if dtype == torch.float16 else 0)
        if labels and n > 1:
            assert torch.equal(xa.grad[1], torch.zeros(v, dtype=dtype, device="cuda"))
        assert not torch.isnan(xa.grad).any()
        with torch.no_grad():
            assert torch.equal(fk.jsd(x, y, lab, beta), loss.detach())


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_non_contiguous(dtype):
    n, v = 5, 1001
    x, y, lab = _inputs(n, v, dtype, "cuda", seed=3)
    ref_loss, ref_g = _ref_grad(x, y, lab, 0.5)
    cases = ((misaligned(x), misaligned(y)), (misaligned(x), y), (x, misaligned(y)),
             (x.t().contiguous().t(), y), (x, y.t().contiguous().t()))
    for xi, yi in cases:
        xa = xi.detach().requires_grad_()  # same memory (and alignment) as xi
        loss = fk.jsd(xa, yi, lab)
        loss.backward()
        assert_close(loss, ref_loss, dtype, factor=2)
        assert_close(xa.grad, ref_g, dtype, factor=4)
    for v2 in (1008, 128256):  # aligned rows, misaligned pointers
        x, y, lab = _inputs(3, v2, dtype, "cuda", seed=v2)
        assert_close(fk.jsd(misaligned(x), misaligned(y), lab), ref_jsd(x.cpu(), y.cpu(),
                                                                          lab.cpu()),
                     dtype, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [255, 1025, 8192])
def test_cuda_count_over_many_programs(n):
    v = 64
    x, y, lab = _inputs(n, v, torch.float32, "cuda", ignore=range(0, n, 7), seed=n)
    ref_loss, ref_g = _ref_grad(x, y, lab, 0.5)
    xa = x.clone().requires_grad_()
    loss = fk.jsd(xa, y, lab)
    loss.backward()
    assert_close(loss, ref_loss, torch.float32, factor=2)
    assert_close(xa.grad, ref_g, torch.float32, factor=2)
    e = fk.jsd(torch.empty(0, 8, device="cuda"), torch.empty(0, 8, device="cuda"),
               torch.empty(0, dtype=torch.long, device="cuda"))
    assert e.item() == 0.0
    lab_all = torch.full((n,), -100, device="cuda")
    xa.grad = None
    loss = fk.jsd(xa, y, lab_all)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(xa.grad, torch.zeros_like(x))


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: _call_bad(make, d), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.jsd(torch.zeros(2, 4, dtype=torch.float64, device="cuda"),
               torch.zeros(2, 4, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.jsd(torch.zeros(2, 4, device="cuda"), torch.zeros(2, 4))


@pytest.mark.cuda
@pytest.mark.parametrize("labels", [True, False])
def test_cuda_graph_capture(labels):
    n, v = 64, 5000
    x, y, lab = _inputs(n, v, torch.bfloat16, "cuda", labels=labels)
    static_x, static_y = x.clone().requires_grad_(), y.clone()
    static_lab = lab.clone() if labels else None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (loads the kernels) outside the capture
        fk.jsd(static_x * 1, static_y, static_lab).backward()
    torch.cuda.current_stream().wait_stream(s)
    static_x.grad = None
    two = torch.tensor(2.0, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = fk.jsd(static_x * 1, static_y, static_lab)
        static_loss.backward(two)
    for seed in (1, 2):
        x2, y2, lab2 = _inputs(n, v, torch.bfloat16, "cuda", seed=seed, ignore=(seed, 7),
                               labels=labels)
        with torch.no_grad():
            static_x.copy_(x2)
        static_y.copy_(y2)
        if labels:
            static_lab.copy_(lab2)
        graph.replay()
        ref_loss, ref_g = _ref_grad(x2, y2, lab2, 0.5, 2.0)
        assert_close(static_loss, ref_loss, torch.bfloat16, factor=2)
        assert_close(static_x.grad, ref_g, torch.bfloat16, factor=4)


@pytest.mark.cuda
def test_cuda_grad_output_scales_in_place_and_memory():
    n, v = 512, 32000
    x, y, lab = _inputs(n, v, torch.bfloat16, "cuda")
    xa = x.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = fk.jsd(xa, y, lab)
    loss.backward(torch.tensor(-3.0, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    # one gradient buffer (it becomes xa.grad) and small per-program partial sums
    assert torch.cuda.max_memory_allocated() - base < n * v * 2 * 1.1
    assert_close(xa.grad, _ref_grad(x, y, lab, 0.5, -3.0)[1], torch.bfloat16, factor=4)


@pytest.mark.cuda
def test_cuda_opcheck_compile():
    x, y, lab = _inputs(5, 33, device="cuda", ignore=(2,))
    torch.library.opcheck(torch.ops.fk.jsd, (x.clone().requires_grad_(), y, lab, 0.3, -100))
    f = torch.compile(lambda x, y, lab: fk.jsd(x * 2, y, lab), fullgraph=True,
                      backend="aot_eager")  # (Inductor's CUDA code generation needs Triton)
    xa = x.clone().requires_grad_()
    f(xa, y, lab).backward()
    _, ref_g = _ref_grad(x * 2, y, lab, 0.5)
    assert_close(xa.grad, 2 * ref_g, torch.float32, factor=2)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    v = 128256
    n = (1 << 31) // v + 3
    x = torch.log_softmax(torch.randn(n, v, device="cuda", dtype=torch.bfloat16), -1)
    y = torch.log_softmax(torch.randn(n, v, device="cuda", dtype=torch.bfloat16), -1)
    lab = torch.full((n,), -100, device="cuda")
    lab[:2] = 1
    lab[-2:] = 1
    xa = x.requires_grad_()
    loss = fk.jsd(xa, y, lab)
    loss.backward()
    rows = torch.tensor([0, 1, n - 2, n - 1], device="cuda")
    ref_loss, ref_g = _ref_grad(x[rows].detach(), y[rows], None, 0.5)
    assert_close(loss, ref_loss, torch.bfloat16, factor=2)
    assert_close(xa.grad[rows], ref_g, torch.bfloat16, factor=4)
    assert xa.grad[2:n - 2].abs().max().item() == 0.0
    del x, y, xa, loss
    torch.cuda.empty_cache()
