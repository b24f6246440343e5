// Autograd kernel of fk::softmax: the forward keeps its output y; the backward needs only y.
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/softmax/softmax.h"

namespace fk::ops {
namespace {

class SoftmaxFunction : public torch::autograd::Function<SoftmaxFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t dim) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto y = softmax_call(x, dim);
    ctx->saved_data["dim"] = dim;
    ctx->save_for_backward({y});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto dx = softmax_backward_call(grads[0], saved[0], ctx->saved_data["dim"].toInt());
    return {dx, at::Tensor()};
  }
};

at::Tensor softmax_autograd(const at::Tensor& x, int64_t dim) {
  return SoftmaxFunction::apply(x, dim);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("softmax", fk::ops::softmax_autograd);
  // Internal op, not differentiable: differentiating it (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_softmax_backward", torch::autograd::autogradNotImplementedFallback());
}
