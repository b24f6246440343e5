"""What the cross-entropy probes share: bf16 logits with every 97th row ignored, the
"mean" denominators on the device, the library's plain forward (with any config, launched
like the C++ launcher does) and its sm_90 variant as the reference, and a timer that checks
a kernel against it."""
import argparse
import importlib.util
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "triton_src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cross_entropy as ce  # noqa: E402
from _harness import rotations  # noqa: E402, F401  (re-exported to the probes)


def parser(old=None):
    """The options of a probe that times kernel forms in rounds: --rounds, and with `old`
    (its help text) --old, the path of an earlier kernel source to time as well."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    if old:
        ap.add_argument("--old", help=old)
    return ap


class Problem:
    """Logits (m, v) in place: every timed call starts from a fresh copy of x0."""

    def __init__(self, m, v, width=44):
        self.m, self.v, self.width = m, v, width
        torch.manual_seed(0)
        self.x0 = (torch.randn(m, v, device="cuda") * 3).to(torch.bfloat16)
        self.t = torch.randint(0, v, (m,), device="cuda")
        self.t[::97] = -100
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.den = torch.zeros(2, device="cuda")
        ce.cross_entropy_den_kernel[(32,)](self.t, self.den, self.den, m, v, -100, 0,
                                           BLOCK=256, PER_SM=1, num_warps=4)
        self.loss = torch.empty(m, device="cuda")
        self.z = torch.empty(m, device="cuda")
        self.floor = 2 * m * v * 2  # bytes: read the logits once, write the gradient once
        plain = [k for k in ce.variants(90) if k.family == "cross_entropy_fwd"
                 and k.dtype == "bf16" and k.block == ce.LARGE and k.flags == ce.FLAG_ALIGNED]
        cfg = plain[0]
        self.block, self.warps = cfg.constexprs["BLOCK"], cfg.num_warps
        self.chunks, self.maxnreg = cfg.constexprs["CHUNKS"], cfg.maxnreg or None
        self.rows_at_once = min(m, cfg.constexprs["PER_SM"] * self.sms)
        self.library = self.library_form()
        self.library_regs = self.regs
        self.ref = None

    def library_form(self, kernel=None, args=None, x0=None):
        """forward() at the library's sm_90 plain config and the C++ launcher's grid."""
        return self.forward(self.block, self.warps, self.chunks, self.rows_at_once,
                            self.maxnreg, kernel, args, x0)

    def args(self):
        """The plain forward's arguments after the two logits pointers: reduction "mean"
        (through self.den), no weights, smoothing or softcap, the gradient written."""
        m, v = self.m, self.v
        return (self.t, self.den, self.den, self.loss, self.z, v, v, m, v, -100, 0.0, 0.0, 1.0,
                0, 0, 1)

    def forward(self, block, warps, chunks, rows_at_once, maxnreg=None, kernel=None,
                args=None, x0=None):
        """The library's plain forward (gradient in place, reduction "mean") with the given
        config, on a grid of rows_at_once x chunks programs (each group of chunks walking
        rows r, r + rows_at_once, ...); a function of the logits, which also leaves
        (registers, spills) in self.regs. With chunks > 1 it goes through Triton's
        compiled-kernel launcher with the launch's cluster size set to chunks (the kernel is
        compiled for one CTA a program either way). kernel: another JIT function of the
        forward's form (default: the library's); args: its arguments after the two logits
        pointers (default: self.args()); x0: logits of the dtype to compile for (default:
        self.x0, bf16). A kernel of the library's current form (with the EXTRA variants'
        arguments) gets them too, for the plain variant: pred_ptr unused, no token scaling,
        EXTRA 0, no lse written."""
        kernel = kernel or ce.cross_entropy_fwd_kernel
        head = self.args() if args is None else args
        extra = {}
        if "EXTRA" in kernel.arg_names and len(head) == len(self.args()):
            head = head + (self.t, 0)
            extra = {"EXTRA": 0}
            if "lse_ptr" in kernel.arg_names:  # no lse written
                head = head + (self.loss, 0)
        x0 = self.x0 if x0 is None else x0
        ctas = rows_at_once * chunks
        k = kernel.warmup(x0, x0, *head, grid=(ctas,), num_warps=warps, BLOCK=block, GENERAL=0,
                          PER_SM=1, CHUNKS=chunks, maxnreg=maxnreg, **extra)
        k._init_handles()
        grid = (ctas, 1, 1)
        if chunks > 1:
            k.packed_metadata = (k.metadata.num_warps, chunks, k.metadata.shared)
            grid = (rows_at_once, 1, 1)
        self.regs = (k.n_regs, k.n_spills)
        return lambda x: k[grid](x, x, *head, block, 0, 1, chunks, *extra.values())

    @staticmethod
    def load_source(name, path):
        """The kernel source file at path, imported as module name."""
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    @staticmethod
    def load_text(name, text, folder):
        """Kernel source text (a variant of the library's), written to folder/name.py and
        imported as module name (Triton's JIT reads a kernel's source from its file)."""
        path = os.path.join(folder, name + ".py")
        with open(path, "w") as f:
            f.write(text)
        return Problem.load_source(name, path)

    def copy(self):
        """Times a copy of the floor's bytes; prints it."""
        xc = torch.empty_like(self.x0)
        ms = do_bench(lambda: xc.copy_(self.x0), warmup=50, rep=300, return_mode="median")
        self._line("copy (same bytes)", ms)

    def report(self, name, fn):
        """Runs fn on a copy of the logits, times it (L2 flushed before each call), prints
        one line; ((loss, gradient), ms)."""
        xr = self.x0.clone()
        fn(xr)
        torch.cuda.synchronize()
        out = (self.loss.clone(), xr)
        xb = self.x0.clone()
        ms = do_bench(lambda: fn(xb), warmup=50, rep=300, return_mode="median")
        self._line(name, ms)
        return out, ms

    def reference(self):
        """Times the library kernel and keeps its losses and gradient as the reference."""
        self.ref, _ = self.report(f"library {self.block} x {self.warps} warps", self.library)

    def check(self, name, fn):
        """report(), then the largest differences from the reference; the time, or None
        when the kernel failed to compile or run."""
        try:
            (lo, g), ms = self.report(name, fn)
        except Exception as e:  # a configuration that does not compile or fit
            print(f"{name:{self.width}s} failed: {type(e).__name__}: {str(e)[:120]}")
            return None
        dl = (lo - self.ref[0]).abs().max().item()
        dg = (g.float() - self.ref[1].float()).abs().max().item()
        ok = dl < 1e-5 and dg < 1e-3
        print(f"{'':{self.width}s} max |dloss| {dl:.2e}  max |dgrad| {dg:.2e} "
              f"{'ok' if ok else 'DIFFERS'}", flush=True)
        return ms

    def _line(self, name, ms):
        print(f"{name:{self.width}s} {ms * 1e3:8.1f} us  {self.floor / ms / 1e6:6.0f} GB/s",
              flush=True)
