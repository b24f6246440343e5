// Schemas of fk::fused_linear_cross_entropy and its internal forward, the shared checks
// and the chunk size.
#include "ops/fused_linear_cross_entropy/fused_linear_cross_entropy.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

CeOptions check_fused_linear_cross_entropy(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, std::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype) {
  constexpr const char* op = "fk::fused_linear_cross_entropy";
  TORCH_CHECK(x.dim() == 2, op, ": x must have shape (N, H), got ", x.sym_sizes());
  checks::check_pair(op, "x", x, "weight", weight);
  TORCH_CHECK(weight.dim() == 2 && weight.sym_size(1) == x.sym_size(1), op,
              ": weight must have shape (V, ", x.sym_size(1), ") to match x, got ",
              weight.sym_sizes());
  TORCH_CHECK(weight.sym_size(0) >= 1, op, ": weight must have at least one class (row), got "
              "shape ", weight.sym_sizes());
  if (bias.has_value() && bias->defined()) {
    checks::check_pair(op, "x", x, "bias", *bias);
    TORCH_CHECK(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), op,
                ": bias must have shape (", weight.sym_size(0), ",), got ", bias->sym_sizes());
  }
  TORCH_CHECK(!chunk_size.has_value() || *chunk_size >= 1, op,
              ": chunk_size must be positive, got ", chunk_size.value_or(0));
  TORCH_CHECK(!accum_dtype.has_value() || *accum_dtype == at::kFloat ||
                  *accum_dtype == weight.scalar_type(),
              op, ": accum_dtype must be None, torch.float32 or the weight's dtype, got ",
              accum_dtype.value_or(at::kFloat));
  return check_ce_target_and_options(op, "x", x, x.sym_size(0), weight.sym_size(0), target,
                                     ce_weight, "ce_weight", ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
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

FlceResult fused_linear_cross_entropy_forward_call(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, std::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype, std::array<bool, 3> grad_mask,
    const std::optional<at::Tensor>& grad_rows) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_fused_linear_cross_entropy_forward", "")
                       .typed<FlceResult(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           int64_t, double, c10::string_view, double, std::optional<double>,
                           std::optional<int64_t>, std::optional<at::ScalarType>,
                           std::array<bool, 3>, const std::optional<at::Tensor>&)>();
  return op.call(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
                 lse_square_scale, softcap, chunk_size, accum_dtype, grad_mask, grad_rows);
}

}  // namespace fk::ops

at::Tensor fk::fused_linear_cross_entropy(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, const std::string& reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::fused_linear_cross_entropy", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           int64_t, double, c10::string_view, double, std::optional<double>,
                           std::optional<int64_t>, std::optional<at::ScalarType>)>();
  return std::get<0>(op.call(x, weight, target, bias, ce_weight, ignore_index, label_smoothing,
                             reduction, lse_square_scale, softcap, chunk_size, accum_dtype));
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (loss, z_loss) of fk::cross_entropy(x @ weight^T + bias, target, ce_weight, ...) with x
  // (N, H), weight (V, H), bias (V,), computed chunk_size rows at a time (chosen from the
  // shapes when None); accum_dtype: the dtype grad_weight / grad_bias are summed in
  // (default: the weight's). See python/fk/ops/fused_linear_cross_entropy.py.
  m.def("fused_linear_cross_entropy(Tensor x, Tensor weight, Tensor target, Tensor? bias=None, "
        "Tensor? ce_weight=None, int ignore_index=-100, float label_smoothing=0.0, "
        "str reduction='mean', float lse_square_scale=0.0, float? softcap=None, "
        "int? chunk_size=None, ScalarType? accum_dtype=None) -> (Tensor, Tensor)");
  // (loss, z_loss, grad_x, grad_weight, grad_bias): the gradients where grad_mask (x,
  // weight, bias) asks, for a grad_output of 1, or of grad_rows (N,) applied to each row
  // of the logits' gradient before the products; undefined elsewhere.
  m.def("_fused_linear_cross_entropy_forward(Tensor x, Tensor weight, Tensor target, "
        "Tensor? bias, Tensor? ce_weight, int ignore_index, float label_smoothing, "
        "str reduction, float lse_square_scale, float? softcap, int? chunk_size, "
        "ScalarType? accum_dtype, bool[3] grad_mask, Tensor? grad_rows) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

namespace fk::ops {
namespace {

// fused_linear_cross_entropy without autograd: the losses only.
std::tuple<at::Tensor, at::Tensor> fused_linear_cross_entropy_composite(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& ce_weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, std::optional<int64_t> chunk_size,
    std::optional<at::ScalarType> accum_dtype) {
  auto r = fused_linear_cross_entropy_forward_call(
      x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
      lse_square_scale, softcap, chunk_size, accum_dtype, {false, false, false}, std::nullopt);
  return {std::get<0>(r), std::get<1>(r)};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("fused_linear_cross_entropy", fk::ops::fused_linear_cross_entropy_composite);
}
