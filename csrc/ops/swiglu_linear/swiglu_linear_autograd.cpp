// Autograd kernel of fk::swiglu_linear (C++, so gradients work from Python, TorchScript and
// C++). The forward keeps x, the weights and the factors s, t; with recompute it keeps only
// x and the weights and forms s, t again at the start of the backward.
//
// Backward: one elementwise pass forms da = dz * t and db = dz * s, written over t and s
// when nothing can read them again (glu::input_grads: not when the graph is retained or a
// higher-order graph is built; then new tensors); then the products through ATen (cuBLAS
// on CUDA, fp32 accumulation), only those whose gradient is needed:
//   dx = da w_gate + db w_up (one mm, one addmm_ into the same output), dWg = da^T x,
//   dWu = db^T x.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/accumulate.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/glu/glu_autograd.h"
#include "ops/swiglu_linear/swiglu_linear.h"

namespace fk::ops {
namespace {

// (rows, last dim) view of t (a copy only when t's layout does not allow one).
at::Tensor rows(const at::Tensor& t) {
  return t.reshape({c10::multiply_integers(t.sizes().slice(0, t.dim() - 1)), t.size(-1)});
}

class SwigluLinearFunction : public torch::autograd::Function<SwigluLinearFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w_gate, const at::Tensor& w_up, bool recompute) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [z, s, t] = swiglu_linear_forward_call(x, w_gate, w_up, {true, !recompute});
    ctx->save_for_backward({x, w_gate, w_up, s, t});
    return z;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_gate = saved[1], &w_up = saved[2];
    at::Tensor s = saved[3], t = saved[4];
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      ctx->needs_input_grad(2)};
    if (!grads[0].defined() || !(mask[0] || mask[1] || mask[2])) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    if (!s.defined()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(std::ignore, s, t) = swiglu_linear_forward_call(x, w_gate, w_up, {false, true});
    }
    const at::Tensor& dz = grads[0];
    auto [da, db] = glu::input_grads(
        true, t, s, [&] { swiglu_linear_gate_grads_in_place_call(dz, t, s); },
        [&] { return swiglu_linear_gate_grads_call(dz, t, s); });
    const auto da2 = rows(da), db2 = rows(db);
    at::Tensor dx, dwg, dwu;
    if (mask[0]) dx = at::mm(da2, w_gate).addmm_(db2, w_up).view(x.sizes());
    if (mask[1] || mask[2]) {
      const auto x2 = rows(x);
      if (mask[1]) dwg = at::mm(da2.t(), x2);
      if (mask[2]) dwu = at::mm(db2.t(), x2);
    }
    return {dx, dwg, dwu, at::Tensor()};
  }
};

at::Tensor swiglu_linear_autograd(const at::Tensor& x, const at::Tensor& w_gate,
                                  const at::Tensor& w_up, bool recompute) {
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (x.requires_grad() || w_gate.requires_grad() || w_up.requires_grad());
  if (!needs_grad) {
    // Nothing will differentiate this call: write z only, keep nothing.
    at::AutoDispatchBelowADInplaceOrView guard;
    return std::get<0>(swiglu_linear_forward_call(x, w_gate, w_up, {true, false}));
  }
  return SwigluLinearFunction::apply(x, w_gate, w_up, recompute);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("swiglu_linear", fk::ops::swiglu_linear_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_swiglu_linear_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_swiglu_linear_gate_grads", torch::autograd::autogradNotImplementedFallback());
  m.impl("_swiglu_linear_gate_grads_", torch::autograd::autogradNotImplementedFallback());
}
