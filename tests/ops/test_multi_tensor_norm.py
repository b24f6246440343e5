"""fk.multi_tensor_norm / fk.multi_tensor_count_zeros at every test level: Triton source
(interpreter), CPU backend, opcheck, torch.compile, TorchScript, bad input, and the CUDA
kernels (marker ``cuda``)."""
import math
from typing import List

import pytest
import torch

import fk
from helpers import cdiv, error_lines, load_triton_src, randn

INF = float("inf")
_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


# --- the reference: float64 over the concatenated elements ----------------------------------

def ref_norm(tensors, ord):
    flat = torch.cat([torch.zeros(0, dtype=torch.float64)]
                     + [t.detach().double().flatten().cpu() for t in tensors])
    if flat.numel() == 0:
        return torch.tensor(0.0, dtype=torch.float64)
    return torch.linalg.vector_norm(flat, ord)


def ref_count_zeros(tensors):
    return sum(int((t.detach().cpu() == 0).sum()) for t in tensors)


def _mixed(device="cpu", seed=0, dtypes=(torch.float32, torch.bfloat16, torch.float16)):
    """Tensors of several shapes and dtypes, a few zeros planted, one empty."""
    shapes = [(1000,), (37, 5), (3,), (0, 4), (4097,), (2, 3, 129), (1,)]
    out = []
    for i, s in enumerate(shapes):
        t = randn(*s, dtype=dtypes[i % len(dtypes)], device=device, seed=seed + i)
        if t.numel() > 2:
            t.view(-1)[1] = 0
            t.view(-1)[-1] = -0.0
        out.append(t)
    return out


def _close(out, ref, rel=2e-6):
    assert out.dtype == torch.float32 and out.dim() == 0
    assert math.isclose(out.item(), ref.item(), rel_tol=rel, abs_tol=0), (out.item(), ref.item())


# --- level 1: the Triton source under the interpreter ---------------------------------------

def _interp(mod, tensors, mode, programs, block):
    rows, first = [], 0
    for t in tensors:
        if t.numel() == 0:
            continue
        rows += [t.data_ptr(), t.numel(), _CODES[t.dtype], first]
        first += cdiv(t.numel(), block)
    table = torch.tensor(rows, dtype=torch.int64)
    dt = torch.int64 if mode == mod.COUNT_ZEROS else torch.float32
    part = torch.full((programs,), -7, dtype=dt)
    mod.multi_tensor_reduce_kernel[(programs,)](table, part, len(rows) // 4, MODE=mode,
                                                BLOCK=block)
    out = torch.full((), -7, dtype=dt)
    mod.multi_tensor_finish_kernel[(1,)](part, out, programs, MODE=mode, BLOCK=4)
    return out


@pytest.mark.parametrize("programs", [1, 5, 64])
def test_interpreter_reduce_and_finish(programs):
    """More and fewer programs than blocks; every mode against the reference."""
    mod = load_triton_src("multi_tensor_norm")
    ts = _mixed()
    _close(_interp(mod, ts, mod.SUM_SQUARES, programs, 256), ref_norm(ts, 2))
    _close(_interp(mod, ts, mod.MAX_ABS, programs, 256), ref_norm(ts, INF), rel=0)
    assert _interp(mod, ts, mod.COUNT_ZEROS, programs, 256).item() == ref_count_zeros(ts)


def test_interpreter_small_values_partial_blocks():
    """|x| < 1 everywhere, every tensor ending in a partial block: the masked lanes must add
    nothing to either norm and count no zero."""
    mod = load_triton_src("multi_tensor_norm")
    ts = [t * 0.01 for t in _mixed()]
    _close(_interp(mod, ts, mod.SUM_SQUARES, 4, 256), ref_norm(ts, 2))
    _close(_interp(mod, ts, mod.MAX_ABS, 4, 256), ref_norm(ts, INF), rel=0)
    assert _interp(mod, ts, mod.COUNT_ZEROS, 4, 256).item() == ref_count_zeros(ts)


def test_interpreter_nan_and_inf_propagate():
    mod = load_triton_src("multi_tensor_norm")
    ts = _mixed()
    ts[4][100] = float("nan")
    for mode in (mod.SUM_SQUARES, mod.MAX_ABS):
        assert math.isnan(_interp(mod, ts, mode, 3, 256).item())
    ts[4][100] = -INF
    for mode in (mod.SUM_SQUARES, mod.MAX_ABS):
        assert _interp(mod, ts, mode, 3, 256).item() == INF


def test_variants_cover_every_dtype_and_mode():
    mod = load_triton_src("multi_tensor_norm")
    for arch in (80, 90, 100, 103, 120):
        vs = mod.variants(arch)
        assert {(v.family, v.flags >> 1) for v in vs} == {
            (f, m) for f in ("multi_tensor_reduce", "multi_tensor_finish") for m in range(3)}
        for v in vs:
            assert v.constexprs["MODE"] == v.flags >> 1 and hasattr(mod, v.kernel)
            assert v.signature["partial_ptr"] == ("*i64" if v.flags >> 1 == 2 else "*fp32")


# --- level 2: the CPU backend --------------------------------------------------------------

@pytest.mark.parametrize("ord", [2, 2.0, INF])
def test_cpu_norm(ord):
    ts = _mixed()
    _close(fk.multi_tensor_norm(ts, ord), ref_norm(ts, ord))
    ts64 = [t.double() for t in ts]
    _close(fk.multi_tensor_norm(ts64, ord), ref_norm(ts64, ord))


def test_cpu_matches_torch_total_norm():
    ts = [t for t in _mixed(dtypes=(torch.float32,)) if t.numel()]  # (torch's inf norm
    # rejects empty tensors)
    for ord in (2.0, INF):
        want = torch.nn.utils.get_total_norm(ts, ord)
        torch.testing.assert_close(fk.multi_tensor_norm(ts, ord), want)


def test_cpu_count_zeros():
    ts = _mixed()
    out = fk.multi_tensor_count_zeros(ts)
    assert out.dtype == torch.int64 and out.dim() == 0
    assert out.item() == ref_count_zeros(ts) == 10
    ts[0][5] = float("nan")
    assert fk.multi_tensor_count_zeros(ts).item() == 10


def test_cpu_non_contiguous_and_nan():
    base = randn(40, 30)
    ts = [base.t(), base[:, ::3], randn(7).bfloat16()]
    assert not ts[0].is_contiguous()
    _close(fk.multi_tensor_norm(ts), ref_norm(ts, 2))
    ts[1][2, 2] = float("nan")
    assert torch.isnan(fk.multi_tensor_norm(ts)) and torch.isnan(fk.multi_tensor_norm(ts, INF))


def test_empty_list_and_empty_tensors():
    assert fk.multi_tensor_norm([]).item() == 0 and fk.multi_tensor_norm([]).dtype == torch.float32
    assert fk.multi_tensor_count_zeros([]).item() == 0
    assert fk.multi_tensor_norm([torch.zeros(0), torch.zeros(3, 0)]).item() == 0
    assert fk.multi_tensor_count_zeros([torch.zeros(0)]).item() == 0


# --- bad input: the same message from every backend ---------------------------------------

BAD = [
    ("int", lambda d: [torch.ones(3, device=d), torch.ones(2, dtype=torch.int32, device=d)],
     "tensors\\[1\\] has dtype Int"),
    ("devices", lambda d: [torch.ones(3, device=d), torch.ones(2, device="meta" if d != "meta"
                                                               else "cpu")],
     "must be on the same device"),
]


@pytest.mark.parametrize("name,make,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_cpu_and_meta_agree(name, make, msg):
    for op in (fk.multi_tensor_norm, fk.multi_tensor_count_zeros):
        cpu, meta = error_lines(lambda d: op(make(d)), ("cpu", "meta"), msg)
        if name != "devices":  # (the devices named differ by construction)
            assert cpu == meta
        assert cpu.startswith(f"fk::{op.__name__}: ")


@pytest.mark.parametrize("ord,text", [(1.0, "1"), (-INF, "-inf"), (float("nan"), "nan"),
                                      (3.5, "3.5")])
def test_bad_ord_cpu_and_meta_agree(ord, text):
    cpu, meta = error_lines(lambda d: fk.multi_tensor_norm([torch.ones(2, device=d)], ord),
                            ("cpu", "meta"), "ord must be 2 or inf")
    assert cpu == meta == f"fk::multi_tensor_norm: ord must be 2 or inf, got {text}"


def test_empty_list_through_the_operator_is_an_error():
    with pytest.raises(RuntimeError):
        torch.ops.fk.multi_tensor_norm([])


# --- level 3/4: opcheck, torch.compile, TorchScript --------------------------------------

def test_opcheck():
    ts = _mixed()
    torch.library.opcheck(torch.ops.fk.multi_tensor_norm, (ts, 2.0))
    torch.library.opcheck(torch.ops.fk.multi_tensor_norm, (ts, INF))
    torch.library.opcheck(torch.ops.fk.multi_tensor_count_zeros, (ts,))


def test_torch_compile_fullgraph_clip():
    """Clipping by the global norm without a host sync, compiled."""
    def clip(grads, max_norm: float):
        norm = fk.multi_tensor_norm(grads)
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        return [g * scale for g in grads], norm, fk.multi_tensor_count_zeros(grads)

    torch._dynamo.reset()
    compiled = torch.compile(clip, fullgraph=True)
    ts = _mixed(dtypes=(torch.float32,))
    out, norm, zeros = compiled(ts, 1.0)
    _close(norm, ref_norm(ts, 2))
    assert zeros.item() == ref_count_zeros(ts)
    for a, b in zip(out, clip(ts, 1.0)[0]):
        torch.testing.assert_close(a, b)


def test_functional_scripts():
    @torch.jit.script
    def f(ts: List[torch.Tensor]):
        return fk.multi_tensor_norm(ts, 2.0), fk.multi_tensor_count_zeros(ts)

    ts = _mixed()
    norm, zeros = f(ts)
    _close(norm, ref_norm(ts, 2))
    assert zeros.item() == ref_count_zeros(ts)
    assert all(t is not None for t in ts)


def test_scripted_operator_call_empties_the_callers_list():
    """What fk's wrappers work around (by passing a new list): torch 2.11's stable-ABI
    boxing moves the tensors out of a TorchScript list given to the operator. If this test
    fails, torch has fixed it."""
    @torch.jit.script
    def g(ts: List[torch.Tensor]):
        norm = torch.ops.fk.multi_tensor_norm(ts, 2.0)
        return norm, ts

    norm, after = g([torch.ones(3), torch.ones(1)])
    assert norm.item() == 2.0
    assert after == [None, None]


# --- level 5: CUDA kernels -----------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("ord", [2.0, INF])
def test_cuda_mixed_list(ord):
    ts = _mixed(device="cuda")
    out = fk.multi_tensor_norm(ts, ord)
    assert out.device.type == "cuda"
    _close(out.cpu(), ref_norm(ts, ord))
    assert fk.multi_tensor_count_zeros(ts).item() == ref_count_zeros(ts)


@pytest.mark.cuda
def test_cuda_many_tensors_and_sizes():
    """Hundreds of tensors from 1 element to several million (more blocks than programs
    and fewer), every dtype."""
    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = [1, 7, 4096, 4097, 65536 * 3 + 5, 2048 * 2048, 11 * 4096 * 13] * 40
    dts = [torch.float32, torch.bfloat16, torch.float16]
    ts = [torch.randn(n, device="cuda", generator=g).to(dts[i % 3]) for i, n in enumerate(sizes)]
    for t in ts[::5]:
        t[: max(1, t.numel() // 7)] = 0
    for ord in (2.0, INF):
        _close(fk.multi_tensor_norm(ts, ord).cpu(), ref_norm(ts, ord), rel=1e-5)
    assert fk.multi_tensor_count_zeros(ts).item() == ref_count_zeros(ts)


@pytest.mark.cuda
def test_cuda_matches_torch_total_norm_and_foreach():
    ts = [torch.randn(s, device="cuda") for s in ((4096, 4096), (4096,), (1000, 3))]
    for ord in (2.0, INF):
        torch.testing.assert_close(fk.multi_tensor_norm(ts, ord),
                                   torch.nn.utils.get_total_norm(ts, ord), rtol=1e-5, atol=0)


@pytest.mark.cuda
def test_cuda_nan_inf_non_contiguous_and_deterministic():
    base = torch.randn(300, 200, device="cuda")
    ts = [base.t(), base[:, ::3].bfloat16(), torch.randn(5000, device="cuda").half()]
    _close(fk.multi_tensor_norm(ts).cpu(), ref_norm(ts, 2))
    a, b = fk.multi_tensor_norm(ts), fk.multi_tensor_norm(ts)
    assert torch.equal(a, b)
    ts[2][77] = float("nan")
    assert torch.isnan(fk.multi_tensor_norm(ts)) and torch.isnan(fk.multi_tensor_norm(ts, INF))
    ts[2][77] = INF
    assert fk.multi_tensor_norm(ts).item() == INF == fk.multi_tensor_norm(ts, INF).item()


@pytest.mark.cuda
def test_cuda_misaligned_views():
    """Views 2 and 4 bytes past a 16-byte boundary (read through aligned copies), with full
    and partial blocks."""
    flat = torch.randn(3 * 4096 + 100, device="cuda")
    half = flat.bfloat16()
    ts = [flat[1:], half[1:4096 * 2 + 9], half[3:], flat[5:4101]]
    assert all(t.data_ptr() % 16 for t in ts)
    for ord in (2.0, INF):
        _close(fk.multi_tensor_norm(ts, ord).cpu(), ref_norm(ts, ord))
    ts[1][7] = 0
    assert fk.multi_tensor_count_zeros(ts).item() == ref_count_zeros(ts)


@pytest.mark.cuda
def test_cuda_no_host_sync_and_graph_capture():
    ts = [torch.randn(s, device="cuda") for s in (1000, 4096 * 3, 7)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        fk.multi_tensor_norm(ts)
        fk.multi_tensor_count_zeros(ts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = ref_norm(ts, 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fk.multi_tensor_norm(ts)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fk.multi_tensor_norm(ts)
        zeros = fk.multi_tensor_count_zeros(ts)
    # New contents in the same tensors: the replayed graph reads them.
    for t in ts:
        t.normal_()
    ts[0][:10] = 0
    for _ in range(3):
        fk.multi_tensor_norm([torch.randn(64, device="cuda")])  # other pinned tables
        graph.replay()
    torch.cuda.synchronize()
    _close(out.cpu(), ref_norm(ts, 2))
    assert zeros.item() == ref_count_zeros(ts)
    assert not math.isclose(out.item(), want.item())


@pytest.mark.cuda
def test_cuda_bad_input_same_message_as_cpu():
    with pytest.raises(RuntimeError, match="not supported on CUDA"):
        fk.multi_tensor_norm([torch.ones(3, dtype=torch.float64, device="cuda")])
    cpu, cuda = error_lines(lambda d: fk.multi_tensor_norm([torch.ones(2, device=d)], 1.0),
                            ("cpu", "cuda"), "ord must be")
    assert cpu == cuda
    with pytest.raises(RuntimeError, match="must be on the same device"):
        fk.multi_tensor_norm([torch.ones(3, device="cuda"), torch.ones(3)])


@pytest.mark.cuda
def test_cuda_more_than_2_31_elements():
    t = torch.ones((1 << 31) + 4099, dtype=torch.bfloat16, device="cuda")
    t[-5:] = 0
    n = t.numel()
    _close(fk.multi_tensor_norm([t, torch.ones(3, device="cuda")]).cpu(),
           torch.tensor(math.sqrt(n - 5 + 3)), rel=1e-5)
    assert fk.multi_tensor_count_zeros([t]).item() == 5


@pytest.mark.cuda
def test_cuda_opcheck_and_compile():
    ts = _mixed(device="cuda")
    torch.library.opcheck(torch.ops.fk.multi_tensor_norm, (ts, 2.0))
    torch.library.opcheck(torch.ops.fk.multi_tensor_count_zeros, (ts,))
    f = torch.compile(lambda ts: fk.multi_tensor_norm(ts) * 2, fullgraph=True,
                      backend="aot_eager")
    _close(f(ts).cpu(), 2 * ref_norm(ts, 2))
