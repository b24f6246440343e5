"""fk.qkv_split_norm_rope at every test level: Triton source (interpreter), CPU backend,
autograd, opcheck, torch.compile, TorchScript, bad input, and the CUDA kernels (marker
``cuda``)."""

import pytest
import torch

import fk
from helpers import (DTYPES, assert_close, cdiv, check_compile_matches_eager, error_lines,
                     load_triton_src, misaligned, poison_cuda_cache, randn, round_nearest,
                     round_toward_zero)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")


# --- the reference, written from the models' definitions --------------------------------

def ref_split(qkv, hq, hkv, qkv_format="grouped", input_layout="sbh"):
    """q (B, S, Hq, D), k, v (B, S, Hkv, D) of a fused projection: Megatron's per-group
    [q heads, k, v] ("grouped") or [q..., k..., v...] ("plain")."""
    x = qkv.transpose(0, 1) if input_layout == "sbh" else qkv
    b, s, n = x.shape
    d = n // (hq + 2 * hkv)
    if qkv_format == "grouped":
        g = x.reshape(b, s, hkv, hq // hkv + 2, d)
        return g[:, :, :, :-2].reshape(b, s, hq, d), g[:, :, :, -2], g[:, :, :, -1]
    return x.reshape(b, s, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=2)


def ref_qk_norm(x, w, eps, cast=round_nearest):
    """Hugging Face Qwen3RMSNorm: fp32 statistics, the normalized row cast to the input dtype,
    times the weight in that dtype (a product of two 16-bit values is exact in fp32, so it is
    rounded once here). float64 throughout for float64 inputs."""
    if w is None:
        return x
    if x.dtype == torch.float64:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    xf = x.float()
    xh = cast(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps), x.dtype)
    return cast(w.float() * xh.float(), x.dtype)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def ref_rope(x, cos, sin, rotary_dim=None):
    """x (B, S, H, D) * cos + rotate_half(x) * sin on the first rotary_dim dims, in float64.
    cos / sin (S, W), (Bc, S, W) or (Bc, 1, S, W); W = rotary_dim / 2 holds one value per
    pair (expanded here)."""
    c, s = cos.double(), sin.double()
    if c.dim() == 4:
        c, s = c[:, 0], s[:, 0]
    r = rotary_dim or c.shape[-1]
    if c.shape[-1] * 2 == r:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    c, s = c[..., None, :], s[..., None, :]  # over heads
    xd = x.double()
    xr = xd[..., :r]
    return torch.cat((xr * c + _rotate_half(xr) * s, xd[..., r:]), dim=-1)


def ref_forward(qkv, qw, kw, cos, sin, hq, hkv, eps=1e-6, rotary_dim=None, layout="bshd",
                qkv_format="grouped", input_layout="sbh", cast=round_nearest):
    """(q, k, v): split, qk-norm (rounded where Hugging Face rounds), RoPE in float64 rounded
    once with `cast`, in the requested layout. Differentiable for float64 inputs."""
    q, k, v = ref_split(qkv, hq, hkv, qkv_format, input_layout)
    outs = []
    for x, w in ((q, qw), (k, kw)):
        y = ref_rope(ref_qk_norm(x, w, eps, cast), cos, sin, rotary_dim)
        outs.append(y if qkv.dtype == torch.float64 else cast(y.float(), qkv.dtype))
    outs.append(v)
    if layout == "bhsd":
        outs = [t.transpose(1, 2) for t in outs]
    return outs


def ref_grads(qkv, qw, kw, cos, sin, grads, *args, **kwargs):
    """float64 gradients (qkv, q_norm_weight, k_norm_weight) of the unrounded reference."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (qkv, qw, kw)]
    outs = ref_forward(leaves[0], leaves[1], leaves[2], cos, sin, *args, **kwargs)
    torch.autograd.backward(outs, [g.double() for g in grads])
    return [None if t is None else t.grad for t in leaves]


def make_inputs(b, s, hq, hkv, d, rot=None, width=None, dtype=torch.float32, device="cpu",
                input_layout="sbh", weights=(True, True), cos_batch=1, cos_dtype=None):
    """qkv, q / k norm weights (around 1), random cos / sin (cos_batch, S, width)."""
    n = (hq + 2 * hkv) * d
    qkv = randn(*((s, b, n) if input_layout == "sbh" else (b, s, n)), dtype=dtype,
                device=device)
    qw = (1 + 0.3 * randn(d)).to(device=device, dtype=dtype) if weights[0] else None
    kw = (1 + 0.3 * randn(d)).to(device=device, dtype=dtype) if weights[1] else None
    width = width or rot or d
    cd = cos_dtype or dtype
    cos = randn(cos_batch, s, width, device=device).to(cd)
    sin = randn(cos_batch, s, width, device=device).to(cd)
    return qkv, qw, kw, cos, sin


def output_grads(b, s, hq, hkv, d, layout, dtype=torch.float32, device="cpu"):
    shape = (lambda h: (b, h, s, d)) if layout == "bhsd" else (lambda h: (b, s, h, d))
    return [randn(*shape(h), dtype=dtype, device=device) for h in (hq, hkv, hkv)]


# --- level 1: the Triton source under the interpreter ---------------------------------

def _mode(mod, qkv_format, input_layout, layout, qw, kw):
    return ((mod.GROUPED.value if qkv_format == "grouped" else 0)
            | (mod.TOKENS_SB.value if input_layout == "sbh" else 0)
            | (mod.OUT_BHSD.value if layout == "bhsd" else 0)
            | (mod.HAS_QW.value if qw is not None else 0)
            | (mod.HAS_KW.value if kw is not None else 0))


def _geometry(qkv, cos, hq, hkv, rot, input_layout):
    sb = input_layout == "sbh"
    s, b = (qkv.shape[0], qkv.shape[1]) if sb else (qkv.shape[1], qkv.shape[0])
    in_sb, in_ss = (qkv.stride(1), qkv.stride(0)) if sb else (qkv.stride(0), qkv.stride(1))
    c3 = cos if cos.dim() == 3 else cos[None]
    width = c3.shape[-1]
    r = rot or width
    c2_off = 0 if width * 2 == r else r // 2
    cos_sb = 0 if c3.shape[0] == 1 else c3.stride(0)
    return b, s, qkv.shape[2] // (hq + 2 * hkv), r // 2, c2_off, in_sb, in_ss, cos_sb, c3.stride(1)


# (B, S, Hq, Hkv, D, rotary_dim passed, cos width, HB, BT, BH, weights)
INTERP_CASES = {
    "full": (2, 5, 6, 2, 16, None, 16, 8, 4, 2, (True, True)),
    "partial": (2, 3, 4, 2, 20, None, 8, 4, 2, 4, (True, True)),   # 3 pass-through chunks
    "half_width": (1, 7, 4, 4, 12, 12, 6, 8, 4, 2, (True, False)),
    "no_norm": (3, 2, 2, 1, 8, None, 8, 4, 2, 2, (False, False)),
    "mha": (2, 3, 3, 3, 8, None, 4, 2, 4, 2, (False, True)),
}
INTERP_OPTIONS = [
    # dtype, qkv_format, input_layout, layout, cos fp32, cos batch
    (torch.bfloat16, "grouped", "sbh", "bshd", False, 1),
    (torch.float16, "plain", "bsh", "bhsd", True, 2),
    (torch.float32, "grouped", "bsh", "bhsd", False, 2),
    (torch.bfloat16, "plain", "sbh", "bshd", True, 1),
]


def _interp_case(case, opts):
    b, s, hq, hkv, d, rot, width, hb, bt, bh, weights = INTERP_CASES[case]
    dtype, qkv_format, input_layout, layout, cos_fp32, cos_batch = opts
    inputs = make_inputs(b, s, hq, hkv, d, rot, width, dtype, input_layout=input_layout,
                         weights=weights, cos_batch=b if cos_batch > 1 else 1,
                         cos_dtype=torch.float32 if cos_fp32 else None)
    return inputs, (hq, hkv, rot, layout, qkv_format, input_layout), (hb, bt, bh)


@pytest.mark.parametrize("opts", INTERP_OPTIONS, ids=lambda o: f"{str(o[0])[6:]}-{o[1]}-{o[2]}-{o[3]}")
@pytest.mark.parametrize("case", list(INTERP_CASES))
@pytest.mark.parametrize("cos_first", [0, 1])
def test_interpreter_forward(case, opts, cos_first):
    mod = load_triton_src("qkv_split_norm_rope")
    (qkv, qw, kw, cos, sin), (hq, hkv, rot, layout, fmt, il), (hb, bt, bh) = \
        _interp_case(case, opts)
    b, s, d, half, c2_off, in_sb, in_ss, cos_sb, cos_ss = _geometry(qkv, cos, hq, hkv, rot, il)
    outs = [torch.full((b, h, s, d) if layout == "bhsd" else (b, s, h, d), float("nan"),
                       dtype=qkv.dtype) for h in (hq, hkv, hkv)]
    mode = _mode(mod, fmt, il, layout, qw, kw)
    tiles = cdiv(b * s, bt) * (cdiv(hq, bh) + 2 * cdiv(hkv, bh))
    mod.qkv_split_norm_rope_fwd_kernel[(tiles,)](
        qkv, qkv if qw is None else qw, qkv if kw is None else kw, cos, sin, *outs, in_sb,
        in_ss, cos_sb, cos_ss, b, s, hq, hkv, d, half, c2_off, mode, 1e-6, HB=hb, BT=bt, BH=bh,
        COS_FIRST=cos_first)
    refs = ref_forward(qkv, qw, kw, cos, sin, hq, hkv, 1e-6, rot, layout, fmt, il,
                       cast=round_toward_zero)
    for out, ref, name in zip(outs, refs, "qkv"):
        assert not torch.isnan(out).any(), f"{name}: unwritten elements"
        assert_close(out, ref, qkv.dtype, what=name)
    assert torch.equal(outs[2], refs[2]), "v is a copy"


@pytest.mark.parametrize("opts", INTERP_OPTIONS[:3], ids=lambda o: f"{str(o[0])[6:]}-{o[1]}-{o[2]}-{o[3]}")
@pytest.mark.parametrize("case", list(INTERP_CASES))
@pytest.mark.parametrize("programs", [1, 3])
def test_interpreter_backward(case, opts, programs):
    mod = load_triton_src("qkv_split_norm_rope")
    (qkv, qw, kw, cos, sin), (hq, hkv, rot, layout, fmt, il), (hb, bt, bh) = \
        _interp_case(case, opts)
    b, s, d, half, c2_off, in_sb, in_ss, cos_sb, cos_ss = _geometry(qkv, cos, hq, hkv, rot, il)
    grads = output_grads(b, s, hq, hkv, d, layout, qkv.dtype)
    dqkv = torch.full_like(qkv, float("nan"))
    part = torch.full((programs, 2 * d), float("nan"))
    mode = _mode(mod, fmt, il, layout, qw, kw)
    mod.qkv_split_norm_rope_bwd_kernel[(programs,)](
        *grads, qkv, qkv if qw is None else qw, qkv if kw is None else kw, cos, sin, dqkv,
        part, in_sb, in_ss, cos_sb, cos_ss, b, s, hq, hkv, d, half, c2_off, mode, 1e-6,
        HB=hb, BT=bt, BH=bh)
    gx, gqw, gkw = ref_grads(qkv, qw, kw, cos, sin, grads, hq, hkv, 1e-6, rot, layout, fmt, il)
    assert not torch.isnan(dqkv).any(), "unwritten elements"
    assert_close(dqkv, gx, qkv.dtype, factor=2, what="dqkv")
    for w, cols, ref, name in ((qw, part[:, :d], gqw, "dqw"), (kw, part[:, d:], gkw, "dkw")):
        if w is not None:
            assert_close(cols.sum(0), ref, qkv.dtype, factor=2, what=name)


@pytest.mark.parametrize("arch", [80, 90, 100])
def test_variants_cover_every_dtype_and_flag(arch):
    """Every dtype has both kernels at every half block, aligned or not (aligned also with S
    a multiple of 16: 257), with cos / sin of its own dtype and (16-bit dtypes) float32, each
    once, with its tile (and the forward's COS_FIRST) from FWD_TILES / BWD_TILES."""
    mod = load_triton_src("qkv_split_norm_rope")
    vs = mod.variants(arch)
    for family, tiles in (("qkv_split_norm_rope_fwd", mod.FWD_TILES),
                          ("qkv_split_norm_rope_bwd", mod.BWD_TILES)):
        for dt in ("fp32", "bf16", "fp16"):
            want = {0, 1, 257} if dt == "fp32" else {0, 1, 257, 2, 3, 259}
            for hb, tile in tiles.items():
                got = [v for v in vs if v.family == family and v.dtype == dt and v.block == hb]
                assert sorted(v.flags for v in got) == sorted(want), (family, dt, hb)
                for v in got:
                    cx = v.constexprs
                    have = (cx["BT"], cx["BH"], v.num_warps)
                    if family.endswith("fwd"):
                        have += (cx["COS_FIRST"],)
                    else:
                        assert "COS_FIRST" not in cx
                    assert have == tile, (family, dt, hb, v.flags)
    assert len(vs) == 2 * 4 * (3 + 6 + 6)


# --- level 2: the CPU backend against the reference --------------------------------------

# (B, S, Hq, Hkv, D, rotary_dim passed, cos width, weights)
CONFIGS = {
    "qwen3": (2, 5, 8, 2, 16, None, 16, (True, True)),
    "partial": (2, 4, 4, 2, 20, None, 8, (True, True)),
    "half_width": (1, 6, 4, 1, 16, 16, 8, (True, True)),
    "no_norm": (2, 3, 4, 2, 8, None, 8, (False, False)),
    "k_norm_only": (2, 3, 2, 2, 8, None, 4, (False, True)),
}


@pytest.mark.parametrize("dtype", DTYPES + (torch.float64,))
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("fmt,il,layout", [("grouped", "sbh", "bshd"), ("plain", "bsh", "bhsd"),
                                           ("grouped", "bsh", "bhsd"), ("plain", "sbh", "bshd")])
def test_cpu_forward_backward(dtype, cfg, fmt, il, layout):
    b, s, hq, hkv, d, rot, width, weights = CONFIGS[cfg]
    qkv, qw, kw, cos, sin = make_inputs(b, s, hq, hkv, d, rot, width, dtype, input_layout=il,
                                        weights=weights, cos_batch=b if layout == "bhsd" else 1)
    leaves = [t for t in (qkv, qw, kw) if t is not None]
    for t in leaves:
        t.requires_grad_()
    outs = fk.qkv_split_norm_rope(qkv, qw, kw, cos, sin, hq, hkv, 1e-6, rot, layout, fmt, il)
    refs = ref_forward(qkv.detach(), qw, kw, cos, sin, hq, hkv, 1e-6, rot, layout, fmt, il)
    for out, ref, name in zip(outs, refs, "qkv"):
        assert out.dtype == dtype and out.shape == ref.shape and out.is_contiguous(), name
        assert_close(out, ref, dtype, what=name)
    grads = output_grads(b, s, hq, hkv, d, layout, dtype)
    torch.autograd.backward(outs, grads)
    gx, gqw, gkw = ref_grads(qkv, qw, kw, cos, sin, grads, hq, hkv, 1e-6, rot, layout, fmt, il)
    assert_close(qkv.grad, gx, dtype, factor=2, what="dqkv")
    if qw is not None:
        assert_close(qw.grad, gqw, dtype, factor=2, what="dqw")
    if kw is not None:
        assert_close(kw.grad, gkw, dtype, factor=2, what="dkw")


def test_cpu_matches_hugging_face_qwen3():
    """Against transformers' own Qwen3 pieces: Qwen3RMSNorm on q / k heads, then
    apply_rotary_pos_emb with the model's rotary embedding (float32)."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    from transformers import Qwen3Config
    b, s, hq, hkv, d = 2, 7, 4, 2, 16
    config = Qwen3Config(hidden_size=64, num_attention_heads=hq, num_key_value_heads=hkv,
                         head_dim=d, rms_norm_eps=1e-6)
    qkv, _, _, _, _ = make_inputs(b, s, hq, hkv, d, input_layout="bsh")
    q_norm, k_norm = qwen3.Qwen3RMSNorm(d, eps=1e-6), qwen3.Qwen3RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.add_(0.3 * randn(d))
        k_norm.weight.add_(0.3 * randn(d))
    rotary = qwen3.Qwen3RotaryEmbedding(config)
    pos = torch.arange(s)[None].expand(b, s)
    cos, sin = rotary(qkv, pos)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)  # plain layout
    hq_ = q_norm(q.view(b, s, hq, d)).transpose(1, 2)
    hk_ = k_norm(k.view(b, s, hkv, d)).transpose(1, 2)
    ref_q, ref_k = qwen3.apply_rotary_pos_emb(hq_, hk_, cos, sin)
    with torch.no_grad():
        oq, ok, ov = fk.qkv_split_norm_rope(qkv, q_norm.weight, k_norm.weight, cos, sin, hq, hkv,
                                            1e-6, layout="bhsd", qkv_format="plain",
                                            input_layout="bsh")
    assert_close(oq, ref_q, torch.float32, what="q")
    assert_close(ok, ref_k, torch.float32, what="k")
    assert torch.equal(ov, v.view(b, s, hkv, d).transpose(1, 2))


def test_cpu_megatron_grouped_layout():
    """Megatron's fused weight: the projection viewed as (S, B, Hkv, (R + 2) * D) splits into
    [R q heads, k, v] per group; checked on a qkv whose heads hold their own index."""
    s, b, hq, hkv, d = 3, 2, 6, 2, 4
    r = hq // hkv
    heads = torch.arange(hq + 2 * hkv, dtype=torch.float32)
    qkv = heads[:, None].expand(-1, d).reshape(1, 1, -1).expand(s, b, -1).contiguous()
    cos, sin = torch.ones(s, d), torch.zeros(s, d)
    q, k, v = fk.qkv_split_norm_rope(qkv, None, None, cos, sin, hq, hkv)
    order = [(g * (r + 2) + i) for g in range(hkv) for i in range(r)]
    assert torch.equal(q[0, 0, :, 0], torch.tensor(order, dtype=torch.float32))
    assert torch.equal(k[0, 0, :, 0], torch.tensor([g * (r + 2) + r for g in range(hkv)],
                                                   dtype=torch.float32))
    assert torch.equal(v[0, 0, :, 0], torch.tensor([g * (r + 2) + r + 1 for g in range(hkv)],
                                                   dtype=torch.float32))


def test_cpu_cos_forms_and_strided_qkv():
    """cos / sin as (S, W), (1, S, W), (B, S, W), (B, 1, S, W), float32 with bfloat16 qkv;
    a qkv with a last-dim stride other than 1."""
    b, s, hq, hkv, d = 2, 5, 4, 2, 16
    qkv, qw, kw, cos, sin = make_inputs(b, s, hq, hkv, d, dtype=torch.bfloat16, cos_batch=b,
                                        cos_dtype=torch.float32)
    for c, sn in ((cos, sin), (cos[:1], sin[:1]), (cos[0], sin[0]), (cos[:, None], sin[:, None])):
        outs = fk.qkv_split_norm_rope(qkv, qw, kw, c, sn, hq, hkv)
        for out, ref in zip(outs, ref_forward(qkv, qw, kw, c, sn, hq, hkv)):
            assert_close(out, ref, torch.bfloat16)
    strided = qkv.transpose(0, 2).contiguous().transpose(0, 2)
    assert strided.stride(2) != 1
    for out, ref in zip(fk.qkv_split_norm_rope(strided, qw, kw, cos, sin, hq, hkv),
                        ref_forward(qkv, qw, kw, cos, sin, hq, hkv)):
        assert_close(out, ref, torch.bfloat16)


def test_cpu_empty():
    cos, sin = torch.ones(0, 8), torch.zeros(0, 8)
    qkv = torch.empty(0, 3, (4 + 4) * 8, requires_grad=True)
    q, k, v = fk.qkv_split_norm_rope(qkv, torch.ones(8), None, cos, sin, 4, 2)
    assert q.shape == (3, 0, 4, 8) and k.shape == (3, 0, 2, 8) and v.shape == (3, 0, 2, 8)
    (q.sum() + k.sum() + v.sum()).backward()
    assert qkv.grad.shape == qkv.shape


def test_cpu_nan_propagates():
    qkv, qw, kw, cos, sin = make_inputs(1, 2, 2, 1, 8, input_layout="bsh")
    qkv[0, 1, 3] = float("nan")  # token 1, q head 0 (grouped: [q, q, k, v])
    q, k, v = fk.qkv_split_norm_rope(qkv, qw, kw, cos, sin, 2, 1, input_layout="bsh")
    assert torch.isnan(q[0, 1, 0]).all() and not torch.isnan(q[0, 0]).any()
    assert not torch.isnan(k).any() and not torch.isnan(v).any()


def test_only_some_gradients_and_unused_outputs():
    qkv, qw, kw, cos, sin = make_inputs(2, 3, 4, 2, 8)
    kw.requires_grad_()
    q, k, v = fk.qkv_split_norm_rope(qkv, qw, kw, cos, sin, 4, 2)
    k.pow(2).sum().backward()  # q, v unused; qkv and qw need no gradient
    grads = [torch.zeros_like(q), 2 * k.detach(), torch.zeros_like(v)]
    assert_close(kw.grad, ref_grads(qkv, qw, kw, cos, sin, grads, 4, 2)[2], torch.float32,
                 factor=2)
    assert qw.grad is None and qkv.grad is None


def test_cos_sin_get_no_gradient():
    qkv, qw, kw, cos, sin = make_inputs(1, 3, 2, 1, 8)
    cos.requires_grad_()
    qkv.requires_grad_()
    q, k, v = fk.qkv_split_norm_rope(qkv, qw, kw, cos, sin, 2, 1)
    (q.sum() + k.sum() + v.sum()).backward()
    assert cos.grad is None and qkv.grad is not None


def test_double_backward_is_a_clear_error():
    qkv, qw, kw, cos, sin = make_inputs(1, 3, 2, 1, 8)
    qkv.requires_grad_()
    q, _, _ = fk.qkv_split_norm_rope(qkv, qw, kw, cos, sin, 2, 1)
    (g,) = torch.autograd.grad(q.pow(2).sum(), qkv, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


# --- bad input: the same message from every backend -----------------------------------

def _bad(qkv=(3, 2, 64), hq=4, hkv=2, qw=(8,), kw=(8,), cos=(3, 8), dt=torch.float32,
         wdt=None, cdt=None, rot=None, layout="bshd", fmt="grouped", il="sbh"):
    def make(device):
        t = lambda shape, dtype: None if shape is None else torch.ones(shape, dtype=dtype,
                                                                       device=device)
        return (t(qkv, dt), t(qw, wdt or dt), t(kw, wdt or dt), t(cos, cdt or dt),
                t(cos, cdt or dt), hq, hkv, 1e-6, rot, layout, fmt, il)
    return make


BAD = [
    ("qkv 2-D", _bad(qkv=(6, 64)), "must have 3 dims"),
    ("int qkv", _bad(dt=torch.int32, wdt=torch.float32, cdt=torch.float32), "not supported"),
    ("layout", _bad(layout="bsdh"), "layout must be 'bshd' or 'bhsd'"),
    ("format", _bad(fmt="interleaved"), "qkv_format must be"),
    ("input layout", _bad(il="hsb"), "input_layout must be"),
    ("heads not a multiple", _bad(hq=3, hkv=2), "positive multiple of num_kv_heads"),
    ("zero kv heads", _bad(hkv=0), "positive multiple of num_kv_heads"),
    ("width", _bad(qkv=(3, 2, 60)), r"must be \(num_heads \+ 2 \* num_kv_heads\) \* head_dim"),
    ("weight shape", _bad(qw=(16,)), "q_norm_weight must have shape"),
    ("weight dtype", _bad(wdt=torch.float16), "must have the same dtype"),
    ("cos dtype", _bad(dt=torch.bfloat16, cdt=torch.float16), "must be float32 or q's dtype"),
    ("cos seq", _bad(cos=(4, 8)), "seq length"),
    ("cos seq bsh", _bad(il="bsh"), "seq length"),
    ("cos batch", _bad(cos=(3, 3, 8)), "batch size 1 or q's"),
    ("odd rotary dim", _bad(cos=(3, 7)), "must be even"),
    ("rotary dim > head dim", _bad(cos=(3, 10)), "must be even"),
    ("cos width", _bad(cos=(3, 6), rot=8), "rotary_dim / 2 entries"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    cpu, meta = error_lines(lambda d: fk.qkv_split_norm_rope(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def _bad_grads(qkv_shape=(3, 2, 64), shapes=((2, 3, 4, 8), (2, 3, 2, 8), (2, 3, 2, 8)),
               gdt=torch.float32):
    def make(device):
        g = [torch.ones(sh, dtype=gdt, device=device) for sh in shapes]
        qkv = torch.ones(qkv_shape, device=device)
        return (*g, qkv, None, None, torch.ones(3, 8, device=device),
                torch.ones(3, 8, device=device), 4, 2, 1e-6, None, "bshd", "grouped", "sbh",
                [False, False])
    return make


@pytest.mark.parametrize("make,msg", [
    (_bad_grads(shapes=((2, 4, 3, 8), (2, 3, 2, 8), (2, 3, 2, 8))), "grad_q must have"),
    (_bad_grads(shapes=((2, 3, 4, 8), (2, 3, 2, 8), (2, 3, 3, 8))), "grad_v must have"),
    (_bad_grads(gdt=torch.float16), "must have the same dtype"),
])
def test_backward_bad_input_cpu_and_meta_agree(make, msg):
    op = torch.ops.fk._qkv_split_norm_rope_backward
    cpu, meta = error_lines(lambda d: op(*make(d)), ("cpu", "meta"), msg)
    assert cpu == meta


def test_devices_differ():
    qkv, qw, kw, cos, sin = make_inputs(1, 3, 2, 1, 8)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.qkv_split_norm_rope(qkv, qw, kw, cos.to("meta"), sin, 2, 1)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.qkv_split_norm_rope(qkv, qw.to("meta"), kw, cos, sin, 2, 1)


# --- level 3: autograd, opcheck, torch.compile, TorchScript ----------------------------------

@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("fmt,il,layout", [("grouped", "sbh", "bshd"), ("plain", "bsh", "bhsd")])
def test_gradcheck(cfg, fmt, il, layout):
    b, s, hq, hkv, d, rot, width, weights = CONFIGS[cfg]
    qkv, qw, kw, cos, sin = make_inputs(b, min(s, 3), hq, hkv, d, rot, width, torch.float64,
                                        input_layout=il, weights=weights, cos_batch=b)
    inputs = [t.requires_grad_() for t in (qkv, qw, kw) if t is not None]

    def f(*ts):
        it = iter(ts)
        x = next(it)
        w1 = next(it) if qw is not None else None
        w2 = next(it) if kw is not None else None
        return fk.qkv_split_norm_rope(x, w1, w2, cos, sin, hq, hkv, 1e-6, rot, layout, fmt, il)

    assert torch.autograd.gradcheck(f, inputs)


def test_opcheck():
    qkv, qw, kw, cos, sin = make_inputs(2, 5, 4, 2, 16, rot=8)
    for t in (qkv, qw, kw):
        t.requires_grad_()
    op = torch.ops.fk.qkv_split_norm_rope
    torch.library.opcheck(op, (qkv, qw, kw, cos, sin, 4, 2, 1e-6, None, "bshd", "grouped",
                               "sbh"))
    torch.library.opcheck(op, (qkv.transpose(0, 1), None, kw, cos[0], sin[0], 4, 2, 1e-5, 8,
                               "bhsd", "plain", "bsh"))
    grads = output_grads(2, 5, 4, 2, 16, "bshd")
    torch.library.opcheck(torch.ops.fk._qkv_split_norm_rope_backward,
                          (*grads, qkv.detach(), qw.detach(), kw.detach(), cos, sin, 4, 2, 1e-6,
                           None, "bshd", "grouped", "sbh", [True, True]),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph():
    def f(x, qw, kw, cos, sin):
        q, k, v = fk.qkv_split_norm_rope(x, qw, kw, cos, sin, 4, 2, layout="bhsd")
        return q.sum() + k.pow(2).sum() + (v * q[:, :2]).sum()

    def args(s):
        qkv, qw, kw, cos, sin = make_inputs(2, s, 4, 2, 8)
        return [qkv.requires_grad_(), qw.requires_grad_(), kw.requires_grad_(), cos, sin]

    check_compile_matches_eager(f, args)


def test_torchscript(tmp_path):
    def f(qkv: torch.Tensor, qw: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return fk.qkv_split_norm_rope(qkv, qw, None, cos, sin, 4, 2, 1e-6, None, "bshd",
                                      "grouped", "sbh")

    scripted = torch.jit.script(f)
    path = str(tmp_path / "qkv.pt")
    torch.jit.save(scripted, path)
    loaded = torch.jit.load(path)
    qkv, qw, _, cos, sin = make_inputs(2, 5, 4, 2, 8)
    for got, want in zip(loaded(qkv, qw, cos, sin), f(qkv, qw, cos, sin)):
        assert torch.equal(got, want)


# --- level 5: CUDA kernels -----------------------------------------------------------------

# (B, S, Hq, Hkv, D, rotary_dim passed, cos width, weights)
CUDA_SHAPES = {
    "qwen3_30b_a3b": (2, 129, 32, 4, 128, None, 128, (True, True)),
    "qwen3_8b": (1, 77, 32, 8, 128, None, 128, (True, True)),
    "seq_of_16s": (2, 48, 16, 4, 128, None, 128, (True, True)),  # the FLAG_ROWS16 variants
    "head_dim_64": (3, 33, 16, 4, 64, None, 64, (True, True)),
    "head_dim_256": (1, 19, 8, 2, 256, None, 256, (True, True)),
    "mha_odd": (2, 9, 5, 5, 128, None, 128, (True, True)),
    "one_token": (1, 1, 1, 1, 128, None, 128, (True, True)),
    "partial_half": (2, 21, 8, 2, 128, None, 64, (True, True)),   # linghe's half-rotary
    "partial_odd": (2, 11, 6, 2, 40, None, 24, (True, False)),
    "half_width": (2, 13, 8, 2, 64, 64, 32, (False, True)),
    "no_norm": (2, 17, 8, 4, 128, None, 128, (False, False)),
    "odd_dims": (2, 7, 3, 1, 38, None, 26, (True, True)),
    # 4096 tokens: 1024 blocks of the backward's 4 tokens at head_dim 128, so a grid of 1024
    # programs on a GPU of 128 or more multiprocessors (8 one-warp programs each), whose
    # weight gradients are summed in the tall steps (triton_src/rms_norm.py FLAG_DW_TALL)
    "many_programs": (2, 2048, 32, 4, 128, None, 128, (True, True)),
}


def _cuda_case(name, dtype, il, cos_dtype, cos_batch):
    b, s, hq, hkv, d, rot, width, weights = CUDA_SHAPES[name]
    inputs = make_inputs(b, s, hq, hkv, d, rot, width, dtype, "cuda", il, weights,
                         b if cos_batch else 1, cos_dtype)
    return inputs, (b, s, hq, hkv, d, rot)


def _check_cuda(inputs, dims, dtype, fmt, il, layout):
    qkv, qw, kw, cos, sin = [None if t is None else t.detach() for t in inputs]  # leaves
    b, s, hq, hkv, d, rot = dims
    for t in (qkv, qw, kw):
        if t is not None:
            t.requires_grad_()
    poison_cuda_cache()
    outs = fk.qkv_split_norm_rope(qkv, qw, kw, cos, sin, hq, hkv, 1e-6, rot, layout, fmt, il)
    cpu = [None if t is None else t.detach().cpu() for t in (qkv, qw, kw, cos, sin)]
    refs = ref_forward(*cpu[:5], hq, hkv, 1e-6, rot, layout, fmt, il)
    for out, ref, name in zip(outs, refs, "qkv"):
        assert not torch.isnan(out).any(), f"{name}: unwritten output elements"
        assert out.is_contiguous()
        assert_close(out, ref, dtype, what=name)
    grads = output_grads(b, s, hq, hkv, d, layout, dtype, "cuda")
    poison_cuda_cache()
    torch.autograd.backward(outs, grads)
    gx, gqw, gkw = ref_grads(*cpu[:5], [g.cpu() for g in grads], hq, hkv, 1e-6, rot, layout, fmt,
                             il)
    assert not torch.isnan(qkv.grad).any()
    assert_close(qkv.grad, gx, dtype, factor=2, what="dqkv")
    for w, ref, name in ((qw, gqw, "dqw"), (kw, gkw, "dkw")):
        if w is not None:
            assert_close(w.grad, ref, dtype, factor=2, what=name)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CUDA_SHAPES))
@pytest.mark.parametrize("fmt,il,layout,cos_dtype,cos_batch", [
    ("grouped", "sbh", "bshd", None, False),
    ("plain", "bsh", "bhsd", torch.float32, True),
    ("grouped", "bsh", "bhsd", None, True),
    ("plain", "sbh", "bshd", torch.float32, False),
])
def test_cuda_matches_reference(dtype, name, fmt, il, layout, cos_dtype, cos_batch):
    inputs, dims = _cuda_case(name, dtype, il, cos_dtype, cos_batch)
    _check_cuda(inputs, dims, dtype, fmt, il, layout)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_misaligned_and_strided(dtype):
    """Misaligned qkv / weights / cos (the unaligned variants), a qkv with padded rows, and a
    last-dim-strided qkv."""
    (qkv, qw, kw, cos, sin), dims = _cuda_case("qwen3_8b", dtype, "sbh", None, False)
    inputs = [misaligned(t) for t in (qkv, qw, kw, cos, sin)]
    _check_cuda(inputs, dims, dtype, "grouped", "sbh", "bshd")
    b, s, hq, hkv, d, rot = dims
    padded = torch.zeros(s, b, qkv.shape[2] + 8, dtype=dtype, device="cuda")
    padded[..., :qkv.shape[2]] = qkv
    _check_cuda((padded[..., :qkv.shape[2]], qw, kw, cos, sin), dims, dtype, "plain", "sbh",
                "bhsd")
    strided = qkv.transpose(0, 2).contiguous().transpose(0, 2)
    _check_cuda((strided, qw, kw, cos, sin), dims, dtype, "grouped", "sbh", "bshd")


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    for name, make, msg in BAD:
        cpu, cuda = error_lines(lambda d: fk.qkv_split_norm_rope(*make(d)), ("cpu", "cuda"), msg)
        assert cpu == cuda, name
    qkv = torch.ones(3, 2, 64, device="cuda", dtype=torch.float64)
    cos = torch.ones(3, 8, device="cuda", dtype=torch.float64)
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.qkv_split_norm_rope(qkv, None, None, cos, cos, 4, 2)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.qkv_split_norm_rope(qkv.float(), None, None, torch.ones(3, 8), torch.ones(3, 8), 4, 2)
    qkv = torch.ones(3, 2, 8 * 1024, device="cuda")
    cos = torch.ones(3, 512, device="cuda")
    with pytest.raises(RuntimeError, match="must be at most 256 on CUDA"):
        fk.qkv_split_norm_rope(qkv, None, None, cos, cos, 4, 2)


@pytest.mark.cuda
def test_cuda_empty_opcheck_compile():
    cos, sin = torch.ones(0, 64, device="cuda"), torch.zeros(0, 64, device="cuda")
    qkv = torch.empty(0, 2, 8 * 64, device="cuda", requires_grad=True)
    w = torch.ones(64, device="cuda", requires_grad=True)
    q, k, v = fk.qkv_split_norm_rope(qkv, w, None, cos, sin, 4, 2)
    assert q.shape == (2, 0, 4, 64)
    (q.sum() + k.sum() + v.sum()).backward()
    assert torch.equal(w.grad, torch.zeros_like(w))
    qkv, qw, kw, cos, sin = make_inputs(2, 5, 4, 2, 64, device="cuda")
    for t in (qkv, qw, kw):
        t.requires_grad_()
    torch.library.opcheck(torch.ops.fk.qkv_split_norm_rope,
                          (qkv, qw, kw, cos, sin, 4, 2, 1e-6, None, "bshd", "grouped", "sbh"))
    # aot_eager: fk's fake kernels and autograd without Inductor (which needs Triton, absent
    # in the GPU test run); the CPU tests cover Inductor.
    f = torch.compile(lambda *a: sum(t.sum() for t in fk.qkv_split_norm_rope(*a, cos, sin, 4, 2)),
                      fullgraph=True, backend="aot_eager")
    f(qkv, qw, kw).backward()
    assert qkv.grad is not None and qw.grad is not None


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    """qkv and q past 2^31 elements (int64 offsets); checked on the first and last tokens."""
    hq, hkv, d, b = 32, 4, 128, 1
    s = (1 << 31) // (hq * d) + 3
    qkv = torch.randn(s, b, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
    qw = torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5
    pos = torch.arange(s, device="cuda", dtype=torch.float32)[:, None]
    freqs = pos * (1.0 / 10000 ** (torch.arange(0, d, 2, device="cuda") / d))
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos(), emb.sin()
    q, k, v = fk.qkv_split_norm_rope(qkv, qw, qw, cos, sin, hq, hkv)
    for sl in (slice(0, 3), slice(s - 3, s)):
        refs = ref_forward(qkv[sl].cpu(), qw.cpu(), qw.cpu(), cos[sl].cpu(), sin[sl].cpu(), hq,
                           hkv)
        for out, ref, name in zip((q, k, v), refs, "qkv"):
            assert_close(out[:, sl], ref, torch.bfloat16, what=f"{name} {sl}")
    del qkv, q, k, v
    torch.cuda.empty_cache()
