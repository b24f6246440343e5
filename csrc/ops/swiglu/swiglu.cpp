// Schemas of fk::swiglu and its backward, and the checks every backend shares.
#include "ops/swiglu/swiglu.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"

namespace fk::ops {

void check_swiglu(const at::Tensor& a, const at::Tensor& b) {
  glu::check_inputs(kSwigluNames, a, b);
}

void check_swiglu_backward(const at::Tensor& grad_c, const at::Tensor& a, const at::Tensor& b) {
  glu::check_backward(kSwigluNames, grad_c, a, b);
}

void check_swiglu_backward_in_place(const at::Tensor& grad_c, const at::Tensor& a,
                                    const at::Tensor& b) {
  glu::check_backward_in_place(kSwigluNames, grad_c, a, b);
}

at::Tensor swiglu_call(const at::Tensor& a, const at::Tensor& b, bool backward_in_place) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::swiglu", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, bool)>();
  return op.call(a, b, backward_in_place);
}

void swiglu_backward_in_place_call(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_swiglu_backward_", "")
                       .typed<void(const at::Tensor&, at::Tensor&, at::Tensor&)>();
  op.call(grad_c, a, b);
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_call(const at::Tensor& grad_c,
                                                        const at::Tensor& a,
                                                        const at::Tensor& b) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fk::_swiglu_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&)>();
  return op.call(grad_c, a, b);
}

}  // namespace fk::ops

at::Tensor fk::swiglu(const at::Tensor& a, const at::Tensor& b, bool backward_in_place) {
  return fk::ops::swiglu_call(a, b, backward_in_place);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // silu(a) * b elementwise; a and b of one shape, dtype and device. Output contiguous.
  // backward_in_place: the backward may write grad_a / grad_b into a's / b's memory (see
  // python/fk/ops/swiglu.py for when that is safe and when it is skipped).
  m.def("swiglu(Tensor a, Tensor b, bool backward_in_place=False) -> Tensor");
  // (grad_a, grad_b) of swiglu given grad_c.
  m.def("_swiglu_backward(Tensor grad_c, Tensor a, Tensor b) -> (Tensor, Tensor)");
  // The same, written into a (grad_a) and b (grad_b); a and b must be contiguous.
  m.def("_swiglu_backward_(Tensor grad_c, Tensor(a!) a, Tensor(b!) b) -> ()");
}
