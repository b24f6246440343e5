// Autograd kernel of fk::fused_add_rms_norm: forward keeps residual_out (an output), weight
// and the fp32 rstd per row. Both outputs may receive a gradient; either may be absent.
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/fused_add_rms_norm/fused_add_rms_norm.h"

namespace fk::ops {
namespace {

class FusedAddRmsNormFunction : public torch::autograd::Function<FusedAddRmsNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& residual,
                                                const std::optional<at::Tensor>& weight,
                                                double eps, double offset,
                                                c10::string_view casting_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, residual_out, rstd] =
        fused_add_rms_norm_forward_call(x, residual, weight, eps, offset, casting_mode);
    // An unused output's gradient stays undefined instead of a tensor of zeros.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({residual_out, weight.value_or(at::Tensor()), rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting_mode"] = std::string(casting_mode);
    return {y, residual_out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    std::optional<at::Tensor> weight;
    if (saved[1].defined()) weight = saved[1];
    const at::Tensor& grad_y = grads[0];
    const at::Tensor& grad_residual_out = grads[1];
    const bool need_dx = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    const bool need_dw = weight.has_value() && ctx->needs_input_grad(2);
    at::Tensor dx, dw;
    if (grad_y.defined()) {
      std::optional<at::Tensor> ds;
      if (grad_residual_out.defined()) ds = grad_residual_out;
      if (need_dx || need_dw) {
        std::tie(dx, dw) = fused_add_rms_norm_backward_call(
            grad_y, ds, saved[0], weight, saved[2], ctx->saved_data["offset"].toDouble(),
            ctx->saved_data["casting_mode"].toStringRef(), {need_dx, need_dw});
      }
    } else {
      // y unused: only the add is differentiated, and it passes the gradient through.
      dx = grad_residual_out;
    }
    // The add gives x and residual the same gradient: one tensor serves both.
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(),
            ctx->needs_input_grad(1) ? dx : at::Tensor(), dw, at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_autograd(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps, double offset, c10::string_view casting_mode) {
  auto out = FusedAddRmsNormFunction::apply(x, residual, weight, eps, offset, casting_mode);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("fused_add_rms_norm", fk::ops::fused_add_rms_norm_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_fused_add_rms_norm_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_fused_add_rms_norm_backward", torch::autograd::autogradNotImplementedFallback());
}
