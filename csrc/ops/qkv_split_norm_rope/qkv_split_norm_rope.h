// fk::qkv_split_norm_rope: the fused QKV projection split into q, k, v, RMSNorm per head of q
// and k (qk-norm), rotate-half RoPE of q and k, written in the attention layout.
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// What the checks found: sizes and options, shared by every backend.
struct QkvSplit {
  int64_t b, s, hq, hkv, d, rot;
  bool grouped;    // Megatron's per-group [q heads..., k, v]; else [q..., k..., v...]
  bool tokens_sb;  // qkv is (S, B, N); else (B, S, N)
  bool bhsd;       // outputs (B, H, S, D); else (B, S, H, D)
};

// Shared by every backend: qkv (S, B, N) ('sbh') or (B, S, N) ('bsh') with
// N = (num_heads + 2 * num_kv_heads) * head_dim; norm weights (head_dim,) of qkv's dtype or
// None; cos / sin as fk::rope takes them for head_dim and seq S. `op` names the operator.
QkvSplit check_qkv_split_norm_rope(const char* op, const Tensor& qkv,
                                   const std::optional<Tensor>& q_norm_weight,
                                   const std::optional<Tensor>& k_norm_weight,
                                   const Tensor& cos, const Tensor& sin, int64_t num_heads,
                                   int64_t num_kv_heads, std::optional<int64_t> rotary_dim,
                                   const std::string& layout, const std::string& qkv_format,
                                   const std::string& input_layout);

// The backward's checks: the forward's, then grad_q / grad_k / grad_v of the outputs' shapes,
// qkv's dtype and device.
QkvSplit check_qkv_split_norm_rope_backward(
    const char* op, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
    const Tensor& qkv, const std::optional<Tensor>& q_norm_weight,
    const std::optional<Tensor>& k_norm_weight, const Tensor& cos, const Tensor& sin,
    int64_t num_heads, int64_t num_kv_heads, std::optional<int64_t> rotary_dim,
    const std::string& layout, const std::string& qkv_format, const std::string& input_layout);

// A new contiguous output of `heads` heads in the layout of `p`.
Tensor qkv_split_output(const QkvSplit& p, int64_t heads, const Tensor& like);

}  // namespace fk::ops
