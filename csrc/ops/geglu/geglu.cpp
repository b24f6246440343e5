// Schemas of fk::geglu and its backward, and the checks every backend shares.
#include "ops/geglu/geglu.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"

namespace fk::ops {

namespace {

GeluApprox parse_gelu_approx(std::string_view approximate) {
  if (approximate == "tanh") return GeluApprox::Tanh;
  if (approximate == "none") return GeluApprox::None;
  TORCH_CHECK(false, kGegluNames.op, ": approximate must be 'tanh' or 'none', got '",
              approximate, "'");
}

}  // namespace

GeluApprox check_geglu(const at::Tensor& a, const at::Tensor& b, std::string_view approximate) {
  glu::check_inputs(kGegluNames, a, b);
  return parse_gelu_approx(approximate);
}

GeluApprox check_geglu_backward(const at::Tensor& grad_c, const at::Tensor& a,
                                const at::Tensor& b, std::string_view approximate) {
  glu::check_backward(kGegluNames, grad_c, a, b);
  return parse_gelu_approx(approximate);
}

GeluApprox check_geglu_backward_in_place(const at::Tensor& grad_c, const at::Tensor& a,
                                         const at::Tensor& b, std::string_view approximate) {
  glu::check_backward_in_place(kGegluNames, grad_c, a, b);
  return parse_gelu_approx(approximate);
}

at::Tensor geglu_call(const at::Tensor& a, const at::Tensor& b, std::string_view approximate,
                      bool backward_in_place) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fk::geglu", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, bool)>();
  return op.call(a, b, approximate, backward_in_place);
}

void geglu_backward_in_place_call(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b,
                                  std::string_view approximate) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fk::_geglu_backward_", "")
          .typed<void(const at::Tensor&, at::Tensor&, at::Tensor&, c10::string_view)>();
  op.call(grad_c, a, b, approximate);
}

std::tuple<at::Tensor, at::Tensor> geglu_backward_call(const at::Tensor& grad_c,
                                                       const at::Tensor& a, const at::Tensor& b,
                                                       std::string_view approximate) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_geglu_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           c10::string_view)>();
  return op.call(grad_c, a, b, approximate);
}

}  // namespace fk::ops

at::Tensor fk::geglu(const at::Tensor& a, const at::Tensor& b, const std::string& approximate,
                     bool backward_in_place) {
  return fk::ops::geglu_call(a, b, approximate, backward_in_place);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // gelu(a) * b elementwise; a and b of one shape, dtype and device. Output contiguous.
  // approximate: 'tanh' (Gemma's gelu_pytorch_tanh) or 'none' (exact, erf), as in
  // torch.nn.functional.gelu. backward_in_place: the backward may write grad_a / grad_b
  // into a's / b's memory (see python/fk/ops/geglu.py for when that is safe and skipped).
  m.def("geglu(Tensor a, Tensor b, str approximate='tanh', bool backward_in_place=False) "
        "-> Tensor");
  // (grad_a, grad_b) of geglu given grad_c.
  m.def("_geglu_backward(Tensor grad_c, Tensor a, Tensor b, str approximate) "
        "-> (Tensor, Tensor)");
  // The same, written into a (grad_a) and b (grad_b); a and b must be contiguous.
  m.def("_geglu_backward_(Tensor grad_c, Tensor(a!) a, Tensor(b!) b, str approximate) -> ()");
}
