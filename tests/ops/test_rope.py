"""fk.rope at every test level: Triton source (interpreter), CPU backend, autograd, opcheck,
torch.compile, TorchScript, bad input, and the CUDA kernels (marker ``cuda``)."""
import pytest
import torch

import fk
from fk.ops.rope import apply_rotary_pos_emb
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, round_nearest, round_toward_zero)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")


# --- the reference, written from the models' definitions --------------------------------

def _rotate_half(x):
    """Hugging Face Llama: cat(-x2, x1) of the two halves."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotate_every_two(x):
    """Hugging Face GPT-J: (-x[2i+1], x[2i]) in place of each pair (x[2i], x[2i+1])."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _as_4d(c):
    """cos / sin of shape (S, W), (Bc, S, W) or (Bc, 1, S, W) as (Bc, 1, S, W)."""
    if c.dim() == 2:
        return c[None, None]
    if c.dim() == 3:
        return c[:, None]
    return c


def ref_rope_f64(x, cos, sin, rotary_dim=None, interleaved=False):
    """x * cos + rotate(x) * sin on the first rotary_dim dims, the rest unchanged, float64.
    cos / sin of width rotary_dim / 2 hold one value per pair (expanded here)."""
    c, s = _as_4d(cos).double(), _as_4d(sin).double()
    r = rotary_dim or c.shape[-1]
    if c.shape[-1] * 2 == r:
        widen = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat((t, t), -1))
        c, s = widen(c), widen(s)
    xd = x.double()
    xr = xd[..., :r]
    rot = _rotate_every_two(xr) if interleaved else _rotate_half(xr)
    return torch.cat((xr * c + rot * s, xd[..., r:]), dim=-1)


def ref_rope(x, cos, sin, rotary_dim=None, interleaved=False, cast=round_nearest):
    """The reference rounded once to x's dtype with `cast` (through float32, as the kernels)."""
    out = ref_rope_f64(x, cos, sin, rotary_dim, interleaved)
    return out if x.dtype == torch.float64 else cast(out.float(), x.dtype)


def ref_rope_grads(q, k, cos, sin, dq, dk, rotary_dim=None, interleaved=False):
    """float64 gradients of the reference with respect to q and k (cos / sin constant)."""
    grads = []
    for x, g in ((q, dq), (k, dk)):
        x64 = x.detach().double().requires_grad_()
        ref_rope_f64(x64, cos, sin, rotary_dim, interleaved).backward(g.detach().double())
        grads.append(x64.grad)
    return grads


def hf_cos_sin(batch, seq, rotary_dim, interleaved=False, dtype=torch.float32, base=10000.0,
               device="cpu", offset=0):
    """cos / sin as Hugging Face rotary embeddings build them: (batch, seq, rotary_dim),
    frequencies duplicated as halves (Llama) or adjacent pairs (GPT-J)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    pos = torch.arange(offset, offset + seq, dtype=torch.float64)[None, :] + \
        torch.arange(batch, dtype=torch.float64)[:, None] * 3
    freqs = pos[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), -1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def _qk(b, hq, hkv, s, d, dtype=torch.float32, device="cpu", layout="bshd", seed=None):
    """q (b, hq, s, d), k (b, hkv, s, d): transposed views of (b, s, h, d) buffers ("bshd",
    as models produce them) or contiguous ("bhsd")."""
    if layout == "bshd":
        q = randn(b, s, hq, d, dtype=dtype, device=device, seed=seed).transpose(1, 2)
        k = randn(b, s, hkv, d, dtype=dtype, device=device, seed=seed).transpose(1, 2)
    else:
        q = randn(b, hq, s, d, dtype=dtype, device=device, seed=seed)
        k = randn(b, hkv, s, d, dtype=dtype, device=device, seed=seed)
    return q, k


# Configurations: (head_dim, rotary_dim passed, cos width, interleaved).
CONFIGS = {
    "full": (16, None, 16, False),
    "partial": (20, None, 8, False),           # Phi / GLM: only the first dims rotate
    "half_width": (16, 16, 8, False),          # GPT-OSS: one cos value per pair
    "interleaved": (16, None, 16, True),       # GPT-J
    "interleaved_partial": (24, None, 8, True),
    "interleaved_half_width": (12, 8, 4, True),
}


def _cos_sin(cfg, b, s, dtype, cos_batch=1, device="cpu"):
    d, rot, width, inter = CONFIGS[cfg]
    c, sn = randn(cos_batch, s, width, device=device), randn(cos_batch, s, width, device=device)
    return c.to(dtype), sn.to(dtype), rot, inter


# --- level 1: the Triton source under the interpreter ---------------------------------

def _run_interpreter(mod, q, k, cos, sin, rotary_dim, interleaved, inverse, hb, bs, bh, steps,
                     heads_fastest):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    c3 = _as_4d(cos)[:, 0]
    s3 = _as_4d(sin)[:, 0]
    width = c3.shape[-1]
    r = rotary_dim or width
    half = r // 2
    c2_off = 0 if width * 2 == r else (1 if interleaved else half)
    qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    strides = [x.stride(i) for x in (q, k, qo, ko) for i in range(3)]
    groups = cdiv(cdiv(hq, bh) + cdiv(hkv, bh), steps)
    kernel = mod.rope_interleaved_kernel if interleaved else mod.rope_kernel
    kernel[(b * cdiv(s, bs) * groups,)](
        q, k, qo, ko, c3, s3, *strides, 0 if c3.shape[0] == 1 else c3.stride(0), c3.stride(1),
        s, hq, hkv, half, d, c2_off, int(inverse), int(heads_fastest),
        HB=hb, BS=bs, BH=bh, STEPS=steps)
    return qo, ko


INTERP_CASES = [
    # cfg, dtype, layout, (hb, bs, bh, steps), heads_fastest, cos fp32, inverse
    ("full", torch.bfloat16, "bshd", (8, 2, 4, 1), True, False, False),
    ("full", torch.float16, "bhsd", (16, 4, 2, 2), False, True, True),
    ("full", torch.float32, "bshd", (4, 2, 2, 3), True, False, False),   # 2 rotation chunks
    ("partial", torch.bfloat16, "bhsd", (4, 4, 4, 1), True, True, True),
    ("half_width", torch.float16, "bshd", (8, 2, 2, 2), False, False, True),
    ("interleaved", torch.bfloat16, "bshd", (8, 2, 4, 1), True, False, True),
    ("interleaved_partial", torch.float32, "bhsd", (2, 2, 2, 2), False, False, False),
    ("interleaved_half_width", torch.bfloat16, "bhsd", (4, 4, 2, 1), True, True, False),
]


@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}")
def test_interpreter(case):
    cfg, dtype, layout, tile, heads_fastest, cos_fp32, inverse = case
    mod = load_triton_src("rope")
    d = CONFIGS[cfg][0]
    b, hq, hkv, s = 2, 5, 3, 7       # heads and seq not multiples of the tile
    q, k = _qk(b, hq, hkv, s, d, dtype, layout=layout)
    cos, sin, rot, inter = _cos_sin(cfg, b, s, torch.float32 if cos_fp32 else dtype,
                                    cos_batch=2 if inverse else 1)
    qo, ko = _run_interpreter(mod, q, k, cos, sin, rot, inter, inverse, *tile, heads_fastest)
    if inverse:  # the transposed map: the gradient of the forward
        refs = ref_rope_grads(q, k, cos, sin, q, k, rot, inter)
        refs = [round_toward_zero(g.float(), dtype) for g in refs]
    else:
        refs = [ref_rope(x, cos, sin, rot, inter, cast=round_toward_zero) for x in (q, k)]
    for out, ref, x, name in ((qo, refs[0], q, "q"), (ko, refs[1], k, "k")):
        assert not torch.isnan(out).any(), f"{name}: unwritten elements"
        assert_close(out, ref, dtype, what=name)
        r = rot or CONFIGS[cfg][2]
        assert torch.equal(out[..., r:], x[..., r:]), f"{name}: pass-through dims changed"


def test_interpreter_in_place():
    """Outputs aliasing the inputs (rope_): the pass-through loop is skipped (D = R)."""
    mod = load_triton_src("rope")
    q, k = _qk(1, 3, 2, 5, 12, torch.float32, layout="bshd")
    cos, sin = randn(1, 5, 8), randn(1, 5, 8)
    refs = [ref_rope(x, cos, sin) for x in (q, k)]
    c2_off = 4
    strides = [x.stride(i) for x in (q, k, q, k) for i in range(3)]
    mod.rope_kernel[(5 * 2,)](q, k, q, k, cos, sin, *strides, 0, cos.stride(1), 5, 3, 2, 4, 8,
                              c2_off, 0, 1, HB=4, BS=1, BH=2, STEPS=2)
    assert_close(q, refs[0], torch.float32)
    assert_close(k, refs[1], torch.float32)


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_cpu_forward_backward(dtype, cfg, layout):
    b, hq, hkv, s = 2, 4, 2, 5
    d = CONFIGS[cfg][0]
    q, k = _qk(b, hq, hkv, s, d, dtype, layout=layout)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin, rot, inter = _cos_sin(cfg, b, s, dtype, cos_batch=b if layout == "bhsd" else 1)
    qo, ko = fk.rope(q, k, cos, sin, rot, inter)
    for out, x, name in ((qo, q, "q"), (ko, k, "k")):
        assert out.dtype == dtype and out.shape == x.shape
        assert out.stride() == x.stride(), f"{name}: layout not kept"
        assert_close(out, ref_rope(x, cos, sin, rot, inter), dtype, what=name)
    dq, dk = randn(*q.shape, dtype=dtype), randn(*k.shape, dtype=dtype)
    torch.autograd.backward((qo, ko), (dq, dk))
    gq, gk = ref_rope_grads(q, k, cos, sin, dq, dk, rot, inter)
    assert_close(q.grad, gq, dtype, factor=2, what="dq")
    assert_close(k.grad, gk, dtype, factor=2, what="dk")


def test_cpu_hf_cos_sin_and_fp32_cos():
    """Real rotary tables (duplicated halves) in float32 with bfloat16 q / k, cos batched."""
    q, k = _qk(2, 4, 2, 6, 16, torch.bfloat16)
    cos, sin = hf_cos_sin(2, 6, 16)
    for c, s in ((cos, sin), (cos[:1], sin[:1]), (cos[0], sin[0]), (cos[:, None], sin[:, None])):
        qo, ko = fk.rope(q, k, c, s)
        assert_close(qo, ref_rope(q, c, s), torch.bfloat16)
        assert_close(ko, ref_rope(k, c, s), torch.bfloat16)


def test_cpu_matches_hf_apply_rotary_pos_emb():
    """fk.ops.rope.apply_rotary_pos_emb against Hugging Face's formula, both unsqueeze dims."""
    b, h, s, d = 2, 3, 5, 8
    cos, sin = hf_cos_sin(b, s, d)
    q, k = randn(b, h, s, d), randn(b, 1, s, d)
    hf_q = q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)
    hf_k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)
    qo, ko = apply_rotary_pos_emb(q, k, cos, sin)
    assert_close(qo, hf_q, torch.float32)
    assert_close(ko, hf_k, torch.float32)
    qo2, ko2 = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                                    unsqueeze_dim=2)
    assert_close(qo2.transpose(1, 2), hf_q, torch.float32)
    assert_close(ko2.transpose(1, 2), hf_k, torch.float32)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)


def test_cpu_layouts():
    """Slices of a fused QKV projection (not dense) give contiguous outputs; an expanded k
    is read without a copy; a last dim with stride != 1 is handled."""
    b, s, hq, hkv, d = 2, 5, 4, 2, 16
    qkv = randn(b, s, hq + 2 * hkv, d)
    q = qkv[:, :, :hq].transpose(1, 2)
    k = qkv[:, :, hq:hq + hkv].transpose(1, 2)
    cos, sin = hf_cos_sin(1, s, d)
    qo, ko = fk.rope(q, k, cos, sin)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close(qo, ref_rope(q, cos, sin), torch.float32)
    ke = randn(b, 1, s, d).expand(b, 3, s, d)
    qo, ko = fk.rope(q, ke, cos, sin)
    assert ko.is_contiguous()
    assert_close(ko, ref_rope(ke, cos, sin), torch.float32)
    qt = randn(b, hq, d, s).transpose(-1, -2)  # last-dim stride s
    qo, _ = fk.rope(qt, k, cos, sin)
    assert qo.is_contiguous()
    assert_close(qo, ref_rope(qt, cos, sin), torch.float32)


def test_cpu_empty():
    cos, sin = hf_cos_sin(1, 0, 8)
    qo, ko = fk.rope(torch.empty(2, 4, 0, 8), torch.empty(2, 1, 0, 8), cos, sin)
    assert qo.shape == (2, 4, 0, 8) and ko.shape == (2, 1, 0, 8)
    cos, sin = hf_cos_sin(1, 3, 8)
    qo, ko = fk.rope(torch.empty(2, 0, 3, 8), randn(2, 1, 3, 8), cos, sin)
    assert qo.shape == (2, 0, 3, 8)


def test_cpu_nan_inf_propagate():
    q = torch.tensor([1.0, float("nan"), 2.0, float("inf")]).view(1, 1, 1, 4)
    cos, sin = torch.ones(1, 4), torch.zeros(1, 4)
    qo, _ = fk.rope(q, q.clone(), cos, sin)
    ref = q * cos + _rotate_half(q) * sin  # inf * 0 = nan, as in the reference formula
    assert torch.equal(torch.isnan(qo), torch.isnan(ref))


def test_only_k_needs_grad_and_unused_output():
    q, k = _qk(1, 2, 1, 3, 8)
    cos, sin = hf_cos_sin(1, 3, 8)
    k.requires_grad_()
    qo, ko = fk.rope(q, k, cos, sin)
    ko.sum().backward()
    gk = ref_rope_grads(q, k, cos, sin, torch.zeros_like(q), torch.ones_like(k))[1]
    assert_close(k.grad, gk, torch.float32)
    q.requires_grad_()
    qo, ko = fk.rope(q, k.detach(), cos, sin)
    qo.pow(2).sum().backward()  # ko unused: its gradient is zero
    gq = ref_rope_grads(q, k, cos, sin, 2 * ref_rope_f64(q, cos, sin), torch.zeros_like(k))[0]
    assert_close(q.grad, gq, torch.float32)


def test_cos_sin_get_no_gradient():
    q, k = _qk(1, 2, 1, 3, 8)
    cos, sin = hf_cos_sin(1, 3, 8)
    cos.requires_grad_()
    q.requires_grad_()
    qo, ko = fk.rope(q, k, cos, sin)
    (qo.sum() + ko.sum()).backward()
    assert cos.grad is None and q.grad is not None


def test_double_backward_is_a_clear_error():
    q, k = _qk(1, 2, 1, 3, 8)
    q.requires_grad_()
    cos, sin = hf_cos_sin(1, 3, 8)
    qo, _ = fk.rope(q, k, cos, sin)
    (gq,) = torch.autograd.grad(qo.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gq.sum().backward()


# --- in place -------------------------------------------------------------------------------

def test_rope_in_place():
    q, k = _qk(2, 4, 2, 5, 20, layout="bshd")
    cos, sin = hf_cos_sin(1, 5, 8)
    refs = fk.rope(q, k, cos, sin)
    q0 = q.clone()
    v = q._version, k._version
    out = fk.rope_(q, k, cos, sin)
    assert out[0] is q and out[1] is k
    assert q._version > v[0] and k._version > v[1]
    assert torch.equal(q, refs[0]) and torch.equal(k, refs[1])
    assert torch.equal(q[..., 8:], q0[..., 8:])


def test_rope_in_place_errors():
    cos, sin = hf_cos_sin(1, 3, 8)
    q, k = _qk(1, 2, 1, 3, 8)
    with pytest.raises(RuntimeError, match="contiguous last dim"):
        fk.rope_(randn(1, 2, 8, 3).transpose(-1, -2), k, cos, sin)
    with pytest.raises(RuntimeError, match="share memory"):
        fk.rope_(q, randn(1, 1, 3, 8).expand(1, 2, 3, 8), cos, sin)
    with pytest.raises(RuntimeError, match="different tensors"):
        fk.rope_(q, q, cos, sin)
    x = randn(1, 2, 3, 8).requires_grad_()
    qq, kk = x * 1, k.clone()
    with pytest.raises(RuntimeError, match="not differentiable"):
        fk.rope_(qq, kk, cos, sin)
    with torch.no_grad():
        fk.rope_(qq, kk, cos, sin)  # allowed without grad mode
    assert_close(qq, ref_rope(x.detach(), cos, sin), torch.float32)


def test_rope_in_place_then_saved_reader_fails_loudly():
    cos, sin = hf_cos_sin(1, 3, 8)
    x = randn(1, 2, 3, 8).requires_grad_()
    q = x * 2
    y = q.sin()  # saves q for its backward
    with torch.no_grad():
        fk.rope_(q, randn(1, 1, 3, 8), cos, sin)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# --- bad input: the same message from every backend -----------------------------------

def _bad(q=(2, 4, 3, 8), k=(2, 2, 3, 8), cos=(1, 3, 8), sin=None, dt=torch.float32,
         kdt=None, cdt=None, rot=None):
    def make(device):
        qt = torch.ones(q, dtype=dt, device=device)
        kt = torch.ones(k, dtype=kdt or dt, device=device)
        ct = torch.ones(cos, dtype=cdt or dt, device=device)
        st = torch.ones(sin or cos, dtype=cdt or dt, device=device)
        return qt, kt, ct, st, rot
    return make


BAD = [
    ("q 3-D", _bad(q=(4, 3, 8)), "must have 4 dims"),
    ("dtypes differ", _bad(kdt=torch.float16), "must have the same dtype"),
    ("batch differs", _bad(k=(1, 2, 3, 8)), "same batch, seq and head_dim"),
    ("head_dim differs", _bad(k=(2, 2, 3, 6)), "same batch, seq and head_dim"),
    ("int dtype", _bad(dt=torch.int32, cdt=torch.float32), "not supported"),
    ("cos dtype", _bad(dt=torch.bfloat16, cdt=torch.float16), "must be float32 or q's dtype"),
    ("cos / sin shapes", _bad(sin=(1, 3, 6)), "must have the same shape"),
    ("cos 4-D", _bad(cos=(1, 2, 3, 8)), "must have shape"),
    ("cos 5-D", _bad(cos=(1, 1, 1, 3, 8)), "must have shape"),
    ("cos seq", _bad(cos=(1, 4, 8)), "seq length"),
    ("cos batch", _bad(cos=(3, 3, 8)), "batch size 1 or q's"),
    ("odd rotary dim", _bad(cos=(1, 3, 7)), "must be even"),
    ("rotary dim > head dim", _bad(cos=(1, 3, 10)), "must be even"),
    ("cos width", _bad(cos=(1, 3, 6), rot=8), "rotary_dim / 2 entries"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.rope(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    q, k = _qk(1, 2, 1, 3, 8)
    cos, sin = hf_cos_sin(1, 3, 8)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.rope(q, k, cos.to("meta"), sin)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.rope(q, k.to("meta"), cos, sin)


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------------

@pytest.mark.parametrize("cfg", ["full", "partial", "half_width", "interleaved_partial"])
def test_gradcheck(cfg):
    d = CONFIGS[cfg][0]
    q, k = _qk(2, 2, 1, 3, d, torch.float64)
    cos, sin, rot, inter = _cos_sin(cfg, 2, 3, torch.float64, cos_batch=2)
    assert torch.autograd.gradcheck(lambda a, b: fk.rope(a, b, cos, sin, rot, inter),
                                    (q.requires_grad_(), k.requires_grad_()))


def test_opcheck():
    q, k = _qk(2, 4, 2, 5, 16, layout="bshd")
    cos, sin = hf_cos_sin(1, 5, 8)
    q.requires_grad_()
    k.requires_grad_()
    torch.library.opcheck(torch.ops.fk.rope, (q, k, cos, sin, None, False))
    torch.library.opcheck(torch.ops.fk.rope, (q, k, cos[0], sin[0], 16, True))
    dq, dk = randn(2, 4, 5, 16), randn(2, 2, 5, 16)
    torch.library.opcheck(torch.ops.fk._rope_backward, (dq, dk, cos, sin, None, False),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.fk.rope_, (q.detach().clone(), k.detach().clone(), cos, sin,
                                               None, False),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def f(x, y, cos, sin):
        b, s, _ = x.shape  # (B, S, H * D) projections, viewed as models do
        qo, ko = fk.rope(x.view(b, s, -1, 8).transpose(1, 2), y.view(b, s, -1, 8).transpose(1, 2),
                         cos, sin)
        return qo.sum() + ko.pow(2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for s in (5, 9):
        cos, sin = hf_cos_sin(1, s, 8)
        args = [randn(2, s, 32).requires_grad_(), randn(2, s, 16).requires_grad_()]
        eager_args = [a.detach().clone().requires_grad_() for a in args]
        out = compiled(*args, cos, sin)
        ref = f(*eager_args, cos, sin)
        assert_close(out, ref, torch.float32, factor=10)
        out.backward()
        ref.backward()
        for a, b in zip(args, eager_args):
            assert_close(a.grad, b.grad, torch.float32, factor=10)


def test_torchscript(tmp_path):
    def f(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        a, b = fk.rope(q, k, cos, sin, None, False)
        c, d = apply_rotary_pos_emb(q, k, cos, sin)
        return a + c, b + d

    scripted = torch.jit.script(f)
    path = str(tmp_path / "rope.pt")
    torch.jit.save(scripted, path)
    loaded = torch.jit.load(path)
    q, k = _qk(2, 4, 2, 5, 16)
    cos, sin = hf_cos_sin(2, 5, 16)
    for got, want in zip(loaded(q, k, cos, sin), f(q, k, cos, sin)):
        assert torch.equal(got, want)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# (b, hq, hkv, s, d, rotary_dim passed, cos width, interleaved)
CUDA_SHAPES = {
    "llama": (2, 32, 8, 257, 128, None, 128, False),
    "llama_1b": (1, 32, 8, 100, 64, None, 64, False),
    "gemma": (2, 16, 8, 33, 256, None, 256, False),
    "qwen_heads": (3, 28, 4, 17, 128, None, 128, False),
    "odd_heads": (2, 5, 3, 9, 128, None, 128, False),
    "one_row": (1, 1, 1, 1, 128, None, 128, False),
    "phi2_partial": (2, 32, 32, 19, 80, None, 32, False),
    "glm_partial": (2, 8, 2, 21, 128, None, 64, False),
    "unaligned_half": (2, 6, 2, 11, 40, None, 40, False),
    "odd_dims": (2, 3, 1, 7, 38, None, 26, False),
    "big_rotary": (1, 4, 2, 9, 512, None, 512, False),  # loops over rotation chunks
    "gpt_oss": (2, 8, 2, 13, 64, 64, 32, False),
    "gptj": (2, 16, 16, 15, 256, None, 64, True),
    "interleaved_full": (2, 8, 4, 10, 128, None, 128, True),
    "interleaved_big": (1, 2, 1, 5, 512, None, 512, True),
    "interleaved_half_width": (1, 4, 2, 6, 64, 64, 32, True),
}


def _cuda_case(name, dtype, layout, cos_dtype, cos_batch):
    b, hq, hkv, s, d, rot, width, inter = CUDA_SHAPES[name]
    q, k = _qk(b, hq, hkv, s, d, dtype, device="cuda", layout=layout)
    cb = b if cos_batch else 1
    cos = randn(cb, s, width, device="cuda").to(cos_dtype or dtype)
    sin = randn(cb, s, width, device="cuda").to(cos_dtype or dtype)
    return q, k, cos, sin, rot, inter


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CUDA_SHAPES))
@pytest.mark.parametrize("layout,cos_dtype,cos_batch",
                         [("bshd", None, False), ("bhsd", torch.float32, True)])
def test_cuda_matches_reference(dtype, name, layout, cos_dtype, cos_batch):
    q, k, cos, sin, rot, inter = _cuda_case(name, dtype, layout, cos_dtype, cos_batch)
    q.requires_grad_()
    k.requires_grad_()
    poison_cuda_cache()
    qo, ko = fk.rope(q, k, cos, sin, rot, inter)
    r = rot or cos.shape[-1]
    for out, x, nm in ((qo, q, "q"), (ko, k, "k")):
        assert not torch.isnan(out).any(), f"{nm}: unwritten output elements"
        assert out.stride() == x.stride(), f"{nm}: layout not kept"
        assert_close(out, ref_rope(x.cpu(), cos.cpu(), sin.cpu(), rot, inter), dtype, what=nm)
        assert torch.equal(out[..., r:], x.detach()[..., r:]), f"{nm}: pass-through changed"
    dq = randn(*q.shape, dtype=dtype, device="cuda")
    dk = randn(*k.shape, dtype=dtype, device="cuda")
    poison_cuda_cache()
    torch.autograd.backward((qo, ko), (dq, dk))
    gq, gk = ref_rope_grads(q.detach().cpu(), k.detach().cpu(), cos.cpu(), sin.cpu(), dq.cpu(),
                            dk.cpu(), rot, inter)
    assert not torch.isnan(q.grad).any() and not torch.isnan(k.grad).any()
    assert_close(q.grad, gq, dtype, factor=2, what="dq")
    assert_close(k.grad, gk, dtype, factor=2, what="dk")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_fused_expanded_and_strided(dtype):
    b, s, hq, hkv, d = 2, 37, 8, 2, 128
    cos, sin = hf_cos_sin(1, s, d, dtype=dtype, device="cuda")
    qm = misaligned(randn(b, hq, s, d, dtype=dtype, device="cuda"))
    km = misaligned(randn(b, hkv, s, d, dtype=dtype, device="cuda"))
    qo, ko = fk.rope(qm, km, cos, sin)
    assert_close(qo, ref_rope(qm.cpu(), cos.cpu(), sin.cpu()), dtype, what="misaligned q")
    assert_close(ko, ref_rope(km.cpu(), cos.cpu(), sin.cpu()), dtype, what="misaligned k")
    qkv = randn(b, s, hq + 2 * hkv, d, dtype=dtype, device="cuda")
    q, k = qkv[:, :, :hq].transpose(1, 2), qkv[:, :, hq:hq + hkv].transpose(1, 2)
    qo, ko = fk.rope(q, k, cos, sin)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close(qo, ref_rope(q.cpu(), cos.cpu(), sin.cpu()), dtype, what="fused q")
    assert_close(ko, ref_rope(k.cpu(), cos.cpu(), sin.cpu()), dtype, what="fused k")
    ke = randn(b, 1, s, d, dtype=dtype, device="cuda").expand(b, hkv, s, d)
    qt = randn(b, hq, d, s, dtype=dtype, device="cuda").transpose(-1, -2)
    qo, ko = fk.rope(qt, ke, cos[0], sin[0])
    assert_close(qo, ref_rope(qt.cpu(), cos.cpu(), sin.cpu()), dtype, what="strided q")
    assert_close(ko, ref_rope(ke.cpu(), cos.cpu(), sin.cpu()), dtype, what="expanded k")
    # cos with a last-dim stride of 2 (copied), sin contiguous: different strides
    cs = torch.stack((cos, sin), -1)
    qo, ko = fk.rope(qt, ke, cs[..., 0], sin)
    assert_close(qo, ref_rope(qt.cpu(), cos.cpu(), sin.cpu()), dtype, what="strided cos")
    assert_close(ko, ref_rope(ke.cpu(), cos.cpu(), sin.cpu()), dtype, what="strided cos")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["llama", "phi2_partial", "gptj", "unaligned_half"])
def test_cuda_in_place(dtype, name):
    q, k, cos, sin, rot, inter = _cuda_case(name, dtype, "bshd", None, False)
    qo, ko = fk.rope(q, k, cos, sin, rot, inter)
    out = fk.rope_(q, k, cos, sin, rot, inter)
    assert out[0] is q and out[1] is k
    assert torch.equal(q, qo) and torch.equal(k, ko)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.rope(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    q = torch.ones(1, 2, 3, 8, dtype=torch.float64, device="cuda")
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.rope(q, q, torch.ones(1, 3, 8, device="cuda", dtype=torch.float64),
                torch.ones(1, 3, 8, device="cuda", dtype=torch.float64))
    q = torch.ones(1, 2, 3, 8, device="cuda")
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.rope(q, q, torch.ones(1, 3, 8), torch.ones(1, 3, 8))


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    cos, sin = hf_cos_sin(1, 0, 64, device="cuda")
    qo, ko = fk.rope(torch.empty(2, 4, 0, 64, device="cuda"),
                     torch.empty(2, 1, 0, 64, device="cuda"), cos, sin)
    assert qo.shape == (2, 4, 0, 64) and ko.shape == (2, 1, 0, 64)
    cos, sin = hf_cos_sin(1, 5, 64, device="cuda")
    k = randn(2, 2, 5, 64, device="cuda")
    qo, ko = fk.rope(torch.empty(2, 0, 5, 64, device="cuda"), k, cos, sin)
    assert qo.shape == (2, 0, 5, 64)
    assert_close(ko, ref_rope(k.cpu(), cos.cpu(), sin.cpu()), torch.float32)
    q, k = _qk(2, 4, 2, 5, 64, device="cuda")
    q.requires_grad_()
    k.requires_grad_()
    torch.library.opcheck(torch.ops.fk.rope, (q, k, cos, sin, None, False))
    # aot_eager: traces fk's fake kernels and autograd without Inductor (which needs
    # Triton, absent in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda q, k: sum(t.sum() for t in fk.rope(q, k, cos, sin)),
                      fullgraph=True, backend="aot_eager")
    f(q, k).backward()
    assert q.grad is not None and k.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    b, hq, hkv, s, d = 1, 32, 1, (1 << 31) // (32 * 128) + 5, 128
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = hf_cos_sin(1, s, d, dtype=torch.bfloat16, device="cuda")
    qo, ko = fk.rope(q, k, cos, sin)
    for sl in (slice(0, 3), slice(s - 3, s)):
        assert_close(qo[:, :, sl], ref_rope(q[:, :, sl].cpu(), cos[:, sl].cpu(), sin[:, sl].cpu()),
                     torch.bfloat16, what=str(sl))
        assert_close(ko[:, :, sl], ref_rope(k[:, :, sl].cpu(), cos[:, sl].cpu(), sin[:, sl].cpu()),
                     torch.bfloat16, what=str(sl))
    del q, k, qo, ko
    torch.cuda.empty_cache()
