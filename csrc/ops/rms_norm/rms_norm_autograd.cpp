// Autograd kernel of fk::rms_norm: forward keeps x, weight and the fp32 rstd per row.
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/rms_norm/rms_norm.h"

namespace fk::ops {
namespace {

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight, double eps, double offset,
                            c10::string_view casting_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = rms_norm_forward_call(x, weight, eps, offset, casting_mode);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting_mode"] = std::string(casting_mode);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    std::optional<at::Tensor> weight;
    if (saved[1].defined()) weight = saved[1];
    const bool need_dw = weight.has_value() && ctx->needs_input_grad(1);
    auto [dx, dw] = rms_norm_backward_call(grads[0], saved[0], weight, saved[2],
                                           ctx->saved_data["offset"].toDouble(),
                                           ctx->saved_data["casting_mode"].toStringRef(),
                                           {true, need_dw});
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                             double eps, double offset, c10::string_view casting_mode) {
  return RmsNormFunction::apply(x, weight, eps, offset, casting_mode);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("rms_norm", fk::ops::rms_norm_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_rms_norm_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_rms_norm_backward", torch::autograd::autogradNotImplementedFallback());
}
