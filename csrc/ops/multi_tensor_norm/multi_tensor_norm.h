// fk::multi_tensor_norm and fk::multi_tensor_count_zeros: reductions over a list of tensors
// (the global gradient norm for clipping, the count of zero elements), float32
// accumulation, one result on the tensors' device, no host synchronization.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: a non-empty list of floating tensors on one device (float32,
// bfloat16, float16; float64 on CPU). `op` names the operator in messages.
void check_tensor_list(const char* op, const std::vector<Tensor>& tensors);
// ord: 2 or inf.
void check_norm_ord(double ord);

}  // namespace fk::ops
