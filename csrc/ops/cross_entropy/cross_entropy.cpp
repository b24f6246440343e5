// Schemas of fk::cross_entropy and its internal ops, the shared checks, and the forward /
// backward drivers the CPU and CUDA backends register (they call the device pieces).
// Fake kernels and the autograd kernel: python/fk/ops/cross_entropy.py.
#include "ops/cross_entropy/cross_entropy.h"

#include <limits>

#include "runtime/checks.h"

namespace fk::ops {

CeReduction parse_ce_reduction(const char* op, const std::string& reduction) {
  if (reduction == "mean") return CeReduction::Mean;
  if (reduction == "sum") return CeReduction::Sum;
  if (reduction == "none") return CeReduction::None;
  fail(str(op, ": reduction must be one of 'mean', 'sum', 'none', got '", reduction, "'"));
}

CeOptions check_ce_target_and_options(const char* op, const char* like_name, const Tensor& like,
                                      int64_t n, int64_t v, const Tensor& target,
                                      const std::optional<Tensor>& weight,
                                      const char* weight_name, int64_t ignore_index,
                                      double label_smoothing, const std::string& reduction,
                                      double lse_square_scale, std::optional<double> softcap) {
  checks::check_same_device(op, like_name, like, "target", target);
  FK_CHECK(target.scalar_type() == kLong, op, ": target must be int64 (class indices), got ",
           target.scalar_type());
  FK_CHECK(target.dim() == 1 && target.size(0) == n, op, ": target must have shape (", n,
           ",) to match ", like_name, ", got ", shape_of(target));
  if (has(weight)) {
    checks::check_same_device(op, like_name, like, weight_name, *weight);
    checks::check_float(op, weight_name, *weight);
    FK_CHECK(weight->dim() == 1 && weight->size(0) == v, op, ": ", weight_name,
             " must have shape (", v, ",) (one per class), got ", shape_of(*weight));
  }
  FK_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
           ": label_smoothing must be in [0, 1], got ", label_smoothing);
  FK_CHECK(!softcap.has_value() || *softcap > 0.0, op, ": softcap must be positive, got ",
           softcap.value_or(0.0));
  return CeOptions{ignore_index, label_smoothing, parse_ce_reduction(op, reduction),
                   lse_square_scale, softcap};
}

CeOptions check_cross_entropy(const char* op, const Tensor& logits, const Tensor& target,
                              const std::optional<Tensor>& weight, int64_t ignore_index,
                              double label_smoothing, const std::string& reduction,
                              double lse_square_scale, std::optional<double> softcap) {
  FK_CHECK(logits.dim() == 2, op, ": logits must have shape (N, V), got ", shape_of(logits));
  checks::check_float(op, "logits", logits);
  FK_CHECK(logits.size(1) >= 1, op, ": logits must have at least one class, got shape ",
           shape_of(logits));
  return check_ce_target_and_options(op, "logits", logits, logits.size(0), logits.size(1),
                                     target, weight, "weight", ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
}

void check_mean_denominator(const char* op, const Tensor& like,
                            const std::optional<Tensor>& mean_denominator, CeReduction reduction) {
  if (!has(mean_denominator)) return;
  const Tensor& d = *mean_denominator;
  FK_CHECK(reduction == CeReduction::Mean, op,
           ": mean_denominator is only used with reduction='mean'");
  checks::check_same_device(op, "logits", like, "mean_denominator", d);
  const auto st = d.scalar_type();
  FK_CHECK(st == kFloat || st == kDouble || st == kBFloat16 || st == kHalf || st == kLong ||
               st == kInt,
           op, ": mean_denominator must be float32, float64, bfloat16, float16, int64 or int32, "
           "got ", st);
  FK_CHECK(d.numel() == 1, op, ": mean_denominator must have one element, got shape ",
           shape_of(d));
}

void check_cross_entropy_backward(const char* op, const Tensor& grad, const Tensor& grad_loss) {
  FK_CHECK(grad.dim() == 2, op, ": grad must have shape (N, V), got ", shape_of(grad));
  checks::check_float(op, "grad", grad);
  checks::check_same_device(op, "grad", grad, "grad_loss", grad_loss);
  FK_CHECK(grad_loss.scalar_type() == ce_loss_dtype(grad), op, ": grad_loss must be ",
           ce_loss_dtype(grad), ", got ", grad_loss.scalar_type());
  FK_CHECK(grad_loss.dim() == 0 || (grad_loss.dim() == 1 && grad_loss.size(0) == grad.size(0)),
           op, ": grad_loss must be a scalar or have shape (", grad.size(0), ",), got ",
           shape_of(grad_loss));
}

ScalarType ce_loss_dtype(const Tensor& logits) { return checks::acc_type(logits); }

ScalarType ce_output_dtype(const char* op, const Tensor& like,
                           std::optional<ScalarType> loss_dtype) {
  if (!loss_dtype.has_value()) return like.scalar_type();
  const auto d = *loss_dtype;
  FK_CHECK(d == kFloat || d == kDouble || d == kBFloat16 || d == kHalf, op,
           ": loss_dtype must be None, float32, float64, bfloat16 or float16, got ", d);
  return d;
}

void check_targets_in_range(const char* op, const Tensor& target, int64_t V,
                            int64_t ignore_index, const Tensor& den, CeReduction reduction) {
  const int64_t n = target.numel();
  if (n == 0) return;
  if (!target.is_cuda()) {
    const auto* y = static_cast<const int64_t*>(target.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      FK_CHECK(y[i] == ignore_index || (y[i] >= 0 && y[i] < V), op, ": target ", y[i],
               " (row ", i, ") is out of range: each target must be in [0, ", V,
               ") (V = ", V, ") or ignore_index (", ignore_index, ")");
    }
    return;
  }
  Tensor ok;
  if (reduction == CeReduction::Mean && den.defined()) {
    const auto count = aten::select(den, 0, 1);
    ok = aten::eq(count, count);  // false only for NaN
  } else {
    const auto in_range = aten::logical_and(aten::ge(target, aten::scalar_int(0)),
                                            aten::lt(target, aten::scalar_int(V)));
    const auto bad = aten::logical_and(aten::ne(target, aten::scalar_int(ignore_index)),
                                       aten::logical_not(in_range));
    ok = aten::logical_not(aten::call("aten::any", "", bad));
  }
  const std::string msg = str(op, ": a target is out of range: each target must be in [0, ", V,
                              ") (V = ", V, ") or ignore_index (", ignore_index, ")");
  aten::call_n<0>("aten::_assert_async", "msg", ok, msg);
}

Tensor cross_entropy_den(const Tensor& target, const Tensor& weight, int64_t V,
                         int64_t ignore_index, ScalarType dtype, CeReduction reduction) {
  if (reduction != CeReduction::Mean) return aten::full({2}, 1.0, dtype, target.device());
  if (target.is_cuda()) return cross_entropy_den_cuda(target, weight, V, ignore_index);
  return cross_entropy_den_cpu(target, weight, V, ignore_index, dtype);
}

Tensor cross_entropy_den_given(const Tensor& mean_denominator, ScalarType dtype) {
  return aten::contiguous(
      aten::expand(aten::reshape(aten::to(mean_denominator, dtype), {1}), {2}));
}

void cross_entropy_rows(const Tensor& logits, const Tensor& grad, const Tensor& target,
                        const Tensor& weight, const Tensor& den, const Tensor& loss_rows,
                        const Tensor& z_rows, const Tensor& pred, const CeOptions& o,
                        const Tensor& lse_rows) {
  if (logits.size(0) == 0) return;
  if (logits.is_cuda()) {
    cross_entropy_rows_cuda(logits, grad, target, weight, den, loss_rows, z_rows, pred, o,
                            lse_rows);
  } else {
    cross_entropy_rows_cpu(logits, grad, target, weight, den, loss_rows, z_rows, pred, o,
                           lse_rows);
  }
}

void cross_entropy_rows_backward(const Tensor& logits, const Tensor& grad, const Tensor& target,
                                 const Tensor& weight, const Tensor& den, const Tensor& lse,
                                 const Tensor& grad_loss, const CeOptions& o) {
  if (logits.numel() == 0) return;
  if (logits.is_cuda()) {
    cross_entropy_rows_backward_cuda(logits, grad, target, weight, den, lse, grad_loss, o);
  } else {
    cross_entropy_rows_backward_cpu(logits, grad, target, weight, den, lse, grad_loss, o);
  }
}

void cross_entropy_scale(const Tensor& src, const Tensor& dst, const Tensor& grad_loss) {
  if (src.numel() == 0) return;
  if (src.is_cuda()) return cross_entropy_scale_cuda(src, dst, grad_loss);
  auto g = grad_loss.dim() == 0 ? grad_loss : aten::view(grad_loss, {grad_loss.numel(), 1});
  aten::copy_(dst, aten::to(src, grad_loss.scalar_type()) * g);
}

std::tuple<Tensor, Tensor> cross_entropy_reduce(const Tensor& loss_rows, const Tensor& z_rows,
                                                CeReduction reduction) {
  if (reduction == CeReduction::None) return {loss_rows, z_rows};
  if (reduction == CeReduction::Mean && loss_rows.numel() == 0) {
    // torch: the mean over no rows is 0 / 0.
    auto nan = aten::full({}, std::numeric_limits<double>::quiet_NaN(),
                          loss_rows.scalar_type(), loss_rows.device());
    return {nan, aten::clone(nan)};
  }
  return {aten::sum_all(loss_rows), aten::sum_all(z_rows)};
}

Tensor cross_entropy_accuracy(const Tensor& pred, const Tensor& target, int64_t ignore_index,
                              CeReduction reduction) {
  const auto keep = aten::ne(target, aten::scalar_int(ignore_index));
  auto right = aten::to(aten::logical_and(aten::eq(pred, target), keep), kFloat);
  if (reduction == CeReduction::None) return right;
  return aten::sum_all(right) / aten::sum_all(keep, kFloat);  // 0 / 0 without rows
}

namespace {

// What run_forward returns: the op's outputs (token_accuracy and predicted_tokens only with
// extras) and the denominators the rows were scaled by (ones without rows).
struct ForwardOut {
  Tensor loss, z, accuracy, pred, den;
};

// Loss rows of contiguous logits x, gradient into grad (x itself, a new buffer, or none),
// each row's logsumexp into lse_rows where defined. A given mean_denominator replaces the
// mean's denominators (so the rows, scaled by it, are summed).
ForwardOut run_forward(const Tensor& x, const Tensor& grad, const Tensor& target,
                       const std::optional<Tensor>& weight, const CeOptions& o, bool extras,
                       const std::optional<Tensor>& mean_denominator,
                       const Tensor& lse_rows = Tensor()) {
  const auto dtype = ce_loss_dtype(x);
  const int64_t n = x.size(0), v = x.size(1);
  auto loss_rows = aten::empty({n}, dtype, x.device());
  auto z_rows = aten::empty({n}, dtype, x.device());
  Tensor pred, accuracy, den;
  if (extras) pred = aten::empty({n}, kLong, x.device());
  auto t = aten::contiguous(target);
  const bool given = has(mean_denominator);
  if (n > 0) {
    Tensor w;
    if (has(weight)) w = aten::contiguous(aten::to(*weight, dtype));
    den = given ? cross_entropy_den_given(*mean_denominator, dtype)
                : cross_entropy_den(t, w, v, o.ignore_index, dtype, o.reduction);
    check_targets_in_range("fk::cross_entropy", t, v, o.ignore_index, given ? Tensor() : den,
                           o.reduction);
    cross_entropy_rows(x, grad, t, w, den, loss_rows, z_rows, pred, o, lse_rows);
  } else {
    den = aten::full({2}, 1.0, dtype, x.device());
  }
  if (extras) accuracy = cross_entropy_accuracy(pred, t, o.ignore_index, o.reduction);
  // With a given denominator the rows are already divided by it: their sum is the mean.
  auto [loss, z] = cross_entropy_reduce(loss_rows, z_rows, given ? CeReduction::Sum : o.reduction);
  return {loss, z, accuracy, pred, den};
}

// The checks of the deferred backward's inputs (python/fk/ops/cross_entropy.py raises the
// same messages): those of the forward, lse (N,) and den (2,) in the loss dtype, grad_loss.
CeOptions check_deferred_backward(const char* op, const Tensor& logits, const Tensor& target,
                                  const std::optional<Tensor>& weight, const Tensor& lse,
                                  const Tensor& den, const Tensor& grad_loss,
                                  int64_t ignore_index, double label_smoothing,
                                  double lse_square_scale, std::optional<double> softcap) {
  auto o = check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing, "none",
                               lse_square_scale, softcap);
  const auto dtype = ce_loss_dtype(logits);
  const int64_t n = logits.size(0);
  checks::check_same_device(op, "logits", logits, "lse", lse);
  FK_CHECK(lse.scalar_type() == dtype && lse.dim() == 1 && lse.size(0) == n, op,
           ": lse must be ", dtype, " of shape (", n, ",), got ", lse.scalar_type(), " of shape ",
           shape_of(lse));
  checks::check_same_device(op, "logits", logits, "den", den);
  FK_CHECK(den.scalar_type() == dtype && den.dim() == 1 && den.size(0) == 2, op, ": den must be ",
           dtype, " of shape (2,), got ", den.scalar_type(), " of shape ", shape_of(den));
  check_cross_entropy_backward(op, logits, grad_loss);
  return o;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> cross_entropy_forward_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool compute_grad, bool extras,
    std::optional<Tensor> mean_denominator) {
  constexpr const char* op = "fk::cross_entropy";
  const auto o = check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
  check_mean_denominator(op, logits, mean_denominator, o.reduction);
  auto x = aten::contiguous(logits);
  Tensor grad;
  if (compute_grad) grad = aten::empty_like(x);
  auto r = run_forward(x, grad, target, weight, o, extras, mean_denominator);
  return {r.loss, r.z, grad, r.accuracy, r.pred};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> cross_entropy_forward_inplace_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool extras, std::optional<Tensor> mean_denominator) {
  constexpr const char* op = "fk::_cross_entropy_forward_";
  const auto o = check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
  check_mean_denominator(op, logits, mean_denominator, o.reduction);
  FK_CHECK(logits.is_contiguous(), op, ": logits must be contiguous");
  auto r = run_forward(logits, logits, target, weight, o, extras, mean_denominator);
  return {r.loss, r.z, r.accuracy, r.pred};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> cross_entropy_deferred_forward_impl(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool extras, std::optional<Tensor> mean_denominator) {
  constexpr const char* op = "fk::cross_entropy";
  const auto o = check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
  check_mean_denominator(op, logits, mean_denominator, o.reduction);
  auto x = aten::contiguous(logits);
  auto lse = aten::empty({x.size(0)}, ce_loss_dtype(x), x.device());
  auto r = run_forward(x, Tensor(), target, weight, o, extras, mean_denominator, lse);
  return {r.loss, r.z, lse, r.den, r.accuracy, r.pred};
}

namespace {

void run_deferred_backward(const Tensor& logits, const Tensor& grad,
                           const Tensor& target, const std::optional<Tensor>& weight,
                           const Tensor& lse, const Tensor& den, const Tensor& grad_loss,
                           const CeOptions& o) {
  Tensor w;
  if (has(weight)) w = aten::contiguous(aten::to(*weight, ce_loss_dtype(logits)));
  cross_entropy_rows_backward(logits, grad, aten::contiguous(target), w, aten::contiguous(den),
                              aten::contiguous(lse), aten::contiguous(grad_loss), o);
}

}  // namespace

Tensor cross_entropy_deferred_backward_impl(Tensor logits, Tensor target,
                                            std::optional<Tensor> weight, Tensor lse, Tensor den,
                                            Tensor grad_loss, int64_t ignore_index,
                                            double label_smoothing, double lse_square_scale,
                                            std::optional<double> softcap) {
  constexpr const char* op = "fk::_cross_entropy_deferred_backward";
  const auto o = check_deferred_backward(op, logits, target, weight, lse, den, grad_loss,
                                         ignore_index, label_smoothing, lse_square_scale,
                                         softcap);
  auto x = aten::contiguous(logits);
  auto out = aten::empty_like(x);
  run_deferred_backward(x, out, target, weight, lse, den, grad_loss, o);
  return out;
}

void cross_entropy_deferred_backward_inplace_impl(Tensor logits, Tensor target,
                                                  std::optional<Tensor> weight, Tensor lse,
                                                  Tensor den, Tensor grad_loss,
                                                  int64_t ignore_index, double label_smoothing,
                                                  double lse_square_scale,
                                                  std::optional<double> softcap) {
  constexpr const char* op = "fk::_cross_entropy_deferred_backward_";
  const auto o = check_deferred_backward(op, logits, target, weight, lse, den, grad_loss,
                                         ignore_index, label_smoothing, lse_square_scale,
                                         softcap);
  FK_CHECK(logits.is_contiguous(), op, ": logits must be contiguous");
  run_deferred_backward(logits, logits, target, weight, lse, den, grad_loss, o);
}

Tensor cross_entropy_backward_impl(Tensor grad, Tensor grad_loss) {
  check_cross_entropy_backward("fk::_cross_entropy_backward", grad, grad_loss);
  auto src = aten::contiguous(grad);
  auto out = aten::empty_like(src);
  cross_entropy_scale(src, out, aten::contiguous(grad_loss));
  return out;
}

void cross_entropy_backward_inplace_impl(Tensor grad, Tensor grad_loss) {
  constexpr const char* op = "fk::_cross_entropy_backward_";
  check_cross_entropy_backward(op, grad, grad_loss);
  FK_CHECK(grad.is_contiguous(), op, ": grad must be contiguous");
  cross_entropy_scale(grad, grad, aten::contiguous(grad_loss));
}

namespace {

// cross_entropy below autograd (no gradient wanted, or inference): the outputs of
// _cross_entropy_forward, no gradient. The autograd kernel is python/fk/ops/cross_entropy.py.
std::tuple<Tensor, Tensor, Tensor, Tensor> cross_entropy_composite(
    Tensor logits, Tensor target, std::optional<Tensor> weight, int64_t ignore_index,
    double label_smoothing, std::string reduction, double lse_square_scale,
    std::optional<double> softcap, bool, std::optional<ScalarType> loss_dtype,
    bool return_token_accuracy, bool return_predicted_tokens,
    std::optional<Tensor> mean_denominator, bool) {
  constexpr const char* op = "fk::cross_entropy";
  const auto o = check_cross_entropy(op, logits, target, weight, ignore_index, label_smoothing,
                                     reduction, lse_square_scale, softcap);
  check_mean_denominator(op, logits, mean_denominator, o.reduction);
  const auto out = ce_output_dtype(op, logits, loss_dtype);
  auto r = aten::call_n<5>("fk::_cross_entropy_forward", "", logits, target, weight,
                           ignore_index, label_smoothing, reduction, lse_square_scale, softcap,
                           false, return_token_accuracy || return_predicted_tokens,
                           mean_denominator);
  return {aten::to(r[0], out), aten::to(r[1], out),
          return_token_accuracy ? r[3] : Tensor(), return_predicted_tokens ? r[4] : Tensor()};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (loss, z_loss) of torch.nn.functional.cross_entropy(logits, target, weight, ignore_index,
  // label_smoothing, reduction) plus lse_square_scale * logsumexp^2 per row (z-loss), with
  // logits -> softcap * tanh(logits / softcap) first. logits (N, V); target (N,) int64.
  // Losses are computed in float32 (float64 for float64 logits) and returned in loss_dtype
  // (None: the logits' dtype, as torch), rounded once. A target that is neither ignore_index
  // nor in [0, V) raises (on CUDA through a device-side assert). With grad_in_logits the
  // gradient is written into the logits' memory during the forward (see
  // python/fk/ops/cross_entropy.py). Returns (loss, z_loss, token_accuracy,
  // predicted_tokens): token_accuracy (float32; per row for 'none', else the fraction of
  // non-ignored rows whose argmax is the target, NaN without any) and predicted_tokens
  // ((N,) int64 argmax of the softcapped logits, -100 for ignored rows) are None unless
  // asked for; neither has a gradient. mean_denominator (one element, on logits' device,
  // reduction 'mean' only; no gradient) replaces the mean's denominators: the sum of the
  // rows' losses and z-losses is divided by it (Hugging Face's num_items_in_batch), on the
  // device. defer_grad: the gradient is computed in the backward from the logits (saved
  // unmodified) and each row's logsumexp, times grad_output in the same pass.
  m.def("cross_entropy(Tensor logits, Tensor target, Tensor? weight=None, int ignore_index=-100, "
        "float label_smoothing=0.0, str reduction='mean', float lse_square_scale=0.0, "
        "float? softcap=None, bool grad_in_logits=True, ScalarType? loss_dtype=None, "
        "bool return_token_accuracy=False, bool return_predicted_tokens=False, "
        "Tensor? mean_denominator=None, bool defer_grad=False) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // (loss, z_loss, grad, token_accuracy, predicted_tokens): losses in float32 (float64 for
  // float64 logits); grad is the gradient of loss with respect to logits for a grad_output
  // of 1 (a new (N, V) tensor of logits' dtype), None unless compute_grad; the last two as
  // cross_entropy returns them, None unless extras.
  m.def("_cross_entropy_forward(Tensor logits, Tensor target, Tensor? weight, int ignore_index, "
        "float label_smoothing, str reduction, float lse_square_scale, float? softcap, "
        "bool compute_grad, bool extras, Tensor? mean_denominator=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // The same with the gradient written into logits (contiguous): (loss, z_loss,
  // token_accuracy, predicted_tokens).
  m.def("_cross_entropy_forward_(Tensor(a!) logits, Tensor target, Tensor? weight, "
        "int ignore_index, float label_smoothing, str reduction, float lse_square_scale, "
        "float? softcap, bool extras, Tensor? mean_denominator=None) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  // grad * grad_loss (a scalar, or (N,) for reduction 'none', scaling each row).
  m.def("_cross_entropy_backward(Tensor grad, Tensor grad_loss) -> Tensor");
  // The same in place (grad contiguous); on CUDA a no-op where grad_loss is 1.
  m.def("_cross_entropy_backward_(Tensor(a!) grad, Tensor grad_loss) -> ()");
  // The deferred form's forward: (loss, z_loss, lse, den, token_accuracy,
  // predicted_tokens), no gradient; lse (N,) is each row's logsumexp of the (softcapped)
  // logits (0 for ignored rows) and den (2,) the denominators the rows were divided by
  // (ones unless 'mean'), both in the loss dtype.
  m.def("_cross_entropy_deferred_forward(Tensor logits, Tensor target, Tensor? weight, "
        "int ignore_index, float label_smoothing, str reduction, float lse_square_scale, "
        "float? softcap, bool extras, Tensor? mean_denominator=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Its backward: the gradient of the loss with respect to logits times grad_loss (a
  // scalar, or (N,) for 'none'), from the logits, lse and den in one pass; a new tensor of
  // logits' dtype, or written into logits (contiguous) by the in-place form.
  m.def("_cross_entropy_deferred_backward(Tensor logits, Tensor target, Tensor? weight, "
        "Tensor lse, Tensor den, Tensor grad_loss, int ignore_index, float label_smoothing, "
        "float lse_square_scale, float? softcap) -> Tensor");
  m.def("_cross_entropy_deferred_backward_(Tensor(a!) logits, Tensor target, Tensor? weight, "
        "Tensor lse, Tensor den, Tensor grad_loss, int ignore_index, float label_smoothing, "
        "float lse_square_scale, float? softcap) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("cross_entropy", TORCH_BOX(&fk::ops::cross_entropy_composite));
}
