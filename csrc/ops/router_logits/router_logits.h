// fk::router_logits: the mixture-of-experts router's logits x @ weight^T in float32 (fp32
// accumulation and output, Megatron's moe_router_dtype="fp32") from 16-bit or float32 x and
// weight, without float32 copies of either on CUDA. Its backward, fk::_router_logits_backward:
// grad_x = grad_logits @ weight in x's dtype and grad_weight = grad_logits^T @ x in the
// weight's dtype (or float32), both from the float32 grad_logits with fp32 accumulation.
#pragma once

#include <optional>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x (..., H) and weight (E, H) of one float dtype and device;
// weight_grad_dtype none (the weight's dtype), float32 or the weight's dtype.
void check_router_logits(const Tensor& x, const Tensor& weight,
                         const std::optional<ScalarType>& weight_grad_dtype);
// The same for x and weight, and grad_logits of shape (..., E) in float32 (float64 for
// float64 inputs) on x's device.
void check_router_logits_backward(const Tensor& grad_logits, const Tensor& x,
                                  const Tensor& weight,
                                  const std::optional<ScalarType>& weight_grad_dtype);
// The dtype of grad_weight: weight_grad_dtype, else the weight's dtype.
ScalarType router_weight_grad_dtype(const Tensor& weight,
                                    const std::optional<ScalarType>& weight_grad_dtype);

}  // namespace fk::ops
