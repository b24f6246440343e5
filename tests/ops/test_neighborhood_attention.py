"""fk.neighborhood_attention at every test level: Triton source (interpreter), CPU backend,
autograd, opcheck, torch.compile, TorchScript, the module, bad input, and the CUDA kernels
(marker ``cuda``)."""
import math

import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn)

pytestmark = [pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning")]


# --- the reference: dense, with the (L, L) mask (fine at test sizes) -------------------------

def ref_mask(seq_len, kernel_size, dilation):
    """True where query i (row) may attend key j (column): |j - i| <= (kernel_size // 2) *
    dilation, j - i a multiple of dilation, j inside the sequence (windows cut at the ends),
    as Liger Kernel's _neighborhood_mask_kernel builds it."""
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    half = (kernel_size // 2) * dilation
    return ((j - i).abs() <= half) & ((j - i) % dilation == 0)


def ref_na(q, k, v, kernel_size=7, dilation=1, scale=None):
    """softmax(scale * q k^T masked to the window) v in float64; differentiable."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~ref_mask(q.shape[-2], kernel_size, dilation).to(s.device), -math.inf)
    return torch.softmax(s, -1) @ v.double()


def ref_na_lse(q, k, kernel_size=7, dilation=1, scale=None):
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~ref_mask(q.shape[-2], kernel_size, dilation).to(s.device), -math.inf)
    return torch.logsumexp(s, -1)


def ref_all(q, k, v, dout, kernel_size=7, dilation=1, scale=None):
    """(out, dq, dk, dv) in float64 on the CPU."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    out = ref_na(*leaves, kernel_size, dilation, scale)
    out.backward(dout.detach().cpu().double())
    return (out.detach(),) + tuple(t.grad for t in leaves)


def qkv(b, h, n, d, dtype=torch.float32, device="cpu", seed=None):
    return [randn(b, h, n, d, dtype=dtype, device=device, seed=None if seed is None else seed + i)
            for i in range(3)]


def check_all(got, ref, dtype, factor=1.0, what=""):
    for name, g, r in zip(("out", "dq", "dk", "dv"), got, ref):
        assert_close(g, r, dtype, factor=factor, what=f"{what} {name}")


# --- level 1: the Triton source under the interpreter ---------------------------------

def _interp_run(mod, q, k, v, dout, kernel_size, dilation, scale, block_d):
    """The three kernels as the C++ launcher runs them: one program per (batch * head,
    residue, block), radius and dilation clamped to the sequence."""
    b, h, n, d = q.shape
    configs = mod.FP32_CONFIGS if q.dtype == torch.float32 else mod.CONFIGS
    (fm, fn, _), (qm, qn, _), (km, kn, _) = configs[block_d]
    dil = max(1, min(dilation, n))
    n_sub = cdiv(n, dil)
    radius = min(kernel_size // 2, n_sub - 1)
    qk_scale = scale * mod.LOG2E.value
    strides = [s for t in (q, k, v) for s in t.stride()[:3]]
    o = torch.full((b, h, n, d), 7.0, dtype=q.dtype)
    lse = torch.full((b, h, n), 7.0)
    mod.na_fwd_kernel[(b * h * dil * cdiv(n_sub, fm),)](
        q, k, v, o, lse, *strides, h, n, d, radius, dil, qk_scale,
        BLOCK_M=fm, BLOCK_N=fn, BLOCK_D=block_d)
    dq, dk, dv = (torch.full((b, h, n, d), 7.0, dtype=q.dtype) for _ in range(3))
    delta = torch.full((b, h, n), 7.0)
    do_strides = list(dout.stride()[:3])
    mod.na_bwd_dq_kernel[(b * h * dil * cdiv(n_sub, qm),)](
        q, k, v, o, dout, lse, delta, dq, *strides, *do_strides, h, n, d, radius, dil,
        qk_scale, scale, BLOCK_M=qm, BLOCK_N=qn, BLOCK_D=block_d)
    mod.na_bwd_dkv_kernel[(b * h * dil * cdiv(n_sub, kn),)](
        q, k, v, dout, lse, delta, dk, dv, *strides, *do_strides, h, n, d, radius, dil,
        qk_scale, scale, BLOCK_M=km, BLOCK_N=kn, BLOCK_D=block_d)
    return o, lse, dq, dk, dv


# (b, h, n, d, kernel_size, dilation, block_d)
INTERP_CASES = [(1, 2, 150, 16, 7, 1, 16), (2, 1, 70, 24, 5, 3, 32), (1, 1, 9, 8, 49, 1, 16),
                (1, 2, 131, 16, 49, 2, 16), (1, 1, 40, 16, 3, 50, 16), (1, 1, 1, 16, 7, 1, 16)]


# Triton 3.6's interpreter multiplies bfloat16 tl.dot operands as their raw 16-bit patterns
# (a 16 x 16 product is off by ~1e10), so the level-1 tests run float32 and float16; the
# bfloat16 kernels are checked on the GPU (test_cuda_*).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", INTERP_CASES, ids=str)
def test_interpreter(dtype, case):
    mod = load_triton_src("neighborhood_attention")
    b, h, n, d, ks, dil, block_d = case
    q, k, v = qkv(b, h, n, d, dtype)
    dout = randn(b, h, n, d, dtype=dtype)
    scale = 0.3
    o, lse, dq, dk, dv = _interp_run(mod, q, k, v, dout, ks, dil, scale, block_d)
    ref = ref_all(q, k, v, dout, ks, dil, scale)
    check_all((o, dq, dk, dv), ref, dtype, factor=2.0)
    # lse sums dot products q . k: its rounding error scales with the terms |q| . |k|, not
    # with lse (with one key lse is that one score, which random inputs may nearly cancel)
    terms = (scale * q.double().abs() @ k.double().abs().transpose(-1, -2)).amax(-1)
    assert_close(lse, ref_na_lse(q, k, ks, dil, scale), torch.float32, what="lse",
                 scale=terms.norm().item())


def test_interpreter_strided_inputs():
    """q, k, v and dO as (batch, seq, heads, dim) projections viewed as (b, h, seq, dim)."""
    mod = load_triton_src("neighborhood_attention")
    b, h, n, d = 2, 3, 45, 16
    q, k, v, dout = (randn(b, n, h, d).transpose(1, 2) for _ in range(4))
    o, lse, dq, dk, dv = _interp_run(mod, q, k, v, dout, 5, 2, 0.25, 16)
    check_all((o, dq, dk, dv), ref_all(q, k, v, dout, 5, 2, 0.25), torch.float32, factor=2)


# --- level 2: the CPU backend against the reference --------------------------------------

# (b, h, n, d, kernel_size, dilation)
CPU_CASES = [(2, 3, 37, 16, 7, 1), (1, 2, 50, 8, 7, 3), (1, 1, 5, 4, 7, 1), (1, 1, 1, 4, 7, 2),
             (2, 1, 64, 5, 49, 1), (1, 2, 60, 8, 49, 2), (1, 1, 20, 4, 1, 1),
             (1, 1, 21, 4, 1001, 1), (1, 1, 12, 4, 3, 40)]


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("case", CPU_CASES, ids=str)
def test_cpu_forward_backward(dtype, case):
    b, h, n, d, ks, dil = case
    q, k, v = (t.requires_grad_() for t in qkv(b, h, n, d, dtype))
    out = fk.neighborhood_attention(q, k, v, ks, dil)
    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    dout = randn(b, h, n, d, dtype=dtype)
    out.backward(dout)
    check_all((out, q.grad, k.grad, v.grad), ref_all(q, k, v, dout, ks, dil), dtype, factor=2)


def test_cpu_lse_and_scale():
    q, k, v = qkv(2, 2, 30, 8)
    for scale in (None, 0.05, 2.0):
        out, lse = torch.ops.fk._neighborhood_attention_forward(q, k, v, 5, 2, scale)
        assert lse.dtype == torch.float32 and lse.shape == (2, 2, 30)
        assert_close(out, ref_na(q, k, v, 5, 2, scale), torch.float32)
        assert_close(lse, ref_na_lse(q, k, 5, 2, scale), torch.float32)
    _, lse64 = torch.ops.fk._neighborhood_attention_forward(q.double(), k.double(), v.double(),
                                                            5, 1, None)
    assert lse64.dtype == torch.float64


def test_cpu_special_windows():
    """kernel_size 1: each query sees only itself (out == v); a window wider than the
    sequence (or a dilation past it) is the same as the widest one."""
    q, k, v = qkv(1, 2, 17, 4)
    torch.testing.assert_close(fk.neighborhood_attention(q, k, v, 1, 1), v)
    torch.testing.assert_close(fk.neighborhood_attention(q, k, v, 7, 17), v)
    torch.testing.assert_close(fk.neighborhood_attention(q, k, v, 7, 10 ** 9), v)
    wide = fk.neighborhood_attention(q, k, v, 10 ** 9 + 1, 1)
    assert_close(wide, ref_na(q, k, v, 33, 1), torch.float32)
    full = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v
    assert_close(wide, full, torch.float32)


def test_cpu_windows_are_cut_not_shifted():
    """The first query sees keys 0..r only (Liger's mask); a shifted (NATTEN-style) window
    would see keys 0..2r."""
    n, d = 12, 4
    q, k, v = qkv(1, 1, n, d)
    out = fk.neighborhood_attention(q, k, v, 5, 1)
    s = (q[0, 0, 0] @ k[0, 0, :3].t()) / 2.0
    expect = torch.softmax(s, -1) @ v[0, 0, :3]
    assert_close(out[0, 0, 0], expect, torch.float32)


def test_cpu_non_contiguous_and_broadcast():
    b, h, n, d = 2, 3, 25, 8
    q, k, v = (randn(b, n, h, d).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    assert_close(fk.neighborhood_attention(q, k, v, 7, 2), ref_na(q, k, v, 7, 2),
                 torch.float32)
    kb = randn(b, 1, n, d).expand(b, h, n, d)  # a key shared by all heads (stride 0)
    assert_close(fk.neighborhood_attention(q, kb, v, 5), ref_na(q, kb, v, 5), torch.float32)


def test_cpu_long_sequence_is_linear_memory():
    """L = 200000: an (L, L) score matrix would need 160 GB; the window form needs O(L)."""
    n = 200_000
    q, k, v = qkv(1, 1, n, 4, seed=5)
    q.requires_grad_()
    out = fk.neighborhood_attention(q, k, v, 3, 1)
    out.sum().backward()
    assert out.shape == q.shape and torch.isfinite(q.grad).all()
    lo, hi = n - 40, n
    ref = ref_na(q[:, :, lo:hi].detach(), k[:, :, lo:hi], v[:, :, lo:hi], 3, 1)
    assert_close(out[:, :, lo + 1:hi], ref[:, :, 1:], torch.float32)


def test_cpu_empty():
    for shape in ((0, 2, 5, 4), (1, 0, 5, 4), (1, 2, 0, 4), (1, 2, 5, 0)):
        q, k, v = (torch.zeros(shape, requires_grad=True) for _ in range(3))
        out = fk.neighborhood_attention(q, k, v)
        assert out.shape == shape
        out.sum().backward()
        assert q.grad.shape == shape and k.grad.shape == shape and v.grad.shape == shape


def test_double_backward_is_a_clear_error():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 10, 4))
    out = fk.neighborhood_attention(q, k, v, 3)
    (gq,) = torch.autograd.grad((out * randn(1, 2, 10, 4)).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gq.sum().backward()


# --- the module --------------------------------------------------------------------------

def _module_ref(mod, x):
    b, n, hid = x.shape
    heads, hd = mod.num_heads, mod.head_dim

    def split(t):
        return t.view(b, n, heads, hd).transpose(1, 2)

    q, k, v = (split(p(x)) for p in (mod.q_proj, mod.k_proj, mod.v_proj))
    att = ref_na(q, k, v, mod.kernel_size, mod.dilation, mod.scale).float()
    return mod.out_proj(att.transpose(1, 2).reshape(b, n, hid))


def test_module():
    torch.manual_seed(0)
    mod = fk.nn.NeighborhoodAttention(32, 4, kernel_size=5, dilation=2)
    names = sorted(n for n, _ in mod.named_parameters())
    # Liger's LigerFusedNeighborhoodAttention names.
    assert names == sorted(f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")
                           for w in ("weight", "bias"))
    assert mod.head_dim == 8 and mod.scale == 1 / math.sqrt(8) and mod.dropout is None
    x = randn(2, 19, 32).requires_grad_()
    y = mod(x)
    with torch.no_grad():
        ref = _module_ref(mod, x)
    assert_close(y, ref, torch.float32)
    y.sum().backward()
    assert x.grad is not None and mod.q_proj.weight.grad is not None
    assert "kernel_size=5" in repr(mod) and "dilation=2" in repr(mod)
    nob = fk.nn.NeighborhoodAttention(16, 2, bias=False, scale=0.5)
    assert nob.q_proj.bias is None and nob.scale == 0.5
    with pytest.raises(NotImplementedError, match="attention_mask"):
        mod(x, torch.ones(2, 19))


def test_module_dropout():
    torch.manual_seed(0)
    mod = fk.nn.NeighborhoodAttention(16, 2, dropout=1.0)
    x = randn(1, 7, 16)
    mod.train()
    # Everything dropped: only out_proj's bias is left.
    torch.testing.assert_close(mod(x), mod.out_proj.bias.expand(1, 7, 16))
    mod.eval()
    with torch.no_grad():
        assert_close(mod(x), _module_ref(mod, x), torch.float32)


def test_module_bad_arguments():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        fk.nn.NeighborhoodAttention(30, 4)
    with pytest.raises(ValueError, match="positive odd"):
        fk.nn.NeighborhoodAttention(32, 4, kernel_size=4)
    with pytest.raises(ValueError, match="positive odd"):
        fk.nn.NeighborhoodAttention(32, 4, kernel_size=0)
    with pytest.raises(ValueError, match="dilation must be positive"):
        fk.nn.NeighborhoodAttention(32, 4, dilation=0)


# --- bad input -----------------------------------------------------------------------------

def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(*shape, dtype=dtype, device=device)


def _bwd(d, grad_out=None, out=None, lse=None, ks=7):
    q = _t(1, 2, 5, 4, device=d)
    return torch.ops.fk._neighborhood_attention_backward(
        q if grad_out is None else grad_out, q, q, q, q if out is None else out,
        _t(1, 2, 5, device=d) if lse is None else lse, ks, 1, None)


BAD = [
    ("3-D q", lambda d: fk.neighborhood_attention(_t(2, 5, 4, device=d), _t(2, 5, 4, device=d),
                                                  _t(2, 5, 4, device=d)),
     "q must have 4 dimensions"),
    ("int dtype", lambda d: fk.neighborhood_attention(
        *(_t(1, 2, 5, 4, dtype=torch.int64, device=d) for _ in range(3))), "not supported"),
    ("dtype mismatch", lambda d: fk.neighborhood_attention(
        _t(1, 2, 5, 4, device=d), _t(1, 2, 5, 4, dtype=torch.float16, device=d),
        _t(1, 2, 5, 4, device=d)), "q and k must have the same dtype"),
    ("shape mismatch", lambda d: fk.neighborhood_attention(
        _t(1, 2, 5, 4, device=d), _t(1, 2, 5, 4, device=d), _t(1, 2, 6, 4, device=d)),
     "q and v must have the same shape"),
    ("even kernel", lambda d: fk.neighborhood_attention(*(_t(1, 2, 5, 4, device=d),) * 3, 4),
     "kernel_size must be a positive odd number, got 4"),
    ("zero kernel", lambda d: fk.neighborhood_attention(*(_t(1, 2, 5, 4, device=d),) * 3, 0),
     "kernel_size must be a positive odd number, got 0"),
    ("zero dilation", lambda d: fk.neighborhood_attention(*(_t(1, 2, 5, 4, device=d),) * 3, 7,
                                                          0),
     "dilation must be positive, got 0"),
    ("backward grad_out shape", lambda d: _bwd(d, grad_out=_t(1, 2, 4, 4, device=d)),
     "grad_out and q must have the same shape"),
    ("backward out dtype", lambda d: _bwd(d, out=_t(1, 2, 5, 4, dtype=torch.float16, device=d)),
     "out and q must have the same dtype"),
    ("backward lse dtype", lambda d: _bwd(d, lse=_t(1, 2, 5, dtype=torch.float16, device=d)),
     "lse must be float32"),
    ("backward lse shape", lambda d: _bwd(d, lse=_t(1, 2, 4, device=d)),
     r"lse must have shape \[1, 2, 5\]"),
    ("backward kernel", lambda d: _bwd(d, ks=2), "kernel_size must be a positive odd"),
]


@pytest.mark.parametrize("name,call,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, call, msg):
    cpu, meta = error_lines(call, ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.neighborhood_attention(_t(1, 2, 5, 4), _t(1, 2, 5, 4, device="meta"), _t(1, 2, 5, 4))


# --- level 3: autograd, opcheck, torch.compile, TorchScript --------------------------------

@pytest.mark.parametrize("ks,dil,scale", [(3, 1, None), (5, 2, 0.7), (7, 1, None)])
def test_gradcheck(ks, dil, scale):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 9, 3, torch.float64, seed=3))
    assert torch.autograd.gradcheck(
        lambda a, b, c: fk.neighborhood_attention(a, b, c, ks, dil, scale), (q, k, v))


def test_opcheck():
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 13, 8))
    torch.library.opcheck(torch.ops.fk._neighborhood_attention_forward, (q, k, v, 5, 2, None))
    torch.library.opcheck(torch.ops.fk._neighborhood_attention_forward, (q, k, v, 3, 1, 0.3))
    out, lse = torch.ops.fk._neighborhood_attention_forward(q.detach(), k.detach(), v.detach(),
                                                            5, 2, None)
    torch.library.opcheck(torch.ops.fk._neighborhood_attention_backward,
                          (randn(2, 2, 13, 8), q.detach(), k.detach(), v.detach(), out, lse,
                           5, 2, None),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_compile_fullgraph():
    def f(q, k, v):
        return fk.neighborhood_attention(q, k, v, 5, 2) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for n in (11, 17):
        q, k, v = (t.requires_grad_() for t in qkv(1, 2, n, 8))
        qe, ke, ve = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out, ref = compiled(q, k, v), f(qe, ke, ve)
        assert_close(out, ref, torch.float32)
        dout = randn(1, 2, n, 8)
        out.backward(dout)
        ref.backward(dout)
        for a, b in ((q, qe), (k, ke), (v, ve)):
            assert_close(a.grad, b.grad, torch.float32)


class _Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.att = fk.nn.NeighborhoodAttention(16, 2, kernel_size=3)

    def forward(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (self.att(x).sum() + fk.neighborhood_attention(q, q, q, 5, 2).sum()
                + torch.ops.fk.neighborhood_attention(q, q, q, 3, 1, 0.5).sum())


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")
def test_torchscript_save_load(tmp_path):
    torch.manual_seed(0)
    module = _Scripted()
    path = tmp_path / "na.pt"
    torch.jit.script(module).save(str(path))
    loaded = torch.jit.load(str(path))
    assert "fk::" in str(loaded.graph)
    x = randn(2, 9, 16)
    q = randn(1, 2, 9, 4)
    qs = [q.clone().requires_grad_() for _ in range(2)]
    outs = [module(x, qs[0]), loaded(x, qs[1])]
    torch.testing.assert_close(outs[1], outs[0])
    for o in outs:
        o.backward()
    torch.testing.assert_close(qs[1].grad, qs[0].grad)


def test_public_op_matches_forward():
    q, k, v = qkv(1, 2, 20, 8)
    torch.testing.assert_close(torch.ops.fk.neighborhood_attention(q, k, v, 5, 2),
                               fk.neighborhood_attention(q, k, v, 5, 2))


# --- level 5: CUDA kernels -----------------------------------------------------------------

# (b, h, n, d, kernel_size, dilation): one row, odd lengths, every head-dim bucket and
# non-power-of-two head dims, dilations that do not divide the length, windows wider than
# the sequence, both target kernel sizes.
CUDA_CASES = [(1, 1, 1, 64, 7, 1), (2, 3, 37, 64, 7, 1), (1, 4, 1000, 64, 7, 1),
              (2, 2, 777, 64, 49, 1), (1, 2, 513, 128, 49, 1), (1, 2, 300, 128, 7, 3),
              (2, 2, 257, 16, 7, 2), (1, 3, 129, 32, 13, 5), (1, 2, 200, 80, 7, 1),
              (1, 2, 150, 8, 9, 1), (1, 1, 100, 100, 5, 7), (1, 2, 40, 64, 101, 1),
              (1, 2, 64, 64, 7, 64), (2, 16, 2048, 64, 49, 2)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CUDA_CASES, ids=str)
def test_cuda_matches_reference(dtype, case):
    b, h, n, d, ks, dil = case
    q, k, v = (t.requires_grad_() for t in qkv(b, h, n, d, dtype, "cuda"))
    poison_cuda_cache()
    out = fk.neighborhood_attention(q, k, v, ks, dil)
    dout = randn(b, h, n, d, dtype=dtype, device="cuda")
    poison_cuda_cache()
    out.backward(dout)
    got = (out, q.grad, k.grad, v.grad)
    for g in got:
        assert not torch.isnan(g).any(), "unwritten elements"
    check_all(got, ref_all(q, k, v, dout, ks, dil), dtype, factor=2, what=str(case))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_lse_matches_cpu(dtype):
    q, k, v = qkv(2, 3, 333, 64, dtype, "cuda")
    for ks, dil, scale in ((7, 1, None), (49, 3, 0.2)):
        _, lse = torch.ops.fk._neighborhood_attention_forward(q, k, v, ks, dil, scale)
        assert lse.dtype == torch.float32
        assert_close(lse, ref_na_lse(q.cpu(), k.cpu(), ks, dil, scale), torch.float32,
                     factor=4)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_strided_misaligned_and_broadcast(dtype):
    """(b, seq, heads, dim) projections seen as (b, heads, seq, dim) (read in place), inputs
    off 16-byte alignment, a head dim that is not the unit-stride dim (copied), a key shared
    by all heads (stride 0)."""
    b, h, n, d = 2, 4, 301, 64
    q, k, v, dout = (randn(b, n, h, d, dtype=dtype, device="cuda").transpose(1, 2)
                     for _ in range(4))
    cases = [(q, k, v, dout),
             tuple(misaligned(t.contiguous()) for t in (q, k, v, dout)),
             tuple(randn(b, h, d, n, dtype=dtype, device="cuda").transpose(2, 3)
                   for _ in range(4)),
             (q, randn(b, 1, n, d, dtype=dtype, device="cuda").expand(b, h, n, d), v, dout)]
    for i, (qq, kk, vv, do) in enumerate(cases):
        leaves = [t.detach().requires_grad_() for t in (qq, kk, vv)]
        out = fk.neighborhood_attention(*leaves, 7, 2)
        out.backward(do)
        ref = ref_all(qq, kk, vv, do, 7, 2)
        got = (out,) + tuple(t.grad for t in leaves)
        if i == 3:  # the expanded key's gradient sums over heads
            got, ref = got[:2] + got[3:], ref[:2] + ref[3:]
        for g, r in zip(got, ref):
            assert_close(g, r, dtype, factor=2, what=f"case {i}")


@pytest.mark.cuda
def test_cuda_module_matches_cpu():
    torch.manual_seed(0)
    mod = fk.nn.NeighborhoodAttention(256, 4, kernel_size=7, dilation=2)
    x = randn(2, 333, 256)
    y_cpu = mod(x)
    y_cuda = mod.cuda()(x.cuda())
    assert_close(y_cuda, y_cpu, torch.float32, factor=4)
    y_cuda.sum().backward()
    assert mod.q_proj.weight.grad is not None


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, call, msg in BAD:
        cpu, cuda = error_lines(call, ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    for call in (lambda d: fk.neighborhood_attention(*(_t(1, 2, 5, 129, device=d),) * 3),
                 lambda d: torch.ops.fk._neighborhood_attention_backward(
                     *(_t(1, 2, 5, 129, device=d),) * 5, _t(1, 2, 5, device=d), 7, 1, None)):
        cuda, fake = error_lines(call, ("cuda", "fake-cuda"), "head_dim 129 is larger than 128")
        assert cuda == fake
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.neighborhood_attention(*(_t(1, 2, 5, 4, dtype=torch.float64, device="cuda"),) * 3)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.neighborhood_attention(_t(1, 2, 5, 4, device="cuda"), _t(1, 2, 5, 4), _t(1, 2, 5, 4))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    for shape in ((0, 2, 5, 64), (1, 2, 0, 64), (1, 2, 5, 0)):
        q, k, v = (torch.zeros(shape, device="cuda", requires_grad=True) for _ in range(3))
        out = fk.neighborhood_attention(q, k, v)
        assert out.shape == shape
        out.sum().backward()
        assert q.grad.shape == shape
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 70, 32, device="cuda"))
    torch.library.opcheck(torch.ops.fk._neighborhood_attention_forward, (q, k, v, 7, 2, None))
    f = torch.compile(lambda a, b, c: fk.neighborhood_attention(a, b, c, 7, 2).pow(2).sum(),
                      fullgraph=True, backend="aot_eager")
    f(q, k, v).backward()
    assert q.grad is not None


@pytest.mark.cuda
def test_cuda_graph_capture():
    """No host synchronisation: forward and backward capture into a CUDA graph."""
    q, k, v, dout = (randn(2, 4, 1000, 64, dtype=torch.bfloat16, device="cuda")
                     for _ in range(4))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, lse = torch.ops.fk._neighborhood_attention_forward(q, k, v, 7, 2, None)
        torch.ops.fk._neighborhood_attention_backward(dout, q, k, v, out, lse, 7, 2, None)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = torch.ops.fk._neighborhood_attention_forward(q, k, v, 7, 2, None)
        grads = torch.ops.fk._neighborhood_attention_backward(dout, q, k, v, out, lse, 7, 2,
                                                              None)
    for t in (q, k, v, dout):
        t.copy_(randn(*t.shape, dtype=t.dtype, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    check_all((out,) + tuple(grads), ref_all(q, k, v, dout, 7, 2), torch.bfloat16, factor=2)


@pytest.mark.cuda
@pytest.mark.parametrize("ks", [7, 49])
def test_cuda_memory_is_linear_in_seq_len(ks):
    """Forward + backward at L = 32768: peak memory a small multiple of the inputs (an (L, L)
    score matrix alone would be 4 GiB per head)."""
    b, h, n, d = 1, 2, 32768, 64
    q, k, v = (t.requires_grad_() for t in qkv(b, h, n, d, torch.bfloat16, "cuda"))
    dout = randn(b, h, n, d, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fk.neighborhood_attention(q, k, v, ks).backward(dout)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= 8 * q.numel() * q.element_size(), extra


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    """One sequence of more than 2^31 elements: rows past element 2^31 in every kernel,
    checked at both ends against the reference on a slice (windows are local)."""
    d, ks = 64, 7
    n = (1 << 31) // d + 1000
    q, k, v, dout = (torch.randn(1, 1, n, d, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = torch.ops.fk._neighborhood_attention_forward(q, k, v, ks, 1, None)
    dq, dk, dv = torch.ops.fk._neighborhood_attention_backward(dout, q, k, v, out, lse, ks, 1,
                                                               None)
    margin = 20
    for lo, hi, keep in ((0, 100, slice(0, 100 - margin)), (n - 100, n, slice(margin, 100))):
        sl = [t[:, :, lo:hi] for t in (q, k, v, dout)]
        ref = ref_all(*sl, ks, 1)
        for g, r in zip((out, dq, dk, dv), ref):
            assert_close(g[:, :, lo:hi][:, :, keep], r[:, :, keep], torch.bfloat16, factor=2)
    del q, k, v, dout, out, lse, dq, dk, dv
    torch.cuda.empty_cache()
