// Autograd kernel of fk::swiglu_linear (C++, so gradients work from Python, TorchScript and
// C++). The forward keeps x, the weights and the factors s, t; with recompute it keeps only
// x and the weights and forms s, t again at the start of the backward.
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/swiglu_linear/swiglu_linear.h"

namespace fk::ops {
namespace {

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
    auto [dx, dwg, dwu] = swiglu_linear_backward_call(grads[0], x, w_gate, w_up, s, t, mask);
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
  m.impl("_swiglu_linear_backward", torch::autograd::autogradNotImplementedFallback());
}
