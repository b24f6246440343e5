// Meta (shape / dtype only) kernels of fk::swiglu_linear, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/swiglu_linear/swiglu_linear.h"

namespace fk::ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_forward_meta(
    const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
    std::array<bool, 2> output_mask) {
  check_swiglu_linear(x, w_gate, w_up);
  auto sizes = x.sym_sizes().vec();
  sizes.back() = w_gate.sym_size(0);
  auto make = [&](bool want) {
    return want ? at::empty_symint(sizes, x.options()) : at::Tensor();
  };
  return {make(output_mask[0]), make(output_mask[1]), make(output_mask[1])};
}

std::tuple<at::Tensor, at::Tensor> swiglu_linear_gate_grads_meta(const at::Tensor& grad_out,
                                                                  const at::Tensor& t,
                                                                  const at::Tensor& s) {
  check_swiglu_linear_gate_grads(grad_out, t, s);
  return {at::empty_symint(t.sym_sizes(), t.options()),
          at::empty_symint(s.sym_sizes(), s.options())};
}

void swiglu_linear_gate_grads_in_place_meta(const at::Tensor& grad_out, at::Tensor& t,
                                            at::Tensor& s) {
  check_swiglu_linear_gate_grads_in_place(grad_out, t, s);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_swiglu_linear_forward", fk::ops::swiglu_linear_forward_meta);
  m.impl("_swiglu_linear_gate_grads", fk::ops::swiglu_linear_gate_grads_meta);
  m.impl("_swiglu_linear_gate_grads_", fk::ops::swiglu_linear_gate_grads_in_place_meta);
}
