// fk::sparsemax: the Euclidean projection of each slice along a dim onto the probability
// simplex, computed in fp32 and rounded once to x's dtype.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x's dtype and the dim. Returns dim wrapped into
// [0, max(x.dim(), 1)) (a 0-dim x counts as one dimension of size 1, as in torch).
int64_t check_sparsemax(const Tensor& x, int64_t dim);
int64_t check_sparsemax_backward(const Tensor& grad_y, const Tensor& y, int64_t dim);

}  // namespace fk::ops
