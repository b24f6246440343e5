"""fk.router_topk (top-k routing: probs and routing map) at every test level: Triton source
(interpreter), CPU backend, autograd, opcheck, torch.compile, TorchScript, bad input, and
the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from helpers import DTYPES, assert_close, cdiv, error_lines, load_triton_src, randn

# (score, pre_softmax) of the three orders
MODES = [("softmax", False), ("softmax", True), ("sigmoid", False)]
MODE_IDS = ["softmax-after", "softmax-before", "sigmoid"]


# --- the reference: torch.topk and the definitions, in float64, differentiable -------------

def ref_topk(logits, k, score="softmax", pre_softmax=False, scaling_factor=1.0, bias=None):
    """(probs, routing_map) from the definitions (Megatron's topk_softmax_with_capacity,
    DeepSeek-V3's gate), float64; differentiable in logits."""
    l = logits.double()
    if score == "sigmoid":
        s = torch.sigmoid(l)
        key = s + bias.double() if bias is not None else s
    elif pre_softmax:
        s = torch.softmax(l, -1)
        key = s
    else:
        key = l
    idx = torch.topk(key.detach(), k, dim=-1).indices
    mask = torch.zeros_like(l, dtype=torch.bool).scatter(-1, idx, True)
    if score == "softmax" and not pre_softmax:
        probs = torch.softmax(l.masked_fill(~mask, float("-inf")), -1)
    else:
        probs = s * mask
        if score == "sigmoid" and k > 1:
            probs = probs / (probs.sum(-1, keepdim=True) + 1e-20)
    return probs * scaling_factor, mask


def _logits(shape, dtype=torch.float32, device="cpu", seed=None, scale=2.0):
    """Random logits; in 16 bits, distinct multiples of 1/16 in each row (exact in bfloat16
    and float16 for up to 256 experts), so that no tie makes the choice ambiguous."""
    if dtype in (torch.float32, torch.float64):
        return randn(*shape, dtype=dtype, device=device, seed=seed, scale=scale)
    e = shape[-1]
    assert e <= 256
    g = torch.Generator().manual_seed(seed or 0)
    rows = torch.stack([torch.randperm(e, generator=g) for _ in range(
        int(torch.tensor(shape[:-1]).prod()))])
    return ((rows.float() - e // 2) / 16).reshape(shape).to(device=device, dtype=dtype)


def _choice_scores(logits, score, bias):
    """The float64 values top-k ranks: the logits (softmax is monotonic), or sigmoid(logits)
    plus the expert bias."""
    x = logits.detach().double()
    if score == "sigmoid":
        x = torch.sigmoid(x) + (0.0 if bias is None else bias.detach().double())
    return x


def _check(logits, k, score, pre, sf=1.0, bias=None, dtype_tol=torch.float32):
    """Against the float64 reference. Rows whose k-th and (k+1)-th choice scores lie within
    float32 rounding of each other (near ties, a few in 8192 x 256 sigmoid scores) may pick
    either expert in float32: there every chosen expert must score within that of the k-th,
    and the rest of the checks run on the other rows."""
    lg = logits.detach().clone().requires_grad_()
    probs, rmap = fk.router_topk(lg, k, score, pre, sf, bias)
    pr, mr = ref_topk(logits.detach().double().requires_grad_(), k, score, pre, sf, bias)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    assert probs.dtype == acc and rmap.dtype == torch.bool
    assert probs.shape == rmap.shape == logits.shape
    assert (rmap.sum(-1) == k).all()
    assert not probs[~rmap].any()
    cs = _choice_scores(logits, score, bias).cpu().reshape(-1, logits.shape[-1])
    top = cs.topk(min(k + 1, cs.shape[-1]), dim=-1).values
    tol = 0.0 if acc == torch.float64 else 4 * 2.0 ** -24 * (1 + cs.abs().amax(-1))
    clear = (top[:, -1] < top[:, k - 1] - tol) if k < cs.shape[-1] else \
        torch.ones(cs.shape[0], dtype=torch.bool)
    rm, mref = rmap.cpu().reshape(cs.shape), mr.cpu().reshape(cs.shape)
    assert torch.equal(rm[clear], mref[clear]), "routing map"
    kth = top[:, k - 1:k] - (tol[:, None] if torch.is_tensor(tol) else tol)
    assert ((cs >= kth) | ~rm).all(), "a near-tie row chose an expert below the k-th score"
    assert clear.float().mean() > 0.95, "too many near ties for the test to mean much"
    rows = clear.reshape(logits.shape[:-1]).to(logits.device)
    assert_close(probs[rows], pr[rows], dtype_tol, what="probs")
    g = randn(*logits.shape, device=logits.device, seed=11).to(acc)
    probs.backward(g)
    lr = logits.detach().double().requires_grad_()
    ref_topk(lr, k, score, pre, sf, bias)[0].backward(g.double())
    assert lg.grad.dtype == logits.dtype
    assert_close(lg.grad[rows], lr.grad[rows], logits.dtype if logits.dtype != torch.float64
                 else torch.float64, factor=2, what="grad_logits")


# --- level 1: the Triton source under the interpreter ---------------------------------------

# (score, pre_softmax, expert bias): the bias is a sigmoid option
INTERP_MODES = [(s, p, False) for s, p in MODES] + [("sigmoid", False, True)]


@pytest.mark.parametrize("score,pre,with_bias", INTERP_MODES,
                         ids=MODE_IDS + ["sigmoid-bias"])
@pytest.mark.parametrize("t,e,k,block,rows", [(7, 37, 5, 64, 2), (3, 8, 1, 32, 4),
                                              (5, 64, 8, 64, 1), (4, 16, 16, 32, 2)])
def test_interpreter_forward_backward(score, pre, with_bias, t, e, k, block, rows):
    mod = load_triton_src("router_topk")
    code = {("softmax", False): 0, ("softmax", True): 1, ("sigmoid", False): 2}[(score, pre)]
    logits = _logits((t, e), seed=t * e + k)
    bias = randn(e, seed=3, scale=0.3) if with_bias else None
    lr = logits.double().requires_grad_()
    pr, mr = ref_topk(lr, k, score, pre, 1.5, bias)
    probs = torch.full((t, e), float("nan"))
    rmap = torch.full((t, e), 7, dtype=torch.int8)
    grid = (cdiv(t, rows),)
    mod.router_topk_fwd_kernel[grid](logits, bias if with_bias else probs, probs, rmap, t, e, k,
                                     code, int(with_bias), int(k > 1), 1.5, ROWS=rows,
                                     BLOCK_E=block)
    assert torch.equal(rmap.bool(), mr) and set(rmap.unique().tolist()) <= {0, 1}
    assert_close(probs, pr, torch.float32, what="probs")
    g = randn(t, e, seed=5)
    pr.backward(g.double())
    dl = torch.full((t, e), float("nan"))
    mod.router_topk_bwd_kernel[grid](g, logits, rmap, dl, t, e, code, int(k > 1), 1.5,
                                     ROWS=rows, BLOCK_E=block)
    assert_close(dl, lr.grad, torch.float32, what="grad_logits")


def test_interpreter_ties_and_nan():
    """Ties go to the lower index; NaN is chosen first (and makes its row's probs NaN)."""
    mod = load_triton_src("router_topk")
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 2.0, 2.0],
                           [0.0, float("nan"), 1.0, 2.0, 0.0, 0.0, 0.0, 0.0]])
    probs = torch.empty(2, 8)
    rmap = torch.empty(2, 8, dtype=torch.int8)
    mod.router_topk_fwd_kernel[(1,)](logits, probs, probs, rmap, 2, 8, 2, 0, 0, 1, 1.0,
                                     ROWS=2, BLOCK_E=32)
    assert rmap[0].nonzero().flatten().tolist() == [1, 2]
    assert rmap[1].nonzero().flatten().tolist() == [1, 3]
    assert torch.isnan(probs[1, [1, 3]]).all()


def test_variants_cover_every_dtype_and_block():
    mod = load_triton_src("router_topk")
    for arch in (80, 90, 100, 103, 120):
        vs = mod.variants(arch)
        keys = {(v.family, v.dtype, v.block) for v in vs}
        assert len(keys) == len(vs) == 2 * 3 * len(mod.BLOCKS)
        assert max(mod.BLOCKS) == 1024
        for v in vs:
            assert v.constexprs["BLOCK_E"] == v.block
            assert v.constexprs["ROWS"] * v.block == max(v.block, mod.TILE_ELEMS)


# --- level 2: the CPU backend --------------------------------------------------------------

@pytest.mark.parametrize("score,pre", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("shape,k", [((1, 8), 1), ((9, 37), 4), ((2, 3, 64), 8), ((5, 16), 16)])
def test_cpu_matches_reference(score, pre, dtype, shape, k):
    logits = _logits(shape, dtype, seed=sum(shape) + k)
    _check(logits, k, score, pre, dtype_tol=torch.float32 if dtype != torch.float64
           else torch.float64)


def test_cpu_scaling_and_bias():
    logits = _logits((11, 32), seed=1)
    bias = randn(32, seed=2, scale=0.5)
    _check(logits, 6, "sigmoid", False, 2.5, bias)
    _check(logits, 1, "sigmoid", False, 2.5, bias)  # k = 1: no normalization
    _check(logits, 3, "softmax", True, 0.5)
    # the bias changes the choice but not the probabilities of what is chosen
    p0, m0 = fk.router_topk(logits, 6, "sigmoid")
    p1, m1 = fk.router_topk(logits, 6, "sigmoid", expert_bias=bias)
    assert not torch.equal(m0, m1)
    s = torch.sigmoid(logits) * m1
    assert_close(p1, s / s.sum(-1, keepdim=True), torch.float32)


def test_cpu_composes_with_router_logits():
    """A router: fk.router_logits then fk.router_topk, gradients to x and the weight."""
    x = randn(6, 32, dtype=torch.bfloat16, seed=1).requires_grad_()
    w = randn(24, 32, dtype=torch.bfloat16, seed=2, scale=0.2).requires_grad_()
    probs, rmap = fk.router_topk(fk.router_logits(x, w), 4, "softmax")
    (probs * randn(6, 24, seed=3)).sum().backward()
    x2 = x.detach().float().requires_grad_()
    w2 = w.detach().float().requires_grad_()
    pr, mr = ref_topk(x2 @ w2.T, 4)
    (pr * randn(6, 24, seed=3).double()).sum().backward()
    assert torch.equal(rmap, mr)
    assert_close(probs, pr, torch.float32)
    assert_close(x.grad, x2.grad, torch.bfloat16)
    assert_close(w.grad, w2.grad, torch.bfloat16)


def test_cpu_empty_rows():
    probs, rmap = fk.router_topk(torch.zeros(0, 8, requires_grad=True), 2)
    assert probs.shape == rmap.shape == (0, 8)


# --- bad input: the same message from every backend -----------------------------------

def _l(d, *shape, dtype=torch.float32):
    return torch.ones(shape, dtype=dtype, device=d)


BAD = [
    ("k too large", lambda d: (_l(d, 2, 8), 9), "k must be between 1 and the number of experts"),
    ("k zero", lambda d: (_l(d, 2, 8), 0), "k must be between"),
    ("score", lambda d: (_l(d, 2, 8), 2, "relu"), "score must be 'softmax' or 'sigmoid'"),
    ("pre_softmax sigmoid", lambda d: (_l(d, 2, 8), 2, "sigmoid", True), "pre_softmax applies"),
    ("bias with softmax", lambda d: (_l(d, 2, 8), 2, "softmax", False, 1.0, _l(d, 8)),
     "expert_bias applies"),
    ("bias shape", lambda d: (_l(d, 2, 8), 2, "sigmoid", False, 1.0, _l(d, 7)),
     "expert_bias must have shape"),
    ("bias dtype", lambda d: (_l(d, 2, 8), 2, "sigmoid", False, 1.0,
                              _l(d, 8, dtype=torch.bfloat16)), "expert_bias must have dtype"),
    ("scaling", lambda d: (_l(d, 2, 8), 2, "softmax", False, float("inf")),
     "scaling_factor must be finite"),
    ("int logits", lambda d: (_l(d, 2, 8, dtype=torch.int32), 2), "not supported"),
    ("scalar", lambda d: (_l(d), 1), "at least one dimension"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.router_topk(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta
    assert cpu.startswith("fk::router_topk: ")


def test_bad_backward_input_cpu_and_meta_agree():
    def call(d):
        return torch.ops.fk._router_topk_backward(_l(d, 2, 8), _l(d, 2, 8), _l(d, 2, 8), 2,
                                                  "softmax", False, 1.0)
    cpu, meta = error_lines(call, ("cpu", "meta"), "routing_map must have dtype Bool")
    assert cpu == meta and cpu.startswith("fk::_router_topk_backward: ")


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------

@pytest.mark.parametrize("score,pre", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("k", [1, 3])
def test_gradcheck(score, pre, k):
    logits = _logits((4, 9), torch.float64, seed=k).requires_grad_()
    assert torch.autograd.gradcheck(lambda l: fk.router_topk(l, k, score, pre, 1.7)[0],
                                    (logits,))


def test_opcheck():
    logits = _logits((2, 3, 16), seed=4).requires_grad_()
    bias = randn(16, seed=5, scale=0.3)
    for args in ((logits, 4), (logits, 4, "softmax", True, 2.0),
                 (logits, 4, "sigmoid", False, 2.5, bias), (logits.detach(), 1, "sigmoid")):
        torch.library.opcheck(torch.ops.fk.router_topk, args)
    probs, rmap = torch.ops.fk.router_topk(logits.detach(), 4)
    torch.library.opcheck(torch.ops.fk._router_topk_backward,
                          (torch.randn_like(probs), logits.detach(), rmap, 4, "softmax", False,
                           1.0))


def test_torch_compile_fullgraph():
    def route(x, w, bias):
        probs, rmap = fk.router_topk(fk.router_logits(x, w), 3, "sigmoid", expert_bias=bias)
        return probs, rmap.sum(0)

    torch._dynamo.reset()
    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    bias = randn(12, seed=9, scale=0.1)
    for rows in (5, 9):
        x = randn(rows, 16, seed=rows).requires_grad_()
        w = randn(12, 16, seed=1, scale=0.3).requires_grad_()
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        (p, counts), (pr, cr) = compiled(x, w, bias), route(x2, w2, bias)
        assert torch.equal(counts, cr)
        assert_close(p, pr, torch.float32)
        g = randn(rows, 12, seed=3)
        p.backward(g)
        pr.backward(g)
        assert_close(x.grad, x2.grad, torch.float32)
        assert_close(w.grad, w2.grad, torch.float32)


def test_functional_scripts():
    @torch.jit.script
    def f(logits):
        return fk.router_topk(logits, 2, "softmax", True)

    logits = _logits((3, 8), seed=2)
    probs, rmap = f(logits)
    pr, mr = ref_topk(logits, 2, "softmax", True)
    assert torch.equal(rmap, mr)
    assert_close(probs, pr, torch.float32)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# (T, E, k): one token; Mixtral 8 / 2, odd expert counts, Qwen3-MoE 128 / 8, DeepSeek-V3
# 256 / 8, linghe's 8192 x 256, 384 and 1024 experts (the largest block).
CUDA_CASES = [(1, 8, 2), (37, 37, 5), (1000, 60, 4), (4096, 128, 8), (8192, 256, 8),
              (777, 384, 16), (300, 1024, 16), (64, 1000, 1)]


@pytest.mark.cuda
@pytest.mark.parametrize("score,pre", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("t,e,k", CUDA_CASES)
def test_cuda_matches_reference(score, pre, t, e, k):
    logits = _logits((t, e), device="cuda", seed=t + e)
    bias = randn(e, device="cuda", seed=1, scale=0.2) if score == "sigmoid" else None
    _check(logits, k, score, pre, 1.3, bias)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_cuda_16bit_logits(dtype):
    for score, pre in MODES:
        _check(_logits((500, 64), dtype, "cuda", seed=4), 6, score, pre)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.router_topk(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    with pytest.raises(RuntimeError, match="router_topk_fwd"):
        fk.router_topk(torch.randn(2, 1025, device="cuda"), 2)


@pytest.mark.cuda
def test_cuda_opcheck_and_compile():
    logits = _logits((2, 5, 64), device="cuda", seed=1).requires_grad_()
    torch.library.opcheck(torch.ops.fk.router_topk, (logits, 4, "softmax", True))
    f = torch.compile(lambda l: fk.router_topk(l, 4)[0].pow(2).sum(), fullgraph=True,
                      backend="aot_eager")
    f(logits).backward()
    assert logits.grad is not None
