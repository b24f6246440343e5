"""Count the SASS of the library's AOT variants (no GPU needed): each variant of a family is
compiled as the build compiles it (cmake/fk_aot.py's compile_record: the variant's hints,
warps, stages and register cap) and disassembled with the cuobjdump that Triton ships, then
summarised: instructions (a static count), registers and spilled bytes, and the instruction
classes that show where a memory-bound kernel spends its issue slots: integer address
arithmetic, shuffles and shared memory (layout conversions), barriers, and global loads and
stores by width (one element at a time against 16-byte vectors).

    python benchmarks/sass_counts.py qkv_split_norm_rope --family qkv_split_norm_rope_fwd
    python benchmarks/sass_counts.py swiglu_fp8 --dtype bf16 --aligned --arch 90

Each line: the variant's key, warps, constexprs, then the counts.
"""
import argparse
import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile

import triton

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "triton_src"))
sys.path.insert(0, os.path.join(ROOT, "cmake"))
import fk_aot  # noqa: E402 (cmake/, on the path just set)

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "cuobjdump")
# class name: regex over the opcode (the first word of an instruction, predicate dropped)
CLASSES = {
    "IMAD": r"IMAD.*", "IADD3": r"IADD3.*", "ISETP": r"ISETP.*", "SEL": r"F?SEL.*",
    "SHFL": r"SHFL.*", "BAR": r"BAR.*", "SMEM": r"(STS|LDS|STSM|LDSM).*",
    "LDG<=32": r"LDG\.E(\.U8|\.S8|\.U16|\.S16)?", "LDG64": r"LDG\.E\.64.*",
    "LDG128": r"LDG\.E\.128.*", "STG<=32": r"STG\.E(\.U8|\.U16)?", "STG64": r"STG\.E\.64.*",
    "STG128": r"STG\.E\.128.*",
}
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def summarise(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    ops = _INSTRUCTION.findall(sass)
    out = {"instructions": len(ops)}
    for key in ("REG", "STACK"):
        m = re.search(key + r":(\d+)", usage)
        out[key.lower()] = int(m.group(1)) if m else -1
    counts = collections.Counter(ops)
    for name, pattern in CLASSES.items():
        out[name] = sum(n for op, n in counts.items() if re.fullmatch(pattern, op))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op", help="triton_src/<op>.py")
    ap.add_argument("--family", default=None, help="one family of the op's variants")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--aligned", action="store_true", help="aligned variants only")
    ap.add_argument("--flags", type=int, default=None, help="one flags value only")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    mod = importlib.import_module(args.op)
    for v in mod.variants(args.arch):
        if (args.family and v.family != args.family) or v.dtype != args.dtype:
            continue
        if (args.aligned and not v.flags & 1) or (args.flags is not None
                                                   and v.flags != args.flags):
            continue
        k, _, _ = fk_aot.compile_record(getattr(mod, v.kernel), fk_aot.variant_record(v),
                                        args.arch)
        r = summarise(k.asm["cubin"])
        print(f"{v.key()} warps {v.num_warps} {v.constexprs}: "
              + " ".join(f"{k} {n}" for k, n in r.items()), flush=True)


if __name__ == "__main__":
    main()
