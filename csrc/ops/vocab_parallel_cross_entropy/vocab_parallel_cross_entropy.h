// fk::_vocab_parallel_cross_entropy_*: the local halves of cross entropy over a vocabulary
// split across ranks (Megatron's layout: this rank holds the logits' classes
// [vocab_start, vocab_start + V_loc) of vocab_size; targets are global class ids). No
// communication here: python/fk/ops/vocab_parallel_cross_entropy.py gathers the per-row
// statistics of every rank between the two ops. The formulas: the docstring of
// triton_src/vocab_parallel_cross_entropy.py.
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "ops/cross_entropy/cross_entropy.h"
#include "runtime/tensor.h"

namespace fk::ops {

constexpr int64_t kVpStats = 6;  // m, d, x_y, w_y, sx, sw (triton_src NSTATS)

struct VpOptions {
  int64_t vocab_start = 0;
  int64_t vocab_size = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double lse_square_scale = 0.0;
  std::optional<double> softcap;
};

// Shared by every backend: logits (N, V_loc) floating, V_loc >= 1; target (N,) int64 on the
// same device; weight (V_loc,) floating (this shard's class weights); 0 <= vocab_start and
// vocab_start + V_loc <= vocab_size; label_smoothing in [0, 1]; softcap > 0.
// python/fk/ops/vocab_parallel_cross_entropy.py raises the same messages.
VpOptions check_vocab_parallel_cross_entropy(const char* op, const Tensor& logits,
                                             const Tensor& target,
                                             const std::optional<Tensor>& weight,
                                             int64_t vocab_start, int64_t vocab_size,
                                             int64_t ignore_index, double label_smoothing,
                                             double lse_square_scale,
                                             std::optional<double> softcap);
// The loss op's extra inputs: stats (W, 6, N) and den (2,) of the loss dtype; grad_scale of
// the loss dtype, a scalar or (N,).
void check_vocab_parallel_stats(const char* op, const Tensor& logits, const Tensor& stats,
                                const Tensor& den, const std::optional<Tensor>& grad_scale);

// Device halves (x, target, weight contiguous; weight in the loss dtype or undefined).
void vp_ce_stats_cpu(const Tensor& x, const Tensor& target, const Tensor& weight,
                     const Tensor& stats, const VpOptions& o);
void vp_ce_stats_cuda(const Tensor& x, const Tensor& target, const Tensor& weight,
                      const Tensor& stats, const VpOptions& o);
// grad undefined: losses only; grad may be x itself. scale undefined: grad_output 1.
void vp_ce_loss_cpu(const Tensor& x, const Tensor& grad, const Tensor& target,
                    const Tensor& weight, const Tensor& stats, const Tensor& den,
                    const Tensor& scale, const Tensor& loss_rows, const Tensor& z_rows,
                    const VpOptions& o);
void vp_ce_loss_cuda(const Tensor& x, const Tensor& grad, const Tensor& target,
                     const Tensor& weight, const Tensor& stats, const Tensor& den,
                     const Tensor& scale, const Tensor& loss_rows, const Tensor& z_rows,
                     const VpOptions& o);

// The registered ops (CPU and CUDA).
Tensor vp_ce_stats_impl(Tensor logits, Tensor target, std::optional<Tensor> weight,
                        int64_t vocab_start, int64_t vocab_size, int64_t ignore_index,
                        double label_smoothing, std::optional<double> softcap);
std::tuple<Tensor, Tensor, Tensor> vp_ce_loss_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, Tensor stats, Tensor den,
    std::optional<Tensor> grad_scale, int64_t vocab_start, int64_t vocab_size,
    int64_t ignore_index, double label_smoothing, double lse_square_scale,
    std::optional<double> softcap, bool compute_grad);
std::tuple<Tensor, Tensor> vp_ce_loss_inplace_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, Tensor stats, Tensor den,
    std::optional<Tensor> grad_scale, int64_t vocab_start, int64_t vocab_size,
    int64_t ignore_index, double label_smoothing, double lse_square_scale,
    std::optional<double> softcap);

}  // namespace fk::ops
