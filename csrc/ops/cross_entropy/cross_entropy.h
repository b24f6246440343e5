// fk::cross_entropy: cross entropy over (N, V) logits with torch's class weights,
// ignore_index, label smoothing and reductions, plus z-loss and softcap; the gradient is
// computed in the forward pass (into the logits' own memory, or a new buffer).
//
// The pieces below the dispatcher (denominators, per-row kernel, gradient scaling) are
// exported for ops built on cross entropy (fused_linear_cross_entropy): each dispatches
// on the tensors' device to the CUDA kernels (triton_src/cross_entropy.py) or the CPU
// reference.
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "runtime/tensor.h"

namespace fk::ops {

// Values as the Triton kernels take them (triton_src/cross_entropy.py REDUCTION_*).
enum class CeReduction : int { None = 0, Mean = 1, Sum = 2 };

// Parses "none" / "mean" / "sum"; anything else is an error naming `op`.
CeReduction parse_ce_reduction(const char* op, const std::string& reduction);

// The options every piece takes.
struct CeOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  CeReduction reduction = CeReduction::Mean;
  double lse_square_scale = 0.0;
  std::optional<double> softcap;
  // Each row's loss, z-loss and gradient times p_y = softmax(logits)_y, a constant of the
  // gradient (Liger Kernel's token scaling; fused_linear_cross_entropy's use_token_scaling).
  bool token_scaling = false;
};

// The predicted token of an ignored row (triton_src/cross_entropy.py IGNORED_PREDICTION).
constexpr int64_t kCeIgnoredPrediction = -100;

// Shared by every backend: logits (N, V) floating with V >= 1; target (N,) int64 on the
// same device; weight (V,) floating on the same device; label_smoothing in [0, 1];
// softcap > 0. Returns the parsed options. `op` names the caller in the messages.
// python/fk/ops/cross_entropy.py raises the same messages from the fake kernels.
CeOptions check_cross_entropy(const char* op, const Tensor& logits, const Tensor& target,
                              const std::optional<Tensor>& weight, int64_t ignore_index,
                              double label_smoothing, const std::string& reduction,
                              double lse_square_scale, std::optional<double> softcap);
// The target / class-weight / option half of the checks, for n rows of v classes, devices
// compared with `like` (named like_name); check_cross_entropy and fused linear cross
// entropy use it.
CeOptions check_ce_target_and_options(const char* op, const char* like_name, const Tensor& like,
                                      int64_t n, int64_t v, const Tensor& target,
                                      const std::optional<Tensor>& weight,
                                      const char* weight_name, int64_t ignore_index,
                                      double label_smoothing, const std::string& reduction,
                                      double lse_square_scale, std::optional<double> softcap);
// mean_denominator (optional): one element (any shape of numel 1), float32, float64,
// bfloat16, float16, int64 or int32, on logits' device, given with reduction "mean" only.
void check_mean_denominator(const char* op, const Tensor& like,
                            const std::optional<Tensor>& mean_denominator, CeReduction reduction);
// grad (N, V) floating; grad_loss a float32 (float64 for float64 grad) scalar or (N,).
void check_cross_entropy_backward(const char* op, const Tensor& grad, const Tensor& grad_loss);

// Loss dtype of the internal ops: float64 for float64 logits (CPU), else float32.
ScalarType ce_loss_dtype(const Tensor& logits);

// The dtype the public ops return their losses in: loss_dtype, or `like`'s dtype when
// unset; loss_dtype must be float32, float64, bfloat16 or float16 (an error naming `op`).
ScalarType ce_output_dtype(const char* op, const Tensor& like,
                           std::optional<ScalarType> loss_dtype);

// Raises unless every target is ignore_index or a class in [0, V) (target contiguous, one
// or more rows). CPU: an error naming `op`, the first bad target, its row and V. CUDA: no
// host synchronisation: aten::_assert_async on the device (a device-side assert, with a
// message of the same form without the value); for a "mean" with `den` defined (the
// denominators cross_entropy_den made from the targets) it reads den (NaN exactly when some
// target is out of range), else it compares the targets.
void check_targets_in_range(const char* op, const Tensor& target, int64_t V,
                            int64_t ignore_index, const Tensor& den, CeReduction reduction);

// --- the pieces (no dispatcher, no autograd) -------------------------------------------

// The (2,) tensor on target's device that cross_entropy_rows scales the loss and gradient
// by: for a mean, [sum of w_y over non-ignored rows (their count without weights), their
// count], where a non-ignored target outside [0, V) makes both NaN; for sum / none, ones.
Tensor cross_entropy_den(const Tensor& target, const Tensor& weight, int64_t V,
                         int64_t ignore_index, ScalarType dtype, CeReduction reduction);

// The denominators pair [m, m] (dtype) from a given mean denominator m (one element):
// device operations only (no host synchronisation).
Tensor cross_entropy_den_given(const Tensor& mean_denominator, ScalarType dtype);

// Per-row loss and z-loss of contiguous (M, V) `logits` into loss_rows / z_rows (M,),
// scaled by the denominators `den` (cross_entropy_den's). With `grad` defined, also the
// gradient of each row's loss, written into grad (M, V), which may be `logits` itself.
// With `pred` defined (M,) int64, also each row's argmax over the (softcapped) logits, the
// first maximum as torch.argmax (kCeIgnoredPrediction for an ignored row).
// With `lse_rows` defined (M,) in the loss dtype, also each row's logsumexp of the
// (softcapped) logits (0 for an ignored row), for cross_entropy_rows_backward.
// `weight` is the class weights in the loss dtype (float32 on CUDA) or undefined.
void cross_entropy_rows(const Tensor& logits, const Tensor& grad, const Tensor& target,
                        const Tensor& weight, const Tensor& den, const Tensor& loss_rows,
                        const Tensor& z_rows, const Tensor& pred, const CeOptions& o,
                        const Tensor& lse_rows = Tensor());

// The gradient cross_entropy_rows writes, times grad_loss (a scalar, or one value per row),
// computed from the (M, V) contiguous logits, each row's lse (cross_entropy_rows' lse_rows)
// and den in one pass: written into grad (M, V) contiguous, which may be `logits` itself.
// Token scaling is not supported here.
void cross_entropy_rows_backward(const Tensor& logits, const Tensor& grad, const Tensor& target,
                                 const Tensor& weight, const Tensor& den, const Tensor& lse,
                                 const Tensor& grad_loss, const CeOptions& o);

// dst = src * grad_loss (a scalar, or one value per row), src and dst (M, V) contiguous;
// dst may be src, and then a grad_loss of 1 leaves it untouched without reading it (CUDA).
void cross_entropy_scale(const Tensor& src, const Tensor& dst, const Tensor& grad_loss);

// The reductions of per-row values: (loss, z_loss) as the op returns them.
std::tuple<Tensor, Tensor> cross_entropy_reduce(const Tensor& loss_rows, const Tensor& z_rows,
                                                CeReduction reduction);

// Token accuracy (float32) from the rows' predictions (cross_entropy_rows' pred): for
// "none", per row 1 where the prediction is the target and 0 elsewhere (ignored rows 0);
// else the fraction of non-ignored rows predicted right (NaN when there are none, as the
// mean loss). On the device, no host synchronisation.
Tensor cross_entropy_accuracy(const Tensor& pred, const Tensor& target, int64_t ignore_index,
                              CeReduction reduction);

// Device-specific halves of the pieces above (cross_entropy_cpu.cpp / _cuda.cpp).
Tensor cross_entropy_den_cpu(const Tensor& target, const Tensor& weight, int64_t V,
                             int64_t ignore_index, ScalarType dtype);
void cross_entropy_rows_cpu(const Tensor& logits, const Tensor& grad, const Tensor& target,
                            const Tensor& weight, const Tensor& den, const Tensor& loss_rows,
                            const Tensor& z_rows, const Tensor& pred, const CeOptions& o,
                            const Tensor& lse_rows);
void cross_entropy_rows_backward_cpu(const Tensor& logits, const Tensor& grad,
                                     const Tensor& target, const Tensor& weight,
                                     const Tensor& den, const Tensor& lse,
                                     const Tensor& grad_loss, const CeOptions& o);
Tensor cross_entropy_den_cuda(const Tensor& target, const Tensor& weight, int64_t V,
                              int64_t ignore_index);
void cross_entropy_rows_cuda(const Tensor& logits, const Tensor& grad, const Tensor& target,
                             const Tensor& weight, const Tensor& den, const Tensor& loss_rows,
                             const Tensor& z_rows, const Tensor& pred, const CeOptions& o,
                             const Tensor& lse_rows);
void cross_entropy_rows_backward_cuda(const Tensor& logits, const Tensor& grad,
                                      const Tensor& target, const Tensor& weight,
                                      const Tensor& den, const Tensor& lse,
                                      const Tensor& grad_loss, const CeOptions& o);
void cross_entropy_scale_cuda(const Tensor& src, const Tensor& dst, const Tensor& grad_loss);

// --- the registered internal ops (the CPU and CUDA backends register these) -------------

// (loss, z_loss, grad, token_accuracy, predicted_tokens); the last two only with extras.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> cross_entropy_forward_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool compute_grad, bool extras,
    std::optional<Tensor> mean_denominator);
std::tuple<Tensor, Tensor, Tensor, Tensor> cross_entropy_forward_inplace_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool extras, std::optional<Tensor> mean_denominator);
Tensor cross_entropy_backward_impl(Tensor grad, Tensor grad_loss);
void cross_entropy_backward_inplace_impl(Tensor grad, Tensor grad_loss);
// The deferred form: (loss, z_loss, lse, den, token_accuracy, predicted_tokens), and the
// backward computing the gradient from the logits, lse and den (new / in the logits).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cross_entropy_deferred_forward_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool extras, std::optional<Tensor> mean_denominator);
Tensor cross_entropy_deferred_backward_impl(Tensor logits, Tensor target,
                                            std::optional<Tensor> weight, Tensor lse, Tensor den,
                                            Tensor grad_loss, int64_t ignore_index,
                                            double label_smoothing, double lse_square_scale,
                                            std::optional<double> softcap);
void cross_entropy_deferred_backward_inplace_impl(Tensor logits, Tensor target,
                                                  std::optional<Tensor> weight, Tensor lse,
                                                  Tensor den, Tensor grad_loss,
                                                  int64_t ignore_index, double label_smoothing,
                                                  double lse_square_scale,
                                                  std::optional<double> softcap);

}  // namespace fk::ops
