// CUDA launch piece of fk::rms_norm shared with fk::fused_add_rms_norm: the reduction of
// fp32 partial weight gradients (kernel family rms_norm_dw of triton_src/rms_norm.py). Row
// views, variant flags and the persistent grid are runtime/rows.h.
#pragma once

#include "runtime/tensor.h"

namespace fk::ops::rms_cuda {

// dw (weight's shape and dtype) = the sum over rows of the fp32 (programs, N) partials.
Tensor reduce_dw(const char* op, const Tensor& partial, const Tensor& weight);

}  // namespace fk::ops::rms_cuda
