// fk::rope: rotary position embedding of q and k (Hugging Face rotate-half convention, or
// the interleaved GPT-J layout), fp32 math; fk::rope_ writes into q and k.
#pragma once

#include <optional>
#include <utility>

#include "runtime/tensor.h"

namespace fk::ops {

// What every rotary op checks first: q (B, Hq, S, D) and k (B, Hkv, S, D) of one dtype and
// device with the same batch, seq and head_dim; cos and sin of one shape and dtype (float32
// or q's) on q's device. `op` names the operator in the messages.
void check_qk_and_tables(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos,
                         const Tensor& sin);

// Shared by every backend: q (B, Hq, S, D), k (B, Hkv, S, D), cos / sin (S, W),
// (1 or B, S, W) or (1 or B, 1, S, W) with W = rotary_dim or rotary_dim / 2. `op` names the
// operator in the messages.
void check_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos,
                const Tensor& sin, std::optional<int64_t> rotary_dim);

// check_rope, plus what writing into q and k needs: a contiguous last dim, no element
// stored twice, q and k not the same tensor (the same memory, offset, sizes and strides).
void check_rope_inplace(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                        std::optional<int64_t> rotary_dim);

// The output for x: x's own layout when x is one dense block with a contiguous last dim
// (e.g. the transposed view of a (B, S, H, D) buffer), else contiguous.
Tensor rope_out_like(const Tensor& x);

// cos / sin as (1 or B, S, W) views.
Tensor rope_cos_3d(const Tensor& cos);

// cos / sin as (1 or B, S, W) views (rope_cos_3d) with a contiguous last dim and the same
// strides, for kernels that take one set of cos / sin strides; copied only where needed.
std::pair<Tensor, Tensor> rope_tables_3d(const Tensor& cos, const Tensor& sin);

// Rotary dim: rotary_dim, or cos's last dim when it is not given.
int64_t rope_rotary_dim(const Tensor& cos, std::optional<int64_t> rotary_dim);

}  // namespace fk::ops
