"""The shipped artifacts: the wheel's tag and contents, the cubins embedded in libfk.so (one
set per GPU arch of the build), and ``import fk`` with Triton unimportable.

The wheel is ``$FK_WHEEL``, else the newest ``dist/fk-*.whl`` of the repository.
"""
import os
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEEL_TAG = "py3-none-manylinux_2_28_x86_64"

EM_CUDA = 190
KERNEL_SECTION = ".rodata.fk_kernels"


# --- ELF reading (stdlib only) ---------------------------------------------------------------

def _elf64_sections(data: bytes, base: int = 0) -> dict:
    """``{name: (type, offset, size)}`` of the little-endian ELF64 image at ``data[base:]``
    (offsets relative to ``base``)."""
    if data[base:base + 4] != b"\x7fELF" or data[base + 4] != 2 or data[base + 5] != 1:
        raise ValueError(f"not a little-endian ELF64 image at offset {base}")
    e_shoff, = struct.unpack_from("<Q", data, base + 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, base + 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, base + e_shoff + i * e_shentsize)
               for i in range(e_shnum)]
    str_off = headers[e_shstrndx][4]

    def name(n: int) -> str:
        start = base + str_off + n
        return data[start:data.index(b"\0", start)].decode()

    return {name(h[0]): (h[1], h[4], h[5]) for h in headers}


def _elf64_image_size(data: bytes, base: int) -> int:
    """Bytes spanned by the ELF64 image at ``data[base:]``: its headers and sections."""
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, base + 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, base + 0x36)
    end = max(e_phoff + e_phentsize * e_phnum, e_shoff + e_shentsize * e_shnum, 0x40)
    for sh_type, off, size in _elf64_sections(data, base).values():
        if sh_type != 8:  # SHT_NOBITS occupies no file bytes
            end = max(end, off + size)
    return end


def cuda_elf_arch(image: bytes, base: int = 0) -> tuple:
    """``(sm, arch_specific)`` of a CUDA ELF (cubin), from its header.

    ``e_flags`` holds the SM arch, in one of two encodings chosen by the ELF ABI version
    (``e_ident[EI_ABIVERSION]``), as written by ptxas for Triton's targets:
      ABI 7 (up to sm_90): SM in bits 0-7 (virtual SM in 16-23), 0x800 marks ``sm_XXa``;
        e.g. sm_80 -> 0x500550, sm_90a -> 0x5a0d5a.
      ABI 8 (sm_100 on): SM in bits 8-15, 0x8 marks ``sm_XXXa``;
        e.g. sm_100a -> 0x0900640a, sm_120a -> 0x0900780a.
    """
    e_machine, = struct.unpack_from("<H", image, base + 18)
    if e_machine != EM_CUDA:
        raise ValueError(f"ELF at offset {base} has e_machine {e_machine}, not EM_CUDA")
    abi = image[base + 8]
    e_flags, = struct.unpack_from("<I", image, base + 48)
    if abi == 7:
        return e_flags & 0xFF, bool(e_flags & 0x800)
    if abi == 8:
        return (e_flags >> 8) & 0xFF, bool(e_flags & 0x8)
    raise ValueError(f"CUDA ELF at offset {base}: unknown ABI version {abi} "
                     f"(e_flags {e_flags:#x})")


def embedded_cubins(lib: bytes) -> tuple:
    """``(section name, [(offset, size, sm, arch_specific)])`` for every CUDA ELF image embedded
    in libfk.so's kernel section.

    The AOT build places the images in ``.rodata.fk_kernels``; a linker that merges
    ``.rodata.*`` input sections leaves them inside ``.rodata``, which is scanned then.
    """
    sections = _elf64_sections(lib)
    name = KERNEL_SECTION if KERNEL_SECTION in sections else ".rodata"
    _, sec_off, sec_size = sections[name]
    sec = lib[sec_off:sec_off + sec_size]
    found, pos = [], 0
    while True:
        i = sec.find(b"\x7fELF", pos)
        if i < 0:
            break
        size = _elf64_image_size(sec, i)
        assert i + size <= len(sec), f"ELF image at {name}+{i:#x} runs past the section"
        found.append((i, size, *cuda_elf_arch(sec, i)))
        pos = i + size
    return name, found


# --- the wheel --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel_path() -> Path:
    env = os.environ.get("FK_WHEEL")
    if env:
        path = Path(env)
        if not path.is_file():
            pytest.fail(f"FK_WHEEL={env} is not a file")
        return path
    wheels = sorted((REPO / "dist").glob("fk-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        pytest.fail(f"no wheel: set FK_WHEEL or build one into {REPO / 'dist'} "
                    "(python -m pip wheel . -w dist --no-build-isolation --no-deps)")
    return wheels[-1]


@pytest.fixture(scope="module")
def wheel(wheel_path):
    with zipfile.ZipFile(wheel_path) as zf:
        yield zf


def _dist_info(zf: zipfile.ZipFile, name: str) -> str:
    matches = [n for n in zf.namelist() if re.fullmatch(rf"[^/]+\.dist-info/{name}", n)]
    assert len(matches) == 1, f"expected one *.dist-info/{name} in the wheel, got {matches}"
    return zf.read(matches[0]).decode()


def _archs_of(build_info_text: str) -> list:
    m = re.search(r"archs? *=? *\"?([0-9;]+)", build_info_text)
    assert m, f"no arch list in {build_info_text!r}"
    return sorted(int(a) for a in m.group(1).split(";") if a)


@pytest.mark.slow
def test_wheel_tag(wheel_path, wheel):
    assert wheel_path.name.endswith(f"-{WHEEL_TAG}.whl"), wheel_path.name
    meta = _dist_info(wheel, "WHEEL")
    tags = re.findall(r"^Tag: *(\S+)", meta, re.M)
    assert tags == [WHEEL_TAG], meta
    assert re.search(r"^Root-Is-Purelib: *false", meta, re.M), meta


@pytest.mark.slow
def test_wheel_contents(wheel):
    names = set(wheel.namelist())
    for required in ("fk/__init__.py", "fk/lib/libfk.so", "fk/include/fk/fk.h",
                     "fk/share/cmake/fk/fkConfig.cmake", "fk/share/cmake/fk/FkTorch.cmake",
                     "fk/_build_info.py"):
        assert required in names, f"{required} missing from the wheel"
    stray = sorted(n for n in names
                   if n.endswith((".cubin", ".cpp", ".cc", ".cu", ".S", ".ptx", ".o", ".a"))
                   or "fk_kernels_table" in n)
    assert not stray, f"build artifacts / sources in the wheel: {stray}"
    assert not [n for n in names if n.startswith("triton_src/") or "/triton_src/" in n]


@pytest.mark.slow
def test_wheel_runtime_requirements(wheel):
    requires = re.findall(r"^Requires-Dist: *(.+)$", _dist_info(wheel, "METADATA"), re.M)
    runtime = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("torch") for r in runtime), requires
    torch_req = [r.replace(" ", "") for r in runtime if re.match(r"torch\b", r)]
    assert torch_req == ["torch>=2.11"], \
        f"the wheel must accept every torch from 2.11 on (stable ABI), got {torch_req}"
    assert not [r for r in runtime if r.startswith("triton")], \
        f"triton must not be a run-time requirement: {runtime}"


# Kernels that need an arch feature are built only for the archs that have it (float8 stores,
# and the FP8 ops' table of segment blocks, built with them: sm_89 and newer; thread-block
# clusters of a size chosen at launch: sm_90 and newer); every other kernel is built for every
# arch. Kernel name -> first arch.
ARCH_GATED = {b"fp8_quantize": 89, b"swiglu_fp8_": 89, b"rms_norm_fp8": 89,
              b"moe_permute_fp8": 89, b"segment_blocks_kernel": 89,
              b"group_norm_fwd_cluster": 90, b"group_norm_bwd_cluster": 90}


def _gate(image: bytes):
    """The first arch of the arch-gated kernel in this ELF image (None: built for every arch)."""
    return next((first for name, first in ARCH_GATED.items() if name in image), None)


# The sections ptxas writes for Triton's line info (sm_100 on: also their .nv.merc.* copies),
# left out unless the build keeps them (FK_KERNEL_LINE_INFO; build info "with line info").
LINE_INFO_SECTIONS = (".debug_line", ".nv_debug_line_sass", ".nv_debug_ptx_txt")


def _line_info_of(build_info_text: str) -> bool:
    """Whether the build keeps the cubins' line info: ``archs 80;90 with line info`` in
    ``fk.build_info()``, ``kernel_line_info = True`` in ``_build_info.py``."""
    return bool(re.search(r"with line info|^kernel_line_info = True", build_info_text, re.M))


def _check_cubins(lib: bytes, archs: list, line_info: bool) -> Counter:
    section, cubins = embedded_cubins(lib)
    assert cubins, f"no CUDA ELF images in libfk.so's {section}"
    per_arch = Counter(sm for _, _, sm, _ in cubins)
    assert sorted(per_arch) == archs, \
        f"cubin archs {dict(per_arch)} differ from the build's archs {archs}"
    _, sec_off, _ = _elf64_sections(lib)[section]
    gated = Counter()  # (arch, first arch of its gate) -> images
    for off, size, sm, _ in cubins:
        names = _elf64_sections(lib, sec_off + off)
        debug = sorted(n for n in names if n.removeprefix(".nv.merc") in LINE_INFO_SECTIONS)
        if line_info:
            assert debug, f"the sm_{sm} cubin at {section}+{off:#x} has no line info"
        else:
            assert not debug, f"the sm_{sm} cubin at {section}+{off:#x} carries {debug}"
        first = _gate(lib[sec_off + off:sec_off + off + size])
        if first is not None:
            assert sm >= first, f"a kernel that needs sm_{first} was built for sm_{sm}"
            gated[sm, first] += 1
    common = {sm: n - sum(c for (a, _), c in gated.items() if a == sm)
              for sm, n in per_arch.items()}
    assert len(set(common.values())) == 1, \
        f"unequal counts of the kernels every arch has: {common} (all: {dict(per_arch)})"
    for first in set(ARCH_GATED.values()):
        counts = {sm: gated[sm, first] for sm in per_arch if sm >= first}
        assert len(set(counts.values())) == 1 and min(counts.values(), default=1) > 0, \
            f"the kernels gated at sm_{first}: {counts}"
    generic = {sm: spec for _, _, sm, spec in cubins if sm == 80}
    assert not any(generic.values()), "sm_80 cubins must be generic (run on every 8.x GPU)"
    return per_arch


@pytest.mark.slow
def test_wheel_cubins_per_arch(wheel):
    info = wheel.read("fk/_build_info.py").decode()
    per_arch = _check_cubins(wheel.read("fk/lib/libfk.so"), _archs_of(info), _line_info_of(info))
    print(f"cubins per arch: {dict(per_arch)}")


def test_installed_cubins_per_arch():
    import torch

    import fk

    info = torch.ops.fk._build_info()
    lib = Path(os.environ.get("FK_LIBRARY") or Path(fk.__file__).parent / "lib" / "libfk.so")
    _check_cubins(lib.read_bytes(), _archs_of(info), _line_info_of(info))


def _pinned_triton() -> str:
    pins = re.findall(r"^triton==(\S+)", (REPO / "requirements-triton.txt").read_text(), re.M)
    assert len(pins) == 1, pins
    return pins[0]


def _check_toolchain(text: str, archs: list) -> None:
    """``triton X.Y.Z; ptxas A.B.C (sm80), D.E.F (sm90, ...)``: the pinned Triton, and one ptxas
    version for each arch of the build."""
    m = re.search(r"\btriton (\S+); ptxas (.+)$", text)
    assert m, f"no 'triton <version>; ptxas <versions>' in {text!r}"
    assert m.group(1) == _pinned_triton(), \
        f"kernels compiled with triton {m.group(1)}, requirements-triton.txt pins {_pinned_triton()}"
    groups = re.findall(r"(\d+\.\d+\.\d+) \(([^)]*)\)", m.group(2))
    assert groups and ", ".join(f"{v} ({a})" for v, a in groups) == m.group(2), m.group(2)
    ptxas_archs = sorted(int(a.strip()[2:]) for _, sms in groups for a in sms.split(","))
    assert ptxas_archs == archs, f"ptxas named for {ptxas_archs}, the build's archs {archs}"


def test_build_info_names_triton_and_ptxas():
    import torch

    import fk  # noqa: F401  (loads libfk)

    info = torch.ops.fk._build_info()
    _check_toolchain(info, _archs_of(info))


@pytest.mark.slow
def test_wheel_build_info_names_triton_and_ptxas(wheel):
    text = wheel.read("fk/_build_info.py").decode()
    triton = re.search(r'^triton_version = "([^"]*)"', text, re.M)
    ptxas = re.search(r'^ptxas = "([^"]*)"', text, re.M)
    assert triton and ptxas, text
    _check_toolchain(f"triton {triton.group(1)}; ptxas {ptxas.group(1)}", _archs_of(text))


_TRITON_KERNEL = textwrap.dedent("""
    import triton
    import triton.language as tl


    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)
""")

_TRITON_COMPILE = textwrap.dedent("""
    import sys
    from pathlib import Path

    try:
        import triton
        from triton.backends.compiler import GPUTarget
    except ImportError:
        raise SystemExit(3)
    if triton.__version__ != sys.argv[3]:
        print(triton.__version__)
        raise SystemExit(4)
    sys.path.insert(0, sys.argv[1])
    from add_one_kernel import add_one

    for arch in map(int, sys.argv[2].split(",")):
        src = triton.compiler.ASTSource(
            add_one, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})
        cubin = triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["cubin"]
        Path(sys.argv[1], f"sm_{arch}.cubin").write_bytes(cubin)
""")

# The targets the kernels' Triton (requirements-triton.txt's pin) compiles each arch for.
_DECODING_CASES = [(80, False), (90, True), (100, True), (103, True), (120, True)]


def _build_triton_version() -> str:
    m = re.search(r"^triton==(\S+)", (REPO / "requirements-triton.txt").read_text(), re.M)
    assert m, "no pinned triton in requirements-triton.txt"
    return m.group(1)


@pytest.fixture(scope="module")
def triton_cubins(tmp_path_factory) -> Path:
    """A small kernel compiled by Triton for each arch of _DECODING_CASES (in a fresh process:
    the test run may have Triton in interpreter mode or blocked). Only the Triton version fk
    builds with: another one (the one a newer torch brings) may pick other targets."""
    out = tmp_path_factory.mktemp("triton_cubins")
    (out / "add_one_kernel.py").write_text(_TRITON_KERNEL)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    archs = ",".join(str(a) for a, _ in _DECODING_CASES)
    build_triton = _build_triton_version()
    proc = subprocess.run([sys.executable, "-c", _TRITON_COMPILE, str(out), archs, build_triton],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode == 3:
        pytest.skip("triton is not installed")
    if proc.returncode == 4:
        pytest.skip(f"triton {proc.stdout.strip()} is installed; fk builds with (and these "
                    f"cases are the targets of) triton {build_triton}")
    assert proc.returncode == 0, f"triton.compile failed:\n{proc.stderr[-4000:]}"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch,arch_specific", _DECODING_CASES)
def test_cuda_elf_arch_decoding(triton_cubins, arch, arch_specific):
    """The e_flags decoding above, against cubins Triton compiles for each arch."""
    cubin = (triton_cubins / f"sm_{arch}.cubin").read_bytes()
    assert cuda_elf_arch(cubin) == (arch, arch_specific)
    assert _elf64_image_size(cubin, 0) == len(cubin)


# --- import fk without triton -----------------------------------------------------------------

_NO_TRITON = textwrap.dedent("""
    import importlib.util
    import sys

    # Triton made unimportable as if it were not installed: `import triton` raises
    # ModuleNotFoundError and importlib.util.find_spec("triton") is None.
    sys.modules["triton"] = None
    assert importlib.util.find_spec("triton") is None
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the triton blocker did not work")

    import torch
    import torch.nn.functional as F

    import fk

    torch.manual_seed(0)
    x = torch.randn(3, 5, 48, requires_grad=True)
    w = torch.randn(48, requires_grad=True)
    y = fk.rms_norm(x, w, 1e-6)
    xf = x.detach()
    ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.detach()
    torch.testing.assert_close(y.detach(), ref)
    y.sum().backward()
    assert x.grad is not None and w.grad is not None

    a = torch.randn(4, 33, requires_grad=True)
    b = torch.randn(4, 33, requires_grad=True)
    z = fk.swiglu(a, b)
    torch.testing.assert_close(z.detach(), F.silu(a.detach()) * b.detach())
    z.sum().backward()
    assert a.grad is not None and b.grad is not None

    mlp = fk.nn.SwiGLUMLP(48, 64)
    mlp(fk.nn.RMSNorm(48, eps=1e-6)(x)).sum().backward()

    loaded = sorted(m for m, mod in sys.modules.items()
                    if (m == "triton" or m.startswith("triton.")) and mod is not None)
    assert not loaded, f"triton modules imported: {loaded}"
    print("OK fk without triton:", fk.build_info())
""")


def test_import_fk_without_triton(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _NO_TRITON], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "OK fk without triton" in proc.stdout
