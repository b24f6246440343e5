// fk::fused_linear_cross_entropy: cross_entropy(x @ weight^T + bias, target, ...) without
// ever holding the (N, V) logits: chunks of rows go through an ATen matmul (cuBLAS on
// CUDA), the cross entropy pieces of csrc/ops/cross_entropy (its Triton kernels on CUDA,
// the reference on CPU) write the logits' gradient into the chunk, and two more matmuls
// turn it into the gradients of x, weight and bias. No kernels of its own (FK_HOST_OPS).
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cross_entropy/cross_entropy.h"

namespace fk::ops {

// Shared by every backend: x (N, H) floating; weight (V, H) and bias (V,) of x's dtype and
// device; target / ce_weight / options as for cross_entropy; chunk_size >= 1; accum_dtype
// float32 or weight's dtype. python/fk/ops/fused_linear_cross_entropy.py raises the same
// messages from the fake kernel.
CeOptions check_fused_linear_cross_entropy(
    const Tensor& x, const Tensor& weight, const Tensor& target,
    const std::optional<Tensor>& bias, const std::optional<Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, const std::string& reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<ScalarType> accum_dtype);

// Rows per chunk: chunk_size if given, else logits about the size of x but at least
// kFlceMinChunkRows rows, a multiple of 128, at most n.
constexpr int64_t kFlceMinChunkRows = 1024;
int64_t flce_chunk_rows(int64_t n, int64_t h, int64_t v, std::optional<int64_t> chunk_size);

// (loss, z_loss, grad_x, grad_weight, grad_bias, token_accuracy, predicted_tokens); a
// gradient is computed only where grad_mask says so (grad_bias also needs a bias), for a
// grad_output of 1, or of grad_rows (one value per row, reduction 'none') when given;
// use_token_scaling scales each row by softmax(logits)_target (CeOptions::token_scaling);
// token_accuracy and predicted_tokens only with extras. The CPU and CUDA backends register
// it (fused_linear_cross_entropy_chunked.cpp).
using FlceResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
FlceResult fused_linear_cross_entropy_forward_impl(
    Tensor x, Tensor weight, Tensor target, std::optional<Tensor> bias,
    std::optional<Tensor> ce_weight, int64_t ignore_index, double label_smoothing,
    std::string reduction, double lse_square_scale, std::optional<double> softcap,
    std::optional<int64_t> chunk_size, std::optional<ScalarType> accum_dtype,
    std::vector<bool> grad_mask, std::optional<Tensor> grad_rows, bool use_token_scaling,
    bool extras);

}  // namespace fk::ops
