"""fk.llama4_rope at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, and the CUDA kernel (marker ``cuda``)."""
import pytest
import torch

import fk
from fk.ops.llama4_rope import apply_rotary_emb
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, round_nearest, round_toward_zero)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")


# --- the reference, written from Hugging Face Llama 4's apply_rotary_emb ---------------------

def _complex_4d(freqs):
    """freqs_cis (complex (S, P), (Bf, S, P), or a real view with a last dim of 2) as complex128
    (Bf, S, 1, P)."""
    if not freqs.is_complex():
        freqs = torch.view_as_complex(freqs.double().contiguous())
    f = freqs.to(torch.complex128)
    if f.dim() == 2:
        f = f[None]
    return f[:, :, None, :]


def ref_llama4_f64(x, freqs, conj=False):
    """view_as_real(view_as_complex(x.reshape(..., D/2, 2)) * freqs_cis) in float64."""
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    f = _complex_4d(freqs)
    return torch.view_as_real(xc * (f.conj() if conj else f)).flatten(3)


def ref_llama4(x, freqs, cast=round_nearest):
    out = ref_llama4_f64(x, freqs)
    return out if x.dtype == torch.float64 else cast(out.float(), x.dtype)


def ref_llama4_grads(q, k, freqs, dq, dk):
    """float64 gradients of the real map (x -> x * f as a real 2x2 rotation per pair)."""
    grads = []
    for x, g in ((q, dq), (k, dk)):
        x64 = x.detach().double().requires_grad_()
        ref_llama4_f64(x64, freqs).backward(g.detach().double())
        grads.append(x64.grad)
    return grads


def hf_freqs_cis(batch, seq, head_dim, base=500000.0, scaling=1.0, device="cpu"):
    """freqs_cis as Llama 4's rotary embedding builds it: complex64 (batch, seq, D/2)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    pos = (torch.arange(seq, dtype=torch.float32)[None, :]
           + torch.arange(batch, dtype=torch.float32)[:, None] * 5)
    freqs = pos[..., None] * inv_freq
    return (torch.polar(torch.ones_like(freqs), freqs) * scaling).to(device)


def hf_apply_rotary_emb(xq, xk, freqs_cis):
    """Hugging Face Llama 4's function, as written in modeling_llama4.py."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    xq_out = torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis[:, :, None, :]).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def _qk(b, s, hq, hkv, d, dtype=torch.float32, device="cpu", layout="bshd"):
    """q (b, s, hq, d), k (b, s, hkv, d): contiguous ("bshd", as Llama 4 has them) or
    transposed views of (b, h, s, d) buffers ("bhsd")."""
    if layout == "bshd":
        return (randn(b, s, hq, d, dtype=dtype, device=device),
                randn(b, s, hkv, d, dtype=dtype, device=device))
    return (randn(b, hq, s, d, dtype=dtype, device=device).transpose(1, 2),
            randn(b, hkv, s, d, dtype=dtype, device=device).transpose(1, 2))


def _freqs(b, s, d, form, dtype=torch.float32, device="cpu"):
    """Random-valued freqs_cis (not unit: any complex scale is applied as given) in one of the
    accepted forms."""
    if form == "complex_b":
        return torch.complex(randn(b, s, d // 2), randn(b, s, d // 2)).to(device)
    if form == "complex_2d":
        return torch.complex(randn(s, d // 2), randn(s, d // 2)).to(device)
    if form == "real_1":
        return randn(1, s, d // 2, 2, dtype=dtype, device=device)
    if form == "real_2d":
        return randn(s, d // 2, 2, dtype=dtype, device=device)
    raise ValueError(form)


# --- level 1: the Triton source under the interpreter ---------------------------------

def _run_interpreter(mod, q, k, freqs, conj, hb, bs, bh, steps, heads_fastest):
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    f = freqs if freqs.dim() == 4 else freqs[None]
    qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    strides = [x.stride(i) for x in (q, k, qo, ko) for i in range(3)]
    groups = cdiv(cdiv(hq, bh) + cdiv(hkv, bh), steps)
    mod.llama4_rope_kernel[(b * cdiv(s, bs) * groups,)](
        q, k, qo, ko, f, *strides, 0 if f.shape[0] == 1 else f.stride(0), f.stride(1),
        s, hq, hkv, d // 2, int(conj), int(heads_fastest), HB=hb, BS=bs, BH=bh, STEPS=steps)
    return qo, ko


INTERP_CASES = [
    # d, dtype, layout, freqs form, (hb, bs, bh, steps), heads_fastest, conj
    (16, torch.bfloat16, "bshd", "real_1", (8, 2, 4, 1), True, False),
    (16, torch.float16, "bhsd", "real_2d", (16, 4, 2, 2), False, True),
    (12, torch.float32, "bshd", "real_b", (4, 2, 2, 3), True, False),   # 2 pair chunks, masked
    (20, torch.bfloat16, "bhsd", "real_b", (4, 4, 4, 1), True, True),
]


@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}")
def test_interpreter(case):
    d, dtype, layout, form, tile, heads_fastest, conj = case
    mod = load_triton_src("llama4_rope")
    b, hq, hkv, s = 2, 5, 3, 7       # heads and seq not multiples of the tile
    q, k = _qk(b, s, hq, hkv, d, dtype, layout=layout)
    if form == "real_b":
        freqs = randn(b, s, d // 2, 2)
    else:
        freqs = _freqs(b, s, d, form, torch.float32 if dtype == torch.float16 else dtype)
    qo, ko = _run_interpreter(mod, q, k, freqs, conj, *tile, heads_fastest)
    for out, x, name in ((qo, q, "q"), (ko, k, "k")):
        ref = round_toward_zero(ref_llama4_f64(x, freqs, conj).float(), dtype)
        assert not torch.isnan(out).any(), f"{name}: unwritten elements"
        assert_close(out, ref, dtype, what=name)


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("form", ["complex_b", "complex_2d", "real_1", "real_2d"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_cpu_forward_backward(dtype, form, layout):
    b, hq, hkv, s, d = 2, 4, 2, 5, 12
    q, k = _qk(b, s, hq, hkv, d, dtype, layout=layout)
    q.requires_grad_()
    k.requires_grad_()
    if dtype == torch.float64 and form.startswith("complex"):
        freqs = _freqs(b, s, d, form).to(torch.complex128)
    else:
        freqs = _freqs(b, s, d, form, dtype=dtype if dtype != torch.float16 else torch.float32)
    qo, ko = fk.llama4_rope(q, k, freqs)
    for out, x, name in ((qo, q, "q"), (ko, k, "k")):
        assert out.dtype == dtype and out.shape == x.shape
        assert out.stride() == x.stride(), f"{name}: layout not kept"
        assert_close(out, ref_llama4(x, freqs), dtype, what=name)
    dq, dk = randn(*q.shape, dtype=dtype), randn(*k.shape, dtype=dtype)
    torch.autograd.backward((qo, ko), (dq, dk))
    gq, gk = ref_llama4_grads(q, k, freqs, dq, dk)
    assert_close(q.grad, gq, dtype, factor=2, what="dq")
    assert_close(k.grad, gk, dtype, factor=2, what="dk")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_matches_hf_apply_rotary_emb(dtype):
    b, s, hq, hkv, d = 2, 6, 4, 2, 16
    q, k = _qk(b, s, hq, hkv, d, dtype)
    freqs = hf_freqs_cis(b, s, d, scaling=1.25)
    hq_out, hk_out = hf_apply_rotary_emb(q, k, freqs)
    qo, ko = apply_rotary_emb(q, k, freqs)
    assert_close(qo, hq_out, dtype)
    assert_close(ko, hk_out, dtype)
    qo2, ko2 = fk.llama4_rope(q, k, torch.view_as_real(freqs))
    assert torch.equal(qo, qo2) and torch.equal(ko, ko2)


def test_backward_is_conjugate_rotation():
    """For unit freqs_cis the backward is the inverse rotation: it undoes the forward."""
    q, k = _qk(1, 5, 2, 1, 8, torch.float64)
    angles = randn(1, 5, 4, dtype=torch.float64)
    freqs = torch.polar(torch.ones_like(angles), angles)
    qo, ko = fk.llama4_rope(q, k, freqs)
    q2, k2 = torch.ops.fk._llama4_rope_backward(qo, ko, freqs)
    assert_close(q2, q, torch.float64)
    assert_close(k2, k, torch.float64)


def test_cpu_layouts():
    """Slices of a fused QKV projection (not dense) give contiguous outputs; an expanded k is
    read; a last dim with stride != 1 is handled."""
    b, s, hq, hkv, d = 2, 5, 4, 2, 16
    qkv = randn(b, s, hq + 2 * hkv, d)
    q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hkv]
    freqs = hf_freqs_cis(b, s, d)
    qo, ko = fk.llama4_rope(q, k, freqs)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close(qo, ref_llama4(q, freqs), torch.float32)
    assert_close(ko, ref_llama4(k, freqs), torch.float32)
    ke = randn(b, s, 1, d).expand(b, s, 3, d)
    qt = randn(b, s, hq, d * 2)[..., ::2]  # last-dim stride 2
    qo, ko = fk.llama4_rope(qt, ke, freqs[:1])
    assert_close(qo, ref_llama4(qt, freqs[:1]), torch.float32)
    assert_close(ko, ref_llama4(ke, freqs[:1]), torch.float32)


def test_cpu_empty():
    freqs = hf_freqs_cis(1, 0, 8)
    qo, ko = fk.llama4_rope(torch.empty(2, 0, 4, 8), torch.empty(2, 0, 1, 8), freqs)
    assert qo.shape == (2, 0, 4, 8) and ko.shape == (2, 0, 1, 8)
    freqs = hf_freqs_cis(1, 3, 8)
    qo, ko = fk.llama4_rope(torch.empty(2, 3, 0, 8), randn(2, 3, 1, 8), freqs)
    assert qo.shape == (2, 3, 0, 8)


def test_cpu_nan_inf_propagate():
    q = torch.tensor([1.0, float("nan"), 2.0, float("inf")]).view(1, 1, 1, 4)
    freqs = torch.tensor([[1 + 0j, 1 + 0j]], dtype=torch.complex64)
    qo, _ = fk.llama4_rope(q, q.clone(), freqs)
    ref = ref_llama4_f64(q, freqs)
    assert torch.equal(torch.isnan(qo), torch.isnan(ref))


def test_only_k_needs_grad_and_freqs_get_no_gradient():
    q, k = _qk(1, 3, 2, 1, 8)
    freqs = torch.view_as_real(hf_freqs_cis(1, 3, 8)).requires_grad_()
    k.requires_grad_()
    qo, ko = fk.llama4_rope(q, k, freqs)
    ko.sum().backward()
    gk = ref_llama4_grads(q, k, freqs.detach(), torch.zeros_like(q), torch.ones_like(k))[1]
    assert_close(k.grad, gk, torch.float32)
    assert freqs.grad is None


def test_double_backward_is_a_clear_error():
    q, k = _qk(1, 3, 2, 1, 8)
    q.requires_grad_()
    qo, _ = fk.llama4_rope(q, k, hf_freqs_cis(1, 3, 8))
    (gq,) = torch.autograd.grad(qo.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gq.sum().backward()


# --- bad input: the same message from every backend -----------------------------------

def _bad(q=(2, 3, 4, 8), k=(2, 3, 2, 8), f=(1, 3, 4), dt=torch.float32, kdt=None,
         fdt=torch.complex64):
    def make(device):
        return (torch.ones(q, dtype=dt, device=device),
                torch.ones(k, dtype=kdt or dt, device=device),
                torch.ones(f, dtype=fdt, device=device))
    return make


BAD = [
    ("q 3-D", _bad(q=(3, 4, 8)), "must have 4 dims"),
    ("dtypes differ", _bad(kdt=torch.float16), "must have the same dtype"),
    ("seq differs", _bad(k=(2, 4, 2, 8)), "same batch, seq and head_dim"),
    ("odd head_dim", _bad(q=(2, 3, 4, 7), k=(2, 3, 2, 7)), "must be even"),
    ("int dtype", _bad(dt=torch.int32), "not supported"),
    ("freqs dtype", _bad(dt=torch.bfloat16, f=(1, 3, 4, 2), fdt=torch.float16),
     "must be complex64, or float32"),
    ("freqs complex128", _bad(fdt=torch.complex128), "must be complex64, or float32"),
    ("freqs real last dim", _bad(f=(1, 3, 4, 3), fdt=torch.float32), "must have shape"),
    ("freqs 4-D complex", _bad(f=(1, 1, 3, 4)), "must have shape"),
    ("freqs seq", _bad(f=(1, 4, 4)), "seq length"),
    ("freqs batch", _bad(f=(3, 3, 4)), "batch size 1 or q's"),
    ("freqs width", _bad(f=(3, 8)), "head_dim / 2"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.llama4_rope(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    q, k = _qk(1, 3, 2, 1, 8)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.llama4_rope(q, k, hf_freqs_cis(1, 3, 8).to("meta"))


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------------

@pytest.mark.parametrize("form", ["complex", "real"])
def test_gradcheck(form):
    q, k = _qk(2, 3, 2, 1, 6, torch.float64)
    freqs = torch.complex(randn(2, 3, 3, dtype=torch.float64), randn(2, 3, 3, dtype=torch.float64))
    if form == "real":
        freqs = torch.view_as_real(freqs)
    assert torch.autograd.gradcheck(lambda a, b: fk.llama4_rope(a, b, freqs),
                                    (q.requires_grad_(), k.requires_grad_()))


def test_opcheck():
    q, k = _qk(2, 5, 4, 2, 16, layout="bhsd")
    q.requires_grad_()
    k.requires_grad_()
    freqs = hf_freqs_cis(2, 5, 16)
    torch.library.opcheck(torch.ops.fk.llama4_rope, (q, k, torch.view_as_real(freqs)))
    torch.library.opcheck(torch.ops.fk.llama4_rope, (q, k, freqs[0]),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    dq, dk = randn(2, 5, 4, 16), randn(2, 5, 2, 16)
    torch.library.opcheck(torch.ops.fk._llama4_rope_backward, (dq, dk, freqs),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def f(x, y, freqs):
        b, s, _ = x.shape  # (B, S, H * D) projections, viewed as Llama 4 does
        qo, ko = fk.llama4_rope(x.view(b, s, -1, 8), y.view(b, s, -1, 8), freqs)
        return qo.sum() + ko.pow(2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for s in (5, 9):
        freqs = torch.view_as_real(hf_freqs_cis(2, s, 8))
        args = [randn(2, s, 32).requires_grad_(), randn(2, s, 16).requires_grad_()]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args, freqs)
        ref = f(*eager_args, freqs)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        for a, b in zip(args, eager_args):
            assert_close(a.grad, b.grad, torch.float32, factor=10)


def test_torchscript(tmp_path):
    def f(q: torch.Tensor, k: torch.Tensor, freqs: torch.Tensor):
        return fk.llama4_rope(q, k, freqs)

    scripted = torch.jit.script(f)
    path = str(tmp_path / "llama4_rope.pt")
    torch.jit.save(scripted, path)
    loaded = torch.jit.load(path)
    q, k = _qk(2, 5, 4, 2, 16)
    freqs = hf_freqs_cis(2, 5, 16)
    for got, want in zip(loaded(q, k, freqs), f(q, k, freqs)):
        assert torch.equal(got, want)


# --- level 5: CUDA kernel --------------------------------------------------------------------

# (b, s, hq, hkv, d)
CUDA_SHAPES = {
    "llama4": (2, 257, 40, 8, 128),
    "one_row": (1, 1, 1, 1, 128),
    "odd_heads": (2, 9, 5, 3, 128),
    "small_head": (3, 17, 8, 2, 64),
    "unaligned_half": (2, 11, 6, 2, 40),
    "odd_dims": (2, 7, 3, 1, 38),
    "big_head": (1, 9, 4, 2, 512),      # loops over pair chunks
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CUDA_SHAPES))
@pytest.mark.parametrize("layout,form", [("bshd", "complex_b"), ("bhsd", "real_1"),
                                         ("bshd", "complex_2d")])
def test_cuda_matches_reference(dtype, name, layout, form):
    b, s, hq, hkv, d = CUDA_SHAPES[name]
    q, k = _qk(b, s, hq, hkv, d, dtype, device="cuda", layout=layout)
    freqs = _freqs(b, s, d, form, dtype=dtype, device="cuda")
    q.requires_grad_()
    k.requires_grad_()
    poison_cuda_cache()
    qo, ko = fk.llama4_rope(q, k, freqs)
    for out, x, nm in ((qo, q, "q"), (ko, k, "k")):
        assert not torch.isnan(out).any(), f"{nm}: unwritten output elements"
        assert out.stride() == x.stride(), f"{nm}: layout not kept"
        assert_close(out, ref_llama4(x.detach().cpu(), freqs.cpu()), dtype, what=nm)
    dq = randn(*q.shape, dtype=dtype, device="cuda")
    dk = randn(*k.shape, dtype=dtype, device="cuda")
    poison_cuda_cache()
    torch.autograd.backward((qo, ko), (dq, dk))
    gq, gk = ref_llama4_grads(q.detach().cpu(), k.detach().cpu(), freqs.cpu(), dq.cpu(), dk.cpu())
    assert not torch.isnan(q.grad).any() and not torch.isnan(k.grad).any()
    assert_close(q.grad, gq, dtype, factor=2, what="dq")
    assert_close(k.grad, gk, dtype, factor=2, what="dk")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_hf(dtype):
    b, s, hq, hkv, d = 2, 33, 8, 2, 128
    q, k = _qk(b, s, hq, hkv, d, dtype, device="cuda")
    freqs = hf_freqs_cis(b, s, d, device="cuda")
    qo, ko = fk.llama4_rope(q, k, freqs)
    hq_out, hk_out = hf_apply_rotary_emb(q, k, freqs)
    assert_close(qo, hq_out, dtype)
    assert_close(ko, hk_out, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_fused_expanded_and_strided(dtype):
    b, s, hq, hkv, d = 2, 37, 8, 2, 128
    freqs = hf_freqs_cis(1, s, d, device="cuda")
    qm = misaligned(randn(b, s, hq, d, dtype=dtype, device="cuda"))
    km = misaligned(randn(b, s, hkv, d, dtype=dtype, device="cuda"))
    fm = misaligned(torch.view_as_real(freqs))
    qo, ko = fk.llama4_rope(qm, km, fm)
    assert_close(qo, ref_llama4(qm.cpu(), freqs.cpu()), dtype, what="misaligned q")
    assert_close(ko, ref_llama4(km.cpu(), freqs.cpu()), dtype, what="misaligned k")
    qkv = randn(b, s, hq + 2 * hkv, d, dtype=dtype, device="cuda")
    q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hkv]
    qo, ko = fk.llama4_rope(q, k, freqs)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close(qo, ref_llama4(q.cpu(), freqs.cpu()), dtype, what="fused q")
    assert_close(ko, ref_llama4(k.cpu(), freqs.cpu()), dtype, what="fused k")
    ke = randn(b, s, 1, d, dtype=dtype, device="cuda").expand(b, s, hkv, d)
    qt = randn(b, s, hq, 2 * d, dtype=dtype, device="cuda")[..., ::2]
    fs = torch.view_as_real(freqs).transpose(-1, -2).contiguous().transpose(-1, -2)  # copied
    qo, ko = fk.llama4_rope(qt, ke, fs)
    assert_close(qo, ref_llama4(qt.cpu(), freqs.cpu()), dtype, what="strided q")
    assert_close(ko, ref_llama4(ke.cpu(), freqs.cpu()), dtype, what="expanded k")


@pytest.mark.cuda
def test_cuda_graph_capture():
    b, s, hq, hkv, d = 2, 64, 8, 2, 128
    q, k = _qk(b, s, hq, hkv, d, torch.bfloat16, device="cuda")
    freqs = hf_freqs_cis(b, s, d, device="cuda")
    fk.llama4_rope(q, k, freqs)  # warm up (module load) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qo, ko = fk.llama4_rope(q, k, freqs)
    q.copy_(randn(*q.shape, dtype=torch.bfloat16, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert_close(qo, ref_llama4(q.cpu(), freqs.cpu()), torch.bfloat16)
    assert_close(ko, ref_llama4(k.cpu(), freqs.cpu()), torch.bfloat16)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.llama4_rope(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    q = torch.ones(1, 3, 2, 8, dtype=torch.float64, device="cuda")
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.llama4_rope(q, q, torch.ones(3, 4, dtype=torch.complex128, device="cuda"))
    q = torch.ones(1, 3, 2, 8, device="cuda")
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.llama4_rope(q, q, hf_freqs_cis(1, 3, 8))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    freqs = hf_freqs_cis(1, 0, 64, device="cuda")
    qo, ko = fk.llama4_rope(torch.empty(2, 0, 4, 64, device="cuda"),
                            torch.empty(2, 0, 1, 64, device="cuda"), freqs)
    assert qo.shape == (2, 0, 4, 64) and ko.shape == (2, 0, 1, 64)
    freqs = hf_freqs_cis(2, 5, 64, device="cuda")
    q, k = _qk(2, 5, 4, 2, 64, device="cuda")
    q.requires_grad_()
    k.requires_grad_()
    torch.library.opcheck(torch.ops.fk.llama4_rope, (q, k, torch.view_as_real(freqs)))
    # aot_eager: fk's fake kernels and autograd without Inductor (Triton is absent there).
    f = torch.compile(lambda q, k: sum(t.sum() for t in fk.llama4_rope(q, k, freqs)),
                      fullgraph=True, backend="aot_eager")
    f(q, k).backward()
    assert q.grad is not None and k.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    b, s, hq, hkv, d = 1, (1 << 31) // (32 * 128) + 5, 32, 1, 128
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
    freqs = hf_freqs_cis(1, s, d, device="cuda")
    qo, ko = fk.llama4_rope(q, k, freqs)
    for sl in (slice(0, 3), slice(s - 3, s)):
        assert_close(qo[:, sl], ref_llama4(q[:, sl].cpu(), freqs[:, sl].cpu()),
                     torch.bfloat16, what=str(sl))
        assert_close(ko[:, sl], ref_llama4(k[:, sl].cpu(), freqs[:, sl].cpu()),
                     torch.bfloat16, what=str(sl))
    del q, k, qo, ko
    torch.cuda.empty_cache()
