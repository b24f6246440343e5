"""benchmarks/benchmark_fsdp_training.py: its arguments, and a tiny run of fk on gloo (2
processes through torchrun): the script works without a GPU, so it does not rot between
GPU runs."""
import os
import subprocess
import sys

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "benchmark_fsdp_training.py")


def test_arguments_and_defaults():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import benchmark_fsdp_training as b
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    args = b.parse_args(["--device", "cpu"])
    assert (args.nproc, args.batch, args.seq, args.model) == (2, 4, 2048, "llama_3_2_1b")
    args = b.parse_args(["--device", "cuda", "--nproc", "2", "--tiny", "--providers", "fk"])
    assert (args.nproc, args.batch, args.seq, args.providers) == (2, 2, 64, "fk")


def test_tiny_run_on_gloo():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--nproc", "2", "--tiny",
                           "--providers", "fk", "--warmup", "0", "--steps", "2"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    out = proc.stdout
    assert "FSDP2 training step, 2 processes (gloo); per GPU" in out, out
    row = next(ln for ln in out.splitlines() if ln.startswith("fk "))
    cells = row.split()
    assert float(cells[1]) > 0 and len(cells) == 8, row  # ms/step ... and the 2 first losses
