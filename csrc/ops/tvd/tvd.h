// fk::tvd: total variation distance 0.5 * sum |p - q| between rows of probabilities, with
// Liger Kernel's reductions ("none", "sum", "mean", "batchmean") and ignored rows
// (shift_labels == ignore_index); the gradient with respect to p is computed in the forward.
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// Values as the Triton kernels' callers use them.
enum class TvdReduction : int { None = 0, Sum = 1, Mean = 2, BatchMean = 3 };

// Shared by every backend: p and q (BT, V) of one floating dtype and device, same shape;
// shift_labels (BT,) int64 on p's device; reduction one of the four. `op` names the caller.
// python/fk/ops/tvd.py raises the same messages from the fake kernels.
TvdReduction check_tvd(const char* op, const Tensor& p, const Tensor& q,
                       const std::optional<Tensor>& shift_labels, const std::string& reduction);
// grad (BT, V) floating; grad_loss of the loss dtype, a scalar or grad's shape.
void check_tvd_backward(const char* op, const Tensor& grad, const Tensor& grad_loss);

// The factor s of the reduction as a 0-dim tensor of `dtype` on labels' / `device`: 1 for
// "none" and "sum", 1 / n for "batchmean", 1 / (n * v) for "mean", n the rows not ignored
// (m without labels); computed on the device (inf when n is 0).
Tensor tvd_scale(const Tensor& labels, int64_t m, int64_t v, int64_t ignore_index,
                 TvdReduction r, ScalarType dtype, const Device& device);

// Device halves. p, q contiguous (M, V) with M * V > 0; labels contiguous (M,) int64 or
// undefined; grad contiguous (M, V) of p's dtype or undefined (no gradient). Return the
// loss: (M, V) for "none", else a scalar.
Tensor tvd_forward_cpu(const Tensor& p, const Tensor& q, const Tensor& labels,
                       const Tensor& grad, TvdReduction r, int64_t ignore_index);
Tensor tvd_forward_cuda(const Tensor& p, const Tensor& q, const Tensor& labels,
                        const Tensor& grad, TvdReduction r, int64_t ignore_index);
// dst = src * grad_loss (a scalar or one value per element); dst may be src, and then a
// grad_loss of 1 leaves it untouched (CUDA: the kernel returns at once).
void tvd_scale_grad_cuda(const Tensor& src, const Tensor& dst, const Tensor& grad_loss);

// The registered internal ops.
std::tuple<Tensor, Tensor> tvd_forward_impl(Tensor p, Tensor q,
                                            std::optional<Tensor> shift_labels,
                                            std::string reduction, int64_t ignore_index,
                                            bool compute_grad);
Tensor tvd_backward_impl(Tensor grad, Tensor grad_loss);
void tvd_backward_inplace_impl(Tensor grad, Tensor grad_loss);

}  // namespace fk::ops
