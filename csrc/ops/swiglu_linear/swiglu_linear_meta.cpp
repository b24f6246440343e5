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

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_linear_backward_meta(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& w_gate,
    const at::Tensor& w_up, const at::Tensor& s, const at::Tensor& t,
    std::array<bool, 3> output_mask) {
  check_swiglu_linear_backward(grad_out, x, w_gate, w_up, s, t);
  at::Tensor dx, dwg, dwu;
  if (output_mask[0]) dx = at::empty_symint(x.sym_sizes(), x.options());
  if (output_mask[1]) dwg = at::empty_symint(w_gate.sym_sizes(), w_gate.options());
  if (output_mask[2]) dwu = at::empty_symint(w_up.sym_sizes(), w_up.options());
  return {dx, dwg, dwu};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("_swiglu_linear_forward", fk::ops::swiglu_linear_forward_meta);
  m.impl("_swiglu_linear_backward", fk::ops::swiglu_linear_backward_meta);
}
