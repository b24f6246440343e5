// Schemas of fk::fused_linear_cross_entropy and its internal forward, the shared checks
// and the chunk size. Fake kernel and the autograd kernel:
// python/fk/ops/fused_linear_cross_entropy.py.
#include "ops/fused_linear_cross_entropy/fused_linear_cross_entropy.h"

#include <algorithm>
#include <array>

#include "runtime/checks.h"

namespace fk::ops {

CeOptions check_fused_linear_cross_entropy(
    const Tensor& x, const Tensor& weight, const Tensor& target,
    const std::optional<Tensor>& bias, const std::optional<Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, const std::string& reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<ScalarType> accum_dtype) {
  constexpr const char* op = "fk::fused_linear_cross_entropy";
  FK_CHECK(x.dim() == 2, op, ": x must have shape (N, H), got ", shape_of(x));
  checks::check_pair(op, "x", x, "weight", weight);
  FK_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), op,
           ": weight must have shape (V, ", x.size(1), ") to match x, got ", shape_of(weight));
  FK_CHECK(weight.size(0) >= 1, op, ": weight must have at least one class (row), got shape ",
           shape_of(weight));
  if (has(bias)) {
    checks::check_pair(op, "x", x, "bias", *bias);
    FK_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op,
             ": bias must have shape (", weight.size(0), ",), got ", shape_of(*bias));
  }
  FK_CHECK(!chunk_size.has_value() || *chunk_size >= 1, op,
           ": chunk_size must be positive, got ", chunk_size.value_or(0));
  FK_CHECK(!accum_dtype.has_value() || *accum_dtype == kFloat ||
               *accum_dtype == weight.scalar_type(),
           op, ": accum_dtype must be None, torch.float32 or the weight's dtype, got ",
           accum_dtype.value_or(kFloat));
  return check_ce_target_and_options(op, "x", x, x.size(0), weight.size(0), target, ce_weight,
                                     "ce_weight", ignore_index, label_smoothing, reduction,
                                     lse_square_scale, softcap);
}

int64_t flce_chunk_rows(int64_t n, int64_t h, int64_t v, std::optional<int64_t> chunk_size) {
  if (chunk_size.has_value()) return std::max<int64_t>(1, std::min(*chunk_size, n));
  // Logits of a chunk about the size of x keep the transient memory at x's (Liger Kernel's
  // rule); at least kFlceMinChunkRows rows keep the matmuls compute-bound: each chunk
  // reads and writes all of grad_weight once, which a grad_weight product over fewer rows
  // does not hide (at 4.2 TB/s and about 700 TFLOP/s the break-even is about 330 rows in
  // bf16), and grad_x's product over a short chunk has few output tiles.
  const int64_t rows = std::max(n * h / std::max<int64_t>(v, 1), kFlceMinChunkRows) / 128 * 128;
  return std::max<int64_t>(1, std::min(rows, n));
}

namespace {

// fused_linear_cross_entropy below autograd (no gradient wanted, or inference): the outputs
// without gradients. The autograd kernel is python/fk/ops/fused_linear_cross_entropy.py.
std::tuple<Tensor, Tensor, Tensor, Tensor> fused_linear_cross_entropy_composite(
    Tensor x, Tensor weight, Tensor target, std::optional<Tensor> bias,
    std::optional<Tensor> ce_weight, int64_t ignore_index, double label_smoothing,
    std::string reduction, double lse_square_scale, std::optional<double> softcap,
    std::optional<int64_t> chunk_size, std::optional<ScalarType> accum_dtype,
    std::optional<ScalarType> loss_dtype, bool use_token_scaling, bool return_token_accuracy,
    bool return_predicted_tokens) {
  check_fused_linear_cross_entropy(x, weight, target, bias, ce_weight, ignore_index,
                                   label_smoothing, reduction, lse_square_scale, softcap,
                                   chunk_size, accum_dtype);
  const auto out = ce_output_dtype("fk::fused_linear_cross_entropy", x, loss_dtype);
  const std::array<bool, 3> no_grad{false, false, false};
  auto r = aten::call_n<7>("fk::_fused_linear_cross_entropy_forward", "", x, weight, target,
                           bias, ce_weight, ignore_index, label_smoothing, reduction,
                           lse_square_scale, softcap, chunk_size, accum_dtype,
                           torch::headeronly::HeaderOnlyArrayRef<bool>(no_grad.data(), 3),
                           std::optional<Tensor>(), use_token_scaling,
                           return_token_accuracy || return_predicted_tokens);
  return {aten::to(r[0], out), aten::to(r[1], out),
          return_token_accuracy ? r[5] : Tensor(), return_predicted_tokens ? r[6] : Tensor()};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (loss, z_loss) of fk::cross_entropy(x @ weight^T + bias, target, ce_weight, ...) with x
  // (N, H), weight (V, H), bias (V,), computed chunk_size rows at a time (chosen from the
  // shapes when None); accum_dtype: the dtype grad_weight / grad_bias are summed in
  // (default: the weight's); the losses are computed in float32 (float64 for float64 x) and
  // returned in loss_dtype (None: x's dtype, as torch's linear + cross_entropy).
  // use_token_scaling: each row's loss (z-loss included) times its predicted probability
  // of the target, softmax(logits)_target, taken as a constant (Liger Kernel's token
  // scaling). Returns (loss, z_loss, token_accuracy, predicted_tokens), the last two as
  // fk::cross_entropy returns them (None unless asked for). See
  // python/fk/ops/fused_linear_cross_entropy.py.
  m.def("fused_linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, "
        "Tensor? ce_weight=None, int ignore_index=-100, float label_smoothing=0.0, "
        "str reduction='mean', float lse_square_scale=0.0, float? softcap=None, "
        "int? chunk_size=None, ScalarType? accum_dtype=None, ScalarType? loss_dtype=None, "
        "bool use_token_scaling=False, bool return_token_accuracy=False, "
        "bool return_predicted_tokens=False) -> (Tensor, Tensor, Tensor, Tensor)");
  // (loss, z_loss, grad_x, grad_weight, grad_bias, token_accuracy, predicted_tokens): the
  // gradients where grad_mask (x, weight, bias) asks, for a grad_output of 1, or of
  // grad_rows (N,) applied to each row of the logits' gradient before the products; None
  // elsewhere; the last two only with extras.
  m.def("_fused_linear_cross_entropy_forward(Tensor x, Tensor weight, Tensor target, "
        "Tensor? bias, Tensor? ce_weight, int ignore_index, float label_smoothing, "
        "str reduction, float lse_square_scale, float? softcap, int? chunk_size, "
        "ScalarType? accum_dtype, bool[3] grad_mask, Tensor? grad_rows, "
        "bool use_token_scaling, bool extras) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("fused_linear_cross_entropy",
         TORCH_BOX(&fk::ops::fused_linear_cross_entropy_composite));
}
