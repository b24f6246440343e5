// fk::softmax: softmax over one dimension, computed in fp32 and rounded once to x's dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fk::ops {

// Shared by every backend: x's dtype and the dim. Returns dim wrapped into
// [0, max(x.dim(), 1)) (a 0-dim x counts as one dimension of size 1, as in torch).
int64_t check_softmax(const at::Tensor& x, int64_t dim);
int64_t check_softmax_backward(const at::Tensor& grad_y, const at::Tensor& y, int64_t dim);

// Calls through the dispatcher (used by the autograd kernel and the public C++ API).
at::Tensor softmax_call(const at::Tensor& x, int64_t dim);
at::Tensor softmax_backward_call(const at::Tensor& grad_y, const at::Tensor& y, int64_t dim);

}  // namespace fk::ops
