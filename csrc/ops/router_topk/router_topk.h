// fk::router_topk: top-k routing of mixture-of-experts router logits (Megatron's softmax
// orders, DeepSeek-V3's sigmoid with an expert bias), returning the routing probabilities
// (zero off the selection) and the routing map; its backward fk::_router_topk_backward.
// The numerics: triton_src/router_topk.py.
#pragma once

#include <optional>
#include <string>

#include "runtime/tensor.h"

namespace fk::ops {

// Score function codes, as the Triton kernels take them.
enum class RouterScore : int { SoftmaxAfter = 0, SoftmaxBefore = 1, Sigmoid = 2 };

// Shared by every backend: logits (..., E) of a float dtype, 1 <= k <= E, score "softmax" or
// "sigmoid", pre_softmax only with softmax, scaling_factor finite, expert_bias (E,) float32
// on logits' device and only with sigmoid. Returns the score code.
RouterScore check_router_topk(const Tensor& logits, int64_t k, const std::string& score,
                              bool pre_softmax, double scaling_factor,
                              const std::optional<Tensor>& expert_bias);
// The same for logits and the options, grad_probs float32 (float64 for float64 logits) and
// routing_map bool, both of logits' shape and device.
RouterScore check_router_topk_backward(const Tensor& grad_probs, const Tensor& logits,
                                       const Tensor& routing_map, int64_t k,
                                       const std::string& score, bool pre_softmax,
                                       double scaling_factor);

}  // namespace fk::ops
