// fk::fused_linear_cross_entropy: cross_entropy(x @ weight^T + bias, target, ...) without
// ever holding the (N, V) logits: chunks of rows go through an ATen matmul (cuBLAS on
// CUDA), the cross entropy pieces of csrc/ops/cross_entropy (its Triton kernels on CUDA,
// the reference on CPU) write the logits' gradient into the chunk, and two more matmuls
// turn it into the gradients of x, weight and bias. No kernels of its own (FK_HOST_OPS).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>

#include "ops/cross_entropy/cross_entropy.h"

namespace fk::ops {

// Shared by every backend: x (N, H) floating; weight (V, H) and bias (V,) of x's dtype and
// device; target / ce_weight / options as for cross_entropy; chunk_size >= 1; accum_dtype
// float32 or weight's dtype.
CeOptions check_fused_linear_cross_entropy(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, std::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype);

// Rows per chunk: chunk_size if given, else logits about the size of x but at least
// kFlceMinChunkRows rows, a multiple of 128, at most n.
constexpr int64_t kFlceMinChunkRows = 1024;
int64_t flce_chunk_rows(int64_t n, int64_t h, int64_t v, std::optional<int64_t> chunk_size);

// (loss, z_loss, grad_x, grad_weight, grad_bias); a gradient is computed only where
// grad_mask says so (grad_bias also needs a bias), for a grad_output of 1, or of
// grad_rows (one value per row, reduction 'none') when given.
using FlceResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
FlceResult fused_linear_cross_entropy_forward_call(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, std::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype, std::array<bool, 3> grad_mask,
    const std::optional<at::Tensor>& grad_rows);

}  // namespace fk::ops
