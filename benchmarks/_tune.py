"""Helpers of the launch-configuration sweeps (tune_jsd.py, tune_group_norm.py, tune_dyt.py,
tune_poly_norm.py, tune_rope.py, tune_qwen2vl_mrope.py, tune_gated_group_rms_norm.py,
tune_moe_permute.py, tune_moe_permute_fp8.py, tune_swiglu_fp8.py): timing (GPU median, or one
run under the Triton interpreter), the measured copy bandwidth the times are read against,
the closeness check each candidate kernel passes before it is timed, and the MoE FP8 tile
kernels' table of segment blocks.

With ``--device cpu`` (and TRITON_INTERPRET=1 in the environment) a script runs every
kernel once at a small shape on torch CPU tensors: a check of the candidate kernels' logic,
its times meaningless.
"""
import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_src"))

DEVICE = "cuda"
COPY_BW = None  # GB/s of the measured 1 GiB device copy


def add_device_args(ap):
    ap.add_argument("--device", default="cuda",
                    help="cpu: run each kernel once under TRITON_INTERPRET=1 (a logic check)")
    ap.add_argument("--quick", action="store_true", help="fewer configurations")


def setup(device):
    """Set the device; on cuda measure the copy bandwidth (a 1 GiB device copy)."""
    global DEVICE, COPY_BW
    DEVICE = device
    if device != "cuda":
        assert os.environ.get("TRITON_INTERPRET") == "1", \
            "--device cpu runs the kernels under the interpreter: set TRITON_INTERPRET=1"
        COPY_BW = 1.0
        return 2
    big = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    big2 = torch.empty_like(big)
    ms = bench(lambda: big2.copy_(big))
    COPY_BW = 2 * big.numel() / ms / 1e6
    del big, big2
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.multi_processor_count} SMs; torch copy of 1 GiB: "
          f"{COPY_BW:6.0f} GB/s (the 100 % below)", flush=True)
    return props.multi_processor_count


def bench(fn):
    if DEVICE != "cuda":
        fn()
        return 1.0
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def timed(name, fn, nbytes):
    """Print the median time of fn, its bandwidth over nbytes and the fraction of the
    measured copy bandwidth; None when the configuration fails to compile or launch."""
    try:
        ms = bench(fn)
    except Exception as e:  # noqa: BLE001 - a configuration that does not compile / launch
        print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:100]})",
              flush=True)
        return None
    if DEVICE == "cuda":
        gbs = nbytes / ms / 1e6
        print(f"{name}: {ms * 1e3:8.1f} us {gbs:6.0f} GB/s {100 * gbs / COPY_BW:5.1f} %",
              flush=True)
    else:
        print(f"{name}: ran", flush=True)
    return ms


def segment_blocks(tpe, m, rows):
    """The MoE FP8 tile kernels' table of blocks for the counts tpe (the library's
    _common.segment_blocks_kernel at its config for E experts, JIT)."""
    import _common as C
    eb, rb = next((eb, rb) for eb, rb in C.SEGMENT_BLOCKS if eb >= tpe.numel())
    table = torch.empty((rows, 3), dtype=torch.int64, device=tpe.device)
    C.segment_blocks_kernel[(triton.cdiv(rows, rb),)](tpe, table, tpe.numel(), m, rows,
                                                      E_BLOCK=eb, RB=rb)
    return table


def check(name, got, want, atol, rtol=0.0):
    """Print the largest difference of got from want (tensors or lists of them, compared in
    float64) and raise when one exceeds atol + rtol * |want|."""
    if isinstance(got, torch.Tensor):
        got, want = [got], [want]
    worst = 0.0
    for g, w in zip(got, want):
        g, w = g.double(), w.double()
        diff = (g - w).abs()
        same_nan = torch.isnan(g) & torch.isnan(w)
        diff = torch.where(same_nan, torch.zeros_like(diff), diff)
        bad = ~(diff <= atol + rtol * w.abs())
        worst = max(worst, diff.max().item() if diff.numel() else 0.0)
        if bad.any():
            i = bad.nonzero()[0].tolist()
            raise AssertionError(f"{name}: differs at {i}: {g[tuple(i)].item()} against "
                                 f"{w[tuple(i)].item()}")
    print(f"check {name}: max |diff| {worst:.3g}", flush=True)


@triton.jit
def exp2_poly(v):
    """2^v in fp32 on the FMA pipe (no MUFU): v clamped to [-127, 127], 2^floor(v) built
    from the exponent bits (0 for floor(v) = -127), 2^frac by a degree-6 least-squares fit
    on [0, 1) (1e-8 relative with fp32 coefficients; evaluated in fp32, 1e-7 relative at
    most over [-140, 0] under the interpreter). No subnormals: 2^v below 2^-126 flushes to
    0."""
    v = tl.minimum(tl.maximum(v, -127.0), 127.0)
    k = tl.floor(v)
    f = v - k
    p = 0.00021690608991775662
    p = p * f + 0.0012443081941455603
    p = p * f + 0.009678472764790058
    p = p * f + 0.05548352375626564
    p = p * f + 0.2402298003435135
    p = p * f + 0.6931470036506653
    p = p * f + 1.0
    scale = ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return p * scale

