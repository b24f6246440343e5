"""The binary interface of libfk.so, which makes one wheel work with every torch >= 2.11 on every
Linux of manylinux_2_28 or later:

- it imports from torch only PyTorch's stable C shim (``aoti_torch_*``, ``torch_*``, from
  libtorch_cpu.so): no c10 / ATen / torch C++ symbol, no libc10, no libtorch_cuda, no CUDA
  runtime (the driver is opened at run time), no Python;
- everything else comes from the system's C and C++ runtimes (libstdc++ dynamically: C++
  exceptions cross between libfk and torch), at symbol versions within manylinux_2_28;
- ``import fk`` refuses a torch older than 2.11 with a message naming both versions.

The library checked is the one ``import fk`` loads (``$FK_LIBRARY``, else the installed
package's); the wheel is ``$FK_WHEEL``, else the newest ``dist/fk-*.whl``.
"""
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The manylinux_2_28 policy (auditwheel's manylinux-policy.json): the newest symbol version
# of each system library family a manylinux_2_28 wheel may require.
MANYLINUX_2_28 = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11), "GCC": (7, 0, 0)}
# Libraries libfk may need: torch's library with the stable C shim, and the system's C / C++
# runtimes (all on manylinux_2_28's list).
TORCH_LIBS = {"libtorch_cpu.so"}
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
               "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"}
FORBIDDEN_LIBS = re.compile(r"^(libc10(_cuda)?\.so|libtorch(_cuda|_python)?\.so|libcudart|"
                            r"libcuda\.so|libpython|libc\+\+)")
# The stable C shim torch exports (unversioned symbols of libtorch_cpu.so).
STABLE_SHIM = re.compile(r"^(aoti_torch_|torch_)\w+$")
# Weak references every GCC-built shared object carries (tracing / transactional memory).
WEAK_TOOLCHAIN = {"__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable"}
TORCH_CXX = ("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch")


# --- ELF reading (stdlib only) ---------------------------------------------------------------

SHT_DYNAMIC, SHT_DYNSYM = 6, 11
SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFE, 0x6FFFFFFF
DT_NEEDED = 1
STB_WEAK = 2


def _sections(data: bytes) -> list:
    """``[(type, offset, size, link)]`` of the little-endian ELF64 file ``data``."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    out = []
    for i in range(e_shnum):
        _, sh_type, _, _, off, size, link, _, _, _ = struct.unpack_from(
            "<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
        out.append((sh_type, off, size, link))
    return out


def _cstr(data: bytes, start: int) -> str:
    return data[start:data.index(b"\0", start)].decode()


class DynamicInfo:
    """DT_NEEDED and the undefined dynamic symbols of an ELF64 shared object, each undefined
    symbol with the library and version it was linked against (from .gnu.version_r)."""

    def __init__(self, data: bytes):
        sections = _sections(data)

        def one(sh_type):
            found = [s for s in sections if s[0] == sh_type]
            assert len(found) == 1, f"expected one section of type {sh_type:#x}, got {found}"
            return found[0]

        def strtab(link):
            return sections[link][1]

        _, dyn_off, dyn_size, dyn_link = one(SHT_DYNAMIC)
        self.needed = []
        for pos in range(dyn_off, dyn_off + dyn_size, 16):
            tag, val = struct.unpack_from("<qQ", data, pos)
            if tag == DT_NEEDED:
                self.needed.append(_cstr(data, strtab(dyn_link) + val))

        versions = {}  # version index -> (library, version name)
        _, vr_off, _, vr_link = one(SHT_GNU_VERNEED)
        need = vr_off
        while True:
            _, cnt, file_, aux, next_ = struct.unpack_from("<HHIII", data, need)
            library = _cstr(data, strtab(vr_link) + file_)
            a = need + aux
            for _ in range(cnt):
                _, _, other, name, anext = struct.unpack_from("<IHHII", data, a)
                versions[other] = (library, _cstr(data, strtab(vr_link) + name))
                a += anext
            if not next_:
                break
            need += next_
        self.versions = sorted(set(versions.values()))

        _, sym_off, sym_size, sym_link = one(SHT_DYNSYM)
        _, vs_off, _, _ = one(SHT_GNU_VERSYM)
        self.undefined = []  # (name, weak, library or None, version or None)
        for i in range(1, sym_size // 24):
            st_name, st_info, _, st_shndx, _, _ = struct.unpack_from(
                "<IBBHQQ", data, sym_off + 24 * i)
            if st_shndx != 0:
                continue
            name = _cstr(data, strtab(sym_link) + st_name)
            ver, = struct.unpack_from("<H", data, vs_off + 2 * i)
            library, version = versions.get(ver & 0x7FFF, (None, None))
            self.undefined.append((name, st_info >> 4 == STB_WEAK, library, version))


@pytest.fixture(scope="module")
def libfk_path() -> Path:
    import fk

    path = Path(os.environ.get("FK_LIBRARY") or Path(fk.__file__).parent / "lib" / "libfk.so")
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def libfk(libfk_path) -> DynamicInfo:
    return DynamicInfo(libfk_path.read_bytes())


# --- libfk.so ---------------------------------------------------------------------------------

def test_needed_libraries(libfk):
    needed = set(libfk.needed)
    forbidden = sorted(n for n in needed if FORBIDDEN_LIBS.match(n))
    assert not forbidden, f"libfk.so needs {forbidden}: it must need only {sorted(TORCH_LIBS)} " \
                          f"of torch and no CUDA runtime, Python or libc++"
    assert needed <= TORCH_LIBS | SYSTEM_LIBS, \
        f"unexpected DT_NEEDED: {sorted(needed - TORCH_LIBS - SYSTEM_LIBS)}"
    assert TORCH_LIBS <= needed and "libstdc++.so.6" in needed, sorted(needed)


def test_undefined_symbols_are_the_stable_shim_and_system_runtimes(libfk):
    torch_cxx = sorted(n for n, *_ in libfk.undefined if n.startswith(TORCH_CXX))
    assert not torch_cxx, f"libfk.so imports torch C++ symbols: {torch_cxx[:20]}"
    cuda = sorted(n for n, *_ in libfk.undefined if re.match(r"cuda|cu[A-Z]|nv", n))
    assert not cuda, f"libfk.so imports CUDA symbols (the driver is opened at run time): {cuda}"
    python = sorted(n for n, *_ in libfk.undefined if re.match(r"_?Py|THP", n))
    assert not python, f"libfk.so imports Python / libtorch_python symbols: {python[:20]}"

    shim, bad = [], []
    for name, weak, library, version in libfk.undefined:
        if library is not None:  # versioned: bound to that library at link time
            if library not in SYSTEM_LIBS:
                bad.append(f"{name}@{version} from {library}")
        elif STABLE_SHIM.match(name):
            shim.append(name)
        elif not (weak and name in WEAK_TOOLCHAIN):
            bad.append(f"{name} (unversioned: from torch or another non-system library)")
    assert not bad, "libfk.so imports symbols outside the stable C shim and the system " \
                    "runtimes:\n  " + "\n  ".join(sorted(bad)[:40])
    assert "aoti_torch_library_impl" in shim or "torch_library_impl" in shim, sorted(shim)


def test_symbol_versions_within_manylinux_2_28(libfk):
    too_new = []
    for library, version in libfk.versions:
        m = re.fullmatch(r"([A-Z]+)_([0-9.]+)", version)
        if not m:  # GLIBC_PRIVATE, CXXABI_TM_1, CXXABI_FLOAT128 ...
            assert version in ("CXXABI_TM_1", "CXXABI_FLOAT128"), f"{version} from {library}"
            continue
        family, number = m.group(1), tuple(int(p) for p in m.group(2).split("."))
        assert family in MANYLINUX_2_28, f"{version} from {library}"
        if number > MANYLINUX_2_28[family]:
            users = sorted(n for n, _, lib, v in libfk.undefined if (lib, v) == (library, version))
            too_new.append(f"{version} ({library}): {users}")
    assert not too_new, "symbol versions newer than manylinux_2_28 allows (pin them in " \
                        "csrc/runtime/manylinux.h or define them in manylinux.cpp):\n  " + \
                        "\n  ".join(too_new)


def test_cxx_runtime_is_the_shared_libstdcxx(libfk):
    """C++ exceptions thrown in libfk are caught by torch's dispatcher: both must use the one
    libstdc++.so.6 of the process (no static libstdc++, no libc++)."""
    imported = {n: lib for n, _, lib, _ in libfk.undefined}
    for name in ("__cxa_throw", "__cxa_begin_catch", "_ZTISt13runtime_error"):
        assert imported.get(name) == "libstdc++.so.6", \
            f"{name} is not imported from libstdc++.so.6 (statically linked C++ runtime?)"


def test_cpp_exception_crosses_into_torch():
    """A C++ exception thrown by a kernel of libfk reaches Python through torch's dispatcher as
    a RuntimeError with its message."""
    import torch

    import fk  # noqa: F401

    with pytest.raises(RuntimeError, match=r"^fk::rms_norm: x has dtype Int"):
        torch.ops.fk._rms_norm_forward(torch.zeros(2, 3, dtype=torch.int32), None, 1e-6, 0.0,
                                       "llama")


def _composite_calls():
    import torch

    f, i64 = torch.ones, torch.long
    return [
        ("rms_norm", lambda: torch.ops.fk.rms_norm(f(2, 8, dtype=i64), None),
         r"^fk::rms_norm: x has dtype Long"),
        ("layer_norm", lambda: torch.ops.fk.layer_norm(f(2, 8), f(7)),
         r"^fk::layer_norm: weight must have shape \(8,\)"),
        ("fused_add_rms_norm", lambda: torch.ops.fk.fused_add_rms_norm(f(2, 8), f(2, 7), None),
         r"^fk::fused_add_rms_norm: x and residual must have the same shape"),
        ("swiglu_linear", lambda: torch.ops.fk.swiglu_linear(f(2, 8), f(4, 7), f(4, 8)),
         r"^fk::swiglu_linear: w_gate must have shape"),
        ("cross_entropy", lambda: torch.ops.fk.cross_entropy(f(2, 8), f(3, dtype=i64)),
         r"^fk::cross_entropy: target must have shape \(2,\)"),
        ("fused_linear_cross_entropy",
         lambda: torch.ops.fk.fused_linear_cross_entropy(f(2, 8), f(5, 7), f(2, dtype=i64)),
         r"^fk::fused_linear_cross_entropy: weight must have shape"),
        ("fused_linear_jsd",
         lambda: torch.ops.fk.fused_linear_jsd(f(2, 8), f(5, 8), f(2, 6), f(4, 6)),
         r"^fk::fused_linear_jsd: teacher_weight must have shape"),
        ("poly_norm", lambda: torch.ops.fk.poly_norm(f(2, 8), f(4), f(1)),
         r"^fk::poly_norm: weight must have shape \(3,\)"),
        ("group_norm", lambda: torch.ops.fk.group_norm(f(2, 6, 3), None, None, 4),
         r"^fk::group_norm: num_groups \(4\) must divide the number of channels \(6\)"),
        ("neighborhood_attention",
         lambda: torch.ops.fk.neighborhood_attention(f(1, 2, 8, 4), f(1, 2, 8, 4), f(1, 2, 8, 4),
                                                     4),
         r"^fk::neighborhood_attention: kernel_size must be a positive odd number, got 4"),
    ]


@pytest.mark.parametrize("index", range(10))
def test_composite_ops_raise_their_own_messages(index):
    """The public ops whose C++ kernel calls an internal one through the stable dispatcher
    (as TorchScript and C++ programs call them): a mistake raises fk's message, not the
    shim's error code of the inner call."""
    import fk  # noqa: F401

    name, call, match = _composite_calls()[index]
    with pytest.raises(RuntimeError, match=match):
        call()


# --- the wheel --------------------------------------------------------------------------------

@pytest.mark.slow
def test_auditwheel_show():
    """``auditwheel show``: the wheel's symbol versions fit manylinux_2_28 and its only external
    library is torch's (which no torch extension bundles). Skipped where auditwheel is not
    installed (the environments that only test the wheel)."""
    pytest.importorskip("auditwheel")
    env = os.environ.get("FK_WHEEL")
    wheels = [Path(env)] if env else sorted((REPO / "dist").glob("fk-*.whl"),
                                            key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.fail(f"no wheel: set FK_WHEEL or run `make wheel` (into {REPO / 'dist'})")
    proc = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheels[-1])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    print(json.dumps({k: report[k] for k in ("wheel", "sym_tag", "versioned_symbols",
                                             "external_libs")}, indent=1))
    m = re.fullmatch(r"manylinux_2_(\d+)_x86_64", report["sym_tag"])
    assert m and int(m.group(1)) <= 28, f"symbol versions need {report['sym_tag']}"
    assert set(report["external_libs"]) <= TORCH_LIBS, report["external_libs"]


# --- import fk under an older torch -----------------------------------------------------------

@pytest.mark.parametrize("version", ["2.11.0", "2.11.0+cu130", "2.13.0+cpu", "2.14.1",
                                     "2.16.0.dev20260301+cu130", "3.0.0"])
def test_check_torch_version_accepts(version):
    from fk._library import check_torch_version

    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.10.0", "2.10.0+cu128", "2.9.1", "1.13.1"])
def test_check_torch_version_refuses(version):
    from fk._library import check_torch_version

    with pytest.raises(ImportError) as e:
        check_torch_version(version)
    assert f"torch {version} is installed" in str(e.value)
    assert "torch >= 2.11" in str(e.value)


_OLD_TORCH = textwrap.dedent("""
    import torch

    torch.__version__ = "2.10.0+cu128"  # as if torch 2.10 were installed
    try:
        import fk  # noqa: F401
    except ImportError as e:
        print("ImportError:", e)
    else:
        raise SystemExit("import fk succeeded under torch 2.10")
    assert not hasattr(torch.ops.fk, "rms_norm"), "libfk was loaded"
""")


def test_import_fk_under_old_torch_is_an_import_error(tmp_path):
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # a development tree's python/ (absolute: cwd changes)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p)
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    proc = subprocess.run([sys.executable, "-c", _OLD_TORCH], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "ImportError: fk needs torch >= 2.11" in proc.stdout, proc.stdout
    assert "torch 2.10.0+cu128 is installed" in proc.stdout, proc.stdout
