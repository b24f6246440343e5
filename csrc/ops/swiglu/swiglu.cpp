// Schemas of fk::swiglu and its backward, and the checks every backend shares.
#include "ops/swiglu/swiglu.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

void check_swiglu(const at::Tensor& a, const at::Tensor& b) {
  checks::check_pair("fk::swiglu", "a", a, "b", b);
  checks::check_same_shape("fk::swiglu", "a", a, "b", b);
}

void check_swiglu_backward(const at::Tensor& grad_c, const at::Tensor& a, const at::Tensor& b) {
  check_swiglu(a, b);
  checks::check_pair("fk::_swiglu_backward", "grad_c", grad_c, "a", a);
  checks::check_same_shape("fk::_swiglu_backward", "grad_c", grad_c, "a", a);
}

at::Tensor swiglu_call(const at::Tensor& a, const at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::swiglu", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
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

at::Tensor fk::swiglu(const at::Tensor& a, const at::Tensor& b) {
  return fk::ops::swiglu_call(a, b);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // silu(a) * b elementwise; a and b of one shape, dtype and device. Output contiguous.
  m.def("swiglu(Tensor a, Tensor b) -> Tensor");
  // (grad_a, grad_b) of swiglu given grad_c.
  m.def("_swiglu_backward(Tensor grad_c, Tensor a, Tensor b) -> (Tensor, Tensor)");
}
