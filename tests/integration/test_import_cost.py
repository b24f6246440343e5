"""What ``import fk`` pulls in: neither torch._dynamo (torch.compile's front end, a second to
import) nor torch.distributed.tensor (half a second), which fk needs only when they are used:
the tiled MLP is put under torch.compiler.disable on first use, and the DTensor sharding rules
are registered when torch.distributed.tensor is imported, before or after fk."""
import subprocess
import sys
import textwrap

import pytest
import torch

_AFTER = textwrap.dedent("""
    import sys
    import torch
    import fk
    for heavy in ("torch._dynamo", "torch.distributed.tensor"):
        assert heavy not in sys.modules, heavy + " imported by import fk"
    from torch.distributed.tensor import DTensor
    rules = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    assert torch.ops.fk._rms_norm_forward.default in rules, "no rules after the import"
    assert torch.ops.fk.rope.default in rules
    import fk.nn.tiled_mlp as t
    assert t.tiled_gated_mlp is t.tiled_gated_mlp  # made once
    assert t.tiled_gated_mlp is not t._tiled_gated_mlp  # the compiler-disabled wrapper
    print("OK")
""")

_BEFORE = textwrap.dedent("""
    import torch
    from torch.distributed.tensor import DTensor
    import fk
    rules = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    assert torch.ops.fk._rms_norm_forward.default in rules, "no rules"
    print("OK")
""")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
@pytest.mark.parametrize("script", [_AFTER, _BEFORE], ids=["dtensor_after_fk", "dtensor_before_fk"])
def test_import_fk_defers_dynamo_and_dtensor(script):
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.stdout.strip() == "OK"
