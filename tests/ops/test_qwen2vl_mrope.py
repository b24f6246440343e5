"""fk.qwen2vl_mrope at every test level: Triton source (interpreter), CPU backend, autograd,
opcheck, torch.compile, TorchScript, bad input, and the CUDA kernel (marker ``cuda``)."""
import pytest
import torch

import fk
from fk.ops.qwen2vl_mrope import apply_multimodal_rotary_pos_emb
from helpers import (DTYPES, assert_close, cdiv, error_lines, load_triton_src, misaligned,
                     poison_cuda_cache, randn, round_nearest, round_toward_zero)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")


# --- the reference, written from Hugging Face's Qwen2-VL and Qwen3-VL code --------------------

def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def compose_sectioned(t, mrope_section):
    """Qwen2-VL / Qwen2.5-VL (transformers 4.x apply_multimodal_rotary_pos_emb): the D dims
    split by mrope_section * 2, chunk i from stream i % 3. t (3, B, S, D) -> (B, S, D)."""
    return torch.cat([m[i % 3] for i, m in enumerate(t.split(list(mrope_section) * 2, dim=-1))],
                     dim=-1)


def compose_interleaved(t, mrope_section):
    """Qwen3-VL's recomposition (its rotary embedding's apply on the D/2 frequencies), applied
    to each half of t (3, B, S, D) -> (B, S, D)."""
    halves = []
    for f in t.chunk(2, dim=-1):
        thw = f[0].clone()
        for dim, offset in ((1, 1), (2, 2)):
            idx = slice(offset, mrope_section[dim] * 3, 3)
            thw[..., idx] = f[dim, ..., idx]
        halves.append(thw)
    return torch.cat(halves, dim=-1)


def ref_mrope_f64(x, cos, sin, mrope_section, interleaved=False):
    compose = compose_interleaved if interleaved else compose_sectioned
    c = compose(cos.double(), mrope_section).unsqueeze(1)
    s = compose(sin.double(), mrope_section).unsqueeze(1)
    xd = x.double()
    return xd * c + _rotate_half(xd) * s


def ref_mrope(x, cos, sin, mrope_section, interleaved=False, cast=round_nearest):
    out = ref_mrope_f64(x, cos, sin, mrope_section, interleaved)
    return out if x.dtype == torch.float64 else cast(out.float(), x.dtype)


def ref_mrope_grads(q, k, cos, sin, dq, dk, mrope_section, interleaved=False):
    grads = []
    for x, g in ((q, dq), (k, dk)):
        x64 = x.detach().double().requires_grad_()
        ref_mrope_f64(x64, cos, sin, mrope_section, interleaved).backward(g.detach().double())
        grads.append(x64.grad)
    return grads


def hf_mrope_cos_sin(batch, seq, head_dim, base=1000000.0, dtype=torch.float32, device="cpu"):
    """cos / sin (3, batch, seq, head_dim) as Qwen2-VL's rotary embedding (transformers 4.x)
    builds them, from distinct temporal / height / width position ids."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    pos = torch.stack([torch.arange(seq, dtype=torch.float32) * (j + 1) + j for j in range(3)])
    pos = pos[:, None, :].expand(3, batch, seq) + torch.arange(batch)[None, :, None]
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def hf_apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    """Hugging Face's function as transformers 4.x ships it for Qwen2-VL / Qwen2.5-VL."""
    mrope_section = mrope_section * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(mrope_section, dim=-1))],
                    dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(mrope_section, dim=-1))],
                    dim=-1).unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _qk(b, hq, hkv, s, d, dtype=torch.float32, device="cpu", layout="bshd"):
    """q (b, hq, s, d), k (b, hkv, s, d): transposed views of (b, s, h, d) buffers ("bshd",
    as models produce them) or contiguous ("bhsd")."""
    if layout == "bshd":
        return (randn(b, s, hq, d, dtype=dtype, device=device).transpose(1, 2),
                randn(b, s, hkv, d, dtype=dtype, device=device).transpose(1, 2))
    return (randn(b, hq, s, d, dtype=dtype, device=device),
            randn(b, hkv, s, d, dtype=dtype, device=device))


# (head_dim, mrope_section, interleaved)
CONFIGS = {
    "qwen2": (16, [2, 3, 3], False),
    "qwen2_empty_t": (12, [0, 4, 2], False),
    "qwen3": (16, [4, 2, 2], True),
    "qwen3_long_h": (20, [2, 5, 3], True),
    "qwen2_sec8": (32, [8, 0, 8], False),  # bounds on multiples of 8 pairs: SEC8 applies
}


def _cos_sin(b, s, d, dtype, cos_batch, device="cpu"):
    """Random-valued cos / sin (the formula is applied as written, whatever the values)."""
    return (randn(3, cos_batch, s, d, device=device).to(dtype),
            randn(3, cos_batch, s, d, device=device).to(dtype))


# --- level 1: the Triton source under the interpreter ---------------------------------

def _run_interpreter(mod, q, k, cos, sin, section, interleaved, inverse, hb, bs, bh, steps,
                     heads_fastest, sec8=0):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    strides = [x.stride(i) for x in (q, k, qo, ko) for i in range(3)]
    groups = cdiv(cdiv(hq, bh) + cdiv(hkv, bh), steps)
    mode = int(interleaved) | 2 * int(inverse) | 4 * int(heads_fastest)
    mod.qwen2vl_mrope_kernel[(b * cdiv(s, bs) * groups,)](
        q, k, qo, ko, cos, sin, *strides, cos.stride(0),
        0 if cos.shape[1] == 1 else cos.stride(1), cos.stride(2), s, hq, hkv, d // 2,
        *section, mode, HB=hb, BS=bs, BH=bh, STEPS=steps, SEC8=sec8)
    return qo, ko


INTERP_CASES = [
    # cfg, dtype, layout, (hb, bs, bh, steps), heads_fastest, cos fp32, inverse[, SEC8]
    ("qwen2", torch.bfloat16, "bshd", (8, 2, 4, 1), True, False, False),
    ("qwen2", torch.float16, "bhsd", (16, 4, 2, 2), False, True, True),
    ("qwen2_empty_t", torch.float32, "bshd", (4, 2, 2, 3), True, False, False),  # 2 chunks
    ("qwen3", torch.bfloat16, "bhsd", (4, 4, 4, 1), True, True, True),
    ("qwen3_long_h", torch.float32, "bshd", (8, 2, 2, 2), False, False, False),
    ("qwen2_sec8", torch.bfloat16, "bshd", (16, 2, 2, 1), True, False, True, 1),
    ("qwen2_sec8", torch.float16, "bhsd", (8, 4, 2, 3), True, True, False, 1),  # 2 chunks
]


@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{c[2]}")
def test_interpreter(case):
    cfg, dtype, layout, tile, heads_fastest, cos_fp32, inverse, *sec8 = case
    mod = load_triton_src("qwen2vl_mrope")
    d, section, inter = CONFIGS[cfg]
    b, hq, hkv, s = 2, 5, 3, 7
    q, k = _qk(b, hq, hkv, s, d, dtype, layout=layout)
    cos, sin = _cos_sin(b, s, d, torch.float32 if cos_fp32 else dtype, 2 if inverse else 1)
    qo, ko = _run_interpreter(mod, q, k, cos, sin, section, inter, inverse, *tile, heads_fastest,
                              *sec8)
    if inverse:
        refs = ref_mrope_grads(q, k, cos, sin, q, k, section, inter)
        refs = [round_toward_zero(g.float(), dtype) for g in refs]
    else:
        refs = [ref_mrope(x, cos, sin, section, inter, cast=round_toward_zero) for x in (q, k)]
    for out, ref, name in ((qo, refs[0], "q"), (ko, refs[1], "k")):
        assert not torch.isnan(out).any(), f"{name}: unwritten elements"
        assert_close(out, ref, dtype, what=name)


# --- level 2: the CPU backend against the reference --------------------------------------

@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_cpu_forward_backward(dtype, cfg, layout):
    d, section, inter = CONFIGS[cfg]
    b, hq, hkv, s = 2, 4, 2, 5
    q, k = _qk(b, hq, hkv, s, d, dtype, layout=layout)
    q.requires_grad_()
    k.requires_grad_()
    cos, sin = _cos_sin(b, s, d, dtype, b if layout == "bhsd" else 1)
    qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, section, inter)
    for out, x, name in ((qo, q, "q"), (ko, k, "k")):
        assert out.dtype == dtype and out.shape == x.shape
        assert out.stride() == x.stride(), f"{name}: layout not kept"
        assert_close(out, ref_mrope(x, cos, sin, section, inter), dtype, what=name)
    dq, dk = randn(*q.shape, dtype=dtype), randn(*k.shape, dtype=dtype)
    torch.autograd.backward((qo, ko), (dq, dk))
    gq, gk = ref_mrope_grads(q, k, cos, sin, dq, dk, section, inter)
    assert_close(q.grad, gq, dtype, factor=2, what="dq")
    assert_close(k.grad, gk, dtype, factor=2, what="dk")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_matches_hf_apply_multimodal_rotary_pos_emb(dtype):
    b, h, hkv, s, d = 2, 4, 2, 6, 32
    section = [4, 6, 6]
    cos, sin = hf_mrope_cos_sin(b, s, d, dtype=dtype)
    q, k = _qk(b, h, hkv, s, d, dtype)
    hf_q, hf_k = hf_apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    qo, ko = apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    assert_close(qo, hf_q, dtype)
    assert_close(ko, hf_k, dtype)
    qo2, ko2 = apply_multimodal_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                                               section, unsqueeze_dim=2)
    assert torch.equal(qo2.transpose(1, 2), qo) and torch.equal(ko2.transpose(1, 2), ko)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        apply_multimodal_rotary_pos_emb(q, k, cos, sin, section, unsqueeze_dim=3)


def test_cpu_matches_hf_qwen3_vl_rotary_embedding():
    """The interleaved form against Qwen3-VL's own rotary embedding and apply function."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m
    cfg = transformers.Qwen3VLTextConfig(hidden_size=64, num_attention_heads=2, head_dim=32,
                                         rope_parameters={"rope_type": "default",
                                                          "rope_theta": 10000.0,
                                                          "mrope_section": [6, 5, 5],
                                                          "mrope_interleaved": True})
    rot = m.Qwen3VLTextRotaryEmbedding(cfg)
    b, s, d = 2, 7, 32
    pos = torch.stack([torch.arange(s) * (j + 1) + j for j in range(3)])[:, None].expand(3, b, s)
    x = randn(b, s, 64)
    cos_hf, sin_hf = rot(x, pos)  # composed (B, S, D)
    # The same tables per stream, uncomposed: (3, B, S, D).
    inv_freq = rot.inv_freq
    freqs = pos[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    q, k = _qk(b, 2, 1, s, d)
    want_q, want_k = m.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    qo, ko = fk.qwen2vl_mrope(q, k, emb.cos(), emb.sin(), [6, 5, 5], interleaved=True)
    assert_close(qo, want_q, torch.float32)
    assert_close(ko, want_k, torch.float32)


def test_cpu_layouts():
    b, s, hq, hkv, d = 2, 5, 4, 2, 16
    section = [2, 3, 3]
    qkv = randn(b, s, hq + 2 * hkv, d)
    q, k = qkv[:, :, :hq].transpose(1, 2), qkv[:, :, hq:hq + hkv].transpose(1, 2)
    cos, sin = hf_mrope_cos_sin(1, s, d)
    qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, section)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close(qo, ref_mrope(q, cos, sin, section), torch.float32)
    ke = randn(b, 1, s, d).expand(b, 3, s, d)
    qt = randn(b, hq, d, s).transpose(-1, -2)
    qo, ko = fk.qwen2vl_mrope(qt, ke, cos, sin, section)
    assert_close(qo, ref_mrope(qt, cos, sin, section), torch.float32)
    assert_close(ko, ref_mrope(ke, cos, sin, section), torch.float32)


def test_cpu_empty():
    cos, sin = hf_mrope_cos_sin(1, 0, 8)
    qo, ko = fk.qwen2vl_mrope(torch.empty(2, 4, 0, 8), torch.empty(2, 1, 0, 8), cos, sin,
                              [2, 1, 1])
    assert qo.shape == (2, 4, 0, 8) and ko.shape == (2, 1, 0, 8)


def test_only_k_needs_grad_and_cos_gets_no_gradient():
    q, k = _qk(1, 2, 1, 3, 8)
    cos, sin = hf_mrope_cos_sin(1, 3, 8)
    cos.requires_grad_()
    k.requires_grad_()
    qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, [2, 1, 1])
    ko.sum().backward()
    gk = ref_mrope_grads(q, k, cos.detach(), sin, torch.zeros_like(q), torch.ones_like(k),
                         [2, 1, 1])[1]
    assert_close(k.grad, gk, torch.float32)
    assert cos.grad is None


def test_double_backward_is_a_clear_error():
    q, k = _qk(1, 2, 1, 3, 8)
    q.requires_grad_()
    cos, sin = hf_mrope_cos_sin(1, 3, 8)
    qo, _ = fk.qwen2vl_mrope(q, k, cos, sin, [2, 1, 1])
    (gq,) = torch.autograd.grad(qo.pow(2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        gq.sum().backward()


# --- bad input: the same message from every backend -----------------------------------

def _bad(q=(2, 4, 3, 8), k=(2, 2, 3, 8), cos=(3, 1, 3, 8), sin=None, dt=torch.float32,
         kdt=None, cdt=None, section=(2, 1, 1)):
    def make(device):
        return (torch.ones(q, dtype=dt, device=device),
                torch.ones(k, dtype=kdt or dt, device=device),
                torch.ones(cos, dtype=cdt or dt, device=device),
                torch.ones(sin or cos, dtype=cdt or dt, device=device), list(section))
    return make


BAD = [
    ("q 3-D", _bad(q=(4, 3, 8)), "must have 4 dims"),
    ("dtypes differ", _bad(kdt=torch.float16), "must have the same dtype"),
    ("seq differs", _bad(k=(2, 2, 4, 8)), "same batch, seq and head_dim"),
    ("int dtype", _bad(dt=torch.int32, cdt=torch.float32), "not supported"),
    ("cos dtype", _bad(dt=torch.bfloat16, cdt=torch.float16), "must be float32 or q's dtype"),
    ("cos / sin shapes", _bad(sin=(3, 1, 3, 6)), "must have the same shape"),
    ("odd head_dim", _bad(q=(2, 4, 3, 7), k=(2, 2, 3, 7), cos=(3, 1, 3, 7)), "must be even"),
    ("cos 3-D", _bad(cos=(1, 3, 8)), r"must have shape \(3,"),
    ("cos 2 streams", _bad(cos=(2, 1, 3, 8)), r"must have shape \(3,"),
    ("cos batch", _bad(cos=(3, 3, 3, 8)), "batch size 1 or q's"),
    ("cos seq", _bad(cos=(3, 1, 4, 8)), "seq length"),
    ("cos width", _bad(cos=(3, 1, 3, 4)), r"head_dim \(8\) in dim 3"),
    ("section sum", _bad(section=(2, 2, 1)), "summing to head_dim / 2"),
    ("section length", _bad(section=(2, 2)), "summing to head_dim / 2"),
    ("section negative", _bad(section=(5, -1, 0)), "summing to head_dim / 2"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.qwen2vl_mrope(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    q, k = _qk(1, 2, 1, 3, 8)
    cos, sin = hf_mrope_cos_sin(1, 3, 8)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.qwen2vl_mrope(q, k, cos.to("meta"), sin, [2, 1, 1])


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------------

@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_gradcheck(cfg):
    d, section, inter = CONFIGS[cfg]
    q, k = _qk(2, 2, 1, 3, d, torch.float64)
    cos, sin = _cos_sin(2, 3, d, torch.float64, 2)
    assert torch.autograd.gradcheck(lambda a, b: fk.qwen2vl_mrope(a, b, cos, sin, section, inter),
                                    (q.requires_grad_(), k.requires_grad_()))


def test_opcheck():
    q, k = _qk(2, 4, 2, 5, 16, layout="bshd")
    cos, sin = hf_mrope_cos_sin(1, 5, 16)
    q.requires_grad_()
    k.requires_grad_()
    torch.library.opcheck(torch.ops.fk.qwen2vl_mrope, (q, k, cos, sin, [2, 3, 3], False))
    torch.library.opcheck(torch.ops.fk.qwen2vl_mrope, (q, k, cos, sin, [4, 2, 2], True))
    dq, dk = randn(2, 4, 5, 16), randn(2, 2, 5, 16)
    torch.library.opcheck(torch.ops.fk._qwen2vl_mrope_backward,
                          (dq, dk, cos, sin, [2, 3, 3], False),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def f(x, y, cos, sin):
        b, s, _ = x.shape
        qo, ko = fk.qwen2vl_mrope(x.view(b, s, -1, 8).transpose(1, 2),
                                  y.view(b, s, -1, 8).transpose(1, 2), cos, sin, [2, 1, 1])
        return qo.sum() + ko.pow(2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for s in (5, 9):
        cos, sin = hf_mrope_cos_sin(2, s, 8)
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
        a, b = fk.qwen2vl_mrope(q, k, cos, sin, [2, 3, 3], False)
        c, d = apply_multimodal_rotary_pos_emb(q, k, cos, sin, [2, 3, 3])
        return a + c, b + d

    scripted = torch.jit.script(f)
    path = str(tmp_path / "mrope.pt")
    torch.jit.save(scripted, path)
    loaded = torch.jit.load(path)
    q, k = _qk(2, 4, 2, 5, 16)
    cos, sin = hf_mrope_cos_sin(2, 5, 16)
    for got, want in zip(loaded(q, k, cos, sin), f(q, k, cos, sin)):
        assert torch.equal(got, want)


# --- level 5: CUDA kernel --------------------------------------------------------------------

# (b, hq, hkv, s, d, mrope_section, interleaved)
CUDA_SHAPES = {
    "qwen2_vl_7b": (2, 28, 4, 257, 128, [16, 24, 24], False),
    "qwen2_vl_2b": (1, 12, 2, 100, 128, [16, 24, 24], False),
    "qwen3_vl": (2, 32, 8, 65, 128, [24, 20, 20], True),
    "one_row": (1, 1, 1, 1, 128, [16, 24, 24], False),
    "odd_heads": (2, 5, 3, 9, 128, [16, 24, 24], True),
    "small_head": (3, 8, 2, 17, 64, [8, 12, 12], False),
    "odd_dims": (2, 3, 1, 7, 38, [5, 7, 7], False),
    "odd_dims_interleaved": (2, 3, 1, 7, 38, [7, 6, 6], True),
    "big_head": (1, 4, 2, 9, 512, [64, 96, 96], False),  # loops over pair chunks
}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CUDA_SHAPES))
@pytest.mark.parametrize("layout,cos_dtype,cos_batch",
                         [("bshd", None, True), ("bhsd", torch.float32, False)])
def test_cuda_matches_reference(dtype, name, layout, cos_dtype, cos_batch):
    b, hq, hkv, s, d, section, inter = CUDA_SHAPES[name]
    q, k = _qk(b, hq, hkv, s, d, dtype, device="cuda", layout=layout)
    cos, sin = _cos_sin(b, s, d, cos_dtype or dtype, b if cos_batch else 1, device="cuda")
    q.requires_grad_()
    k.requires_grad_()
    poison_cuda_cache()
    qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, section, inter)
    for out, x, nm in ((qo, q, "q"), (ko, k, "k")):
        assert not torch.isnan(out).any(), f"{nm}: unwritten output elements"
        assert out.stride() == x.stride(), f"{nm}: layout not kept"
        assert_close(out, ref_mrope(x.detach().cpu(), cos.cpu(), sin.cpu(), section, inter),
                     dtype, what=nm)
    dq = randn(*q.shape, dtype=dtype, device="cuda")
    dk = randn(*k.shape, dtype=dtype, device="cuda")
    poison_cuda_cache()
    torch.autograd.backward((qo, ko), (dq, dk))
    gq, gk = ref_mrope_grads(q.detach().cpu(), k.detach().cpu(), cos.cpu(), sin.cpu(), dq.cpu(),
                             dk.cpu(), section, inter)
    assert not torch.isnan(q.grad).any() and not torch.isnan(k.grad).any()
    assert_close(q.grad, gq, dtype, factor=2, what="dq")
    assert_close(k.grad, gk, dtype, factor=2, what="dk")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_fused_expanded_and_strided(dtype):
    b, s, hq, hkv, d = 2, 37, 8, 2, 128
    section = [16, 24, 24]
    cos, sin = hf_mrope_cos_sin(b, s, d, dtype=dtype, device="cuda")
    qm = misaligned(randn(b, hq, s, d, dtype=dtype, device="cuda"))
    km = misaligned(randn(b, hkv, s, d, dtype=dtype, device="cuda"))
    qo, ko = fk.qwen2vl_mrope(qm, km, misaligned(cos), sin, section)
    assert_close(qo, ref_mrope(qm.cpu(), cos.cpu(), sin.cpu(), section), dtype, what="misaligned q")
    assert_close(ko, ref_mrope(km.cpu(), cos.cpu(), sin.cpu(), section), dtype, what="misaligned k")
    qkv = randn(b, s, hq + 2 * hkv, d, dtype=dtype, device="cuda")
    q, k = qkv[:, :, :hq].transpose(1, 2), qkv[:, :, hq:hq + hkv].transpose(1, 2)
    qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, section)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert_close(qo, ref_mrope(q.cpu(), cos.cpu(), sin.cpu(), section), dtype, what="fused q")
    assert_close(ko, ref_mrope(k.cpu(), cos.cpu(), sin.cpu(), section), dtype, what="fused k")
    ke = randn(b, 1, s, d, dtype=dtype, device="cuda").expand(b, hkv, s, d)
    qt = randn(b, hq, d, s, dtype=dtype, device="cuda").transpose(-1, -2)
    cs = torch.stack((cos, sin), -1)  # cos with a last-dim stride of 2: copied
    qo, ko = fk.qwen2vl_mrope(qt, ke, cs[..., 0], sin, section)
    assert_close(qo, ref_mrope(qt.cpu(), cos.cpu(), sin.cpu(), section), dtype, what="strided q")
    assert_close(ko, ref_mrope(ke.cpu(), cos.cpu(), sin.cpu(), section), dtype, what="expanded k")


@pytest.mark.cuda
def test_cuda_graph_capture():
    b, s, hq, hkv, d = 2, 64, 8, 2, 128
    section = [16, 24, 24]
    q, k = _qk(b, hq, hkv, s, d, torch.bfloat16, device="cuda")
    cos, sin = hf_mrope_cos_sin(b, s, d, dtype=torch.bfloat16, device="cuda")
    fk.qwen2vl_mrope(q, k, cos, sin, section)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, section)
    q.copy_(randn(*q.shape, dtype=torch.bfloat16, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert_close(qo, ref_mrope(q.cpu(), cos.cpu(), sin.cpu(), section), torch.bfloat16)
    assert_close(ko, ref_mrope(k.cpu(), cos.cpu(), sin.cpu(), section), torch.bfloat16)


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.qwen2vl_mrope(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    q = torch.ones(1, 2, 3, 8, dtype=torch.float64, device="cuda")
    c = torch.ones(3, 1, 3, 8, dtype=torch.float64, device="cuda")
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.qwen2vl_mrope(q, q, c, c, [2, 1, 1])


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    cos, sin = hf_mrope_cos_sin(1, 0, 64, device="cuda")
    qo, ko = fk.qwen2vl_mrope(torch.empty(2, 4, 0, 64, device="cuda"),
                              torch.empty(2, 1, 0, 64, device="cuda"), cos, sin, [8, 12, 12])
    assert qo.shape == (2, 4, 0, 64) and ko.shape == (2, 1, 0, 64)
    cos, sin = hf_mrope_cos_sin(2, 5, 64, device="cuda")
    q, k = _qk(2, 4, 2, 5, 64, device="cuda")
    q.requires_grad_()
    k.requires_grad_()
    torch.library.opcheck(torch.ops.fk.qwen2vl_mrope, (q, k, cos, sin, [8, 12, 12], False))
    f = torch.compile(lambda q, k: sum(t.sum() for t in fk.qwen2vl_mrope(q, k, cos, sin,
                                                                          [8, 12, 12])),
                      fullgraph=True, backend="aot_eager")
    f(q, k).backward()
    assert q.grad is not None and k.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    b, hq, hkv, s, d = 1, 32, 1, (1 << 31) // (32 * 128) + 5, 128
    section = [16, 24, 24]
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = hf_mrope_cos_sin(1, s, d, dtype=torch.bfloat16, device="cuda")
    qo, ko = fk.qwen2vl_mrope(q, k, cos, sin, section)
    for sl in (slice(0, 3), slice(s - 3, s)):
        c, sn = cos[:, :, sl].cpu(), sin[:, :, sl].cpu()
        assert_close(qo[:, :, sl], ref_mrope(q[:, :, sl].cpu(), c, sn, section), torch.bfloat16,
                     what=str(sl))
        assert_close(ko[:, :, sl], ref_mrope(k[:, :, sl].cpu(), c, sn, section), torch.bfloat16,
                     what=str(sl))
    del q, k, qo, ko
    torch.cuda.empty_cache()
