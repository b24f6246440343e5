// Schemas of fk::sparsemax and its backward, and the checks every backend shares.
// Fake kernels and the autograd formula: python/fk/ops/sparsemax.py.
#include "ops/sparsemax/sparsemax.h"

#include <algorithm>

#include "runtime/checks.h"

namespace fk::ops {

int64_t check_sparsemax(const Tensor& x, int64_t dim) {
  constexpr const char* op = "fk::sparsemax";
  checks::check_float(op, "x", x);
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  FK_CHECK(dim >= -ndim && dim < ndim, op, ": dim ", dim, " is out of range for x with ",
           x.dim(), " dimensions (expected a value in [", -ndim, ", ", ndim - 1, "])");
  return dim < 0 ? dim + ndim : dim;
}

int64_t check_sparsemax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim) {
  constexpr const char* op = "fk::_sparsemax_backward";
  checks::check_pair(op, "grad_y", grad_y, "y", y);
  checks::check_same_shape(op, "grad_y", grad_y, "y", y);
  return check_sparsemax(y, dim);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = max(x - tau, 0) over dim with tau such that sum(y) = 1 (Martins and Astudillo,
  // 2016), in fp32, rounded once to x's dtype; a contiguous result of x's shape. A slice
  // holding +inf or NaN, or only -inf, gives NaN; -inf entries of other slices give 0.
  m.def("sparsemax(Tensor x, int dim=-1) -> Tensor");
  // With S = {y > 0} per slice: grad_x = grad_y - mean_S(grad_y) on S, 0 elsewhere, from
  // the forward's output y.
  m.def("_sparsemax_backward(Tensor grad_y, Tensor y, int dim) -> Tensor");
}
