// Meta (shape / dtype only) kernels of fk::softmax, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/softmax/softmax.h"

namespace fk::ops {
namespace {

at::Tensor softmax_meta(const at::Tensor& x, int64_t dim) {
  check_softmax(x, dim);
  return at::empty_symint(x.sym_sizes(), x.options());
}

at::Tensor softmax_backward_meta(const at::Tensor& grad_y, const at::Tensor& y, int64_t dim) {
  check_softmax_backward(grad_y, y, dim);
  return at::empty_symint(y.sym_sizes(), y.options());
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("softmax", fk::ops::softmax_meta);
  m.impl("_softmax_backward", fk::ops::softmax_backward_meta);
}
