"""The backward_in_place contract shared by the gated activations (csrc/ops/glu/): swiglu
and geglu in both gelu forms, each against its float64 reference."""
import pytest
import torch

import fk
from helpers import assert_close, randn, ref_geglu, ref_grads, ref_swiglu

GATES = {
    "swiglu": (lambda a, b, in_place=False: fk.swiglu(a, b, in_place), ref_swiglu),
    "geglu_tanh": (lambda a, b, in_place=False: fk.geglu(a, b, "tanh", in_place),
                   lambda a, b: ref_geglu(a, b, "tanh")),
    "geglu_none": (lambda a, b, in_place=False: fk.geglu(a, b, "none", in_place),
                   lambda a, b: ref_geglu(a, b, "none")),
}


def _ref_grads(ref, a, b, dc):
    return ref_grads(ref, [a.detach().requires_grad_(), b.detach().requires_grad_()], dc)


@pytest.fixture(params=list(GATES))
def gate(request):
    return GATES[request.param]


def test_in_place_backward_writes_into_inputs_and_default_does_not(gate):
    op, ref = gate
    a0, b0, dc = randn(4, 33, scale=2), randn(4, 33), randn(4, 33)
    ga, gb = _ref_grads(ref, a0, b0, dc)
    a1, b1 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    op(a1 * 1, b1 * 1).backward(dc)                 # default: intermediates untouched
    assert_close(a1.grad, ga, torch.float32, factor=2)
    ai, bi = (a0 * 1).requires_grad_(), (b0 * 1).requires_grad_()
    op(ai, bi, True).backward(dc)
    # ai / bi are leaves here, so their memory now holds their gradients (as documented).
    assert_close(ai, ga, torch.float32, factor=2)
    assert_close(bi, gb, torch.float32, factor=2)
    a2, b2 = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    op(a2, b2).backward(dc)
    assert torch.equal(a2, a0) and torch.equal(b2, b0)


def test_in_place_skipped_when_graph_retained(gate):
    op, _ = gate
    a0, b0, dc = randn(4, 33), randn(4, 33), randn(4, 33)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    y = op(a, b, True)
    y.backward(dc, retain_graph=True)
    first = a.grad.clone()
    assert torch.equal(a, a0) and torch.equal(b, b0)
    y.backward(dc)
    assert_close(a.grad, 2 * first, torch.float32)


@pytest.mark.parametrize("in_place", [True, False])
def test_double_backward_is_a_clear_error(gate, in_place):
    op, ref = gate
    a = randn(3, 8).requires_grad_()
    b = randn(3, 8).requires_grad_()
    a0 = a.detach().clone()
    y = op(a * 1, b * 1, in_place)
    (ga,) = torch.autograd.grad(y.sum(), a, create_graph=True)
    assert_close(ga, _ref_grads(ref, a0, b, torch.ones(3, 8))[0], torch.float32, factor=2)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        ga.sum().backward()


def test_in_place_skipped_for_non_contiguous_and_aliased(gate):
    op, ref = gate
    at = randn(6, 8).t().requires_grad_()
    bt = randn(6, 8).t()
    at0 = at.detach().clone()
    op(at, bt, True).sum().backward()
    assert torch.equal(at, at0)
    x = randn(5, 7).requires_grad_()
    h = x * 1
    x0 = h.detach().clone()
    op(h, h, True).backward(torch.ones(5, 7))
    assert torch.equal(h, x0)
    ga, gb = _ref_grads(ref, x0, x0, torch.ones(5, 7))
    assert_close(x.grad, ga + gb, torch.float32, factor=2)


def test_in_place_then_other_reader_fails_loudly(gate):
    op, _ = gate
    x = randn(4, 16).requires_grad_()
    a = x * 2
    s = a.sin()                         # saves a; its backward runs after the gate's
    y = op(a, x * 3, True)
    del a
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y.sum() + s.sum()).backward()
