"""fk.swiglu_linear (fused SwiGLU GEMM) at every test level: Triton source (interpreter), CPU
backend, autograd, opcheck, torch.compile, TorchScript, bad input, modules, and the CUDA
kernels (marker ``cuda``)."""
import io

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, ref_grads, round_nearest, round_toward_zero)

# --- the reference ---------------------------------------------------------------------
#
# Written from the definition, in float64: a = x Wg^T, b = x Wu^T, z = silu(a) * b. The op
# documents where it rounds to x's dtype: z once; the backward factors s = silu(a) and
# t = b * silu'(a) once; da = dz * t and db = dz * s once (the GEMM operands); da Wg once
# (dx = da Wg, then db Wu added onto it); each gradient once at the end. `cast` rounds
# float32 to the dtype (the interpreter truncates bfloat16, see helpers.round_toward_zero).


def _rnd(t, dtype, cast):
    if dtype == torch.float64:
        return t
    return cast(t.float(), dtype).double()


def ref_forward(x, wg, wu, cast=round_nearest, gm=1.0, dm=1.0):
    """(z, s, t) in x's dtype; with the multipliers u = gm a: z = silu(u) b dm and the
    factors of the gradients of a and b, s = dm silu(u), t = gm dm b silu'(u)."""
    dtype = x.dtype
    x64 = x.detach().double().reshape(-1, x.shape[-1])
    a = x64 @ wg.detach().double().T * gm
    b = x64 @ wu.detach().double().T
    sig = 1 / (1 + torch.exp(-a))
    silu = a * sig
    shape = (*x.shape[:-1], wg.shape[0])
    outs = (silu * b * dm, silu * dm, b * (sig + a * sig * (1 - sig)) * (gm * dm))
    return [_rnd(o, dtype, cast).to(dtype).reshape(shape) for o in outs]


def ref_backward(dz, x, wg, wu, cast=round_nearest, gm=1.0, dm=1.0):
    """(dx, dwg, dwu) in x's dtype, given the factors rounded as the forward stores them."""
    dtype = x.dtype
    _, s, t = ref_forward(x, wg, wu, cast, gm, dm)
    k, n = x.shape[-1], wg.shape[0]
    dz64 = dz.double().reshape(-1, n)
    da = _rnd(dz64 * t.double().reshape(-1, n), dtype, cast)
    db = _rnd(dz64 * s.double().reshape(-1, n), dtype, cast)
    x64 = x.detach().double().reshape(-1, k)
    # dx = da Wg + db Wu as the op runs it: one product, then the other added onto it in
    # place (addmm_), so the first is rounded to the dtype on its own.
    dx = _rnd(da @ wg.detach().double(), dtype, cast) + db @ wu.detach().double()
    outs = (dx.reshape(x.shape), da.T @ x64, db.T @ x64)
    return [_rnd(o, dtype, cast).to(dtype) for o in outs]


def _mlp_half(x, wg, wu):
    return F.silu(x @ wg.T) * (x @ wu.T)


def _scaled_half(gm, dm):
    return lambda x, wg, wu: F.silu(x @ wg.T * gm) * (x @ wu.T) * dm


def _inputs(m, n, k, dtype=torch.float32, device="cpu", lead=None, grad=False, seed=None):
    """x (m, k) (or lead + (k,)), weights (n, k) scaled so that a, b are O(1)."""
    shape = (*(lead or (m,)), k)
    seeds = (None,) * 3 if seed is None else (seed, seed + 1, seed + 2)
    x = randn(*shape, dtype=dtype, device=device, seed=seeds[0])
    wg = randn(n, k, dtype=dtype, device=device, scale=max(k, 1) ** -0.5, seed=seeds[1])
    wu = randn(n, k, dtype=dtype, device=device, scale=max(k, 1) ** -0.5, seed=seeds[2])
    if grad:
        for t in (x, wg, wu):
            t.requires_grad_()
    return x, wg, wu


# --- level 1: the Triton source under the interpreter ---------------------------------

INTERP_CASES = [(style, dtype, shape) for dtype in DTYPES
                for shape in ((37, 45, 70, (16, 16, 32)), (5, 9, 16, (16, 32, 16)))
                for style in ("ptr",)]
# The TMA kernel (16-bit dtypes; descriptors want N, K multiples of 16 bytes / 8 elements)
INTERP_CASES += [("tma", torch.bfloat16, (37, 48, 80, (16, 16, 32))),
                 ("tma", torch.float16, (5, 16, 32, (16, 32, 16)))]
# The persistent TMA kernel: 3 programs over 9 and 2 tiles (several tiles per program, and
# more programs than tiles).
INTERP_CASES += [("persistent", torch.bfloat16, (37, 48, 80, (16, 16, 32))),
                 ("persistent", torch.float16, (5, 16, 32, (16, 32, 16)))]


@pytest.mark.parametrize("style,dtype,shape", INTERP_CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-{c[2][0]}x{c[2][1]}x{c[2][2]}"
                              for c in INTERP_CASES])
@pytest.mark.parametrize("gm,dm", [(1.0, 1.0), (0.6, 1.7)])
def test_interpreter_forward(style, dtype, shape, gm, dm):
    """The plain variants (SCALED 0) and the SCALED ones with Falcon-H1-like multipliers."""
    mod = load_triton_src("swiglu_linear")
    m, n, k, (bm, bn, bk) = shape
    name = mod.kernel_name(style, mod.FLAG_ALIGNED)
    kernel = getattr(mod, name)
    x, wg, wu = _inputs(m, n, k, dtype)
    zr, sr, tr = ref_forward(x, wg, wu, cast=round_toward_zero, gm=gm, dm=dm)
    per_sm = mod.programs_per_sm(style, name)
    assert per_sm == (style == "persistent")
    cx = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, PER_SM=per_sm,
              SCALED=int((gm, dm) != (1.0, 1.0)))
    grid = (3 if per_sm else cdiv(m, bm) * cdiv(n, bn),)
    z, s, t = (torch.full((m, n), float("nan"), dtype=dtype) for _ in range(3))
    # z only, then s and t only (the backward's recompute)
    kernel[grid](x, wg, wu, z, s, t, m, n, k, 1, 0, gm, dm, **cx)
    assert_close(z, zr, dtype, factor=1.5, what="z")
    assert torch.isnan(s).all() and torch.isnan(t).all()
    kernel[grid](x, wg, wu, z, s, t, m, n, k, 0, 1, gm, dm, **cx)
    assert_close(s, sr, dtype, factor=1.5, what="s")
    assert_close(t, tr, dtype, factor=1.5, what="t")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel,block", [(1, 64), (300, 64), (256, 128)])
def test_interpreter_gate_grads(dtype, numel, block):
    """da = dz * t, db = dz * s; into new tensors and over t and s (the in-place form)."""
    mod = load_triton_src("swiglu_linear")
    dz, t, s = (randn(numel, dtype=dtype) for _ in range(3))
    dar = _rnd(dz.double() * t.double(), dtype, round_toward_zero).to(dtype)
    dbr = _rnd(dz.double() * s.double(), dtype, round_toward_zero).to(dtype)
    da, db = torch.full_like(t, float("nan")), torch.full_like(s, float("nan"))
    grid = (cdiv(numel, block),)
    mod.swiglu_linear_gate_grads_kernel[grid](dz, t, s, da, db, numel, BLOCK=block)
    assert torch.equal(da, dar) and torch.equal(db, dbr)
    mod.swiglu_linear_gate_grads_kernel[grid](dz, t, s, t, s, numel, BLOCK=block)
    assert torch.equal(t, dar) and torch.equal(s, dbr)


def test_variants_cover_every_dtype_and_flag():
    mod = load_triton_src("swiglu_linear")
    for arch in (80, 90, 100, 103, 120):
        keys = {(v.family, v.dtype, v.flags) for v in mod.variants(arch)}
        # per dtype: the forward plain / SCALED, each aligned or not; the gate gradients
        assert len(keys) == len(mod.variants(arch)) == 3 * (4 + 2), arch
        for v in mod.variants(arch):
            assert hasattr(mod, v.kernel)
            assert (v.flags & mod.FLAG_ALIGNED == 0) == (v.divisible_by_16 == ())
            # TMA kernels need the aligned flag (16-byte aligned bases and row strides).
            assert "_tma" not in v.kernel or v.flags & mod.FLAG_ALIGNED
            if v.family == "swiglu_linear_fwd":
                assert set(v.constexprs) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M",
                                             "PER_SM", "SCALED"}
                assert v.constexprs["SCALED"] == int(bool(v.flags & mod.FLAG_SCALED))
                # The C++ launcher runs a persistent grid where PER_SM > 0: only the TMA
                # kernel walks several tiles per program.
                assert v.constexprs["PER_SM"] == 0 or "_tma" in v.kernel
        # sm_90's aligned 16-bit forward is the TMA kernel on a persistent grid.
        if arch == 90:
            fwd = [v for v in mod.variants(arch) if v.family == "swiglu_linear_fwd"
                   and v.dtype == "bf16" and v.flags == mod.FLAG_ALIGNED]
            assert [(v.kernel, v.constexprs["PER_SM"]) for v in fwd] == [
                ("swiglu_linear_fwd_tma_kernel", 1)]
            # No warp-specialized kernel ships (NaN at several configs on the H200).
            assert "_ws" not in v.kernel


# --- level 2: the CPU backend against the reference --------------------------------------

CPU_CASES = [((1,), 1, 1), ((7,), 17, 33), ((2, 3), 40, 24), ((4, 5, 2), 9, 64)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("lead,n,k", CPU_CASES)
@pytest.mark.parametrize("recompute", [False, True])
def test_cpu_forward_backward(dtype, lead, n, k, recompute):
    x, wg, wu = _inputs(None, n, k, dtype, lead=lead, grad=True)
    z = fk.swiglu_linear(x, wg, wu, recompute)
    assert z.dtype == dtype and z.shape == (*lead, n) and z.is_contiguous()
    zr, _, _ = ref_forward(x, wg, wu)
    assert_close(z, zr, dtype, what="z")
    dz = randn(*lead, n, dtype=dtype)
    z.backward(dz)
    for got, ref, name in zip((x.grad, wg.grad, wu.grad), ref_backward(dz, x, wg, wu),
                              ("dx", "dwg", "dwu")):
        assert got.dtype == dtype and got.shape == ref.shape
        assert_close(got, ref, dtype, factor=1.5, what=name)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("gm,dm", [(0.6, 1.7), (2.5, 1.0), (1.0, 0.25)])
@pytest.mark.parametrize("recompute", [False, True])
def test_cpu_multipliers(dtype, gm, dm, recompute):
    lead, n, k = (2, 3), 40, 24
    x, wg, wu = _inputs(None, n, k, dtype, lead=lead, grad=True, seed=4)
    z = fk.swiglu_linear(x, wg, wu, recompute, gate_multiplier=gm, down_multiplier=dm)
    zr, _, _ = ref_forward(x, wg, wu, gm=gm, dm=dm)
    assert_close(z, zr, dtype, what="z")
    dz = randn(*lead, n, dtype=dtype, seed=7)
    z.backward(dz)
    refs = ref_backward(dz, x, wg, wu, gm=gm, dm=dm)
    for got, ref, name in zip((x.grad, wg.grad, wu.grad), refs, ("dx", "dwg", "dwu")):
        assert_close(got, ref, dtype, factor=1.5, what=name)
    if dtype == torch.float32:  # and against plain autograd of the definition
        want = ref_grads(_scaled_half(gm, dm), [x, wg, wu], dz)
        for got, ref in zip((x.grad, wg.grad, wu.grad), want):
            assert_close(got, ref, torch.float32, factor=2)


def test_multipliers_gradcheck_opcheck_and_compile():
    x, wg, wu = _inputs(4, 6, 5, torch.float64, grad=True, seed=1)
    for recompute in (False, True):
        assert torch.autograd.gradcheck(
            lambda x, wg, wu: fk.swiglu_linear(x, wg, wu, recompute, 0.6, 1.7), (x, wg, wu))
    xf, wgf, wuf = _inputs(4, 6, 5, grad=True, seed=2)
    # The internal forward's checks as in test_opcheck (its backward writes over its saved
    # outputs); the public op gets every check.
    torch.library.opcheck(torch.ops.fk._swiglu_linear_forward,
                          (xf.detach(), wgf.detach(), wuf.detach(), [True, True], 0.6, 1.7),
                          test_utils=("test_schema", "test_faketensor"))
    for recompute in (False, True):
        torch.library.opcheck(torch.ops.fk.swiglu_linear,
                              (xf, wgf, wuf, recompute, 2.5, 0.25))

    def f(x, wg, wu):
        return fk.swiglu_linear(x, wg, wu, gate_multiplier=0.6, down_multiplier=1.7)

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(xf, wgf, wuf)
    assert_close(out, _scaled_half(0.6, 1.7)(xf, wgf, wuf), torch.float32)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_fused_mlp_matches_falcon_h1_mlp(bias, recompute):
    """fk.nn.FusedSwiGLUMLP with the multipliers against Hugging Face's FalconH1MLP."""
    falcon = pytest.importorskip("transformers.models.falcon_h1.modeling_falcon_h1")
    from transformers import FalconH1Config
    config = FalconH1Config(hidden_size=32, intermediate_size=48, mlp_bias=bias,
                            hidden_act="silu", mlp_multipliers=[0.6, 1.7])
    torch.manual_seed(0)
    ref = falcon.FalconH1MLP(config)
    mlp = fk.nn.FusedSwiGLUMLP(32, 48, bias=bias, recompute=recompute, gate_multiplier=0.6,
                               down_multiplier=1.7)
    mlp.load_state_dict(ref.state_dict())
    x = randn(3, 5, 32, seed=3).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    out, want = mlp(x), ref(x2)
    assert_close(out, want, torch.float32, factor=10)
    out.pow(2).sum().backward()
    want.pow(2).sum().backward()
    assert_close(x.grad, x2.grad, torch.float32, factor=10)
    for (name, p), q in zip(mlp.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, torch.float32, factor=10, what=name)


def test_cpu_matches_unrounded_autograd_in_fp32():
    """Against plain torch autograd of the unfused definition (no intermediate rounding)."""
    x, wg, wu = _inputs(6, 20, 48, grad=True)
    dz = randn(6, 20)
    z = fk.swiglu_linear(x, wg, wu)
    z.backward(dz)
    assert_close(z, _mlp_half(x, wg, wu), torch.float32)
    for got, ref in zip((x.grad, wg.grad, wu.grad), ref_grads(_mlp_half, [x, wg, wu], dz)):
        assert_close(got, ref, torch.float32, factor=2)


def test_cpu_recompute_gives_identical_gradients():
    grads = []
    for recompute in (False, True):
        x, wg, wu = _inputs(5, 12, 16, torch.bfloat16, grad=True, seed=3)
        fk.swiglu_linear(x, wg, wu, recompute).pow(2).sum().backward()
        grads.append((x.grad, wg.grad, wu.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def _saved_numels(recompute):
    x, wg, wu = _inputs(6, 10, 8, grad=True)
    numels = []

    def pack(t):
        numels.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fk.swiglu_linear(x, wg, wu, recompute)
    return sorted(numels)


def test_recompute_saves_only_the_inputs():
    # x (6 x 8) and the two weights (10 x 8); without recompute also s and t (6 x 10).
    assert _saved_numels(True) == [48, 80, 80]
    assert _saved_numels(False) == [48, 60, 60, 80, 80]


class _Calls(TorchDispatchMode):
    """Records the fk ops and matrix products a region dispatches."""

    def __init__(self):
        super().__init__()
        self.calls, self.args = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace == "fk" or name in ("mm", "addmm", "addmm_", "matmul"):
            self.calls.append(name)
            self.args.append(args)
        return func(*args, **(kwargs or {}))


# (needs grad: x, w_gate, w_up) -> the products the backward runs
NEEDS = [((True, False, False), ["mm", "addmm_"]), ((False, True, True), ["mm", "mm"]),
         ((False, True, False), ["mm"]), ((False, False, True), ["mm"]),
         ((True, True, True), ["mm", "addmm_", "mm", "mm"])]


@pytest.mark.parametrize("needs,products", NEEDS)
def test_only_needed_gradients_are_computed(needs, products):
    x, wg, wu = _inputs(4, 6, 8)
    for t, need in zip((x, wg, wu), needs):
        t.requires_grad_(need)
    z = fk.swiglu_linear(x, wg, wu)
    with _Calls() as mode:
        z.sum().backward()
    assert [c for c in mode.calls if not c.startswith("_swiglu")] == products
    assert [c for c in mode.calls if c.startswith("_swiglu")] == ["_swiglu_linear_gate_grads_"]
    for t, need in zip((x, wg, wu), needs):
        assert (t.grad is not None) == need


def _gate_grad_ops(retain_graph, recompute=False, dtype=torch.float32):
    x, wg, wu = _inputs(5, 12, 16, dtype, grad=True, seed=7)
    z = fk.swiglu_linear(x, wg, wu, recompute)
    dz = randn(5, 12, dtype=dtype, seed=8)
    with _Calls() as mode:
        z.backward(dz, retain_graph=retain_graph)
    grads = [t.grad.clone() for t in (x, wg, wu)]
    return z, dz, (x, wg, wu), grads, [c for c in mode.calls if c.startswith("_swiglu")]


@pytest.mark.parametrize("recompute", [False, True])
def test_backward_writes_over_the_saved_factors_only_when_nothing_reads_them_again(recompute):
    # Without retain_graph the gate gradients go into the saved s, t (the in-place op);
    # the graph is freed, so a second backward fails as for any torch op.
    z, dz, _, grads, ops = _gate_grad_ops(False, recompute)
    assert ops[-1] == "_swiglu_linear_gate_grads_"
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        z.backward(dz)
    # With retain_graph, new tensors: a second backward reads intact s, t and gives the
    # same gradients again (accumulated: twice the first).
    z2, dz2, inputs, grads2, ops2 = _gate_grad_ops(True, recompute)
    assert ops2[-1] == "_swiglu_linear_gate_grads"
    for g, g2 in zip(grads, grads2):
        assert torch.equal(g, g2)
    z2.backward(dz2)
    for t, g in zip(inputs, grads2):
        assert torch.equal(t.grad, 2 * g)


def test_overwritten_factors_fail_loudly_if_read_again():
    # Anything else holding the saved s (here through a saved-tensor hook) and reading it
    # after the backward wrote db over it fails the saved-variable version check.
    x, wg, wu = _inputs(5, 12, 16, grad=True)
    held = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: held.append(t) or t, lambda t: t):
        z = fk.swiglu_linear(x, wg, wu)
    s = [t for t in held if t.shape == (5, 12)][0]
    y = (torch.ones(5, 12, requires_grad=True) * s).sum()  # saves s
    z.backward(randn(5, 12))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_no_grad_forward_keeps_nothing():
    x, wg, wu = _inputs(4, 6, 8, grad=True)
    with _Calls() as mode, torch.no_grad():
        z = fk.swiglu_linear(x, wg, wu)
    assert not z.requires_grad
    (args,) = [a for c, a in zip(mode.calls, mode.args) if c == "_swiglu_linear_forward"]
    assert list(args[-1]) == [True, False]
    assert_close(z, ref_forward(x, wg, wu)[0], torch.float32)


def test_cpu_non_contiguous():
    x = randn(24, 7).t()                 # (7, 24), not contiguous
    wg = randn(24, 10).t()               # (10, 24)
    wu = randn(10, 48)[:, ::2]           # (10, 24)
    assert not (x.is_contiguous() or wg.is_contiguous() or wu.is_contiguous())
    assert_close(fk.swiglu_linear(x, wg, wu), ref_forward(x, wg, wu)[0], torch.float32)


@pytest.mark.parametrize("m,n,k", [(0, 5, 8), (3, 0, 8), (3, 5, 0)])
def test_cpu_empty(m, n, k):
    x, wg, wu = _inputs(m, n, k, grad=True)
    z = fk.swiglu_linear(x, wg, wu)
    assert z.shape == (m, n)
    assert torch.equal(z, torch.zeros(m, n))       # k == 0: silu(0) * 0
    z.sum().backward()
    assert x.grad.shape == (m, k) and wg.grad.shape == (n, k)
    assert not x.grad.any() and not wg.grad.any() and not wu.grad.any()


def test_cpu_nan_inf_propagate():
    x, wg, wu = _inputs(3, 4, 8)
    x[1, 2] = float("nan")
    x[2, 0] = float("inf")
    # Row 2's gate is +inf where wg[:, 0] > 0 (silu(+inf) * up = +-inf) and -inf
    # elsewhere (silu(-inf) = -inf * 0 = nan): fix the signs so that both occur.
    wg[:, 0] = wg[:, 0].abs() * torch.tensor([1.0, -1.0, 1.0, -1.0])
    z = fk.swiglu_linear(x, wg, wu)
    ref = _mlp_half(x, wg, wu)
    assert torch.equal(torch.isnan(z), torch.isnan(ref))
    assert torch.isnan(z[1]).all() and not torch.isnan(z[0]).any()
    assert torch.isnan(z[2, 1::2]).all()
    assert torch.equal(torch.isinf(z), torch.isinf(ref)) and torch.isinf(z[2, 0::2]).all()
    assert torch.equal(z[torch.isinf(ref)], ref[torch.isinf(ref)])
    ok = torch.isfinite(ref)
    assert_close(z[ok], ref[ok], torch.float32)


# --- bad input: the same message from every backend -----------------------------------

def _w(d, *shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("dtypes differ", lambda d: (_w(d, 2, 8), _w(d, 4, 8, dtype=torch.float16), _w(d, 4, 8)),
     "must have the same dtype"),
    ("K mismatch", lambda d: (_w(d, 2, 8), _w(d, 4, 7), _w(d, 4, 7)), "w_gate must have shape"),
    ("1-d weight", lambda d: (_w(d, 2, 8), _w(d, 8), _w(d, 8)), "w_gate must have shape"),
    ("up shape", lambda d: (_w(d, 2, 8), _w(d, 4, 8), _w(d, 5, 8)), "must have the same shape"),
    ("int dtype", lambda d: (_w(d, 2, 8, dtype=torch.int32),) * 3, "not supported"),
    ("scalar", lambda d: (_w(d), _w(d, 4, 1), _w(d, 4, 1)), "at least one dimension"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.swiglu_linear(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta
    assert cpu.startswith("fk::swiglu_linear: ")


@pytest.mark.parametrize("gm,dm,name", [(float("inf"), 1.0, "gate_multiplier"),
                                         (1.0, float("nan"), "down_multiplier")])
def test_bad_multipliers_cpu_and_meta_agree(gm, dm, name):
    msg = f"fk::swiglu_linear: {name} must be finite"
    for grad in (False, True):
        cpu, meta = error_lines(
            lambda d: fk.swiglu_linear(_w(d, 2, 8).requires_grad_(grad), _w(d, 4, 8), _w(d, 4, 8),
                                       gate_multiplier=gm, down_multiplier=dm),
            ("cpu", "meta"), msg)
        assert cpu == meta


def test_bad_gate_grads_input_cpu_and_meta_agree():
    def call(d):
        return torch.ops.fk._swiglu_linear_gate_grads(_w(d, 3, 5), _w(d, 3, 4), _w(d, 3, 4))
    cpu, meta = error_lines(call, ("cpu", "meta"), "must have the same shape")
    assert cpu == meta and cpu.startswith("fk::_swiglu_linear_gate_grads: ")

    def call_(d):
        t = _w(d, 3, 4)
        return torch.ops.fk._swiglu_linear_gate_grads_(_w(d, 3, 4), t, t)
    cpu, meta = error_lines(call_, ("cpu", "meta"), "must not share memory")
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.swiglu_linear(torch.ones(2, 8), torch.ones(4, 8, device="meta"), torch.ones(4, 8))


def test_meta_shapes_are_symbolic_friendly():
    x = torch.empty(2, 3, 8, device="meta", dtype=torch.bfloat16)
    w = torch.empty(5, 8, device="meta", dtype=torch.bfloat16)
    z, s, t = torch.ops.fk._swiglu_linear_forward(x, w, w, [True, True])
    assert z.shape == s.shape == t.shape == (2, 3, 5) and z.dtype == torch.bfloat16
    z, s, t = torch.ops.fk._swiglu_linear_forward(x, w, w, [True, False])
    assert s is None and t is None


# --- modules ----------------------------------------------------------------------------

class _HFLlamaMLP(torch.nn.Module):
    """What Hugging Face's LlamaMLP computes, with its parameter names (bias=mlp_bias)."""

    def __init__(self, hidden, inter, bias=False):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inter, bias=bias)
        self.up_proj = torch.nn.Linear(hidden, inter, bias=bias)
        self.down_proj = torch.nn.Linear(inter, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_mlp_module_loads_hf_state_dict_and_matches(bias, recompute):
    torch.manual_seed(0)
    hf = _HFLlamaMLP(32, 80, bias)
    mlp = fk.nn.FusedSwiGLUMLP(32, 80, bias=bias, recompute=recompute)
    assert set(mlp.state_dict()) == set(hf.state_dict())
    mlp.load_state_dict(hf.state_dict())
    x = randn(2, 5, 32).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, yr = mlp(x), hf(x2)
    assert_close(y, yr, torch.float32, factor=2)
    dy = randn(2, 5, 32)
    y.backward(dy)
    yr.backward(dy)
    assert_close(x.grad, x2.grad, torch.float32, factor=5)
    for (name, p), pr in zip(mlp.named_parameters(), hf.parameters()):
        assert_close(p.grad, pr.grad, torch.float32, factor=5, what=name)


def test_fused_swiglu_module():
    m = fk.nn.FusedSwiGLU(16, 24)
    assert m.gate_proj.weight.shape == (24, 16) and m.gate_proj.bias is None
    x = randn(3, 16)
    assert_close(m(x), _mlp_half(x, m.gate_proj.weight, m.up_proj.weight), torch.float32)
    assert "recompute=False" in repr(m)


def test_modules_script_save_load():
    torch.manual_seed(1)
    for mod in (fk.nn.FusedSwiGLUMLP(16, 40), fk.nn.FusedSwiGLUMLP(16, 40, bias=True),
                fk.nn.FusedSwiGLU(16, 40, recompute=True)):
        scripted = torch.jit.script(mod)
        buf = io.BytesIO()
        torch.jit.save(scripted, buf)
        buf.seek(0)
        loaded = torch.jit.load(buf)
        x = randn(3, 16).requires_grad_()
        y = loaded(x)
        assert_close(y, mod(x), torch.float32)
        y.sum().backward()
        assert x.grad is not None


def test_functional_scripts():
    @torch.jit.script
    def f(x, wg, wu):
        return fk.swiglu_linear(x, wg, wu) + torch.ops.fk.swiglu_linear(x, wg, wu, True)

    x, wg, wu = _inputs(3, 5, 8)
    assert_close(f(x, wg, wu), 2 * ref_forward(x, wg, wu)[0], torch.float32)


# --- level 3: autograd, opcheck, torch.compile ---------------------------------------------

@pytest.mark.parametrize("recompute", [False, True])
def test_gradcheck(recompute):
    x, wg, wu = _inputs(None, 4, 5, torch.float64, lead=(2, 3), grad=True)
    assert torch.autograd.gradcheck(lambda *a: fk.swiglu_linear(*a, recompute), (x, wg, wu))


def test_double_backward_is_a_clear_error():
    x, wg, wu = _inputs(3, 4, 5, grad=True)
    (gx,) = torch.autograd.grad(fk.swiglu_linear(x, wg, wu).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


def test_opcheck():
    x, wg, wu = _inputs(None, 6, 16, lead=(2, 3), grad=True)
    torch.library.opcheck(torch.ops.fk.swiglu_linear, (x, wg, wu, False))
    torch.library.opcheck(torch.ops.fk.swiglu_linear, (x, wg, wu, True))
    xd, wgd, wud = x.detach(), wg.detach(), wu.detach()
    torch.library.opcheck(torch.ops.fk.swiglu_linear, (xd, wgd, wud))
    torch.library.opcheck(torch.ops.fk._swiglu_linear_forward, (xd, wgd, wud, [True, True]),
                          test_utils=("test_schema", "test_faketensor"))
    _, s, t = torch.ops.fk._swiglu_linear_forward(xd, wgd, wud, [False, True])
    dz = randn(2, 3, 6)
    for op in (torch.ops.fk._swiglu_linear_gate_grads, torch.ops.fk._swiglu_linear_gate_grads_):
        torch.library.opcheck(op, (dz, t.clone(), s.clone()),
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def mlp(x, wg, wu, wd):
        return fk.swiglu_linear(x, wg, wu) @ wd.T

    torch._dynamo.reset()
    compiled = torch.compile(mlp, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        args = [*_inputs(rows, 24, 16, grad=True), randn(16, 24).requires_grad_()]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args)
        ref = mlp(*eager_args)
        assert_close(out, ref, torch.float32, factor=2)
        out.sum().backward()
        ref.sum().backward()
        for a, b in zip(args, eager_args):
            assert_close(a.grad, b.grad, torch.float32, factor=2)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# (leading dims, N, K): one row, odd sizes that are not multiples of any tile, sizes below
# one tile, aligned sizes (the fast variants), and a Llama-like width.
CUDA_CASES = [((1,), 1, 1), ((1,), 17, 33), ((37,), 45, 70), ((3, 43), 129, 200),
              ((130,), 257, 16), ((257,), 96, 512), ((300,), 1000, 4096), ((2, 128), 1376, 512)]


def _cuda_check(dtype, lead, n, k, recompute=False, needs=(True, True, True), gm=1.0, dm=1.0):
    x, wg, wu = _inputs(None, n, k, dtype, device="cuda", lead=lead)
    for t, need in zip((x, wg, wu), needs):
        t.requires_grad_(need)
    poison_cuda_cache()
    z = fk.swiglu_linear(x, wg, wu, recompute, gm, dm)
    assert not torch.isnan(z).any(), "unwritten output elements"
    assert_close(z, ref_forward(x, wg, wu, gm=gm, dm=dm)[0], dtype, factor=1.5, what="z")
    dz = randn(*lead, n, dtype=dtype, device="cuda")
    poison_cuda_cache()
    z.backward(dz)
    refs = ref_backward(dz, x, wg, wu, gm=gm, dm=dm)
    for t, need, ref, name in zip((x, wg, wu), needs, refs, ("dx", "dwg", "dwu")):
        if not need:
            assert t.grad is None
            continue
        assert not torch.isnan(t.grad).any(), f"unwritten {name} elements"
        assert_close(t.grad, ref, dtype, factor=2, what=name)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n,k", CUDA_CASES)
def test_cuda_matches_reference(dtype, lead, n, k):
    _cuda_check(dtype, lead, n, k)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,n,k", CUDA_CASES)
def test_cuda_multipliers(dtype, lead, n, k):
    """The SCALED variants (pointer and TMA kernels, aligned or not), with recompute."""
    _cuda_check(dtype, lead, n, k, gm=0.6, dm=1.7)
    _cuda_check(dtype, lead, n, k, recompute=True, gm=2.5, dm=0.25)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_recompute_and_frozen(dtype):
    _cuda_check(dtype, (77,), 300, 136, recompute=True)
    _cuda_check(dtype, (77,), 300, 136, needs=(True, False, False))
    _cuda_check(dtype, (77,), 300, 136, needs=(False, True, True))
    _cuda_check(dtype, (77,), 300, 136, recompute=True, needs=(False, False, True))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_non_contiguous(dtype):
    x, wg, wu = _inputs(50, 96, 64, dtype, device="cuda")
    xm, wgm, wum = misaligned(x), misaligned(wg), misaligned(wu)
    assert_close(fk.swiglu_linear(xm, wgm, wum), ref_forward(x, wg, wu)[0], dtype, factor=1.5)
    xt = x.t().contiguous().t()
    assert not xt.is_contiguous()
    assert_close(fk.swiglu_linear(xt, wg, wu), ref_forward(x, wg, wu)[0], dtype, factor=1.5)
    xm.requires_grad_()
    wgm.requires_grad_()
    dz = randn(50, 96, dtype=dtype, device="cuda")
    fk.swiglu_linear(xm, wgm, wum).backward(dz)
    dxr, dwgr, _ = ref_backward(dz, x, wg, wu)
    assert_close(xm.grad, dxr, dtype, factor=2)
    assert_close(wgm.grad, dwgr, dtype, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recompute", [False, True])
def test_cuda_backward_in_place_and_retained(dtype, recompute):
    # The backward's two ways to hold the gate gradients (over the saved factors; new
    # memory when the graph is retained) give the same gradients, and a retained graph
    # gives them again in a second backward.
    lead, n, k = (3, 41), 200, 136
    x, wg, wu = _inputs(None, n, k, dtype, device="cuda", lead=lead, grad=True, seed=11)
    dz = randn(*lead, n, dtype=dtype, device="cuda", seed=12)
    grads = []
    for retain in (False, True):
        for t in (x, wg, wu):
            t.grad = None
        z = fk.swiglu_linear(x, wg, wu, recompute)
        z.backward(dz, retain_graph=retain)
        grads.append([t.grad.clone() for t in (x, wg, wu)])
    for a, b, ref, name in zip(*grads, ref_backward(dz, x, wg, wu), ("dx", "dwg", "dwu")):
        assert torch.equal(a, b), name
        assert_close(a, ref, dtype, factor=2, what=name)
    z.backward(dz)
    for t, g in zip((x, wg, wu), grads[1]):
        assert_close(t.grad, 2 * g.float(), dtype, factor=2)


@pytest.mark.cuda
def test_cuda_backward_allocates_no_gate_gradients():
    # Without retain_graph, da and db are written over s and t: the backward's peak stays
    # below the retained-graph backward's by about their size (2 x M x N elements).
    m, n, k = 2048, 4096, 256
    x, wg, wu = _inputs(m, n, k, torch.bfloat16, device="cuda", grad=True)
    dz = randn(m, n, dtype=torch.bfloat16, device="cuda")
    fk.swiglu_linear(x, wg, wu).backward(dz)  # cuBLAS workspaces allocated before measuring
    peaks = []
    for retain in (False, True):
        for t in (x, wg, wu):
            t.grad = None
        z = fk.swiglu_linear(x, wg, wu)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        z.backward(dz, retain_graph=retain)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del z
    gate_bytes = 2 * m * n * 2
    assert peaks[1] - peaks[0] >= 0.9 * gate_bytes, peaks


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.swiglu_linear(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        w = torch.ones(4, 8, dtype=torch.float64, device="cuda")
        fk.swiglu_linear(torch.ones(2, 8, dtype=torch.float64, device="cuda"), w, w)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.swiglu_linear(torch.ones(2, 8, device="cuda"), torch.ones(4, 8), torch.ones(4, 8))


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", [(0, 5, 8), (3, 0, 8), (3, 5, 0)])
def test_cuda_empty(m, n, k):
    x, wg, wu = _inputs(m, n, k, device="cuda", grad=True)
    z = fk.swiglu_linear(x, wg, wu)
    assert z.shape == (m, n) and not z.any()
    z.sum().backward()
    assert x.grad.shape == (m, k) and not x.grad.any() and not wg.grad.any()


@pytest.mark.cuda
def test_cuda_opcheck_and_compile():
    x, wg, wu = _inputs(None, 24, 32, device="cuda", lead=(2, 5), grad=True)
    torch.library.opcheck(torch.ops.fk.swiglu_linear, (x, wg, wu, False))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda x, wg, wu: fk.swiglu_linear(x, wg, wu).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, wg, wu).backward()
    assert x.grad is not None and wg.grad is not None and wu.grad is not None


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_mlp_module(dtype):
    torch.manual_seed(0)
    hf = _HFLlamaMLP(256, 688).to("cuda", dtype)
    mlp = fk.nn.FusedSwiGLUMLP(256, 688).to("cuda", dtype)
    mlp.load_state_dict(hf.state_dict())
    x = randn(3, 67, 256, dtype=dtype, device="cuda").requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    dy = randn(3, 67, 256, dtype=dtype, device="cuda")
    mlp(x).backward(dy)
    y64 = _HFLlamaMLP(256, 688).double().cuda()
    y64.load_state_dict(hf.state_dict())
    y64(x2.double()).backward(dy.double())
    assert_close(x.grad, x2.grad, dtype, factor=3)
    for (name, p), pr in zip(mlp.named_parameters(), y64.parameters()):
        assert_close(p.grad, pr.grad, dtype, factor=3, what=name)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    # x and dx past 2^31 elements (M * K), and z, s, t past 2^31 (M * N) in a second call.
    def big(*shape, scale=1.0):  # drawn on the GPU: 2^31 normals on the CPU take long
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale
        return t.requires_grad_()

    torch.manual_seed(0)
    k, n = 4096, 48
    m = (1 << 31) // k + 67
    x, wg, wu = big(m, k), big(n, k, scale=k ** -0.5), big(n, k, scale=k ** -0.5)
    z = fk.swiglu_linear(x, wg, wu)
    dz = torch.randn_like(z)
    z.backward(dz)
    rows = torch.cat([torch.arange(0, 64), torch.arange(m - 64, m)]).cuda()
    zr = ref_forward(x[rows], wg, wu)[0]
    assert_close(z[rows], zr, torch.bfloat16, factor=1.5)
    dxr = ref_backward(dz[rows], x[rows], wg, wu)[0]
    assert_close(x.grad[rows], dxr, torch.bfloat16, factor=2)
    # dW over all rows: the same products in float32 from the factors the forward stored.
    _, s, t = torch.ops.fk._swiglu_linear_forward(x.detach(), wg.detach(), wu.detach(),
                                                  [False, True])
    da = (dz.float() * t.float()).bfloat16().float()
    assert_close(wg.grad, (da.T @ x.detach().float()).bfloat16(), torch.bfloat16, factor=2)
    del x, z, dz, s, t, da
    torch.cuda.empty_cache()
    m2, n2, k2 = (1 << 31) // 14336 + 67, 14336, 64
    x, wg, wu = big(m2, k2), big(n2, k2, scale=k2 ** -0.5), big(n2, k2, scale=k2 ** -0.5)
    with torch.no_grad():
        z = fk.swiglu_linear(x, wg, wu)
    for sl in (slice(0, 8), slice(m2 - 8, m2)):
        assert_close(z[sl], ref_forward(x[sl], wg, wu)[0], torch.bfloat16, factor=1.5)
    del x, z
    torch.cuda.empty_cache()
