"""examples/cpp, built with CMake + Ninja against the installed fk package and run, with no
Python in the programs: the C++ API (fk::swiglu, fk::rms_norm, fk::layer_norm,
fk::cross_entropy, forward and backward, with the autograd formulas that
fk::register_autograd() registers from include/fk/autograd.h), training through them, a
TorchScript module exported by examples/torchscript_export.py, loaded with torch::jit::load
and differentiated; and fk_autograd_check, every formula of include/fk/autograd.h against
finite differences (the FP8 ops', which take no float64, against float32 references)."""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fk

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning"),
              # torch 2.14 on: a FutureWarning
              pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cpp"
EXPORT = REPO / "examples" / "torchscript_export.py"

API_CHECKS = ["swiglu forward", "swiglu backward grad_a", "swiglu backward grad_b",
              "rms_norm forward", "rms_norm backward grad_x", "rms_norm backward grad_weight",
              "layer_norm forward", "layer_norm backward grad_x",
              "layer_norm backward grad_weight", "layer_norm backward grad_bias",
              "layer_norm backward frozen weight and bias",
              "cross_entropy forward", "cross_entropy backward grad_logits",
              "rms_norm double backward raises",
              "training loss falls", "training matches ATen"]
SCRIPT_CHECKS = ["torchscript forward vs C++ reference", "torchscript forward vs exported output",
                 "torchscript backward grad_input", "torchscript backward grad_norm_weight",
                 "torchscript backward grad_gate_weight", "torchscript backward grad_up_weight",
                 "torchscript backward grad_down_weight"]
# fk_autograd_check: at least one check per formula of include/fk/autograd.h: a gradcheck and
# a double backward per op; for an op none of whose outputs carries a gradient
# (NOT_DIFFERENTIABLE_OPS), a check that no output requires grad instead. rms_norm_fp8's
# checks have lines of their own (test_autograd_formulas).
AUTOGRAD_OPS = ["swiglu", "geglu", "rms_norm", "fused_add_rms_norm", "layer_norm", "softmax",
                "rope", "swiglu_linear", "cross_entropy", "fused_linear_cross_entropy", "jsd",
                "kl_div", "tvd", "fused_linear_jsd", "dyt", "poly_norm", "sparsemax",
                "llama4_rope", "qwen2vl_mrope", "group_norm", "neighborhood_attention",
                "moe_permute", "moe_unpermute", "qkv_split_norm_rope", "gated_group_rms_norm",
                "fp8_quantize", "swiglu_fp8", "moe_swiglu_fp8", "moe_permute_fp8"]
NOT_DIFFERENTIABLE_OPS = {"fp8_quantize"}


def _tool(name: str) -> str:
    """``name`` from this Python's environment, else from PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"`{name}` not found (looked next to {sys.executable} and on PATH): the C++ "
                    f"example needs CMake >= 3.24 and Ninja; install them (e.g. `pip install "
                    f"cmake ninja`) or put them on PATH")
    return found


def _run(cmd, timeout, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, **kw)


def _output(proc: subprocess.CompletedProcess) -> str:
    return f"exit code {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def example_binary(tmp_path_factory) -> Path:
    cmake, ninja = _tool("cmake"), _tool("ninja")
    build = tmp_path_factory.mktemp("example_cpp_build")
    t0 = time.time()
    proc = _run([cmake, "-S", EXAMPLE, "-B", build, "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={ninja}", f"-DCMAKE_PREFIX_PATH={fk.cmake_prefix_path}",
                 f"-DPython3_EXECUTABLE={sys.executable}"], timeout=300)
    assert proc.returncode == 0, f"cmake configure failed:\n{_output(proc)}"
    t1 = time.time()
    proc = _run([cmake, "--build", build], timeout=900)
    assert proc.returncode == 0, f"cmake build failed:\n{_output(proc)}"
    print(f"examples/cpp: configure {t1 - t0:.1f} s, build {time.time() - t1:.1f} s")
    binary = build / "fk_example"
    assert binary.is_file(), f"{binary} was not built"
    return binary


@pytest.fixture(scope="module")
def autograd_check_binary(example_binary) -> Path:
    binary = example_binary.parent / "fk_autograd_check"
    assert binary.is_file(), f"{binary} was not built"
    return binary


@pytest.fixture(scope="module")
def block_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("example_cpp_block") / "block.pt"
    proc = _run([sys.executable, EXPORT, path], timeout=300)
    assert proc.returncode == 0, f"{EXPORT.name} failed:\n{_output(proc)}"
    assert path.is_file()
    return path


def _run_example(binary: Path, *args):
    """Runs the program as a user would: no LD_LIBRARY_PATH, no PYTHONPATH; libfk's
    RUNPATH and the program's own find torch's libraries."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    return _run([binary, *args], timeout=300, env=env)


def _ok_lines(stdout: str) -> set:
    return {re.sub(r" \(max .*\)$", "", line[3:])
            for line in stdout.splitlines() if line.startswith("OK ")}


def _names(line: str, check: str, op: str) -> bool:
    """Whether the OK line is a `check` ("gradcheck") of `op`: the op's whole name, so that
    "swiglu" is not satisfied by a check of "swiglu_fp8"."""
    return line == f"{check} {op}" or line.startswith(f"{check} {op} ")


def test_example_runs_as_built(example_binary):
    """No LD_LIBRARY_PATH: the program finds libfk, torch and their dependencies by itself."""
    proc = _run_example(example_binary)
    assert proc.returncode == 0, _output(proc)
    assert "OK all checks passed" in proc.stdout, _output(proc)


def test_example_cpp_api(example_binary):
    proc = _run_example(example_binary)
    assert proc.returncode == 0, _output(proc)
    assert _ok_lines(proc.stdout) >= set(API_CHECKS) | {"all checks passed"}, _output(proc)
    assert "FAIL" not in proc.stdout


def test_example_torchscript(example_binary, block_file):
    proc = _run_example(example_binary, block_file)
    assert proc.returncode == 0, _output(proc)
    ok = _ok_lines(proc.stdout)
    assert ok >= set(API_CHECKS) | set(SCRIPT_CHECKS) | {"all checks passed"}, _output(proc)

    m = re.search(r"checksum sum=(\S+) abs_sum=(\S+)", proc.stdout)
    assert m, _output(proc)
    expected = torch.jit.load(str(block_file)).expected_output
    assert float(m.group(1)) == pytest.approx(expected.sum().item(), rel=1e-4, abs=1e-3)
    assert float(m.group(2)) == pytest.approx(expected.abs().sum().item(), rel=1e-4)


def test_example_detects_mismatch(example_binary, block_file, tmp_path):
    """A wrong stored output makes the program fail with the check named."""
    block = torch.jit.load(str(block_file))
    with torch.no_grad():
        block.expected_output.view(-1)[3] += 0.5
    bad = tmp_path / "bad_block.pt"
    block.save(str(bad))
    proc = _run_example(example_binary, bad)
    assert proc.returncode == 1, _output(proc)
    assert "FAIL torchscript forward vs exported output" in proc.stdout, _output(proc)
    assert "torchscript forward vs C++ reference" in _ok_lines(proc.stdout), _output(proc)


def test_example_reports_load_error(example_binary, tmp_path):
    proc = _run_example(example_binary, tmp_path / "missing.pt")
    assert proc.returncode == 2, _output(proc)
    assert "FAIL error:" in proc.stdout, _output(proc)


def test_autograd_formulas(autograd_check_binary):
    """Every formula of include/fk/autograd.h, registered by fk::register_autograd(), against
    finite differences (float64, CPU backend; the FP8 ops, which take no float64, against
    independent float32 paths); double backwards raise; in-place options; no output of
    fk::fp8_quantize requires grad."""
    proc = _run_example(autograd_check_binary)
    assert proc.returncode == 0, _output(proc)
    assert "FAIL" not in proc.stdout, _output(proc)
    ok = _ok_lines(proc.stdout)
    assert "all checks passed" in ok, _output(proc)
    for op in AUTOGRAD_OPS:
        if op in NOT_DIFFERENTIABLE_OPS:
            assert f"{op} outputs do not require grad" in ok, (op, _output(proc))
            continue
        assert any(_names(line, "gradcheck", op) for line in ok), (op, _output(proc))
        assert any(_names(line, "double backward raises", op) for line in ok), (
            op, _output(proc))
    for line in ("rope_ refuses q and k that require grad",
                 "swiglu backward_in_place writes into a and b",
                 "cross_entropy grad_in_logits writes the gradient into the logits",
                 "kl_div refuses a target that requires grad",
                 "rms_norm_fp8 gradient through y equals rms_norm's",
                 "rms_norm_fp8 refuses a recorded call without y",
                 "double backward raises rms_norm_fp8"):
        assert line in ok, _output(proc)
