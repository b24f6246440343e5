// Autograd kernel of fk::geglu (C++, so gradients work from Python, TorchScript and C++).
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <string>

#include "ops/geglu/geglu.h"
#include "ops/glu/glu_autograd.h"

namespace fk::ops {
namespace {

class GegluFunction : public torch::autograd::Function<GegluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b, c10::string_view approximate,
                            bool backward_in_place) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->saved_data["in_place"] = backward_in_place;
    return geglu_call(a, b, approximate, false);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor a = saved[0], b = saved[1];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    auto [da, db] = glu::input_grads(
        ctx->saved_data["in_place"].toBool(), a, b,
        [&] { geglu_backward_in_place_call(grads[0], a, b, approximate); },
        [&] { return geglu_backward_call(grads[0], a, b, approximate); });
    return {da, db, at::Tensor(), at::Tensor()};
  }
};

at::Tensor geglu_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view approximate,
                          bool backward_in_place) {
  return GegluFunction::apply(a, b, approximate, backward_in_place);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("geglu", fk::ops::geglu_autograd);
  // Internal ops are not differentiable: differentiating them (double backward) raises
  // "the derivative for ... is not implemented".
  m.impl("_geglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("_geglu_backward_", torch::autograd::autogradNotImplementedFallback());
}
