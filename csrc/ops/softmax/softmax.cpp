// Schemas of fk::softmax and its backward, and the checks every backend shares.
#include "ops/softmax/softmax.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

int64_t check_softmax(const at::Tensor& x, int64_t dim) {
  constexpr const char* op = "fk::softmax";
  checks::check_float(op, "x", x);
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  TORCH_CHECK(dim >= -ndim && dim < ndim, op, ": dim ", dim, " is out of range for x with ",
              x.dim(), " dimensions (expected a value in [", -ndim, ", ", ndim - 1, "])");
  return dim < 0 ? dim + ndim : dim;
}

int64_t check_softmax_backward(const at::Tensor& grad_y, const at::Tensor& y, int64_t dim) {
  constexpr const char* op = "fk::_softmax_backward";
  checks::check_pair(op, "grad_y", grad_y, "y", y);
  checks::check_same_shape(op, "grad_y", grad_y, "y", y);
  return check_softmax(y, dim);
}

at::Tensor softmax_call(const at::Tensor& x, int64_t dim) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::softmax", "")
                       .typed<at::Tensor(const at::Tensor&, int64_t)>();
  return op.call(x, dim);
}

at::Tensor softmax_backward_call(const at::Tensor& grad_y, const at::Tensor& y, int64_t dim) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_softmax_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(grad_y, y, dim);
}

}  // namespace fk::ops

at::Tensor fk::softmax(const at::Tensor& x, int64_t dim) { return fk::ops::softmax_call(x, dim); }

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // exp(x - max) / sum(exp(x - max)) over dim, in fp32, rounded once to x's dtype; a
  // contiguous result of x's shape. Like torch.softmax: a row of only -inf gives NaN.
  m.def("softmax(Tensor x, int dim=-1) -> Tensor");
  // grad_x = y * (grad_y - sum(grad_y * y, dim)), from the forward's output y.
  m.def("_softmax_backward(Tensor grad_y, Tensor y, int dim) -> Tensor");
}
