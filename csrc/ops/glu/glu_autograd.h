// The backward of the elementwise gated activations (fk::swiglu, fk::geglu) with the
// backward_in_place option: when to write the gradients into the inputs' memory.
#pragma once

#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>

#include <tuple>
#include <utility>

namespace fk::ops::glu {

// Whether the backward may overwrite the saved a and b with their gradients: this backward
// is not retaining the graph (a second backward would read them) nor building a
// higher-order graph, and a and b are plain, contiguous, separate tensors.
inline bool can_write_grads_into_inputs(const at::Tensor& a, const at::Tensor& b) {
  const auto wrapped = c10::DispatchKeySet({c10::DispatchKey::Python,
                                            c10::DispatchKey::Functionalize});
  return !torch::autograd::get_current_graph_task_keep_graph() && !at::GradMode::is_enabled() &&
         a.layout() == at::kStrided && a.is_contiguous() && b.is_contiguous() &&
         !a.key_set().has_any(wrapped) && !b.key_set().has_any(wrapped) &&
         !a.is_alias_of(b) && a.numel() > 0;
}

// (grad_a, grad_b) from the saved a and b. With `in_place_allowed` (the op's
// backward_in_place argument) and where it is safe, `in_place()` writes them into a and b
// (through the op's internal in-place backward) and a and b are returned as the gradients;
// otherwise `out_of_place()` returns new tensors.
template <class InPlace, class OutOfPlace>
std::tuple<at::Tensor, at::Tensor> input_grads(bool in_place_allowed, const at::Tensor& a,
                                               const at::Tensor& b, InPlace&& in_place,
                                               OutOfPlace&& out_of_place) {
  if (!in_place_allowed || !can_write_grads_into_inputs(a, b)) return out_of_place();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    in_place();
  }
  // Anything else that saved a or b for its backward now fails loudly on unpacking instead
  // of reading gradients as if they were activations.
  a.unsafeGetTensorImpl()->bump_version();
  b.unsafeGetTensorImpl()->bump_version();
  return {a.detach(), b.detach()};
}

}  // namespace fk::ops::glu
