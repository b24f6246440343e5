// Autograd kernel of fk::layer_norm: forward keeps x, weight and the fp32 mean and rstd per
// row; the backward asks only for the gradients autograd needs.
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/layer_norm/layer_norm.h"

namespace fk::ops {
namespace {

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = layer_norm_forward_call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["has_bias"] = has(bias);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    std::optional<at::Tensor> weight;
    if (saved[1].defined()) weight = saved[1];
    // needs_input_grad counts tensor inputs only: without a weight, the bias is input 1.
    const bool has_w = weight.has_value();
    const std::array<bool, 3> mask = {
        ctx->needs_input_grad(0), has_w && ctx->needs_input_grad(1),
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(has_w ? 2 : 1)};
    auto [dx, dw, db] = layer_norm_backward_call(grads[0], saved[0], weight, saved[2], saved[3],
                                                 mask);
    return {dx, dw, db, at::Tensor()};
  }
};

at::Tensor layer_norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
  return LayerNormFunction::apply(x, weight, bias, eps);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("layer_norm", fk::ops::layer_norm_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_layer_norm_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_layer_norm_backward", torch::autograd::autogradNotImplementedFallback());
}
