"""Cross entropy forward with the gradient at 8192 x 128256 bf16, in place, its rows split
over clusters of 8 programs (the library's sm_90 plain config): how the programs of a
cluster exchange their chunks' (max, sum of exp). Each form is the library kernel with its
exchange PTX (`_exchange_asm`) replaced, and where a form needs it, a barrier added after
the row loop; the forms are built from triton_src/cross_entropy.py's text at run time
(loaded as separate modules), so they follow the library source.

  library  the first thread of each program stores its sums into every program's shared
           memory (distributed shared memory), one cluster barrier (release / acquire), each
           program reads them from its own shared memory; two slots used in turn; the
           first exchange first waits until the whole cluster has started
  read2    each program stores its sums into its own shared memory, barrier, reads everyone's
           remotely, a second full barrier (so no program leaves or overwrites while others
           read)
  early    as read2, the second barrier's arrive (release) right after the reads, its wait
           at the next exchange or after the row loop
  relaxed  as early with a relaxed arrive: no memory ordering for the remote reads (not
           kept: the PTX memory model does not order the reads before another program's
           later write or exit)
  slots    as read2 without its second barrier (two slots used in turn), one full barrier
           after the row loop
  lanes    as library, lanes 0 .. 7 of the first warp each storing into one program
  --old PATH also times an earlier kernel source taking a reduction flag before write_grad
           and a global buffer of the chunks' sums (8192 x 32 floats) after it, e.g. v8's:
           git show b1c85f2:triton_src/cross_entropy.py > /tmp/ce_v8.py

Each form runs in rotating order, --rounds times (do_bench, L2 flushed before each call),
checked against the library kernel's losses and gradient (benchmarks/NOTES.md v9).

    python benchmarks/probes/ce_exchange.py [--rounds 3] [--old /tmp/ce_v8.py]
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ce_probe import Problem, ce, parser, rotations  # noqa: E402

ROWS = 8192

# The replaced _exchange_asm: operands as the library's ($0 .. $(n - 1) out, then the
# values, the slot's byte offset, first). {body} is the text of each form below.
_ASM_FN = '''@triton.constexpr_function
def _exchange_asm(chunks, values):
    n = values * chunks
    own = [f"st.shared.f32 [%fk_a+{{4 * v}}], ${{n + v}};" for v in range(values)]
    remote = []
    for j in range(chunks):
        remote.append(f"mapa.shared::cluster.u32 %fk_r, %fk_a, {{j}};")
        remote += [f"ld.shared::cluster.f32 ${{v * chunks + j}}, [%fk_r+{{4 * v}}];"
                   for v in range(values)]
    head = ["{{", f".shared .align 16 .f32 fk_ce_sums[{{2 * n}}];",
            ".reg .b32 %fk_a, %fk_r, %fk_o, %fk_l;", ".reg .pred %fk_p;",
            "mov.u32 %fk_a, fk_ce_sums;"]
    first_wait = [f"setp.ne.u32 %fk_p, ${{n + values + 1}}, 0;",
                  "@%fk_p barrier.cluster.wait.acquire;"]
    meet = ["barrier.cluster.arrive.release;", "barrier.cluster.wait.acquire;"]
{body}
    return "\\n".join(lines + ["}}"])
'''
_BODIES = {
    "read2": "    lines = head + first_wait + own + meet + remote + meet",
    "early": ("    lines = head + ['barrier.cluster.wait.acquire;'] + own + meet + remote"
              " + ['barrier.cluster.arrive.release;']"),
    "relaxed": ("    lines = head + ['barrier.cluster.wait.acquire;'] + own + meet + remote"
                " + ['barrier.cluster.arrive.relaxed;']"),
    "slots": ("    lines = head + first_wait + [f'add.u32 %fk_a, %fk_a, ${n + values};'] + own"
              " + meet + remote"),
    "lanes": '''    lines = head + first_wait + [f"add.u32 %fk_a, %fk_a, ${n + values};",
             "mov.u32 %fk_o, %cluster_ctarank;", "shl.b32 %fk_o, %fk_o, 2;",
             "mov.u32 %fk_l, %tid.x;", f"setp.lt.u32 %fk_p, %fk_l, {chunks};",
             "@%fk_p mapa.shared::cluster.u32 %fk_r, %fk_a, %fk_l;",
             "@%fk_p add.u32 %fk_r, %fk_r, %fk_o;"]
    lines += [f"@%fk_p st.shared::cluster.f32 [%fk_r+{4 * v * chunks}], ${n + v};"
              for v in range(values)]
    lines += meet + [f"ld.shared.f32 ${k}, [%fk_a+{4 * k}];" for k in range(n)]''',
}
# The barrier after the row loop (the wait that pairs with an arrive left open, or a full one).
_AFTER_LOOP = {"early": "barrier.cluster.wait.acquire;", "relaxed": "barrier.cluster.wait.acquire;",
               "slots": "barrier.cluster.arrive.release;\\nbarrier.cluster.wait.acquire;"}
# The last line of the forward kernel's row loop (the pass-2 store).
_LOOP_END = (" " * 20 + 'tl.store(g_row + cols, g.to(gdtype), mask=mask, '
             'eviction_policy="evict_first")\n')


def _form(name, src, tmp):
    """The library source with the exchange of form `name`, loaded as its own module."""
    start = src.index("@triton.constexpr_function\ndef _exchange_asm")
    end = src.index("@triton.constexpr_function\ndef _exchange_constraints")
    out = src[:start] + _ASM_FN.format(body=_BODIES[name]) + "\n\n" + src[end:]
    if name in _AFTER_LOOP:
        assert out.count(_LOOP_END) == 1
        out = out.replace(_LOOP_END, _LOOP_END + (
            "    if CHUNKS > 1:\n"
            f"        rank = tl.inline_asm_elementwise(\"{_AFTER_LOOP[name]}\\nmov.b32 $0, $1;\",\n"
            "                                         \"=r,r\", [rank], dtype=tl.int32,\n"
            "                                         is_pure=False, pack=1)\n"))
    return Problem.load_text(f"ce_exchange_{name}", out, tmp)


def main():
    args = parser(old="an earlier kernel source taking the global sums buffer").parse_args()
    p = Problem(ROWS, 128256, width=50)

    def launcher(mod, kernel_args=None):
        """mod's plain forward at the library's config (clusters of p.chunks programs)."""
        return p.library_form(mod.cross_entropy_fwd_kernel, kernel_args)

    src = open(ce.__file__).read()
    with tempfile.TemporaryDirectory() as tmp:
        forms = [(name, launcher(_form(name, src, tmp))) for name in _BODIES]
        if args.old:
            # v8's arguments: a reduction flag (1: "mean") before write_grad, the buffer after.
            sums = torch.empty(ROWS, 4 * p.chunks, device="cuda")
            old = Problem.load_source("ce_exchange_old", args.old)
            forms.append(("old: global buffer", launcher(old, p.args()[:-1] + (1, 1, sums))))
        p.copy()
        p.reference()
        for name, fn in rotations(forms, args.rounds):
            p.check(name, fn)


if __name__ == "__main__":
    main()
