// Schemas of fk::layer_norm and its internal forward / backward, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/layer_norm.py.
#include "ops/layer_norm/layer_norm.h"

#include "runtime/checks.h"

namespace fk::ops {
namespace {

// weight / bias: x's device and dtype, shape (x.size(-1),).
void check_affine(const char* op, const char* name, const Tensor& x, const Tensor& t) {
  checks::check_pair(op, "x", x, name, t);
  FK_CHECK(t.dim() == 1 && t.size(0) == x.size(-1), op, ": ", name, " must have shape (",
           x.size(-1), ",) to match the last dim of x, got ", shape_of(t));
}

// mean / rstd: float32 (float64 for float64 x) on x's device, one value per row of x.
void check_stat(const char* op, const char* name, const Tensor& x, const Tensor& t) {
  checks::check_same_device(op, name, t, "x", x);
  FK_CHECK(t.scalar_type() == checks::acc_type(x), op, ": ", name, " must be ",
           checks::acc_type(x), " for ", x.scalar_type(), " x, got ", t.scalar_type());
  FK_CHECK(t.numel() * x.size(-1) == x.numel() || x.size(-1) == 0, op, ": ", name,
           " must hold one value per row of x");
}

}  // namespace

void check_layer_norm(const Tensor& x, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias) {
  constexpr const char* op = "fk::layer_norm";
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  if (has(weight)) check_affine(op, "weight", x, *weight);
  if (has(bias)) check_affine(op, "bias", x, *bias);
}

void check_layer_norm_backward(const Tensor& grad_y, const Tensor& x,
                               const std::optional<Tensor>& weight, const Tensor& mean,
                               const Tensor& rstd) {
  constexpr const char* op = "fk::_layer_norm_backward";
  check_layer_norm(x, weight, std::nullopt);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
  check_stat(op, "mean", x, mean);
  check_stat(op, "rstd", x, rstd);
}

namespace {

// layer_norm on any backend is the first output of _layer_norm_forward, whose autograd
// formula (python/fk/ops/layer_norm.py) saves the mean and rstd it returns.
Tensor layer_norm_composite(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
                            double eps) {
  check_layer_norm(x, weight, bias);
  return aten::call_n<3>("fk::_layer_norm_forward", "", x, weight, bias, eps)[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
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

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("layer_norm", TORCH_BOX(&fk::ops::layer_norm_composite));
}
