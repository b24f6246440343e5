// Schemas of fk::swiglu and its backward, and the checks every backend shares.
// Fake kernels and the autograd formula: python/fk/ops/swiglu.py and python/fk/ops/_glu.py.
#include "ops/swiglu/swiglu.h"

#include <cmath>

namespace fk::ops {

void check_swiglu(const Tensor& a, const Tensor& b) { glu::check_inputs(kSwigluNames, a, b); }

void check_swiglu_backward(const Tensor& grad_c, const Tensor& a, const Tensor& b) {
  glu::check_backward(kSwigluNames, grad_c, a, b);
}

void check_swiglu_backward_in_place(const Tensor& grad_c, const Tensor& a, const Tensor& b) {
  glu::check_backward_in_place(kSwigluNames, grad_c, a, b);
}

void check_swiglu_multipliers(const char* op, double gate_multiplier, double down_multiplier) {
  FK_CHECK(std::isfinite(gate_multiplier), op, ": gate_multiplier must be finite, got ",
           gate_multiplier);
  FK_CHECK(std::isfinite(down_multiplier), op, ": down_multiplier must be finite, got ",
           down_multiplier);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // silu(a * gate_multiplier) * b * down_multiplier elementwise (the multipliers of
  // Falcon-H1's MLP; 1 by default); a and b of one shape, dtype and device. Output
  // contiguous. backward_in_place: the backward may write grad_a / grad_b into a's / b's
  // memory (see python/fk/ops/swiglu.py for when that is safe and when it is skipped).
  m.def("swiglu(Tensor a, Tensor b, bool backward_in_place=False, float gate_multiplier=1.0, "
        "float down_multiplier=1.0) -> Tensor");
  // (grad_a, grad_b) of swiglu given grad_c.
  m.def("_swiglu_backward(Tensor grad_c, Tensor a, Tensor b, float gate_multiplier=1.0, "
        "float down_multiplier=1.0) -> (Tensor, Tensor)");
  // The same, written into a (grad_a) and b (grad_b); a and b must be contiguous.
  m.def("_swiglu_backward_(Tensor grad_c, Tensor(a!) a, Tensor(b!) b, "
        "float gate_multiplier=1.0, float down_multiplier=1.0) -> ()");
}
