// Schemas of fk::layer_norm and its internal forward / backward, and the shared checks.
#include "ops/layer_norm/layer_norm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

// weight / bias: x's device and dtype, shape (x.size(-1),).
void check_affine(const char* op, const char* name, const at::Tensor& x, const at::Tensor& t) {
  checks::check_pair(op, "x", x, name, t);
  TORCH_CHECK(t.dim() == 1 && t.sym_size(0) == x.sym_size(-1), op, ": ", name,
              " must have shape (", x.sym_size(-1), ",) to match the last dim of x, got ",
              t.sym_sizes());
}

// mean / rstd: float32 (float64 for float64 x) on x's device, one value per row of x.
void check_stat(const char* op, const char* name, const at::Tensor& x, const at::Tensor& t) {
  checks::check_same_device(op, name, t, "x", x);
  TORCH_CHECK(t.scalar_type() == checks::acc_type(x), op, ": ", name, " must be ",
              checks::acc_type(x), " for ", x.scalar_type(), " x, got ", t.scalar_type());
  TORCH_CHECK(t.sym_numel() * x.sym_size(-1) == x.sym_numel() || x.sym_size(-1) == 0, op, ": ",
              name, " must hold one value per row of x");
}

}  // namespace

void check_layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "fk::layer_norm";
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  if (has(weight)) check_affine(op, "weight", x, *weight);
  if (has(bias)) check_affine(op, "bias", x, *bias);
}

void check_layer_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                               const at::Tensor& rstd) {
  constexpr const char* op = "fk::_layer_norm_backward";
  check_layer_norm(x, weight, std::nullopt);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
  check_stat(op, "mean", x, mean);
  check_stat(op, "rstd", x, rstd);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_forward_call(
    const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_layer_norm_forward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const std::optional<at::Tensor>&,
                           const std::optional<at::Tensor>&, double)>();
  return op.call(x, weight, bias, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_call(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& mean, const at::Tensor& rstd, std::array<bool, 3> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_layer_norm_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, const at::Tensor&,
                           const at::Tensor&, std::array<bool, 3>)>();
  return op.call(grad_y, x, weight, mean, rstd, output_mask);
}

}  // namespace fk::ops

at::Tensor fk::layer_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::layer_norm", "")
                       .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                                         const std::optional<at::Tensor>&, double)>();
  return op.call(x, weight, bias, eps);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim of x; mean and the
  // biased variance in fp32. weight, bias: (x.size(-1),) of x's dtype, each optional.
  m.def("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
        "-> Tensor");
  // (y, mean, rstd): mean and rstd are float32 (float64 for float64 x), shape x.shape[:-1].
  m.def("_layer_norm_forward(Tensor x, Tensor? weight, Tensor? bias, float eps) "
        "-> (Tensor, Tensor, Tensor)");
  // (grad_x, grad_weight, grad_bias); an output whose output_mask entry is False is
  // undefined. grad_weight is taken at weight (ones when weight is None); grad_weight and
  // grad_bias have shape (x.size(-1),) and x's dtype.
  m.def("_layer_norm_backward(Tensor grad_y, Tensor x, Tensor? weight, Tensor mean, "
        "Tensor rstd, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
}

namespace fk::ops {
namespace {

// layer_norm on any backend is the first output of _layer_norm_forward.
at::Tensor layer_norm_composite(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, double eps) {
  return std::get<0>(layer_norm_forward_call(x, weight, bias, eps));
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("layer_norm", fk::ops::layer_norm_composite);
}
