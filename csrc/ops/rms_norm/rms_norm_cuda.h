// CUDA launch piece of fk::rms_norm shared with fk::fused_add_rms_norm: the reduction of
// fp32 partial weight gradients (kernel family rms_norm_dw of triton_src/rms_norm.py). Row
// views, variant flags and the persistent grid are runtime/rows.h.
#pragma once

#include <utility>

#include "runtime/tensor.h"

namespace fk::ops::rms_cuda {

// dw (weight's shape and dtype) = the sum over rows of the fp32 (programs, N) partials.
Tensor reduce_dw(const char* op, const Tensor& partial, const Tensor& weight);

// Two weights' gradients from one launch: the fp32 (programs, N) partials hold the first
// weight's n1 columns, then the second's; both 1-D, of `weight`'s dtype and device.
std::pair<Tensor, Tensor> reduce_dw2(const char* op, const Tensor& partial, int64_t n1,
                                     const Tensor& weight);

}  // namespace fk::ops::rms_cuda
