// Autograd kernel of fk::swiglu (C++, so gradients work from Python, TorchScript and C++).
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "ops/glu/glu_autograd.h"
#include "ops/swiglu/swiglu.h"

namespace fk::ops {
namespace {

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b, bool backward_in_place) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    ctx->saved_data["in_place"] = backward_in_place;
    return swiglu_call(a, b, false);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor a = saved[0], b = saved[1];
    auto [da, db] = glu::input_grads(
        ctx->saved_data["in_place"].toBool(), a, b,
        [&] { swiglu_backward_in_place_call(grads[0], a, b); },
        [&] { return swiglu_backward_call(grads[0], a, b); });
    return {da, db, at::Tensor()};
  }
};

at::Tensor swiglu_autograd(const at::Tensor& a, const at::Tensor& b, bool backward_in_place) {
  return SwigluFunction::apply(a, b, backward_in_place);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("swiglu", fk::ops::swiglu_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_swiglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_swiglu_backward_", torch::autograd::autogradNotImplementedFallback());
}
