// fk::neighborhood_attention: 1-D neighborhood attention over the sequence (windows cut at
// the sequence ends), flash-attention style: no (L, L) scores anywhere.
#pragma once

#include <optional>

#include "runtime/tensor.h"

namespace fk::ops {

// Sizes of the (batch, heads, seq_len, head_dim) inputs and the resolved options.
struct NaParams {
  int64_t b, h, l, d;
  int64_t radius;    // window half-width in steps of `dilation`, clamped to the sequence
  int64_t dilation;  // clamped to seq_len (any larger dilation leaves each query alone)
  double scale;      // the given scale, or 1 / sqrt(head_dim)
};

// Shared by every backend: q, k, v and the options. The backward check names `op` for its
// own arguments and fk::neighborhood_attention for the forward's.
NaParams check_neighborhood_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      int64_t kernel_size, int64_t dilation,
                                      std::optional<double> scale,
                                      const char* op = "fk::neighborhood_attention");
NaParams check_neighborhood_attention_backward(const Tensor& grad_out, const Tensor& q,
                                               const Tensor& k, const Tensor& v,
                                               const Tensor& out, const Tensor& lse,
                                               int64_t kernel_size, int64_t dilation,
                                               std::optional<double> scale);

}  // namespace fk::ops
