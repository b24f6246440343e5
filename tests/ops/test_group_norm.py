"""fk.group_norm at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, the module, and the CUDA kernels (marker
``cuda``)."""
import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, round_nearest, round_toward_zero)


def _ref_forward(x, weight, bias, groups, eps):
    """GroupNorm from its definition on float64 tensors (any of weight / bias may be None)."""
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = (xg - mean).pow(2).mean(-1, keepdim=True)
    y = ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def ref_group_norm(x, weight, bias, groups, eps=1e-6, cast=round_nearest):
    """GroupNorm in float64, rounded once to x's dtype with `cast`."""
    d = [None if t is None else t.double() for t in (weight, bias)]
    y = _ref_forward(x.double(), d[0], d[1], groups, eps)
    return y if x.dtype == torch.float64 else cast(y.float(), x.dtype)


def ref_grads(x, weight, bias, groups, dy, eps=1e-6):
    """Gradients (dx, dweight, dbias) in float64 by autograd (None for absent parameters)."""
    leaves = [None if t is None else t.detach().double().requires_grad_()
              for t in (x, weight, bias)]
    _ref_forward(leaves[0], leaves[1], leaves[2], groups, eps).backward(dy.double())
    return [None if t is None else t.grad for t in leaves]


def _params(c, pdt, device="cpu", which="wb"):
    w = randn(c, dtype=pdt, device=device) * 0.5 + 1.0 if "w" in which else None
    b = randn(c, dtype=pdt, device=device) if "b" in which else None
    return w, b


def _check_grads(x, w, b, groups, dy, got, dtype, pdt, eps=1e-6):
    gx, gw, gb = ref_grads(x, w, b, groups, dy, eps)
    # Groups of a few elements: dx is a cancellation of terms of rstd * dy's size.
    group = x[0].numel() // groups if x.shape[0] else 1
    scale = None
    if group <= 4 and x.numel():
        var = x.double().reshape(x.shape[0], groups, -1).var(-1, unbiased=False)
        scale = dy.double().norm().item() * (var + eps).rsqrt().max().item()
    assert_close(got[0], gx, dtype, factor=4, what="dx", scale=scale)
    s = dy.double().norm().item()
    if w is not None:
        assert got[1].dtype == pdt and got[1].shape == w.shape
        assert_close(got[1], gw, pdt, factor=3, what="dweight", scale=s)
    if b is not None:
        assert got[2].dtype == pdt and got[2].shape == b.shape
        assert_close(got[2], gb, pdt, factor=3, what="dbias", scale=s)


# --- level 1: the Triton source under the interpreter ---------------------------------

def _check_forward(x, w, b, groups, eps, dtype, y, mean, rstd):
    """A forward kernel's y, mean and rstd against the float64 reference; returns x's groups
    in float64, (n, groups, group size)."""
    assert_close(y, ref_group_norm(x, w, b, groups, eps, cast=round_toward_zero), dtype,
                 factor=2, what="y")
    xg = x.double().reshape(x.shape[0], groups, -1)
    assert_close(mean, xg.mean(-1), torch.float32, what="mean")
    assert_close(rstd, 1 / torch.sqrt(xg.var(-1, unbiased=False) + eps), torch.float32,
                 factor=10, what="rstd")
    return xg


_INTERPRETER_CASES = [
    ((3, 6, 5), 2, 2, 4, "wb", 2), ((3, 6, 5), 2, 2, 4, "wb", 4), ((2, 4, 16), 1, 4, 16, "", 2),
    ((3, 8), 2, 4, 1, "wb", 2), ((3, 8), 2, 4, 1, "wb", 6), ((2, 32, 12), 2, 4, 8, "wb", 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups,block_c,block_hw,which,programs,prefetch", [
    case + (prefetch,) for case in _INTERPRETER_CASES for prefetch in (0, 1)
    # The prefetching backward is built for Cg a multiple of BLOCK_C only.
    if not prefetch or case[0][1] // case[1] % case[2] == 0])
def test_interpreter(dtype, shape, groups, block_c, block_hw, which, programs, prefetch):
    """Programs own every programs-th group; their counts differ where programs does not
    divide the groups (4 programs over 6), and a program of one group has no overlap. The
    backward runs both forms (PREFETCH: each pass's next tile loaded first), over groups of
    several channel blocks and position tiles, the last position tile partly masked."""
    mod = load_triton_src("group_norm")
    n, c = shape[:2]
    hw = shape[2] if len(shape) > 2 else 1
    cg, eps = c // groups, 1e-6
    x, dy = randn(*shape, dtype=dtype) + 3.0, randn(*shape, dtype=dtype)
    w, b = _params(c, torch.float32, which=which)
    stats = torch.full((n, groups), float("nan"))
    wa = w if w is not None else stats
    ba = b if b is not None else stats
    y = torch.full_like(x, float("nan"))
    mean, rstd = stats.clone(), stats.clone()
    mod.group_norm_fwd_kernel[(programs,)](x, wa, ba, y, mean, rstd, n * groups, groups, cg,
                                           hw, eps, int(w is not None), int(b is not None),
                                           BLOCK_C=block_c, BLOCK_HW=block_hw)
    xg = _check_forward(x, w, b, groups, eps, dtype, y, mean, rstd)
    dx = torch.full_like(x, float("nan"))
    partial = torch.full((2, n * c), float("nan"))
    mod.group_norm_bwd_kernel[(programs,)](dy, x, wa, mean, rstd, dx, partial, n * groups,
                                           groups, cg, hw, int(w is not None), 1,
                                           BLOCK_C=block_c, BLOCK_HW=block_hw,
                                           PREFETCH=prefetch)
    gx = ref_grads(x, w, b, groups, dy, eps)[0]
    small = (dy.double().norm().item() * rstd.max().item()) if c // groups * hw <= 4 else None
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=4, what="dx",
                 scale=small)
    dw, db = torch.full((c,), float("nan")), torch.full((c,), float("nan"))
    mod.group_norm_reduce_kernel[(cdiv(c, 4),)](partial, dw, db, n, c, 1, 1, BLOCK_B=2,
                                                BLOCK_C=4)
    s = dy.double().norm().item()
    xhat = ((xg - xg.mean(-1, keepdim=True)) * rstd.double()[..., None]).reshape(n, c, -1)
    assert_close(dw, (dy.double().reshape(n, c, -1) * xhat).sum((0, 2)), torch.float32,
                 factor=3, scale=s, what="dweight")
    assert_close(db, dy.double().reshape(n, c, -1).sum((0, 2)), torch.float32, factor=3,
                 scale=s, what="dbias")
    # want_dx = 0: the same partial sums, dx never written.
    skipped = torch.full_like(x, float("nan"))
    partial2 = torch.full((2, n * c), float("nan"))
    mod.group_norm_bwd_kernel[(programs,)](dy, x, wa, mean, rstd, skipped, partial2, n * groups,
                                           groups, cg, hw, int(w is not None), 0,
                                           BLOCK_C=block_c, BLOCK_HW=block_hw,
                                           PREFETCH=prefetch)
    assert torch.isnan(skipped).all()
    assert torch.equal(partial2, partial)


class _ClusterSums:
    """Stands in for _common.cluster_sums under the interpreter, which runs programs one
    after another, so a program cannot wait for the rest of its cluster: each call keeps the
    caller's (a, b) under (key, rank) and returns the sums over ranks 0 .. n - 1 in rank order
    from 0.0, as the hardware form adds them (NaN while a rank's pair is not kept yet: the
    kernels run twice, the second run reading the first run's pairs)."""

    def __init__(self):
        self.kept = {}

    def __call__(self, a, b, key, rank, n):
        import triton.language as tl

        def num(t, kind):
            return kind(t.handle.data.item()) if hasattr(t, "handle") else kind(t)

        k, r, n = num(key, int), num(rank, int), num(n, int)
        self.kept[k, r] = (num(a, float), num(b, float))
        sums = [0.0, 0.0]
        for j in range(n):
            pair = self.kept.get((k, j), (float("nan"),) * 2)
            sums = [sums[0] + pair[0], sums[1] + pair[1]]
        return tl.full([], sums[0], tl.float32), tl.full([], sums[1], tl.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", ["x", "fp32", "none"])
@pytest.mark.parametrize("shape,groups,block_c", [((3, 8, 8), 2, 2), ((2, 12, 4), 2, 2),
                                                  ((2, 8, 16), 1, 1), ((1, 4, 32), 2, 2)])
def test_interpreter_cluster(dtype, params, shape, groups, block_c, monkeypatch):
    """The cluster kernels: a group of Cg = cl * BLOCK_C channels and HW = BLOCK_HW positions
    split over cl programs (2, 3, 8 and 1), one (BLOCK_C, HW) tile each, their sums met in an
    emulation of the cluster (_ClusterSums); weight and bias read in x's dtype (has 1), in
    float32 (has 2) or absent; dx skipped with want_dx = 0."""
    mod = load_triton_src("group_norm")
    monkeypatch.setattr(mod, "cluster_sums", _ClusterSums())
    monkeypatch.setattr(mod, "cluster_arrive", lambda rank: rank)
    n, c, hw = shape
    cg, eps = c // groups, 1e-6
    cl = cg // block_c
    pdt = torch.float32 if params == "fp32" else dtype
    has = {"x": 1, "fp32": 2, "none": 0}[params]
    x, dy = randn(*shape, dtype=dtype) + 3.0, randn(*shape, dtype=dtype)
    w, b = _params(c, pdt, which="" if params == "none" else "wb")
    stats = torch.full((n, groups), float("nan"))
    wa = w if w is not None else stats
    ba = b if b is not None else stats
    y = torch.full_like(x, float("nan"))
    mean, rstd = stats.clone(), stats.clone()
    for _ in range(2):
        mod.group_norm_fwd_cluster_kernel[(n * groups * cl,)](
            x, wa, wa, ba, ba, y, mean, rstd, groups, cl, eps, has, has, BLOCK_C=block_c,
            BLOCK_HW=hw)
    xg = _check_forward(x, w, b, groups, eps, dtype, y, mean, rstd)
    monkeypatch.setattr(mod, "cluster_sums", _ClusterSums())
    dx = torch.full_like(x, float("nan"))
    partial = torch.full((2, n * c), float("nan"))
    for _ in range(2):
        mod.group_norm_bwd_cluster_kernel[(n * groups * cl,)](
            dy, x, wa, wa, mean, rstd, dx, partial, n * groups, groups, cl, has, 1,
            BLOCK_C=block_c, BLOCK_HW=hw)
    gx, gw, gb = ref_grads(x, w, b, groups, dy, eps)
    assert_close(dx, round_toward_zero(gx.float(), dtype), dtype, factor=4, what="dx")
    s = dy.double().norm().item()
    xhat = ((xg - xg.mean(-1, keepdim=True)) * rstd.double()[..., None]).reshape(n, c, -1)
    assert_close(partial[0].reshape(n, c).sum(0), (dy.double().reshape(n, c, -1) * xhat)
                 .sum((0, 2)), torch.float32, factor=3, scale=s, what="dweight")
    assert_close(partial[1].reshape(n, c).sum(0), dy.double().reshape(n, c, -1).sum((0, 2)),
                 torch.float32, factor=3, scale=s, what="dbias")
    skipped = torch.full_like(x, float("nan"))
    partial2 = torch.full((2, n * c), float("nan"))
    mod.group_norm_bwd_cluster_kernel[(n * groups * cl,)](
        dy, x, wa, wa, mean, rstd, skipped, partial2, n * groups, groups, cl, has, 0,
        BLOCK_C=block_c, BLOCK_HW=hw)
    assert torch.isnan(skipped).all()
    assert torch.equal(partial2, partial)


# --- level 2: the CPU backend against the reference --------------------------------------

SHAPES = [((2, 4, 3, 5), 2), ((1, 6, 7), 3), ((4, 8), 4), ((2, 3, 1), 3), ((3, 16, 40), 1)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("params", ["fp32", "x", "none", "w_only"])
@pytest.mark.parametrize("shape,groups", SHAPES)
def test_cpu_forward_backward(dtype, params, shape, groups):
    pdt = torch.float32 if params == "fp32" else dtype
    which = {"none": "", "w_only": "w"}.get(params, "wb")
    x = (randn(*shape, dtype=dtype) + 2.0).requires_grad_()
    w, b = _params(shape[1], pdt, which=which)
    for p in (w, b):
        if p is not None:
            p.requires_grad_()
    y = fk.group_norm(x, w, b, groups, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    assert_close(y, ref_group_norm(x, w, b, groups, 1e-5), dtype, factor=2, what="y")
    dy = randn(*shape, dtype=dtype)
    y.backward(dy)
    _check_grads(x, w, b, groups, dy, (x.grad, None if w is None else w.grad,
                                       None if b is None else b.grad), dtype, pdt, 1e-5)


def test_cpu_matches_torch_group_norm():
    x = randn(3, 8, 5, 6)
    w, b = _params(8, torch.float32)
    torch.testing.assert_close(fk.group_norm(x, w, b, 4, 1e-5),
                               torch.nn.functional.group_norm(x, 4, w, b, 1e-5))
    torch.testing.assert_close(fk.group_norm(x, None, None, 2),
                               torch.nn.functional.group_norm(x, 2, None, None, 1e-6))
    xb = x.bfloat16()
    torch.testing.assert_close(fk.group_norm(xb, w, b, 4, 1e-5),
                               torch.nn.functional.group_norm(xb, 4, w.bfloat16(),
                                                              b.bfloat16(), 1e-5),
                               atol=2e-2, rtol=2e-2)


def test_large_mean_statistics():
    x = randn(2, 4, 64) * 0.01 + 1000.0
    _, mean, rstd = torch.ops.fk._group_norm_forward(x, None, None, 2, 1e-6)
    xg = x.double().reshape(2, 2, -1)
    assert_close(mean, xg.mean(-1), torch.float32)
    assert_close(rstd, 1 / torch.sqrt(xg.var(-1, unbiased=False) + 1e-6), torch.float32,
                 factor=1e3)


def test_non_contiguous_and_empty():
    x = randn(5, 6, 8).transpose(0, 2)  # (8, 6, 5)
    w, b = _params(6, torch.float32)
    assert not x.is_contiguous()
    assert_close(fk.group_norm(x, w, b, 3), ref_group_norm(x, w, b, 3), torch.float32,
                 factor=2)
    for shape in ((0, 4, 5), (2, 4, 0)):
        xe = torch.empty(shape, requires_grad=True)
        pe = [p.requires_grad_() for p in _params(4, torch.float32)]
        y = fk.group_norm(xe, *pe, 2)
        assert y.shape == shape
        y.sum().backward()
        assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in pe)
        assert xe.grad.shape == shape


def test_only_some_gradients_and_double_backward():
    x = randn(2, 4, 6)
    w, b = _params(4, torch.float32)
    w.requires_grad_()
    fk.group_norm(x, w, b, 2).sum().backward()
    assert w.grad is not None and b.grad is None and x.grad is None
    x.requires_grad_()
    (gx,) = torch.autograd.grad(fk.group_norm(x, w, b, 2).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input -----------------------------------------------------------------------------

def _f(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("1-d x", lambda d: (_f(8, d=d), None, None, 1), "at least two dimensions"),
    ("int x", lambda d: (_f(2, 4, 3, dtype=torch.int64, d=d), None, None, 2), "not supported"),
    ("groups 0", lambda d: (_f(2, 4, 3, d=d), None, None, 0), "num_groups must be positive"),
    ("groups divide", lambda d: (_f(2, 6, 3, d=d), None, None, 4), "must divide the number"),
    ("weight size", lambda d: (_f(2, 4, 3, d=d), _f(3, d=d), None, 2), "weight must have shape"),
    ("bias size", lambda d: (_f(2, 4, 3, d=d), _f(4, d=d), _f(4, 1, d=d), 2),
     "bias must have shape"),
    ("bias dtype", lambda d: (_f(2, 4, 3, d=d), _f(4, d=d), _f(4, dtype=torch.float16, d=d), 2),
     "must be float32 or x's dtype"),
    ("mixed params", lambda d: (_f(2, 4, 3, dtype=torch.bfloat16, d=d), _f(4, d=d),
                                _f(4, dtype=torch.bfloat16, d=d), 2),
     "weight and bias must have the same dtype"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.group_norm(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_backward_input_cpu_and_meta_agree():
    def call(d):
        return torch.ops.fk._group_norm_backward(_f(2, 4, 3, d=d), _f(2, 4, 3, d=d), None,
                                                 None, _f(2, 2, d=d), _f(3, d=d), 2,
                                                 [True] * 3)
    cpu, meta = error_lines(call, ("cpu", "meta"), "rstd must hold one value per")
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.group_norm(torch.ones(2, 4, 3), torch.ones(4, device="meta"), None, 2)


def test_module():
    m = fk.nn.GroupNorm(2, 4)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    assert m.eps == 1e-5 and torch.equal(m.weight, torch.ones(4))
    ref = torch.nn.GroupNorm(2, 4)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    m.load_state_dict(ref.state_dict())
    x = randn(3, 4, 5, 5)
    torch.testing.assert_close(m(x), ref(x))
    m(x).sum().backward()
    assert m.weight.grad is not None and m.bias.grad is not None
    plain = fk.nn.GroupNorm(2, 4, affine=False)
    assert plain.weight is None and list(plain.parameters()) == []
    torch.testing.assert_close(plain(x), torch.nn.functional.group_norm(x, 2, eps=1e-5))
    half = fk.nn.GroupNorm(2, 4, dtype=torch.bfloat16)
    assert half.weight.dtype == torch.bfloat16 and half(x.bfloat16()).dtype == torch.bfloat16
    assert "2, 4, eps=1e-05, affine=True" in repr(m)
    with pytest.raises(ValueError, match="divisible"):
        fk.nn.GroupNorm(3, 4)


# --- level 3: autograd, opcheck, torch.compile, TorchScript ------------------------------

@pytest.mark.parametrize("which", ["wb", "", "b"])
def test_gradcheck(which):
    x = randn(2, 6, 5, dtype=torch.float64).requires_grad_()
    w, b = _params(6, torch.float64, which=which)
    ps = [p.requires_grad_() for p in (w, b) if p is not None]

    def f(x, *ps):
        it = iter(ps)
        return fk.group_norm(x, next(it) if w is not None else None,
                             next(it) if b is not None else None, 3, 1e-6)

    assert torch.autograd.gradcheck(f, (x, *ps))


def test_opcheck():
    x = randn(4, 6, 10).requires_grad_()
    w, b = [p.requires_grad_() for p in _params(6, torch.float32)]
    torch.library.opcheck(torch.ops.fk.group_norm, (x, w, b, 3, 1e-6))
    torch.library.opcheck(torch.ops.fk.group_norm, (x, None, None, 2, 1e-6))
    xb = randn(4, 6, 10, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.fk._group_norm_forward, (xb, w.detach(), None, 3, 1e-5),
                          test_utils=("test_schema", "test_faketensor"))
    _, mean, rstd = torch.ops.fk._group_norm_forward(x.detach(), w.detach(), b.detach(), 3,
                                                     1e-6)
    assert mean.shape == rstd.shape == (4, 3) and rstd.dtype == torch.float32
    dy = randn(4, 6, 10)
    for mask in ([True, True, True], [False, True, False], [True, False, False]):
        torch.library.opcheck(torch.ops.fk._group_norm_backward,
                              (dy, x.detach(), w.detach(), b.detach(), mean, rstd, 3, mask),
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def block(x, w, b):
        return fk.group_norm(x, w, b, 4) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for n in (3, 5):
        args = [randn(n, 8, 6).requires_grad_(),
                *[p.requires_grad_() for p in _params(8, torch.float32)]]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args)
        ref = block(*eager_args)
        assert_close(out, ref, torch.float32, factor=10)
        out.sum().backward()
        ref.sum().backward()
        for a, e in zip(args, eager_args):
            assert_close(a.grad, e.grad, torch.float32, factor=10)


class _Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = fk.nn.GroupNorm(2, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) + fk.group_norm(x, self.norm.weight, None, 3)


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    module = _Scripted()
    path = tmp_path / "group_norm.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::_group_norm_forward" in str(loaded.inlined_graph)
    x = randn(3, 6, 7)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    outs = [module(xs[0]), loaded(xs[1])]
    torch.testing.assert_close(outs[1], outs[0])
    p = module.norm
    assert_close(outs[0], ref_group_norm(x, p.weight, p.bias, 2, 1e-5) +
                 ref_group_norm(x, p.weight, None, 3), torch.float32, factor=2)
    dy = randn(3, 6, 7)
    for o in outs:
        o.backward(dy)
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# Every tile bucket (BLOCK_HW 1, 8, 64, 512, 4096; tiles of 1024 and 8192), odd sizes,
# groups of one element and groups longer than a tile; aligned groups whose channels the
# tile's channel block divides (the backward's prefetching variants) at several tiles, and
# one it does not (15 channels, tile rows of 2). On sm_90 and newer, CLUSTER_SHAPES run the
# cluster kernels (groups of 2-8 tiles of 8192 elements, HW a power of two), at clusters of
# 2, 3, 4, 5 and 8 programs and tile rows of 64 to 8192 positions.
CLUSTER_SHAPES = [((2, 32, 4096), 8), ((2, 512, 4096), 32), ((3, 64, 32, 32), 4),
                  ((2, 96, 1024), 4), ((2, 1024, 8, 8), 2), ((2, 40, 8192), 5),
                  ((2, 40, 64, 64), 4)]
CUDA_SHAPES = [((1, 1, 1), 1), ((3, 6, 7), 3), ((4, 8), 4), ((2, 64, 28, 28), 32),
               ((2, 4, 33, 3), 2), ((1, 512, 64), 32), ((5, 12, 257), 4), ((1, 4, 70001), 1),
               ((3, 40, 9), 5), ((3, 48, 128), 3), ((2, 1024, 24, 24), 32),
               ((2, 30, 4096), 2)] + CLUSTER_SHAPES


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("params", ["fp32", "x", "none"])
@pytest.mark.parametrize("shape,groups", CUDA_SHAPES)
def test_cuda_matches_reference(dtype, params, shape, groups):
    eps = 1e-6
    pdt = torch.float32 if params == "fp32" else dtype
    x = (randn(*shape, dtype=dtype, device="cuda") + 1.5).requires_grad_()
    w, b = _params(shape[1], pdt, device="cuda", which="" if params == "none" else "wb")
    for p in (w, b):
        if p is not None:
            p.requires_grad_()
    poison_cuda_cache()
    y = fk.group_norm(x, w, b, groups, eps)
    assert not torch.isnan(y).any(), "unwritten output elements"
    cpu = [None if t is None else t.detach().cpu() for t in (x, w, b)]
    assert_close(y, ref_group_norm(cpu[0], cpu[1], cpu[2], groups, eps), dtype, factor=2)
    dy = randn(*shape, dtype=dtype, device="cuda", scale=3.0)
    poison_cuda_cache()
    y.backward(dy)
    _check_grads(cpu[0], cpu[1], cpu[2], groups, dy.cpu(),
                 (x.grad, None if w is None else w.grad, None if b is None else b.grad),
                 dtype, pdt, eps)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_torch(dtype):
    x = randn(4, 64, 32, 32, dtype=dtype, device="cuda")
    w, b = _params(64, dtype, device="cuda")
    ref = torch.nn.functional.group_norm(x.float(), 16, w.float(), b.float(), 1e-5)
    assert_close(fk.group_norm(x, w, b, 16, 1e-5), ref, dtype, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((2, 32, 4096), 8), ((3, 6, 7), 3), ((2, 8, 64), 2)])
def test_cuda_misaligned_and_partial_masks(dtype, shape, groups):
    x = misaligned(randn(*shape, dtype=dtype, device="cuda"))
    w, b = [misaligned(p) for p in _params(shape[1], torch.float32, device="cuda")]
    y, mean, rstd = torch.ops.fk._group_norm_forward(x, w, b, groups, 1e-6)
    cpu = [t.cpu() for t in (x, w, b)]
    assert_close(y, ref_group_norm(*cpu, groups), dtype, factor=2)
    dy = misaligned(randn(*shape, dtype=dtype, device="cuda"))
    got = torch.ops.fk._group_norm_backward(dy, x, w, b, misaligned(mean), misaligned(rstd),
                                            groups, [True] * 3)
    _check_grads(*cpu, groups, dy.cpu(), got, dtype, torch.float32)
    for mask in ([False, True, True], [True, False, False], [False, False, True]):
        part = torch.ops.fk._group_norm_backward(dy, x, w, b, mean, rstd, groups, mask)
        for want, p, full in zip(mask, part, got):
            assert (p is not None) == want
            if want:
                torch.testing.assert_close(p, full)


def _kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key for e in prof.key_averages() if "group_norm" in e.key}


@pytest.mark.cuda
@pytest.mark.parametrize("shape,groups", CLUSTER_SHAPES[:3])
def test_cuda_cluster_kernels_taken(shape, groups):
    """Which kernels run: the cluster ones on sm_90 and newer for aligned CLUSTER_SHAPES,
    the persistent ones for misaligned x, groups of one tile and older GPUs."""
    x = randn(*shape, dtype=torch.bfloat16, device="cuda")

    def step(x):
        w, b = _params(x.shape[1], torch.bfloat16, device="cuda")
        y, mean, rstd = torch.ops.fk._group_norm_forward(x, w, b, groups, 1e-6)
        torch.ops.fk._group_norm_backward(y, x, w, b, mean, rstd, groups, [True] * 3)

    cluster = {"group_norm_fwd_cluster_kernel", "group_norm_bwd_cluster_kernel"}
    persistent = {"group_norm_fwd_kernel", "group_norm_bwd_kernel"}
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    assert _kernel_names(lambda: step(x)) >= (cluster if sm90 else persistent)
    assert not _kernel_names(lambda: step(misaligned(x))) & cluster
    one_tile = randn(2, 2 * groups, 4096, dtype=torch.bfloat16, device="cuda")
    assert not _kernel_names(lambda: step(one_tile)) & cluster


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.group_norm(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.group_norm(_f(2, 4, 3, dtype=torch.float64, d="cuda"), None, None, 2)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.group_norm(_f(2, 4, 3, d="cuda"), _f(4), None, 2)


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    for shape in ((0, 4, 5), (2, 4, 0)):
        xe = torch.empty(shape, device="cuda", requires_grad=True)
        pe = [p.requires_grad_() for p in _params(4, torch.float32, device="cuda")]
        y = fk.group_norm(xe, *pe, 2)
        assert y.shape == shape
        y.sum().backward()
        assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in pe)
    x = randn(4, 6, 40, device="cuda").requires_grad_()
    w, b = [p.requires_grad_() for p in _params(6, torch.float32, device="cuda")]
    torch.library.opcheck(torch.ops.fk.group_norm, (x, w, b, 3, 1e-6))
    # aot_eager: traces fk's fake kernels and autograd without Inductor.
    f = torch.compile(lambda x, w, b: fk.group_norm(x, w, b, 3).sum(), fullgraph=True,
                      backend="aot_eager")
    f(x, w, b).backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(4, 64, 1000), (4, 64, 4096)])
def test_cuda_graph_capture(shape):
    """Captured and replayed on new x: the persistent kernels, and (HW 4096, 4 channels a
    group) the cluster kernels, whose launches carry the cluster size."""
    x = randn(*shape, device="cuda", dtype=torch.bfloat16)
    dy = randn(*shape, device="cuda", dtype=torch.bfloat16)
    w, b = _params(64, torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y, mean, rstd = torch.ops.fk._group_norm_forward(x, w, b, 16, 1e-6)  # load kernels
        torch.ops.fk._group_norm_backward(dy, x, w, b, mean, rstd, 16, [True] * 3)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, mean, rstd = torch.ops.fk._group_norm_forward(x, w, b, 16, 1e-6)
        got = torch.ops.fk._group_norm_backward(dy, x, w, b, mean, rstd, 16, [True] * 3)
    x.copy_(randn(*shape, device="cuda", dtype=torch.bfloat16, scale=2.0))
    graph.replay()
    torch.cuda.synchronize()
    cpu = [t.cpu() for t in (x, w, b)]
    assert_close(y, ref_group_norm(*cpu, 16), torch.bfloat16, factor=2)
    _check_grads(*cpu, 16, dy.cpu(), got, torch.bfloat16, torch.bfloat16)


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    c, hw, groups = 32, 4096, 8
    n = (1 << 31) // (c * hw) + 2
    x = torch.randn(n, c, hw, device="cuda", dtype=torch.bfloat16)
    w, b = _params(c, torch.float32, device="cuda")
    y, mean, rstd = torch.ops.fk._group_norm_forward(x, w, b, groups, 1e-6)
    cpu = [w.cpu(), b.cpu()]
    for rows in (slice(0, 2), slice(n - 2, n)):
        assert_close(y[rows], ref_group_norm(x[rows].cpu(), *cpu, groups), torch.bfloat16,
                     factor=2)
    del y
    dy = torch.ones_like(x)
    dx, dw, db = torch.ops.fk._group_norm_backward(dy, x, w, b, mean, rstd, groups,
                                                   [True] * 3)
    for rows in (slice(0, 2), slice(n - 2, n)):
        gx = ref_grads(x[rows].cpu(), *cpu, groups, dy[rows].cpu())[0]
        assert_close(dx[rows], gx, torch.bfloat16, factor=4)
    # dbias sums dy = ones over every (sample, position) of a channel, exactly in fp32.
    assert torch.equal(db.cpu(), torch.full((c,), float(n * hw)))
    del x, dy, dx
    torch.cuda.empty_cache()
