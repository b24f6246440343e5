// Meta (shape / dtype only) kernels of fk::geglu, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/geglu/geglu.h"

namespace fk::ops {
namespace {

at::Tensor geglu_meta(const at::Tensor& a, const at::Tensor& b, c10::string_view approximate,
                      bool) {
  check_geglu(a, b, approximate);
  return at::empty_symint(a.sym_sizes(), a.options());
}

std::tuple<at::Tensor, at::Tensor> geglu_backward_meta(const at::Tensor& grad_c,
                                                       const at::Tensor& a, const at::Tensor& b,
                                                       c10::string_view approximate) {
  check_geglu_backward(grad_c, a, b, approximate);
  return {at::empty_symint(a.sym_sizes(), a.options()),
          at::empty_symint(b.sym_sizes(), b.options())};
}

void geglu_backward_in_place_meta(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b,
                                  c10::string_view approximate) {
  check_geglu_backward_in_place(grad_c, a, b, approximate);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("geglu", fk::ops::geglu_meta);
  m.impl("_geglu_backward", fk::ops::geglu_backward_meta);
  m.impl("_geglu_backward_", fk::ops::geglu_backward_in_place_meta);
}
