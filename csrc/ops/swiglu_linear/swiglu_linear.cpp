// Schemas of fk::swiglu_linear and its internal forward / gate-gradient ops, and the shared
// checks. Fake kernels and the autograd formula: python/fk/ops/swiglu_linear.py.
#include "ops/swiglu_linear/swiglu_linear.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include "ops/glu/glu.h"
#include "runtime/checks.h"

namespace fk::ops {

void check_swiglu_linear(const Tensor& x, const Tensor& w_gate, const Tensor& w_up) {
  constexpr const char* op = "fk::swiglu_linear";
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_pair(op, "x", x, "w_gate", w_gate);
  checks::check_pair(op, "x", x, "w_up", w_up);
  FK_CHECK(w_gate.dim() == 2 && w_gate.size(1) == x.size(-1), op, ": w_gate must have shape (N, ",
           x.size(-1), ") to match the last dim of x, got ", shape_of(w_gate));
  checks::check_same_shape(op, "w_gate", w_gate, "w_up", w_up);
}

void check_swiglu_linear_gate_grads(const Tensor& grad_out, const Tensor& t, const Tensor& s) {
  constexpr const char* op = "fk::_swiglu_linear_gate_grads";
  checks::check_pair(op, "grad_out", grad_out, "t", t);
  checks::check_pair(op, "s", s, "t", t);
  checks::check_same_shape(op, "grad_out", grad_out, "t", t);
  checks::check_same_shape(op, "s", s, "t", t);
}

void check_swiglu_linear_gate_grads_in_place(const Tensor& grad_out, const Tensor& t,
                                             const Tensor& s) {
  constexpr const char* op = "fk::_swiglu_linear_gate_grads_";
  check_swiglu_linear_gate_grads(grad_out, t, s);
  FK_CHECK(t.is_contiguous() && s.is_contiguous(), op, ": t and s must be contiguous");
  FK_CHECK(t.numel() == 0 || !glu::share_storage(t, s), op, ": t and s must not share memory");
}

namespace {

// swiglu_linear on any backend is the first output of _swiglu_linear_forward, whose
// autograd formula (python/fk/ops/swiglu_linear.py) saves the factors s, t it returns, or
// only the inputs when they are not returned (recompute). Without grad mode nothing will
// differentiate the call, so only z is written. (fk.swiglu_linear in Python also skips the
// factors when no input requires grad; the stable ABI has no requires_grad query.)
Tensor swiglu_linear_composite(Tensor x, Tensor w_gate, Tensor w_up, bool recompute,
                               double gate_multiplier, double down_multiplier) {
  check_swiglu_linear(x, w_gate, w_up);
  const bool mask[2] = {true, !recompute && aoti_torch_grad_mode_is_enabled()};
  return aten::call_n<3>("fk::_swiglu_linear_forward", "", x, w_gate, w_up,
                         torch::headeronly::HeaderOnlyArrayRef<bool>(mask, 2), gate_multiplier,
                         down_multiplier)[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // silu(x @ w_gate^T * gate_multiplier) * (x @ w_up^T) * down_multiplier (the multipliers
  // of Falcon-H1's MLP, 1 by default). x: (..., K); w_gate, w_up: (N, K) (nn.Linear
  // weights); result (..., N), contiguous. recompute: keep nothing for backward but the
  // inputs and recompute the backward factors there (one more forward GEMM).
  m.def("swiglu_linear(Tensor x, Tensor w_gate, Tensor w_up, bool recompute=False, "
        "float gate_multiplier=1.0, float down_multiplier=1.0) -> Tensor");
  // (z, s, t) with s = dm silu(u), t = gm dm b silu'(u) (u = gm a, a = x w_gate^T,
  // b = x w_up^T; gm, dm the multipliers), all of shape (..., N): z when output_mask[0], s
  // and t when output_mask[1], else undefined.
  m.def("_swiglu_linear_forward(Tensor x, Tensor w_gate, Tensor w_up, bool[2] output_mask, "
        "float gate_multiplier=1.0, float down_multiplier=1.0) -> (Tensor, Tensor, Tensor)");
  // The elementwise step of the backward: (grad_a, grad_b) = (grad_out * t, grad_out * s),
  // products in fp32, each rounded once to the inputs' dtype; all three of one shape.
  m.def("_swiglu_linear_gate_grads(Tensor grad_out, Tensor t, Tensor s) -> (Tensor, Tensor)");
  // The same written into t (grad_a) and s (grad_b), which must be contiguous and separate.
  m.def("_swiglu_linear_gate_grads_(Tensor grad_out, Tensor(a!) t, Tensor(b!) s) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("swiglu_linear", TORCH_BOX(&fk::ops::swiglu_linear_composite));
}
