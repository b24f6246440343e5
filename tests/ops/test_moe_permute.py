"""fk.moe_permute / fk.moe_unpermute at every test level: Triton source (interpreter), CPU
backend, autograd, gradcheck, opcheck, torch.compile, bad input, and the CUDA kernels
(marker ``cuda``), against references with argsort and index_select (moe_permute's in
tests/helpers.py, moe_unpermute's here)."""
import os
import subprocess
import sys

import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, interp_row_map, load_triton_src,
                     poison_cuda_cache, ref_permute, ref_row_map, routing)


# --- the reference (of moe_permute: tests/helpers.py) ---------------------------------------

def ref_unpermute(permuted, row_map, probs=None):
    """sum over routed (t, e) of probs[t, e] * permuted[row], in float64 (differentiable)."""
    row_map = row_map.cpu().long()
    tok, ex = (row_map >= 0).nonzero(as_tuple=True)
    rows = row_map[tok, ex].to(permuted.device)
    contrib = permuted.double().index_select(0, rows)
    if probs is not None:
        w = probs.double()[tok.to(probs.device), ex.to(probs.device)]
        contrib = contrib * w[:, None]
    out = torch.zeros(row_map.shape[0], permuted.shape[1], dtype=torch.float64,
                      device=permuted.device)
    return out.index_add(0, tok.to(permuted.device), contrib)


def _randn(*shape, dtype=torch.float32, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def check_permute(out, tokens, rmap, probs, pad_to, num_out_rows=None):
    permuted, pp, row_map, tpe = out
    ref = ref_permute(tokens.detach(), rmap, None if probs is None else probs.detach(), pad_to,
                      num_out_rows)
    assert row_map.dtype == torch.int32 and tpe.dtype == torch.int32
    assert torch.equal(row_map.cpu().long(), ref[2]), "row_id_map"
    assert torch.equal(tpe.cpu().long(), ref[3]), "tokens_per_expert"
    assert permuted.dtype == tokens.dtype and permuted.shape == ref[0].shape
    assert torch.equal(permuted.cpu(), ref[0].cpu()), "permuted (an exact copy)"
    if probs is None:
        assert pp is None
    else:
        assert pp.dtype == probs.dtype and torch.equal(pp.cpu(), ref[1].cpu()), "permuted_probs"


# --- level 1: the Triton source under the interpreter ---------------------------------------

@pytest.mark.parametrize("k,pad_to", [(1, 1), (2, 4), (3, 4), (5, 16), (9, 3)])
@pytest.mark.parametrize("with_probs", [True, False])
def test_interpreter_permute(k, pad_to, with_probs):
    mod = load_triton_src("moe_permute")
    t, e, h = 37, 11, 21
    rmap, probs = routing(t, e, k, empty=(2,))
    rmap[5] = False  # a token routed nowhere
    x = _randn(t, h)
    tpe, row_map, src, n = interp_row_map(rmap, pad_to)
    n += 5  # trailing rows past the last segment
    src = torch.cat([src, torch.full((5,), -1, dtype=torch.int32)])
    out = torch.full((n, h), float("nan"))
    pout = torch.full((n,), float("nan"))
    kb, be, zr = 2, 4, 4  # several passes of KB experts, several chunks of BE
    mod.moe_permute_scatter_kernel[(t + cdiv(n, zr),)](
        x, row_map, probs, out, probs, pout, out, probs, src, t, h, e, n, 0, int(with_probs),
        0, KB=kb, BE=be, BLOCK_H=8, ZR=zr)
    ref = ref_permute(x, rmap, probs, pad_to, n)
    assert torch.equal(row_map.long(), ref[2]) and torch.equal(tpe.long(), ref[3])
    assert torch.equal(out, ref[0])
    if with_probs:
        assert torch.equal(pout, ref[1])
    else:
        assert torch.isnan(pout).all()


def test_interpreter_bound_too_small_writes_in_bounds_only():
    rmap, _ = routing(20, 6, 3)
    tpe, row_map, src, n = interp_row_map(rmap, 4, n=30)
    assert int(tpe.sum()) > 30
    ref = ref_row_map(rmap, 4)[0]
    assert torch.equal(row_map.long(), torch.where(ref < 30, ref, -1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 3, 9])
def test_interpreter_unpermute_and_backward(dtype, k):
    mod = load_triton_src("moe_permute")
    t, e, h, pad_to = 29, 10, 19, 4
    rmap, probs = routing(t, e, k, empty=(0, 7))
    _, row_map, src, n = interp_row_map(rmap, pad_to)
    y = _randn(n, h, dtype=dtype, seed=3)
    probs32 = probs.float()
    kb, be = 2, 4
    for has_w in (0, 1):
        out = torch.full((t, h), float("nan"), dtype=dtype)
        gpp = _randn(n, seed=4)
        dp = torch.full((t, e), float("nan"))
        mod.moe_unpermute_gather_kernel[(t,)](y, row_map, probs32, out, gpp, dp, t, h, e, n,
                                              has_w, 1, KB=kb, BE=be, BLOCK_H=8)
        ref = ref_unpermute(y, row_map, probs32 if has_w else None)
        assert_close(out, ref, dtype, factor=2, what="unpermute")
        ref_dp = torch.zeros(t, e)
        routed = row_map >= 0
        ref_dp[routed] = gpp[row_map[routed].long()]
        assert torch.equal(dp, ref_dp)
    # the backward of unpermute: dpermuted = probs * grad (padding 0), dprobs = dot products
    g = _randn(t, h, dtype=dtype, seed=5)
    src2 = torch.full((n,), -1, dtype=torch.int32)
    mod.moe_permute_invert_kernel[(cdiv(t, 8), cdiv(e, 4))](row_map, src2, t, e, n, BT=8, BE=4)
    assert torch.equal(src2, src)
    dperm = torch.full((n, h), float("nan"), dtype=dtype)
    dw = torch.full((t, e), float("nan"))
    mod.moe_permute_scatter_kernel[(t + cdiv(n, 4),)](
        g, row_map, probs32, dperm, probs32, probs32, y, dw, src2, t, h, e, n, 1, 0, 1,
        KB=kb, BE=be, BLOCK_H=8, ZR=4)
    yl = y.double().requires_grad_()
    pl = probs32.double().requires_grad_()
    ref_unpermute(yl, row_map, pl).backward(g.double())
    assert_close(dperm, yl.grad, dtype, factor=2, what="dpermuted")
    assert_close(dw, pl.grad, torch.float32, factor=20, what="dprobs")


def test_variants_cover_every_dtype():
    """Every arch: the map kernels once per dtype; the data kernels per dtype with and without
    aligned rows, and for 16-bit tokens with float32 probs too; the probs-typed pointers of
    the tokens' dtype or float32."""
    mod = load_triton_src("moe_permute")
    for arch in (80, 90, 100, 120):
        vs = mod.variants(arch)
        for fam in ("moe_permute_count", "moe_permute_scan", "moe_permute_map",
                    "moe_permute_invert"):
            assert sorted(v.dtype for v in vs if v.family == fam) == ["bf16", "fp16", "fp32"]
        # the map kernel runs on the count kernel's grid (the C++ launch reads count's blocks)
        blocks = {(v.family, v.constexprs.get("BT"), v.constexprs["BE"]) for v in vs
                  if v.family in ("moe_permute_count", "moe_permute_map")}
        assert len({b[1:] for b in blocks}) == 1, blocks
        for fam, data in (("moe_permute_scatter", "x_ptr"), ("moe_unpermute_gather", "y_ptr")):
            got = sorted((v.dtype, v.flags) for v in vs if v.family == fam)
            assert got == [(dt, f) for dt in ("bf16", "fp16", "fp32")
                           for f in ((0, 1) if dt == "fp32" else (0, 1, 2, 3))]
            for v in (v for v in vs if v.family == fam):
                pdt = "fp32" if v.flags & mod.FLAG_PROBS_F32 else v.dtype
                assert v.signature[data] == v.signature["out_ptr"] == f"*{v.dtype}"
                assert v.signature["w_ptr"] == f"*{pdt}"
                assert ("H" in v.divisible_by_16) == bool(v.flags & 1)
                assert "w_ptr" not in v.divisible_by_16


# --- level 2: the CPU backend --------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("k", [1, 2, 8, 16])
@pytest.mark.parametrize("pad_to", [1, 16, 128])
def test_cpu_permute_unpermute(dtype, k, pad_to):
    t, e, h = 45, 20, 33
    rmap, probs = routing(t, e, k, empty=(3, 11), seed=k)
    pdt = torch.float32 if dtype != torch.float64 else dtype
    probs = probs.to(pdt)
    x = _randn(t, h, dtype=dtype)
    for kwargs in ({}, {"topk": k}):
        out = fk.moe_permute(x, rmap, probs, pad_to=pad_to, **kwargs)
        n = fk.ops.moe_permute.moe_permute_bound(t, e, k, pad_to) if kwargs else None
        check_permute(out, x, rmap, probs, pad_to, n)
        y = fk.moe_unpermute(out[0], out[2], probs)
        assert y.dtype == dtype and y.shape == (t, h)
        # each token comes back as the sum of its probs times itself
        assert_close(y, ref_unpermute(out[0], out[2], probs), dtype, what="unpermute")
    assert_close(fk.moe_unpermute(out[0], out[2]), ref_unpermute(out[0], out[2]), dtype)


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("probs_fp32", [True, False])
def test_cpu_backward(dtype, probs_fp32):
    t, e, h, k, pad_to = 31, 12, 17, 4, 8
    rmap, probs = routing(t, e, k, empty=(5,))
    pdt = torch.float32 if probs_fp32 else dtype
    x = _randn(t, h, dtype=dtype).requires_grad_()
    p = probs.to(pdt).clone().requires_grad_()
    permuted, pp, row_map, _ = fk.moe_permute(x, rmap, p, pad_to=pad_to, topk=k)
    w_out = _randn(h, h, dtype=dtype, seed=7)
    expert_out = (permuted @ w_out) * pp.to(dtype)[:, None]
    p2 = probs.to(pdt).clone().requires_grad_()
    y = fk.moe_unpermute(expert_out, row_map, p2)
    dy = _randn(t, h, dtype=dtype, seed=8)
    y.backward(dy)
    # the same graph in float64 through the reference
    xl, pl, p2l = (v.detach().double().requires_grad_() for v in (x, p, p2))
    n = permuted.shape[0]
    rperm, rpp, rmap_ref, _ = ref_permute(xl, rmap, pl, pad_to, n)
    rout = (rperm @ w_out.double()) * rpp[:, None]
    ref_unpermute(rout, rmap_ref, p2l).backward(dy.double())
    assert_close(x.grad, xl.grad, dtype, factor=4, what="dtokens")
    assert p.grad.dtype == pdt and p2.grad.dtype == pdt
    gd = pdt if dtype == torch.float64 else dtype  # the coarser of the two
    assert_close(p.grad, pl.grad, gd, factor=8, what="dprobs (permute)")
    assert_close(p2.grad, p2l.grad, gd, factor=8, what="dprobs (unpermute)")


def test_cpu_integer_routing_maps_and_sync_mode():
    rmap, probs = routing(23, 9, 3)
    x = _randn(23, 6)
    ref = fk.moe_permute(x, rmap, probs, pad_to=4)
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        out = fk.moe_permute(x, rmap.to(dt) * 3, probs, pad_to=4)  # any nonzero is routed
        for a, b in zip(out, ref):
            assert torch.equal(a, b)
    # no bound: exactly the padded segments' rows
    assert ref[0].shape[0] == int(ref[3].sum())


def test_cpu_empty_and_edge_shapes():
    # no tokens
    out = fk.moe_permute(torch.empty(0, 8), torch.zeros(0, 5, dtype=torch.bool), topk=2)
    assert out[0].shape == (0, 8) and out[2].shape == (0, 5) and torch.equal(
        out[3], torch.zeros(5, dtype=torch.int32))
    assert fk.moe_unpermute(out[0], out[2]).shape == (0, 8)
    # nothing routed, with trailing rows: all zero
    out = fk.moe_permute(_randn(4, 8), torch.zeros(4, 5, dtype=torch.bool), num_out_rows=6)
    assert torch.equal(out[0], torch.zeros(6, 8)) and (out[2] == -1).all()
    assert torch.equal(fk.moe_unpermute(out[0], out[2]), torch.zeros(4, 8))
    # no experts; zero hidden size
    out = fk.moe_permute(_randn(3, 4), torch.zeros(3, 0, dtype=torch.bool))
    assert out[0].shape == (0, 4) and out[2].shape == (3, 0) and out[3].shape == (0,)
    assert torch.equal(fk.moe_unpermute(out[0], out[2]), torch.zeros(3, 4))
    rmap, probs = routing(5, 4, 2)
    out = fk.moe_permute(torch.empty(5, 0), rmap, probs, pad_to=2)
    assert out[0].shape == (int(out[3].sum()), 0)
    # one token, every expert
    out = fk.moe_permute(_randn(1, 3), torch.ones(1, 3, dtype=torch.bool), pad_to=1)
    assert torch.equal(out[2], torch.tensor([[0, 1, 2]], dtype=torch.int32))


def test_cpu_non_contiguous_inputs():
    rmap, probs = routing(12, 6, 2)
    x = _randn(7, 12).t()
    out = fk.moe_permute(x, rmap.t().contiguous().t(), probs.t().contiguous().t(), pad_to=4)
    check_permute(out, x, rmap, probs, 4)
    permuted = out[0].t().contiguous().t()
    assert_close(fk.moe_unpermute(permuted, out[2], probs),
                 ref_unpermute(permuted, out[2], probs), torch.float32)


def test_cpu_bound_too_small_raises():
    rmap, _ = routing(10, 4, 3)
    with pytest.raises(RuntimeError, match=r"the padded segments need \d+ rows but "
                                           r"num_out_rows is 5"):
        fk.moe_permute(_randn(10, 4), rmap, pad_to=2, num_out_rows=5)
    # a token routed to more experts than topk
    rmap[0] = True
    with pytest.raises(RuntimeError, match="more than topk"):
        fk.moe_permute(_randn(10, 4), rmap, pad_to=1, topk=1)


def test_cpu_bad_row_map_entry_raises():
    rmap, _ = routing(6, 3, 1)
    out = fk.moe_permute(_randn(6, 4), rmap, pad_to=1)
    bad = out[2].clone()
    bad[2, 1] = 6
    with pytest.raises(RuntimeError, match=r"row_id_map\[2, 1\] is 6, not -1 or a row"):
        fk.moe_unpermute(out[0], bad)


def test_only_some_gradients_and_unused_outputs():
    rmap, probs = routing(9, 5, 2)
    x = _randn(9, 4).requires_grad_()
    p = probs.clone().requires_grad_()
    permuted, pp, _, _ = fk.moe_permute(x, rmap, p, pad_to=2)
    pp.sum().backward()  # permuted unused
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert torch.equal(p.grad, rmap.float())
    x.grad = p.grad = None
    permuted, pp, row_map, _ = fk.moe_permute(x, rmap, p, pad_to=2)
    permuted.sum().backward()  # permuted_probs unused
    assert torch.equal(x.grad, rmap.sum(1, keepdim=True).float().expand(9, 4))
    assert torch.equal(p.grad, torch.zeros_like(p))
    y = permuted.detach().requires_grad_()
    fk.moe_unpermute(y, row_map, p.detach()).sum().backward()  # probs without grad
    assert y.grad is not None
    q = p.detach().requires_grad_()
    fk.moe_unpermute(y.detach(), row_map, q).sum().backward()  # only probs
    ref = torch.zeros_like(q)
    routed = row_map >= 0
    ref[routed] = y.detach()[row_map[routed].long()].sum(1)
    assert_close(q.grad, ref, torch.float32)


def test_double_backward_is_a_clear_error():
    rmap, probs = routing(6, 4, 2)
    x = _randn(6, 8).requires_grad_()
    permuted = fk.moe_permute(x, rmap, pad_to=2)[0]
    (gx,) = torch.autograd.grad(permuted.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gx.sum().backward()


# --- bad input ------------------------------------------------------------------------------

def _f(*shape, dtype=torch.float32, d="cpu"):
    return torch.ones(shape, dtype=dtype, device=d)


def _b(*shape, d="cpu"):
    return torch.ones(shape, dtype=torch.bool, device=d)


BAD_PERMUTE = [
    ("1-D tokens", lambda d: (_f(8, d=d), _b(8, 2, d=d)), {}, "tokens must be 2-D"),
    ("int tokens", lambda d: (_f(2, 8, dtype=torch.int32, d=d), _b(2, 2, d=d)), {},
     "not supported"),
    ("map rows", lambda d: (_f(2, 8, d=d), _b(3, 2, d=d)), {}, r"routing_map must have shape"),
    ("map dtype", lambda d: (_f(2, 8, d=d), _f(2, 2, d=d)), {}, "routing_map has dtype Float"),
    ("probs shape", lambda d: (_f(2, 8, d=d), _b(2, 3, d=d), _f(2, 2, d=d)), {},
     r"probs must have shape \(2, 3\)"),
    ("probs dtype", lambda d: (_f(2, 8, dtype=torch.bfloat16, d=d), _b(2, 3, d=d),
                               _f(2, 3, dtype=torch.float16, d=d)), {},
     "probs must be float32 or the dtype of tokens"),
    ("pad_to", lambda d: (_f(2, 8, d=d), _b(2, 3, d=d)), {"pad_to": 0}, "pad_to must be"),
    ("num_out_rows", lambda d: (_f(2, 8, d=d), _b(2, 3, d=d)), {"num_out_rows": -1},
     "num_out_rows must be"),
]


@pytest.mark.parametrize("name,make,kw,msg", BAD_PERMUTE, ids=[b[0] for b in BAD_PERMUTE])
def test_bad_permute_input_cpu_and_meta_agree(name, make, kw, msg):
    cpu, meta = error_lines(lambda d: fk.moe_permute(*make(d), **kw), ("cpu", "meta"), msg)
    assert cpu == meta


def _map(t, e, d):
    return torch.full((t, e), -1, dtype=torch.int32, device=d)


BAD_UNPERMUTE = [
    ("1-D permuted", lambda d: (_f(8, d=d), _map(2, 2, d)), "permuted must be 2-D"),
    ("map dtype", lambda d: (_f(4, 8, d=d), _map(2, 2, d).long()), "int32 tensor"),
    ("probs shape", lambda d: (_f(4, 8, d=d), _map(2, 2, d), _f(2, 3, d=d)),
     r"probs must have shape \(2, 2\)"),
    ("probs dtype", lambda d: (_f(4, 8, dtype=torch.float16, d=d), _map(2, 2, d),
                               _f(2, 2, dtype=torch.bfloat16, d=d)),
     "probs must be float32 or the dtype of permuted"),
]


@pytest.mark.parametrize("name,make,msg", BAD_UNPERMUTE, ids=[b[0] for b in BAD_UNPERMUTE])
def test_bad_unpermute_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.moe_unpermute(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_bad_backward_input_cpu_and_meta_agree():
    def permute_bwd(d):
        return torch.ops.fk._moe_permute_backward(_f(4, 8, d=d), _f(3, d=d), _map(2, 2, d))

    cpu, meta = error_lines(permute_bwd, ("cpu", "meta"), r"grad_permuted_probs must have")
    assert cpu == meta

    def unpermute_bwd(d):
        return torch.ops.fk._moe_unpermute_backward(_f(3, 8, d=d), _f(4, 8, d=d), _map(2, 2, d),
                                                    None, False)

    cpu, meta = error_lines(unpermute_bwd, ("cpu", "meta"), r"grad_out must have shape \(2, 8\)")
    assert cpu == meta


def test_topk_and_num_out_rows_both_given():
    with pytest.raises(RuntimeError, match="not both"):
        fk.moe_permute(_f(2, 4), _b(2, 2), topk=1, num_out_rows=8)


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.moe_permute(_f(2, 4), _b(2, 2, d="meta"))


# --- level 3: gradcheck, opcheck, torch.compile ---------------------------------------------

@pytest.mark.parametrize("pad_to", [1, 4])
def test_gradcheck(pad_to):
    rmap, probs = routing(7, 5, 2, empty=(1,))
    x = _randn(7, 3, dtype=torch.float64).requires_grad_()
    p = probs.double().requires_grad_()

    def permute(x, p):
        permuted, pp, _, _ = fk.moe_permute(x, rmap, p, pad_to=pad_to, topk=2)
        return permuted, pp

    assert torch.autograd.gradcheck(permute, (x, p))
    row_map = fk.moe_permute(x.detach(), rmap, pad_to=pad_to)[2]
    n = int(row_map.max()) + 3
    y = _randn(n, 3, dtype=torch.float64, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda y, p: fk.moe_unpermute(y, row_map, p), (y, p))
    assert torch.autograd.gradcheck(lambda y: fk.moe_unpermute(y, row_map), (y,))


def test_opcheck():
    rmap, probs = routing(10, 6, 3, empty=(2,))
    x = _randn(10, 8).requires_grad_()
    p = probs.clone().requires_grad_()
    torch.library.opcheck(torch.ops.fk.moe_permute, (x, rmap, p, 4, 60))
    torch.library.opcheck(torch.ops.fk.moe_permute, (x.detach().bfloat16(), rmap, None, 1, 40))
    permuted, pp, row_map, _ = torch.ops.fk.moe_permute(x.detach(), rmap, p.detach(), 4, 60)
    y = permuted.clone().requires_grad_()
    torch.library.opcheck(torch.ops.fk.moe_unpermute, (y, row_map, p))
    torch.library.opcheck(torch.ops.fk.moe_unpermute, (y, row_map, None))
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.fk._moe_permute_backward, (permuted, pp, row_map),
                          test_utils=utils)
    torch.library.opcheck(torch.ops.fk._moe_unpermute_backward,
                          (_randn(10, 8), permuted, row_map, p.detach(), True), test_utils=utils)


def test_torch_compile_fullgraph():
    def block(x, rmap, p, w):
        permuted, pp, row_map, tpe = fk.moe_permute(x, rmap, p, pad_to=4, topk=3)
        h = (permuted @ w) * pp[:, None]
        return fk.moe_unpermute(h, row_map, p), tpe

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for t in (11, 17):
        rmap, probs = routing(t, 6, 3, seed=t)
        w = _randn(8, 8, seed=3)
        args = [_randn(t, 8).requires_grad_(), rmap, probs.clone().requires_grad_(), w]
        eager = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        out, tpe = compiled(*args)
        ref, ref_tpe = block(*eager)
        assert torch.equal(tpe, ref_tpe)
        assert_close(out, ref, torch.float32, factor=10)
        out.sum().backward()
        ref.sum().backward()
        assert_close(args[0].grad, eager[0].grad, torch.float32, factor=10)
        assert_close(args[2].grad, eager[2].grad, torch.float32, factor=10)


def test_torch_compile_sync_mode():
    torch._dynamo.reset()
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        f = torch.compile(lambda x, m: fk.moe_permute(x, m, pad_to=4)[0].sum(0), fullgraph=True)
        rmap, _ = routing(13, 5, 2)
        x = _randn(13, 6)
        assert_close(f(x, rmap), ref_permute(x, rmap, pad_to=4)[0].sum(0), torch.float32)
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = False


class _Scripted(torch.nn.Module):
    def forward(self, x: torch.Tensor, rmap: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        permuted, pp, row_map, tpe = fk.moe_permute(x, rmap, probs, pad_to=4, topk=2)
        assert pp is not None
        return fk.moe_unpermute(permuted * pp[:, None], row_map, probs) + tpe.sum()


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    module = _Scripted()
    path = tmp_path / "moe.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    graph = str(loaded.inlined_graph)
    assert "fk::moe_permute" in graph and "fk::moe_unpermute" in graph
    rmap, probs = routing(9, 5, 2)
    xs = [_randn(9, 6).requires_grad_() for _ in range(2)]
    outs = [module(xs[0], rmap, probs), loaded(xs[1], rmap, probs)]
    torch.testing.assert_close(outs[1], outs[0])
    for o in outs:
        o.sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad)
    # each token comes back as itself times the sum of its squared probs, plus the row count
    w = (probs * probs * rmap).sum(1, keepdim=True)
    n = fk.ops.moe_permute.moe_permute_bound(9, 5, 2, 4)
    ref_n = int(ref_row_map(rmap, 4)[1].sum())
    assert ref_n <= n
    assert_close(outs[0], xs[0].detach() * w + ref_n, torch.float32)


# --- level 5: CUDA kernels ------------------------------------------------------------------

CUDA_CASES = [
    # (T, E, H, k, pad_to)
    (1, 1, 1, 1, 1),
    (37, 10, 200, 3, 16),
    (300, 64, 1000, 8, 16),
    (513, 130, 2048, 8, 128),  # E not a power of two, several expert chunks
    (2048, 256, 777, 8, 16),
    (1000, 40, 4099, 16, 1),  # top-16: two passes of the kernels' 8 experts
    (257, 20, 64, 17, 4),  # more experts a token than 16
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CUDA_CASES, ids=[str(c) for c in CUDA_CASES])
@pytest.mark.parametrize("probs_fp32", [True, False])
def test_cuda_matches_reference(dtype, case, probs_fp32):
    t, e, h, k, pad_to = case
    rmap, probs = routing(t, e, k, device="cuda", empty=(0,) if e > 2 else (), seed=t)
    p = probs.to(torch.float32 if probs_fp32 else dtype).clone().requires_grad_()
    x = _randn(t, h, dtype=dtype, device="cuda").requires_grad_()
    for kw in ({"topk": k}, {}):
        poison_cuda_cache()
        out = fk.moe_permute(x, rmap, p, pad_to=pad_to, **kw)
        n = fk.ops.moe_permute.moe_permute_bound(t, e, k, pad_to) if kw else None
        check_permute(out, x, rmap, p, pad_to, n)
    permuted, pp, row_map, _ = out
    y_in = (permuted.detach() * 0.5 + 1).requires_grad_()
    p2 = p.detach().clone().requires_grad_()
    poison_cuda_cache()
    y = fk.moe_unpermute(y_in, row_map, p2)
    assert_close(y, ref_unpermute(y_in.detach(), row_map, p2.detach()), dtype, factor=2)
    assert_close(fk.moe_unpermute(y_in.detach(), row_map),
                 ref_unpermute(y_in.detach(), row_map), dtype, factor=2)
    dy = _randn(t, h, dtype=dtype, device="cuda", seed=9)
    poison_cuda_cache()
    y.backward(dy)
    yl, pl = y_in.detach().double().requires_grad_(), p2.detach().double().requires_grad_()
    ref_unpermute(yl, row_map, pl).backward(dy.double())
    assert_close(y_in.grad, yl.grad, dtype, factor=2, what="dpermuted")
    assert_close(p2.grad, pl.grad, p.dtype, factor=8, what="dprobs (unpermute)")
    gp = _randn(*permuted.shape, dtype=dtype, device="cuda", seed=10)
    gpp = _randn(pp.shape[0], dtype=p.dtype, device="cuda", seed=11)
    poison_cuda_cache()
    torch.autograd.backward([permuted, pp], [gp, gpp])
    xl, pl = x.detach().double().requires_grad_(), p.detach().double().requires_grad_()
    rperm, rpp, _, _ = ref_permute(xl, rmap, pl, pad_to)
    torch.autograd.backward([rperm, rpp], [gp.double(), gpp.double()])
    assert_close(x.grad, xl.grad, dtype, factor=2, what="dtokens")
    assert torch.equal(p.grad.double(), pl.grad.to(p.dtype).double()), "dprobs (permute)"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_int_maps(dtype):
    from helpers import misaligned
    t, e, h, k = 99, 24, 256, 4
    rmap, probs = routing(t, e, k, device="cuda")
    x = misaligned(_randn(t, h, dtype=dtype, device="cuda"))
    out = fk.moe_permute(x, rmap.to(torch.int64), probs, pad_to=16, topk=k)
    check_permute(out, x, rmap, probs, 16, fk.ops.moe_permute.moe_permute_bound(t, e, k, 16))
    y = misaligned(out[0])
    assert_close(fk.moe_unpermute(y, out[2], probs), ref_unpermute(y, out[2], probs), dtype,
                 factor=2)


@pytest.mark.cuda
def test_cuda_empty_and_matches_cpu_errors():
    out = fk.moe_permute(_f(0, 8, d="cuda"), _b(0, 5, d="cuda"), topk=2)
    assert out[0].shape == (0, 8) and out[3].tolist() == [0] * 5
    out = fk.moe_permute(_f(4, 8, d="cuda"), torch.zeros(4, 5, dtype=torch.bool, device="cuda"),
                         num_out_rows=6)
    assert torch.equal(out[0], torch.zeros(6, 8, device="cuda")) and (out[2] == -1).all()
    out = fk.moe_permute(_f(3, 4, d="cuda"), _b(3, 0, d="cuda"))
    assert out[0].shape == (0, 4) and out[2].shape == (3, 0)
    for name, make, kw, msg in BAD_PERMUTE:
        cpu, cuda = error_lines(lambda d: fk.moe_permute(*make(d), **kw), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    for name, make, msg in BAD_UNPERMUTE:
        cpu, cuda = error_lines(lambda d: fk.moe_unpermute(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name


@pytest.mark.cuda
def test_cuda_opcheck_compile_and_graph_capture():
    rmap, probs = routing(64, 16, 4, device="cuda")
    x = _randn(64, 128, device="cuda").requires_grad_()
    p = probs.clone().requires_grad_()
    torch.library.opcheck(torch.ops.fk.moe_permute, (x, rmap, p, 16, 512))
    permuted, _, row_map, _ = torch.ops.fk.moe_permute(x.detach(), rmap, p.detach(), 16, 512)
    torch.library.opcheck(torch.ops.fk.moe_unpermute, (permuted.requires_grad_(), row_map, p))
    f = torch.compile(lambda x, m, p: fk.moe_unpermute(
        *fk.moe_permute(x, m, p, topk=4)[0:3:2], p).sum(), fullgraph=True, backend="aot_eager")
    f(x, rmap, p).backward()
    # with a bound, nothing synchronises: the forward captures into a CUDA graph
    xs = x.detach().clone()
    fk.moe_permute(xs, rmap, probs, topk=4)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = fk.moe_permute(xs, rmap, probs, topk=4)
    xs.copy_(_randn(64, 128, device="cuda", seed=5))
    g.replay()
    torch.cuda.synchronize()
    check_permute(captured, xs, rmap, probs, 16, fk.ops.moe_permute.moe_permute_bound(64, 16, 4))


@pytest.mark.cuda
def test_cuda_large_offsets():
    # more than 2^31 elements in permuted: int64 offsets in the data kernels
    t, e, h, k = 8192, 8, 66000, 4
    rmap, _ = routing(t, e, k, device="cuda")
    x = torch.ones(t, h, dtype=torch.bfloat16, device="cuda")
    x[:, -1] = torch.arange(t, device="cuda").to(torch.bfloat16)
    permuted, _, row_map, tpe = fk.moe_permute(x, rmap, pad_to=16, topk=k)
    assert permuted.numel() > 2 ** 31
    last = int(row_map.max())
    t_last = int((row_map == last).nonzero()[0, 0])
    assert torch.equal(permuted[last], x[t_last])
    y = fk.moe_unpermute(permuted, row_map)
    assert torch.equal(y[:, 0], torch.full((t,), float(k), dtype=torch.bfloat16, device="cuda"))


# --- level 4: the MoE block example ------------------------------------------------------------

def test_moe_block_example_matches_the_reference():
    """examples/moe_block.py on the CPU (tiny block): router, permute, grouped GEMMs, SwiGLU,
    unpermute trained against the plain torch block; the script checks the losses agree and
    fall, and exits non-zero otherwise."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "moe_block.py")
    r = subprocess.run([sys.executable, script, "--device", "cpu", "--tiny", "--steps", "8"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line[:4].strip().isdigit()]
    assert len(rows) == 8 and float(rows[-1][2]) < float(rows[0][2]), r.stdout
