// Autograd kernel of fk::swiglu (C++, so gradients work from Python, TorchScript and C++).
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/swiglu/swiglu.h"

namespace fk::ops {
namespace {

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    return swiglu_call(a, b);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [da, db] = swiglu_backward_call(grads[0], saved[0], saved[1]);
    return {da, db};
  }
};

at::Tensor swiglu_autograd(const at::Tensor& a, const at::Tensor& b) {
  return SwigluFunction::apply(a, b);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Autograd, m) {
  m.impl("swiglu", fk::ops::swiglu_autograd);
}
