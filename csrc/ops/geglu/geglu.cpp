// Schemas of fk::geglu and its backward, and the checks every backend shares.
// Fake kernels and the autograd formula: python/fk/ops/geglu.py and python/fk/ops/_glu.py.
#include "ops/geglu/geglu.h"

namespace fk::ops {

namespace {

GeluApprox parse_gelu_approx(const std::string& approximate) {
  if (approximate == "tanh") return GeluApprox::Tanh;
  if (approximate == "none") return GeluApprox::None;
  fail(str(kGegluNames.op, ": approximate must be 'tanh' or 'none', got '", approximate, "'"));
}

}  // namespace

GeluApprox check_geglu(const Tensor& a, const Tensor& b, const std::string& approximate) {
  glu::check_inputs(kGegluNames, a, b);
  return parse_gelu_approx(approximate);
}

GeluApprox check_geglu_backward(const Tensor& grad_c, const Tensor& a, const Tensor& b,
                                const std::string& approximate) {
  glu::check_backward(kGegluNames, grad_c, a, b);
  return parse_gelu_approx(approximate);
}

GeluApprox check_geglu_backward_in_place(const Tensor& grad_c, const Tensor& a,
                                         const Tensor& b, const std::string& approximate) {
  glu::check_backward_in_place(kGegluNames, grad_c, a, b);
  return parse_gelu_approx(approximate);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
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
