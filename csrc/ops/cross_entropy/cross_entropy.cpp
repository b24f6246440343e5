// Schemas of fk::cross_entropy and its internal ops, the shared checks, and the forward /
// backward drivers every backend but Meta registers (they call the device pieces).
#include "ops/cross_entropy/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <limits>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

CeReduction parse_ce_reduction(const char* op, std::string_view reduction) {
  if (reduction == "mean") return CeReduction::Mean;
  if (reduction == "sum") return CeReduction::Sum;
  if (reduction == "none") return CeReduction::None;
  TORCH_CHECK(false, op, ": reduction must be one of 'mean', 'sum', 'none', got '", reduction,
              "'");
}

CeOptions check_ce_target_and_options(const char* op, const char* like_name,
                                      const at::Tensor& like, const c10::SymInt& n,
                                      const c10::SymInt& v, const at::Tensor& target,
                                      const std::optional<at::Tensor>& weight,
                                      const char* weight_name, int64_t ignore_index,
                                      double label_smoothing, std::string_view reduction,
                                      double lse_square_scale, std::optional<double> softcap) {
  checks::check_same_device(op, like_name, like, "target", target);
  TORCH_CHECK(target.scalar_type() == at::kLong, op,
              ": target must be int64 (class indices), got ", target.scalar_type());
  TORCH_CHECK(target.dim() == 1 && target.sym_size(0) == n, op, ": target must have shape (", n,
              ",) to match ", like_name, ", got ", target.sym_sizes());
  if (weight.has_value() && weight->defined()) {
    checks::check_same_device(op, like_name, like, weight_name, *weight);
    checks::check_float(op, weight_name, *weight);
    TORCH_CHECK(weight->dim() == 1 && weight->sym_size(0) == v, op, ": ", weight_name,
                " must have shape (", v, ",) (one per class), got ", weight->sym_sizes());
  }
  TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
              ": label_smoothing must be in [0, 1], got ", label_smoothing);
  TORCH_CHECK(!softcap.has_value() || *softcap > 0.0, op, ": softcap must be positive, got ",
              softcap.value_or(0.0));
  return CeOptions{ignore_index, label_smoothing, parse_ce_reduction(op, reduction),
                   lse_square_scale, softcap};
}

CeOptions check_cross_entropy(const char* op, const at::Tensor& logits, const at::Tensor& target,
                              const std::optional<at::Tensor>& weight, int64_t ignore_index,
                              double label_smoothing, std::string_view reduction,
                              double lse_square_scale, std::optional<double> softcap) {
  TORCH_CHECK(logits.dim() == 2, op, ": logits must have shape (N, V), got ", logits.sym_sizes());
  checks::check_float(op, "logits", logits);
  TORCH_CHECK(logits.sym_size(1) >= 1, op, ": logits must have at least one class, got shape ",
              logits.sym_sizes());
  return check_ce_target_and_options(op, "logits", logits, logits.sym_size(0),
                                     logits.sym_size(1), target, weight, "weight", ignore_index,
                                     label_smoothing, reduction, lse_square_scale, softcap);
}

void check_cross_entropy_backward(const char* op, const at::Tensor& grad,
                                  const at::Tensor& grad_loss) {
  TORCH_CHECK(grad.dim() == 2, op, ": grad must have shape (N, V), got ", grad.sym_sizes());
  checks::check_float(op, "grad", grad);
  checks::check_same_device(op, "grad", grad, "grad_loss", grad_loss);
  TORCH_CHECK(grad_loss.scalar_type() == ce_loss_dtype(grad), op, ": grad_loss must be ",
              ce_loss_dtype(grad), ", got ", grad_loss.scalar_type());
  TORCH_CHECK(grad_loss.dim() == 0 || (grad_loss.dim() == 1 &&
                                       grad_loss.sym_size(0) == grad.sym_size(0)),
              op, ": grad_loss must be a scalar or have shape (", grad.sym_size(0), ",), got ",
              grad_loss.sym_sizes());
}

at::ScalarType ce_loss_dtype(const at::Tensor& logits) { return checks::acc_type(logits); }

at::Tensor cross_entropy_den(const at::Tensor& target, const at::Tensor& weight, int64_t V,
                             int64_t ignore_index, at::ScalarType dtype, CeReduction reduction) {
  if (reduction != CeReduction::Mean) return at::ones({2}, target.options().dtype(dtype));
  if (target.is_cuda()) return cross_entropy_den_cuda(target, weight, V, ignore_index);
  return cross_entropy_den_cpu(target, weight, V, ignore_index, dtype);
}

void cross_entropy_rows(const at::Tensor& logits, const at::Tensor& grad,
                        const at::Tensor& target, const at::Tensor& weight, const at::Tensor& den,
                        const at::Tensor& loss_rows, const at::Tensor& z_rows,
                        const CeOptions& o) {
  if (logits.size(0) == 0) return;
  if (logits.is_cuda()) {
    cross_entropy_rows_cuda(logits, grad, target, weight, den, loss_rows, z_rows, o);
  } else {
    cross_entropy_rows_cpu(logits, grad, target, weight, den, loss_rows, z_rows, o);
  }
}

void cross_entropy_scale(const at::Tensor& src, const at::Tensor& dst,
                         const at::Tensor& grad_loss) {
  if (src.numel() == 0) return;
  if (src.is_cuda()) return cross_entropy_scale_cuda(src, dst, grad_loss);
  auto g = grad_loss.dim() == 0 ? grad_loss : grad_loss.view({-1, 1});
  dst.copy_(src.to(grad_loss.scalar_type()) * g);
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_reduce(const at::Tensor& loss_rows,
                                                        const at::Tensor& z_rows,
                                                        CeReduction reduction) {
  if (reduction == CeReduction::None) return {loss_rows, z_rows};
  if (reduction == CeReduction::Mean && loss_rows.numel() == 0) {
    // torch: the mean over no rows is 0 / 0.
    auto nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), loss_rows.options());
    return {nan, nan.clone()};
  }
  return {loss_rows.sum(), z_rows.sum()};
}

namespace {

// Loss rows of contiguous logits x, gradient into grad (x itself, a new buffer, or none).
std::tuple<at::Tensor, at::Tensor> run_forward(const at::Tensor& x, const at::Tensor& grad,
                                               const at::Tensor& target,
                                               const std::optional<at::Tensor>& weight,
                                               const CeOptions& o) {
  const auto dtype = ce_loss_dtype(x);
  const int64_t n = x.size(0), v = x.size(1);
  auto loss_rows = at::empty({n}, x.options().dtype(dtype));
  auto z_rows = at::empty({n}, x.options().dtype(dtype));
  if (n > 0) {
    auto t = target.contiguous();
    at::Tensor w;
    if (weight.has_value() && weight->defined()) w = weight->to(dtype).contiguous();
    const auto den = cross_entropy_den(t, w, v, o.ignore_index, dtype, o.reduction);
    cross_entropy_rows(x, grad, t, w, den, loss_rows, z_rows, o);
  }
  return cross_entropy_reduce(loss_rows, z_rows, o.reduction);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_impl(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, bool compute_grad) {
  const auto o = check_cross_entropy("fk::cross_entropy", logits, target, weight, ignore_index,
                                     label_smoothing, reduction, lse_square_scale, softcap);
  auto x = logits.contiguous();
  at::Tensor grad;
  if (compute_grad) grad = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto [loss, z] = run_forward(x, grad, target, weight, o);
  return {loss, z, grad};
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward_inplace_impl(
    at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap) {
  constexpr const char* op = "fk::_cross_entropy_forward_";
  const auto o = check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
  TORCH_CHECK(logits.is_contiguous(), op, ": logits must be contiguous");
  return run_forward(logits, logits, target, weight, o);
}

at::Tensor cross_entropy_backward_impl(const at::Tensor& grad, const at::Tensor& grad_loss) {
  check_cross_entropy_backward("fk::_cross_entropy_backward", grad, grad_loss);
  auto src = grad.contiguous();
  auto out = at::empty_like(src, at::MemoryFormat::Contiguous);
  cross_entropy_scale(src, out, grad_loss.contiguous());
  return out;
}

void cross_entropy_backward_inplace_impl(at::Tensor& grad, const at::Tensor& grad_loss) {
  constexpr const char* op = "fk::_cross_entropy_backward_";
  check_cross_entropy_backward(op, grad, grad_loss);
  TORCH_CHECK(grad.is_contiguous(), op, ": grad must be contiguous");
  cross_entropy_scale(grad, grad, grad_loss.contiguous());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_forward_call(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, std::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, bool compute_grad) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_cross_entropy_forward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                           int64_t, double, c10::string_view, double, std::optional<double>,
                           bool)>();
  return op.call(logits, target, weight, ignore_index, label_smoothing, reduction,
                 lse_square_scale, softcap, compute_grad);
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward_inplace_call(
    at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, std::string_view reduction,
    double lse_square_scale, std::optional<double> softcap) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_cross_entropy_forward_", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                           int64_t, double, c10::string_view, double, std::optional<double>)>();
  return op.call(logits, target, weight, ignore_index, label_smoothing, reduction,
                 lse_square_scale, softcap);
}

at::Tensor cross_entropy_backward_call(const at::Tensor& grad, const at::Tensor& grad_loss) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_cross_entropy_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, grad_loss);
}

void cross_entropy_backward_inplace_call(at::Tensor& grad, const at::Tensor& grad_loss) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_cross_entropy_backward_", "")
                       .typed<void(at::Tensor&, const at::Tensor&)>();
  op.call(grad, grad_loss);
}

}  // namespace fk::ops

at::Tensor fk::cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                             const std::optional<at::Tensor>& weight, int64_t ignore_index,
                             double label_smoothing, const std::string& reduction,
                             double lse_square_scale, std::optional<double> softcap,
                             bool grad_in_logits) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::cross_entropy", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                           int64_t, double, c10::string_view, double, std::optional<double>,
                           bool)>();
  return std::get<0>(op.call(logits, target, weight, ignore_index, label_smoothing, reduction,
                             lse_square_scale, softcap, grad_in_logits));
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (loss, z_loss) of torch.nn.functional.cross_entropy(logits, target, weight, ignore_index,
  // label_smoothing, reduction) plus lse_square_scale * logsumexp^2 per row (z-loss), with
  // logits -> softcap * tanh(logits / softcap) first. logits (N, V); target (N,) int64.
  // Losses are float32 (float64 for float64 logits). With grad_in_logits the gradient is
  // written into the logits' memory during the forward (see python/fk/ops/cross_entropy.py).
  m.def("cross_entropy(Tensor logits, Tensor target, Tensor? weight=None, int ignore_index=-100, "
        "float label_smoothing=0.0, str reduction='mean', float lse_square_scale=0.0, "
        "float? softcap=None, bool grad_in_logits=True) -> (Tensor, Tensor)");
  // (loss, z_loss, grad): grad is the gradient of loss with respect to logits for a
  // grad_output of 1 (a new (N, V) tensor of logits' dtype), undefined unless compute_grad.
  m.def("_cross_entropy_forward(Tensor logits, Tensor target, Tensor? weight, int ignore_index, "
        "float label_smoothing, str reduction, float lse_square_scale, float? softcap, "
        "bool compute_grad) -> (Tensor, Tensor, Tensor)");
  // The same with the gradient written into logits (contiguous).
  m.def("_cross_entropy_forward_(Tensor(a!) logits, Tensor target, Tensor? weight, "
        "int ignore_index, float label_smoothing, str reduction, float lse_square_scale, "
        "float? softcap) -> (Tensor, Tensor)");
  // grad * grad_loss (a scalar, or (N,) for reduction 'none', scaling each row).
  m.def("_cross_entropy_backward(Tensor grad, Tensor grad_loss) -> Tensor");
  // The same in place (grad contiguous); a no-op where grad_loss is 1.
  m.def("_cross_entropy_backward_(Tensor(a!) grad, Tensor grad_loss) -> ()");
}

namespace fk::ops {
namespace {

// cross_entropy without autograd: the losses of _cross_entropy_forward, no gradient.
std::tuple<at::Tensor, at::Tensor> cross_entropy_composite(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, bool) {
  auto [loss, z, grad] = cross_entropy_forward_call(logits, target, weight, ignore_index,
                                                    label_smoothing, reduction, lse_square_scale,
                                                    softcap, false);
  return {loss, z};
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("cross_entropy", fk::ops::cross_entropy_composite);
}
