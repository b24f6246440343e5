// fk::gated_group_rms_norm: group RMSNorm of x times act(gate) (norm before gate), the output
// gate of linear-attention layers, with an optional transpose (B, S, H, D) -> (S, B, H * D).
#pragma once

#include <optional>
#include <string>

#include "runtime/tensor.h"

namespace fk::ops {

struct GatedNorm {
  int64_t n, g;      // last dim of x, group size
  bool sigmoid;      // gate activation sigmoid; else silu
  bool w_per_group;  // weight (group_size,) shared by the groups; else (N,)
};

// Shared by every backend: x (..., N), gate of x's shape and dtype, weight (N,) or
// (group_size,) of x's dtype or None, group_size dividing N, activation 'silu' | 'sigmoid',
// transpose_out only for 4-D x. `op` names the operator.
GatedNorm check_gated_group_rms_norm(const char* op, const Tensor& x, const Tensor& gate,
                                     const std::optional<Tensor>& weight, int64_t group_size,
                                     const std::string& activation, bool transpose_out);

// The backward's checks: the forward's, then grad_y of the output's shape and x's dtype.
GatedNorm check_gated_group_rms_norm_backward(const char* op, const Tensor& grad_y,
                                              const Tensor& x, const Tensor& gate,
                                              const std::optional<Tensor>& weight,
                                              int64_t group_size, const std::string& activation,
                                              bool transpose_out);

// The output's shape: x's, or (S, B, H * D) for x (B, S, H, D) with transpose_out.
Shape gated_group_rms_norm_out_shape(const Tensor& x, bool transpose_out);

}  // namespace fk::ops
