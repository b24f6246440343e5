// Autograd kernel of fk::swiglu (C++, so gradients work from Python, TorchScript and C++).
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "ops/swiglu/swiglu.h"

namespace fk::ops {
namespace {

// Whether the backward may overwrite the saved a and b with their gradients: the caller
// allowed it, this backward is not retaining the graph (a second backward would read them)
// nor building a higher-order graph, and a and b are plain, contiguous, separate tensors.
bool can_write_grads_into_inputs(const at::Tensor& a, const at::Tensor& b) {
  const auto wrapped = c10::DispatchKeySet({c10::DispatchKey::Python,
                                            c10::DispatchKey::Functionalize});
  return !torch::autograd::get_current_graph_task_keep_graph() && !at::GradMode::is_enabled() &&
         a.layout() == at::kStrided && a.is_contiguous() && b.is_contiguous() &&
         !a.key_set().has_any(wrapped) && !b.key_set().has_any(wrapped) &&
         !a.is_alias_of(b) && a.numel() > 0;
}

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
    if (ctx->saved_data["in_place"].toBool() && can_write_grads_into_inputs(a, b)) {
      {
        at::AutoDispatchBelowADInplaceOrView guard;
        swiglu_backward_in_place_call(grads[0], a, b);
      }
      // Anything else that saved a or b for its backward now fails loudly on unpacking
      // instead of reading gradients as if they were activations.
      a.unsafeGetTensorImpl()->bump_version();
      b.unsafeGetTensorImpl()->bump_version();
      return {a.detach(), b.detach(), at::Tensor()};
    }
    auto [da, db] = swiglu_backward_call(grads[0], a, b);
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
