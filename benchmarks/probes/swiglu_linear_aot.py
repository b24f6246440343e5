"""swiglu_linear's sm_90 forward compiled by a Triton other than the GPU machine's, timed
against cuBLAS: compile here, run the cubins there.

The GPU machine's Triton is torch's pin (3.6); fk's build may use a newer one (issue: the
Triton at build time is ours to choose). This probe compiles its candidate kernels with
whatever ``import triton`` finds on the build machine (no GPU needed), writes the cubins and
their launch metadata to a folder, and on the GPU machine launches them through the driver
API (ctypes, no Triton JIT), checks each against torch and times them with cuBLAS in
rotating rounds (``_swiglu_linear_probe``).

Candidates (bf16, x (M, K), weights (N, K), Llama-3-8B MLP at 8192 tokens by default):

  gemm ...     a plain GEMM on the stacked weights, one accumulator BLOCK_M x BLOCK_N
               (how close does this Triton's sm_90 GEMM get to cuBLAS?)
  fused ...    the library's form: two accumulators (gate, up) fed by one x tile, the
               SiLU-mul epilogue; one tile per program or a persistent grid
  packed ...   one accumulator of BLOCK_M x 2 BN over weights packed in blocks of BN rows
               (gate rows, then the same up rows), split into gate and up in the epilogue:
               the fused forward as a plain GEMM loop
  library      the library's kernel and sm_90 config, compiled by this Triton
"ws" marks a loop under ``tl.range(..., warp_specialize=True)``.

    PYTHONPATH=<triton> python benchmarks/probes/swiglu_linear_aot.py build DIR
    python benchmarks/probes/swiglu_linear_aot.py run DIR [DIR ...] [--only A,B] [--rounds 5]
    ncu ... python benchmarks/probes/swiglu_linear_aot.py run DIR --profile NAME
"""
import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "triton_src"))
import swiglu_linear as K  # noqa: E402

BK = 64


@triton.jit
def gemm_kernel(x_ptr, w_ptr, c_ptr, M, N, K_, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WS: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K_], [K_, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    pid_m, pid_n = K._grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K_, BLOCK_K), warp_specialize=WS):
        acc = tl.dot(x_desc.load([row0, k * BLOCK_K]), w_desc.load([col0, k * BLOCK_K]).T, acc)
    c_desc.store([row0, col0], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def fused_kernel(x_ptr, wg_ptr, wu_ptr, z_ptr, s_ptr, t_ptr, M, N, K_, store_z, store_saved,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, WS: tl.constexpr, PERSISTENT: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K_], [K_, 1], [BLOCK_M, BLOCK_K])
    wg_desc = tl.make_tensor_descriptor(wg_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    wu_desc = tl.make_tensor_descriptor(wu_ptr, [N, K_], [K_, 1], [BLOCK_N, BLOCK_K])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    step = tl.num_programs(0) if PERSISTENT else tiles
    for tile in range(tl.program_id(0), tiles, step):
        pid_m, pid_n = K._grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K_, BLOCK_K), warp_specialize=WS):
            xt = x_desc.load([row0, k * BLOCK_K])
            acc_g = tl.dot(xt, wg_desc.load([col0, k * BLOCK_K]).T, acc_g)
            acc_u = tl.dot(xt, wu_desc.load([col0, k * BLOCK_K]).T, acc_u)
        K._fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z,
                        store_saved, 1.0, 1.0, dtype, BLOCK_M, BLOCK_N, False)


@triton.jit
def packed_kernel(x_ptr, w_ptr, z_ptr, s_ptr, t_ptr, M, N, K_, store_z, store_saved,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, WS: tl.constexpr, PERSISTENT: tl.constexpr):
    """w (2N, K): rows [2 BN j, 2 BN j + BN) are Wg's rows [BN j, BN (j + 1)), the next BN
    rows the same rows of Wu; N a multiple of BLOCK_N."""
    dtype = x_ptr.dtype.element_ty
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, K_], [K_, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [2 * N, K_], [K_, 1], [2 * BLOCK_N, BLOCK_K])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    step = tl.num_programs(0) if PERSISTENT else tiles
    for tile in range(tl.program_id(0), tiles, step):
        pid_m, pid_n = K._grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K_, BLOCK_K), warp_specialize=WS):
            acc = tl.dot(x_desc.load([row0, k * BLOCK_K]), w_desc.load([2 * col0, k * BLOCK_K]).T,
                         acc)
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
        K._fwd_epilogue(acc_g, acc_u, z_ptr, s_ptr, t_ptr, row0, col0, M, N, store_z,
                        store_saved, 1.0, 1.0, dtype, BLOCK_M, BLOCK_N, False)


_FUSED_ARGS = ("x_ptr", "wg_ptr", "wu_ptr", "z_ptr", "s_ptr", "t_ptr", "M", "N", "K_",
               "store_z", "store_saved")
_PACKED_ARGS = ("x_ptr", "w_ptr", "z_ptr", "s_ptr", "t_ptr", "M", "N", "K_", "store_z",
                "store_saved")
_GEMM_ARGS = ("x_ptr", "w_ptr", "c_ptr", "M", "N", "K_")
_INTS = ("M", "N", "K_", "store_z", "store_saved")


def _candidates():
    """(name, kernel, args, constexprs, warps, stages, persistent)."""
    out = []
    for bn, st, ws, w in ((256, 3, 1, 4), (256, 4, 1, 4), (128, 4, 1, 4), (256, 3, 1, 8),
                          (256, 3, 0, 8), (256, 4, 0, 8)):
        out.append((f"gemm {'ws' if ws else 'nows'} bn{bn} st{st} w{w}", "gemm_kernel",
                    _GEMM_ARGS, {"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": BK, "GROUP_M": 8,
                                 "WS": ws}, w, st, 0))
    for kern, args, tag in (("fused_kernel", _FUSED_ARGS, "fused"),
                            ("packed_kernel", _PACKED_ARGS, "packed")):
        for bn, st, ws, w, pers in ((128, 3, 1, 4, 0), (128, 4, 1, 4, 0), (64, 4, 1, 4, 0),
                                    (128, 3, 1, 4, 1), (128, 3, 1, 8, 0), (128, 3, 0, 8, 1),
                                    (128, 4, 0, 8, 1)):
            out.append((f"{tag} {'ws' if ws else 'nows'}{' pers' if pers else ''} bn{bn} "
                        f"st{st} w{w}", kern, args,
                        {"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": BK, "GROUP_M": 32 if pers
                         else 8, "WS": ws, "PERSISTENT": pers}, w, st, pers))
    style, bm, bn, bk, group, warps, stages = K.configs(90)[2]
    out.append(("library", "swiglu_linear_fwd_tma_kernel", K.FWD_ARGS,
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group, "PER_SM": 1,
                 "SCALED": 0}, warps, stages, 1))
    return out


def build(out_dir: Path):
    from triton.backends.compiler import GPUTarget

    out_dir.mkdir(parents=True, exist_ok=True)
    index = {"triton": triton.__version__, "kernels": []}
    mod = sys.modules[__name__]
    for i, (name, kern, args, consts, warps, stages, pers) in enumerate(_candidates()):
        fn = getattr(mod, kern, None) or getattr(K, kern)
        sig = {a: ("fp32" if a in ("gate_mult", "down_mult") else "i32" if a in _INTS
                   or a in ("K",) else "*bf16") for a in args}
        sig.update({c: "constexpr" for c in consts})
        hinted = [a for a in args if sig[a] != "fp32" and a not in ("store_z", "store_saved")]
        attrs = {(list(sig).index(a),): [["tt.divisibility", 16]] for a in hinted}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": warps, "num_stages": stages,
                                        "enable_fp_fusion": True})
        except Exception as e:  # noqa: BLE001 - a candidate that does not compile is a result
            print(f"{name:32s} compile failed: {str(e).splitlines()[0][:200]}", flush=True)
            continue
        md = k.metadata
        (out_dir / f"{i}.cubin").write_bytes(k.asm["cubin"])
        index["kernels"].append({
            "name": name, "cubin": f"{i}.cubin", "entry": md.name, "num_warps": md.num_warps,
            "shared": md.shared, "global_scratch_size": md.global_scratch_size,
            "global_scratch_align": md.global_scratch_align,
            "profile_scratch_size": md.profile_scratch_size, "params":
            [(a, sig[a]) for a in args], "persistent": pers, "kernel": kern,
            "constexprs": consts})
        print(f"{name:32s} warps {md.num_warps} shared {md.shared} "
              f"scratch {md.global_scratch_size}", flush=True)
    (out_dir / "index.json").write_text(json.dumps(index, indent=1))
    print(f"triton {triton.__version__}: {len(index['kernels'])} kernels in {out_dir}")


class _Driver:
    """cuModuleLoadData / cuLaunchKernel through ctypes on torch's current context."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")

    def check(self, rc, what):
        if rc != 0:
            s = ctypes.c_char_p()
            self.cu.cuGetErrorString(rc, ctypes.byref(s))
            raise RuntimeError(f"{what}: {s.value.decode() if s.value else rc}")

    def load(self, image: bytes, entry: str, shared: int):
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.cu.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
        self.check(self.cu.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode()),
                   "cuModuleGetFunction")
        if shared > 48 * 1024:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.check(self.cu.cuFuncSetAttribute(fn, 8, shared), "cuFuncSetAttribute")
        return fn

    def launch(self, fn, grid, warps, shared, stream, values):
        """values: the kernel's parameters as ctypes scalars, in order."""
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        self.check(self.cu.cuLaunchKernel(fn, grid, 1, 1, 32 * warps, 1, 1, shared,
                                          ctypes.c_void_p(stream), params, None),
                   "cuLaunchKernel")


def run(argv):
    import torch
    import torch.nn.functional as F

    import _swiglu_linear_probe as P

    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", type=Path, help="folders written by build")
    ap.add_argument("--only", default="", help="comma-separated name parts to keep")
    ap.add_argument("--profile", default="", help="launch this one kernel once and stop "
                    "(under a profiler)")
    P.add_args(ap)
    args = ap.parse_args(argv)
    p = P.Problem(args)
    m, n, k = p.m, p.n, p.k
    drv = _Driver()
    ab_ref = torch.matmul(p.x, p.wcat.T)
    packed = {}

    def make(rec, out_dir):
        fn = drv.load((out_dir / rec["cubin"]).read_bytes(), rec["entry"], rec["shared"])
        bm, bn = rec["constexprs"]["BLOCK_M"], rec["constexprs"]["BLOCK_N"]
        gemm = rec["kernel"] == "gemm_kernel"
        tiles = triton.cdiv(m, bm) * triton.cdiv(2 * n if gemm else n, bn)
        grid = min(tiles, p.sms) if rec["persistent"] else tiles
        if rec["kernel"] == "packed_kernel" and bn not in packed:
            packed[bn] = torch.stack([p.wg.view(n // bn, bn, k), p.wu.view(n // bn, bn, k)],
                                     dim=1).reshape(2 * n, k).contiguous()
        scratch = None
        if rec["global_scratch_size"]:
            scratch = torch.empty(rec["global_scratch_size"] * grid + 256, dtype=torch.uint8,
                                  device="cuda")
        ptrs = {"x_ptr": p.x, "wg_ptr": p.wg, "wu_ptr": p.wu, "z_ptr": p.outs[0],
                "s_ptr": p.outs[1], "t_ptr": p.outs[2], "c_ptr": p.ab,
                "w_ptr": p.wcat if gemm else packed.get(bn)}

        def call(store):
            ints = {"M": m, "N": 2 * n if gemm else n, "K_": k, "K": k,
                    "store_z": store[0], "store_saved": store[1]}
            vals = []
            for a, ty in rec["params"]:
                if ty.startswith("*"):
                    vals.append(ctypes.c_uint64(ptrs[a].data_ptr()))
                elif ty == "fp32":
                    vals.append(ctypes.c_float(1.0))
                else:
                    vals.append(ctypes.c_int32(ints[a]))
            base = scratch.data_ptr() if scratch is not None else 0
            align = max(1, rec["global_scratch_align"])
            vals.append(ctypes.c_uint64((base + align - 1) // align * align))
            vals.append(ctypes.c_uint64(0))
            drv.launch(fn, grid, rec["num_warps"], rec["shared"],
                       torch.cuda.current_stream().cuda_stream, vals)
        return call

    # The SiLU-mul step the fused kernel replaces, on contiguous (M, N) pre-activations:
    # torch's and, where fk is installed, fk.swiglu (the target is cuBLAS + the best).
    a_pre, b_pre = torch.randn(m, n, device="cuda", dtype=p.x.dtype), torch.randn_like(p.outs[0])
    runs = {P.CUBLAS: p.cublas(), "swiglu torch": lambda: F.silu(a_pre) * b_pre}
    try:
        import fk
        runs["swiglu fk"] = lambda: fk.swiglu(a_pre, b_pre)
    except ImportError:
        pass
    only = [o for o in args.only.split(",") if o]
    for out_dir in args.dirs:
        index = json.loads((out_dir / "index.json").read_text())
        tag = "t" + "".join(index["triton"].split(".")[:2])
        print(f"{out_dir}: kernels compiled by triton {index['triton']}; GPU "
              f"{torch.cuda.get_device_name()}", flush=True)
        for rec in index["kernels"]:
            stores = ([((1, 1), "")] if rec["kernel"] == "gemm_kernel"
                      else [((1, 1), " zst"), ((1, 0), " z")])
            names = {f"{tag} {rec['name']}{suffix}": store for store, suffix in stores}
            names = {nm: st for nm, st in names.items()
                     if not only or any(o in nm for o in only) or nm == args.profile}
            if not names:
                continue
            try:
                call = make(rec, out_dir)
            except RuntimeError as e:
                print(f"{tag} {rec['name']:32s} load failed: {e}")
                continue
            for nm, store in names.items():
                runs[nm] = call_with(call, store)
    if args.profile:
        runs[args.profile]()
        torch.cuda.synchronize()
        return

    def outputs(name):
        return ([p.ab], [ab_ref]) if " gemm " in name else p.fused_outputs(name)

    p.width = 44
    ok = p.check({nm: fn for nm, fn in runs.items() if not nm.startswith("swiglu ")}, outputs)
    med = p.time(runs, ok + [nm for nm in runs if nm.startswith("swiglu ")])
    target = med[P.CUBLAS] + min(t for nm, t in med.items() if nm.startswith("swiglu "))
    print(f"cuBLAS stacked + best swiglu: {target:.3f} ms (the gated forward's target: 0.95 of "
          "it)")
    for nm, t in sorted(med.items(), key=lambda kv: kv[1]):
        if nm.endswith(" z") or nm.endswith(" zst"):
            print(f"{nm:{p.width}s} {t:.3f} ms  {t / target:.3f} of cuBLAS + swiglu")


def call_with(call, store):
    return lambda: call(store)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("build", "run"):
        sys.exit(__doc__)
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(sys.argv[2:])


if __name__ == "__main__":
    main()
