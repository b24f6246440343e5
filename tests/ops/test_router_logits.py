"""fk.router_logits (float32 router logits from 16-bit inputs) at every test level: Triton
source (interpreter), CPU backend, autograd, opcheck, torch.compile, TorchScript, bad input,
and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch
import torch.nn.functional as F

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn)

# --- the reference ------------------------------------------------------------------------
#
# From the definition, in float64: logits = x W^T (float32 out); grad_x = g W rounded once
# to x's dtype; grad_W = g^T x in float32 (or rounded once to the weight's dtype).


def ref_forward(x, w):
    out = x.detach().double() @ w.detach().double().T
    return out if x.dtype == torch.float64 else out.float()


def ref_backward(g, x, w, weight_grad_dtype=None):
    g64 = g.double().reshape(-1, w.shape[0])
    x64 = x.detach().double().reshape(-1, x.shape[-1])
    dx = (g64 @ w.detach().double()).reshape(x.shape)
    dw = g64.T @ x64
    wdt = weight_grad_dtype or w.dtype
    return dx.to(x.dtype), dw.to(wdt)


def _inputs(t, e, h, dtype=torch.float32, device="cpu", lead=None, grad=False, seed=None):
    seeds = (None, None) if seed is None else (seed, seed + 1)
    x = randn(*(lead or (t,)), h, dtype=dtype, device=device, seed=seeds[0])
    w = randn(e, h, dtype=dtype, device=device, scale=max(h, 1) ** -0.5, seed=seeds[1])
    if grad:
        x.requires_grad_()
        w.requires_grad_()
    return x, w


# Tolerances: the logits and a float32 grad_W are float32 results of exact products of the
# inputs (fp32 accumulation), so they are held to float32's bound whatever the input dtype;
# grad_x and a grad_W of the weight's dtype are rounded once to it. Through autograd,
# weight.grad always has the weight's dtype (torch's engine casts a gradient to its input's
# dtype), so `dw_dtype` is the weight's dtype there and the op's own output dtype when the
# backward op is called directly.
def _check_grads(x, w, g, dx, dw, dw_dtype=None, factor=2.0):
    dw_dtype = dw_dtype or w.dtype
    dxr, dwr = ref_backward(g, x, w, dw_dtype)
    assert dx.dtype == x.dtype and dx.shape == x.shape
    assert dw.dtype == dw_dtype and dw.shape == w.shape
    assert_close(dx, dxr, x.dtype, factor=factor, what="dx")
    assert_close(dw, dwr, dw_dtype, factor=factor, what="dw")


# --- level 1: the Triton source under the interpreter ---------------------------------------

INTERP_SHAPES = [(37, 19, 70), (16, 32, 64), (1, 8, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,e,h", INTERP_SHAPES)
def test_interpreter_three_products(dtype, t, e, h):
    """Forward (A = x, B = W stored (E, H)), grad x (A = g fp32, B = W) and grad W (A = g^T,
    B = x) in split slices summed afterwards, each against the float64 reference."""
    mod = load_triton_src("router_logits")
    x, w = _inputs(t, e, h, dtype, seed=3)
    g = randn(t, e, seed=5) * 1e-3
    cx = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2)
    logits = torch.full((t, e), float("nan"))
    mod.router_gemm_kernel[(cdiv(t, 16) * cdiv(e, 16), 1)](x, w, logits, t, e, h, h, h, e, h,
                                                           A_T=0, B_T=1, **cx)
    assert_close(logits, ref_forward(x, w), torch.float32, what="logits")
    dx = torch.full((t, h), float("nan"), dtype=dtype)
    mod.router_gemm_kernel[(cdiv(t, 16) * cdiv(h, 16), 1)](g, w, dx, t, h, e, e, h, h, e,
                                                           A_T=0, B_T=0, **cx)
    dxr, dwr = ref_backward(g, x, w, torch.float32)
    # The interpreter rounds bfloat16 toward zero: up to twice the nearest rounding's error.
    assert_close(dx, dxr, dtype, factor=2, what="dx")
    for splits, kps in ((1, t), (3, 16)):
        if cdiv(t, kps) != splits:
            continue
        dw = torch.full((splits, e, h), float("nan"))
        mod.router_gemm_kernel[(cdiv(e, 16) * cdiv(h, 16), splits)](g, x, dw, e, h, t, e, h, h,
                                                                    kps, A_T=1, B_T=0, **cx)
        # bfloat16: the two-term split of g leaves about 2^-16 of |g| (2^-17 on hardware,
        # which rounds to nearest).
        assert_close(dw.sum(0), dwr, torch.float32, factor=4 if dtype == torch.bfloat16 else 1,
                     what=f"dw splits={splits}")


def test_interpreter_bf16_split_beats_bf16_rounding():
    """grad W from a float32 g and bfloat16 x: the split product is far closer to the exact
    one than a product of g rounded to bfloat16 would be."""
    mod = load_triton_src("router_logits")
    t, e, h = 64, 16, 32
    x = randn(t, h, dtype=torch.bfloat16, seed=1)
    g = randn(t, e, seed=2)
    dw = torch.empty(e, h)
    mod.router_gemm_kernel[(1 * 2, 1)](g, x, dw, e, h, t, e, h, h, t, A_T=1, B_T=0,
                                       BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1)
    exact = g.double().T @ x.double()
    rounded = g.bfloat16().double().T @ x.double()
    from helpers import rel_err
    assert rel_err(dw, exact) < rel_err(rounded, exact) / 50


def test_variants_cover_every_dtype_and_product():
    mod = load_triton_src("router_logits")
    for arch in (80, 90, 100, 103, 120):
        vs = mod.variants(arch)
        keys = {(v.dtype, v.flags) for v in vs}
        assert len(keys) == len(vs) == 3 * 3 * 2, arch
        for v in vs:
            assert v.family == "router_gemm" and hasattr(mod, v.kernel)
            assert (v.flags & mod.FLAG_ALIGNED == 0) == (v.divisible_by_16 == ())
            product = [p for p, f in mod.PRODUCT_FLAGS.items() if v.flags & f]
            assert len(product) == 1
            a, b, c, a_t, b_t = mod._PRODUCTS[product[0]]
            assert (v.constexprs["A_T"], v.constexprs["B_T"]) == (a_t, b_t)
            assert v.signature["c_ptr"] == "*" + (v.dtype if c == "x" else c)
            assert v.signature["b_ptr"] == "*" + v.dtype


# --- level 2: the CPU backend against the reference ---------------------------------------

CPU_CASES = [((1,), 1, 1), ((7,), 17, 33), ((2, 3), 40, 24), ((4, 5, 2), 9, 64)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("lead,e,h", CPU_CASES)
def test_cpu_forward_backward(dtype, lead, e, h):
    x, w = _inputs(None, e, h, dtype, lead=lead, grad=True)
    out = fk.router_logits(x, w)
    want_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert out.dtype == want_dtype and out.shape == (*lead, e) and out.is_contiguous()
    assert_close(out, ref_forward(x, w), want_dtype, what="logits")
    g = randn(*lead, e, dtype=want_dtype)
    out.backward(g)
    _check_grads(x, w, g, x.grad, w.grad)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_cpu_weight_grad_dtype(dtype):
    """The backward op returns grad_W in the weight's dtype by default (rounded once), in
    float32 when asked; through autograd the weight's .grad has its dtype either way (torch
    casts), the same values."""
    x, w = _inputs(6, 12, 20, dtype, seed=1)
    g = randn(6, 12, seed=2)
    for wgd, want in ((None, dtype), (torch.float32, torch.float32), (dtype, dtype)):
        dx, dw = torch.ops.fk._router_logits_backward(g, x, w, [True, True], wgd)
        _check_grads(x, w, g, dx, dw, want)
    grads = []
    for wgd in (None, torch.float32):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        fk.router_logits(xg, wg, weight_grad_dtype=wgd).backward(g)
        _check_grads(x, w, g, xg.grad, wg.grad)
        grads.append(wg.grad)
    assert torch.equal(*grads)


def test_cpu_matches_megatron_fp32_router():
    """What Megatron's fp32 router computes: F.linear on float32 copies of both inputs."""
    x, w = _inputs(9, 16, 48, torch.bfloat16, grad=True, seed=4)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out = fk.router_logits(x, w)
    ref = F.linear(x2.float(), w2.float())
    assert_close(out, ref, torch.float32)
    g = randn(9, 16, seed=5)
    out.backward(g)
    ref.backward(g)
    assert_close(x.grad, x2.grad, torch.bfloat16)
    assert w.grad.dtype == torch.bfloat16
    assert_close(w.grad, w2.grad, torch.bfloat16)


def test_cpu_only_needed_gradients():
    x, w = _inputs(4, 8, 16)
    w.requires_grad_()
    fk.router_logits(x, w).sum().backward()
    assert x.grad is None and w.grad is not None
    x2, w2 = _inputs(4, 8, 16)
    x2.requires_grad_()
    fk.router_logits(x2, w2).sum().backward()
    assert w2.grad is None and x2.grad is not None


def test_cpu_non_contiguous():
    x = randn(24, 7).t()
    w = randn(10, 48)[:, ::2]
    assert not (x.is_contiguous() or w.is_contiguous())
    assert_close(fk.router_logits(x, w), ref_forward(x, w), torch.float32)


@pytest.mark.parametrize("t,e,h", [(0, 5, 8), (3, 0, 8), (3, 5, 0)])
def test_cpu_empty(t, e, h):
    x, w = _inputs(t, e, h, grad=True)
    out = fk.router_logits(x, w)
    assert out.shape == (t, e) and out.dtype == torch.float32 and not out.any()
    out.sum().backward()
    assert x.grad.shape == (t, h) and w.grad.shape == (e, h)
    assert not x.grad.any() and not w.grad.any()


def test_cpu_nan_inf_propagate():
    x, w = _inputs(3, 4, 8, torch.bfloat16)
    x[1, 2] = float("nan")
    x[2, 0] = float("inf")
    out = fk.router_logits(x, w)
    ref = x.float() @ w.float().T
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    assert torch.isnan(out[1]).all() and torch.isinf(out[2]).any()


# --- bad input: the same message from every backend -----------------------------------

def _w(d, *shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("dtypes differ", lambda d: (_w(d, 2, 8), _w(d, 4, 8, dtype=torch.float16)),
     "must have the same dtype"),
    ("H mismatch", lambda d: (_w(d, 2, 8), _w(d, 4, 7)), "weight must have shape"),
    ("1-d weight", lambda d: (_w(d, 2, 8), _w(d, 8)), "weight must have shape"),
    ("int dtype", lambda d: (_w(d, 2, 8, dtype=torch.int32),) * 2, "not supported"),
    ("scalar", lambda d: (_w(d), _w(d, 4, 1)), "at least one dimension"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.router_logits(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta
    assert cpu.startswith("fk::router_logits: ")


def test_bad_weight_grad_dtype_cpu_and_meta_agree():
    def call(d):
        return fk.router_logits(_w(d, 2, 8, dtype=torch.bfloat16),
                                _w(d, 4, 8, dtype=torch.bfloat16), torch.float16)
    cpu, meta = error_lines(call, ("cpu", "meta"), "weight_grad_dtype must be float32 or")
    assert cpu == meta == ("fk::router_logits: weight_grad_dtype must be float32 or the "
                           "weight's dtype (BFloat16), got Half")


@pytest.mark.parametrize("g_shape,g_dtype,msg", [((2, 5), torch.float32, "must have shape"),
                                                  ((2, 4), torch.bfloat16, "must have dtype")])
def test_bad_backward_input_cpu_and_meta_agree(g_shape, g_dtype, msg):
    def call(d):
        x, w = _w(d, 2, 8, dtype=torch.bfloat16), _w(d, 4, 8, dtype=torch.bfloat16)
        return torch.ops.fk._router_logits_backward(_w(d, *g_shape, dtype=g_dtype), x, w,
                                                    [True, True])
    cpu, meta = error_lines(call, ("cpu", "meta"), msg)
    assert cpu == meta and cpu.startswith("fk::_router_logits_backward: ")


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.router_logits(torch.ones(2, 8), torch.ones(4, 8, device="meta"))


def test_meta_shapes():
    x = torch.empty(2, 3, 8, device="meta", dtype=torch.bfloat16)
    w = torch.empty(5, 8, device="meta", dtype=torch.bfloat16)
    out = fk.router_logits(x, w)
    assert out.shape == (2, 3, 5) and out.dtype == torch.float32
    g = torch.empty(2, 3, 5, device="meta")
    dx, dw = torch.ops.fk._router_logits_backward(g, x, w, [True, True], torch.bfloat16)
    assert dx.shape == x.shape and dx.dtype == torch.bfloat16 and dw.dtype == torch.bfloat16
    dx, dw = torch.ops.fk._router_logits_backward(g, x, w, [False, True])
    assert dx is None and dw.dtype == torch.bfloat16
    _, dw = torch.ops.fk._router_logits_backward(g, x, w, [False, True], torch.float32)
    assert dw.dtype == torch.float32


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------

def test_gradcheck():
    x, w = _inputs(None, 5, 6, torch.float64, lead=(2, 3), grad=True)
    assert torch.autograd.gradcheck(fk.router_logits, (x, w))
    assert torch.autograd.gradcheck(lambda x, w: torch.ops.fk.router_logits(x, w), (x, w))


def test_double_backward_is_a_clear_error():
    x, w = _inputs(3, 4, 5, grad=True)
    (gx,) = torch.autograd.grad(fk.router_logits(x, w).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_opcheck():
    for dtype in (torch.float32, torch.bfloat16):
        x, w = _inputs(None, 6, 16, dtype, lead=(2, 3), grad=True)
        torch.library.opcheck(torch.ops.fk.router_logits, (x, w))
        torch.library.opcheck(torch.ops.fk.router_logits, (x, w, dtype))
        torch.library.opcheck(torch.ops.fk.router_logits, (x.detach(), w.detach()))
        g = randn(2, 3, 6)
        torch.library.opcheck(torch.ops.fk._router_logits_backward,
                              (g, x.detach(), w.detach(), [True, True]))
        torch.library.opcheck(torch.ops.fk._router_logits_backward,
                              (g, x.detach(), w.detach(), [False, True], dtype))


def test_torch_compile_fullgraph():
    def route(x, w):
        return torch.softmax(fk.router_logits(x, w), dim=-1)

    torch._dynamo.reset()
    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        x, w = _inputs(rows, 12, 16, torch.bfloat16, grad=True)
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        out, ref = compiled(x, w), route(x2, w2)
        assert out.dtype == torch.float32
        assert_close(out, ref, torch.float32)
        g = randn(rows, 12)
        out.backward(g)
        ref.backward(g)
        assert_close(x.grad, x2.grad, torch.bfloat16)
        assert_close(w.grad, w2.grad, torch.bfloat16)


def test_functional_scripts():
    @torch.jit.script
    def f(x, w):
        return fk.router_logits(x, w) + torch.ops.fk.router_logits(x, w, None)

    x, w = _inputs(3, 5, 8, torch.bfloat16)
    assert_close(f(x, w), 2 * ref_forward(x, w), torch.float32)


def test_autocast_float32_inputs_run_in_the_autocast_dtype():
    x, w = _inputs(4, 6, 16, grad=True, seed=9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fk.router_logits(x, w)
    assert out.dtype == torch.float32
    assert torch.equal(out, fk.router_logits(x.bfloat16(), w.bfloat16()))
    out.sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


# --- level 5: CUDA kernels -----------------------------------------------------------------

# (leading dims, E, H): one token, odd sizes below and above one tile, aligned shapes (the
# fast variants), non-power-of-two expert counts, and linghe's router shape (8192 tokens,
# hidden 2048, 256 experts) with Qwen3-MoE's 128 and DeepSeek-V3's 256 experts.
CUDA_CASES = [((1,), 1, 1), ((1,), 8, 64), ((37,), 19, 70), ((3, 43), 129, 200),
              ((257,), 96, 512), ((1000,), 160, 1000), ((2, 512), 60, 2048),
              ((4096,), 128, 2048), ((8192,), 256, 2048), ((5000,), 384, 7168)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,e,h", CUDA_CASES)
def test_cuda_matches_reference(dtype, lead, e, h):
    x, w = _inputs(None, e, h, dtype, device="cuda", lead=lead, grad=True)
    poison_cuda_cache()
    out = fk.router_logits(x, w)
    assert out.dtype == torch.float32 and not torch.isnan(out).any(), "unwritten logits"
    assert_close(out, ref_forward(x, w), torch.float32, what="logits")
    g = randn(*lead, e, device="cuda") * 1e-3
    poison_cuda_cache()
    out.backward(g)
    assert not torch.isnan(x.grad).any() and not torch.isnan(w.grad).any()
    # grad W from the bfloat16 split: about 2^-17 relative; the float32 bound is 1e-5.
    _check_grads(x, w, g, x.grad, w.grad, factor=3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_cuda_weight_grad_dtype_and_frozen(dtype):
    x, w = _inputs(300, 64, 256, dtype, device="cuda", grad=True, seed=3)
    g = randn(300, 64, device="cuda", seed=4)
    fk.router_logits(x, w, weight_grad_dtype=dtype).backward(g)
    _check_grads(x, w, g, x.grad, w.grad)
    dx, dw = torch.ops.fk._router_logits_backward(g, x.detach(), w.detach(), [True, True],
                                                  torch.float32)
    _check_grads(x, w, g, dx, dw, torch.float32, factor=3)
    x.grad = w.grad = None
    w.requires_grad_(False)
    fk.router_logits(x, w).backward(g)
    assert w.grad is None
    dxr, _ = ref_backward(g, x, w)
    assert_close(x.grad, dxr, dtype, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_non_contiguous(dtype):
    x, w = _inputs(50, 24, 64, dtype, device="cuda")
    xm, wm = misaligned(x), misaligned(w)
    assert_close(fk.router_logits(xm, wm), ref_forward(x, w), torch.float32)
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    assert_close(fk.router_logits(xt, w), ref_forward(x, w), torch.float32)
    xm.requires_grad_()
    wm.requires_grad_()
    g = randn(50, 24, device="cuda")
    fk.router_logits(xm, wm).backward(g)
    _check_grads(x, w, g, xm.grad, wm.grad)
    # an expanded (stride-0) incoming gradient: what out.sum().backward() passes
    x.requires_grad_()
    w.requires_grad_()
    fk.router_logits(x, w).sum().backward()
    _check_grads(x, w, torch.ones(50, 24, device="cuda"), x.grad, w.grad)


@pytest.mark.cuda
def test_cuda_deterministic():
    x, w = _inputs(8192, 256, 2048, torch.bfloat16, device="cuda", grad=True, seed=1)
    g = randn(8192, 256, device="cuda", seed=2)
    grads = []
    for _ in range(2):
        x.grad = w.grad = None
        out = fk.router_logits(x, w)
        out.backward(g)
        grads.append((out, x.grad, w.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.router_logits(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        w = torch.ones(4, 8, dtype=torch.float64, device="cuda")
        fk.router_logits(torch.ones(2, 8, dtype=torch.float64, device="cuda"), w)


@pytest.mark.cuda
@pytest.mark.parametrize("t,e,h", [(0, 5, 8), (3, 0, 8), (3, 5, 0)])
def test_cuda_empty(t, e, h):
    x, w = _inputs(t, e, h, device="cuda", grad=True)
    out = fk.router_logits(x, w)
    assert out.shape == (t, e) and not out.any()
    out.sum().backward()
    assert x.grad.shape == (t, h) and not x.grad.any() and not w.grad.any()


@pytest.mark.cuda
def test_cuda_opcheck_and_compile():
    x, w = _inputs(None, 24, 32, torch.bfloat16, device="cuda", lead=(2, 5), grad=True)
    torch.library.opcheck(torch.ops.fk.router_logits, (x, w))
    f = torch.compile(lambda x, w: fk.router_logits(x, w).softmax(-1).max(-1).values.sum(),
                      fullgraph=True, backend="aot_eager")
    f(x, w).backward()
    assert x.grad is not None and w.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    # x and grad_x past 2^31 elements (T * H).
    torch.manual_seed(0)
    h, e = 4096, 64
    t = (1 << 31) // h + 67
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(e, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5).requires_grad_()
    out = fk.router_logits(x, w)
    g = torch.randn_like(out) * 1e-3
    out.backward(g)
    rows = torch.cat([torch.arange(0, 64), torch.arange(t - 64, t)]).cuda()
    assert_close(out[rows], ref_forward(x[rows], w), torch.float32)
    dxr, _ = ref_backward(g[rows], x[rows], w)
    assert_close(x.grad[rows], dxr, torch.bfloat16, factor=2)
    dwr = g.T @ x.detach().float()  # float32 (cuBLAS without TF32): 8 GiB, not 16
    assert_close(w.grad, dwr, torch.bfloat16, factor=2)
