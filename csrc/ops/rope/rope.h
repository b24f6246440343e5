// fk::rope: rotary position embedding of q and k (Hugging Face rotate-half convention, or
// the interleaved GPT-J layout), fp32 math; fk::rope_ writes into q and k.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace fk::ops {

// Shared by every backend (SymInt-aware): q (B, Hq, S, D), k (B, Hkv, S, D), cos / sin
// (S, W), (1 or B, S, W) or (1 or B, 1, S, W) with W = rotary_dim or rotary_dim / 2.
// `op` names the operator in the messages.
void check_rope(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                const at::Tensor& sin, std::optional<int64_t> rotary_dim);

// check_rope, plus what writing into q and k needs: a contiguous last dim, no element
// stored twice, q and k not the same tensor.
void check_rope_inplace(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                        const at::Tensor& sin, std::optional<int64_t> rotary_dim);

// The output for x: x's own layout when x is one dense block with a contiguous last dim
// (e.g. the transposed view of a (B, S, H, D) buffer), else contiguous.
at::Tensor rope_out_like(const at::Tensor& x);

// cos / sin as (1 or B, S, W) views.
at::Tensor rope_cos_3d(const at::Tensor& cos);

// Rotary dim (concrete): rotary_dim, or cos's last dim when it is not given.
int64_t rope_rotary_dim(const at::Tensor& cos, std::optional<int64_t> rotary_dim);

// Calls through the dispatcher.
std::tuple<at::Tensor, at::Tensor> rope_call(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& cos, const at::Tensor& sin,
                                             std::optional<int64_t> rotary_dim,
                                             bool interleaved);
std::tuple<at::Tensor, at::Tensor> rope_backward_call(const at::Tensor& grad_q,
                                                      const at::Tensor& grad_k,
                                                      const at::Tensor& cos,
                                                      const at::Tensor& sin,
                                                      std::optional<int64_t> rotary_dim,
                                                      bool interleaved);

void rope_inplace_call(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, std::optional<int64_t> rotary_dim,
                       bool interleaved);

}  // namespace fk::ops
