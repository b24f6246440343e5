// Meta (shape / dtype only) kernels of fk::swiglu, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/swiglu/swiglu.h"

namespace fk::ops {
namespace {

at::Tensor swiglu_meta(const at::Tensor& a, const at::Tensor& b, bool) {
  check_swiglu(a, b);
  return at::empty_symint(a.sym_sizes(), a.options());
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_meta(const at::Tensor& grad_c,
                                                        const at::Tensor& a,
                                                        const at::Tensor& b) {
  check_swiglu_backward(grad_c, a, b);
  return {at::empty_symint(a.sym_sizes(), a.options()),
          at::empty_symint(b.sym_sizes(), b.options())};
}

void swiglu_backward_in_place_meta(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b) {
  check_swiglu_backward_in_place(grad_c, a, b);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("swiglu", fk::ops::swiglu_meta);
  m.impl("_swiglu_backward", fk::ops::swiglu_backward_meta);
  m.impl("_swiglu_backward_", fk::ops::swiglu_backward_in_place_meta);
}
