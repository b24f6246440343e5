// Schemas of fk::softmax and its backward, and the checks every backend shares.
// Fake kernels and the autograd formula: python/fk/ops/softmax.py.
#include "ops/softmax/softmax.h"

#include <algorithm>

#include "runtime/checks.h"

namespace fk::ops {

int64_t check_softmax(const Tensor& x, int64_t dim) {
  constexpr const char* op = "fk::softmax";
  checks::check_float(op, "x", x);
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  FK_CHECK(dim >= -ndim && dim < ndim, op, ": dim ", dim, " is out of range for x with ",
           x.dim(), " dimensions (expected a value in [", -ndim, ", ", ndim - 1, "])");
  return dim < 0 ? dim + ndim : dim;
}

int64_t check_softmax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim) {
  constexpr const char* op = "fk::_softmax_backward";
  checks::check_pair(op, "grad_y", grad_y, "y", y);
  checks::check_same_shape(op, "grad_y", grad_y, "y", y);
  return check_softmax(y, dim);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // exp(x - max) / sum(exp(x - max)) over dim, in fp32, rounded once to x's dtype; a
  // contiguous result of x's shape. Like torch.softmax: a row of only -inf gives NaN.
  m.def("softmax(Tensor x, int dim=-1) -> Tensor");
  // grad_x = y * (grad_y - sum(grad_y * y, dim)), from the forward's output y.
  m.def("_softmax_backward(Tensor grad_y, Tensor y, int dim) -> Tensor");
}
