// Schemas of fk::swiglu_linear and its internal forward / backward, and the shared checks.
#include "ops/swiglu_linear/swiglu_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

void check_swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up) {
  constexpr const char* op = "fk::swiglu_linear";
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_pair(op, "x", x, "w_gate", w_gate);
  checks::check_pair(op, "x", x, "w_up", w_up);
  TORCH_CHECK(w_gate.dim() == 2 && w_gate.sym_size(1) == x.sym_size(-1), op,
              ": w_gate must have shape (N, ", x.sym_size(-1),
              ") to match the last dim of x, got ", w_gate.sym_sizes());
  checks::check_same_shape(op, "w_gate", w_gate, "w_up", w_up);
}

void check_swiglu_linear_gate_grads(const at::Tensor& grad_out, const at::Tensor& t,
                                    const at::Tensor& s) {
  constexpr const char* op = "fk::_swiglu_linear_gate_grads";
  checks::check_pair(op, "grad_out", grad_out, "t", t);
  checks::check_pair(op, "s", s, "t", t);
  checks::check_same_shape(op, "grad_out", grad_out, "t", t);
  checks::check_same_shape(op, "s", s, "t", t);
}

void check_swiglu_linear_gate_grads_in_place(const at::Tensor& grad_out, const at::Tensor& t,
                                             const at::Tensor& s) {
  constexpr const char* op = "fk::_swiglu_linear_gate_grads_";
  check_swiglu_linear_gate_grads(grad_out, t, s);
  TORCH_CHECK(t.is_contiguous() && s.is_contiguous(), op, ": t and s must be contiguous");
  TORCH_CHECK(t.numel() == 0 || !t.is_alias_of(s), op, ": t and s must not share memory");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_forward_call(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
    std::array<bool, 2> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_swiglu_linear_forward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           std::array<bool, 2>)>();
  return op.call(x, w_gate, w_up, output_mask);
}

std::tuple<at::Tensor, at::Tensor> swiglu_linear_gate_grads_call(const at::Tensor& grad_out,
                                                                 const at::Tensor& t,
                                                                 const at::Tensor& s) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fk::_swiglu_linear_gate_grads", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&)>();
  return op.call(grad_out, t, s);
}

void swiglu_linear_gate_grads_in_place_call(const at::Tensor& grad_out, at::Tensor& t,
                                            at::Tensor& s) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_swiglu_linear_gate_grads_", "")
                       .typed<void(const at::Tensor&, at::Tensor&, at::Tensor&)>();
  op.call(grad_out, t, s);
}

}  // namespace fk::ops

at::Tensor fk::swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate,
                             const at::Tensor& w_up, bool recompute) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::swiglu_linear", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, bool)>();
  return op.call(x, w_gate, w_up, recompute);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // silu(x @ w_gate^T) * (x @ w_up^T). x: (..., K); w_gate, w_up: (N, K) (nn.Linear
  // weights); result (..., N), contiguous. recompute: keep nothing for backward but the
  // inputs and recompute the backward factors there (one more forward GEMM).
  m.def("swiglu_linear(Tensor x, Tensor w_gate, Tensor w_up, bool recompute=False) -> Tensor");
  // (z, s, t) with s = silu(a), t = b * silu'(a) (a = x w_gate^T, b = x w_up^T), all of
  // shape (..., N): z when output_mask[0], s and t when output_mask[1], else undefined.
  m.def("_swiglu_linear_forward(Tensor x, Tensor w_gate, Tensor w_up, bool[2] output_mask) "
        "-> (Tensor, Tensor, Tensor)");
  // The elementwise step of the backward: (grad_a, grad_b) = (grad_out * t, grad_out * s),
  // products in fp32, each rounded once to the inputs' dtype; all three of one shape.
  m.def("_swiglu_linear_gate_grads(Tensor grad_out, Tensor t, Tensor s) -> (Tensor, Tensor)");
  // The same written into t (grad_a) and s (grad_b), which must be contiguous and separate.
  m.def("_swiglu_linear_gate_grads_(Tensor grad_out, Tensor(a!) t, Tensor(b!) s) -> ()");
}

namespace fk::ops {
namespace {

// swiglu_linear on any backend is the first output of _swiglu_linear_forward.
at::Tensor swiglu_linear_composite(const at::Tensor& x, const at::Tensor& w_gate,
                                   const at::Tensor& w_up, bool) {
  return std::get<0>(swiglu_linear_forward_call(x, w_gate, w_up, {true, false}));
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("swiglu_linear", fk::ops::swiglu_linear_composite);
}
