// fk::jsd: the generalized Jensen-Shannon divergence of Liger Kernel between (BT, V) rows of
// student log-probabilities (input) and teacher log-probabilities (target), averaged over
// the rows whose shift label is not ignore_index; the gradient with respect to the input is
// computed in the forward pass. CUDA kernels: triton_src/jsd.py.
#pragma once

#include <optional>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: input (BT, V) floating; target of input's device, dtype and
// shape; shift_labels (BT,) int64 on input's device; beta in [0, 1]. `op` names the caller
// in the messages; python/fk/ops/jsd.py raises the same messages from the fake kernels.
void check_jsd(const char* op, const Tensor& input, const Tensor& target,
               const std::optional<Tensor>& shift_labels, double beta);

// Which formula the kernels use: 0 < beta < 1, beta == 0 (forward KL), beta == 1 (reverse
// KL); triton_src/jsd.py's `mode`.
enum class JsdMode : int { General = 0, Forward = 1, Reverse = 2 };
JsdMode jsd_mode(double beta);

// The loss (0-dim, input's dtype) of contiguous (BT, V) x and y, BT * V > 0; with `grad`
// defined (contiguous, x's dtype and shape) also the gradient with respect to x.
Tensor jsd_cpu(const Tensor& x, const Tensor& y, const std::optional<Tensor>& labels,
               double beta, int64_t ignore_index, const Tensor& grad);
Tensor jsd_cuda(const Tensor& x, const Tensor& y, const std::optional<Tensor>& labels,
                double beta, int64_t ignore_index, const Tensor& grad);

// fk::_jsd_forward: (loss, grad), grad undefined unless compute_grad.
std::tuple<Tensor, Tensor> jsd_forward_impl(Tensor input, Tensor target,
                                            std::optional<Tensor> shift_labels, double beta,
                                            int64_t ignore_index, bool compute_grad);

}  // namespace fk::ops
