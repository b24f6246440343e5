// Schemas of fk::poly_norm and its internal forward / backward, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/poly_norm.py.
#include "ops/poly_norm/poly_norm.h"

#include "runtime/checks.h"

namespace fk::ops {

void check_poly_norm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "fk::poly_norm";
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  checks::check_same_device(op, "weight", weight, "x", x);
  checks::check_float(op, "weight", weight);
  FK_CHECK(weight.dim() == 1 && weight.size(0) == 3, op,
           ": weight must have shape (3,), got ", shape_of(weight));
  checks::check_same_device(op, "bias", bias, "x", x);
  checks::check_same_dtype(op, "weight", weight, "bias", bias);
  FK_CHECK(bias.numel() == 1 && bias.dim() <= 1, op,
           ": bias must have shape (1,) or () (one element), got ", shape_of(bias));
  const auto pt = weight.scalar_type();
  FK_CHECK(pt == kFloat || pt == x.scalar_type(), op,
           ": weight and bias must be float32 or x's dtype (", x.scalar_type(), "), got ", pt);
}

void check_poly_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                              const Tensor& bias, const Tensor& rstd) {
  constexpr const char* op = "fk::_poly_norm_backward";
  check_poly_norm(x, weight, bias);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
  checks::check_same_device(op, "rstd", rstd, "x", x);
  FK_CHECK(rstd.scalar_type() == kFloat || rstd.scalar_type() == kDouble, op,
           ": rstd must be float32 (float64 for float64 x), got ", rstd.scalar_type());
  FK_CHECK(rstd.numel() * x.size(-1) == 3 * x.numel() || x.size(-1) == 0, op,
           ": rstd must hold three values per row of x");
}

namespace {

// poly_norm on any backend is the first output of _poly_norm_forward, whose autograd formula
// (python/fk/ops/poly_norm.py, include/fk/autograd.h) saves the rstd it returns.
Tensor poly_norm_composite(Tensor x, Tensor weight, Tensor bias, double eps) {
  check_poly_norm(x, weight, bias);
  return aten::call_n<2>("fk::_poly_norm_forward", "", x, weight, bias, eps)[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b over the last dim of x,
  // norm(u) = u * rsqrt(mean(u^2) + eps), in fp32, rounded once to x's dtype. weight: (3,);
  // bias: one element; both float32 or x's dtype.
  m.def("poly_norm(Tensor x, Tensor weight, Tensor bias, float eps=1e-06) -> Tensor");
  // (y, rstd): rstd is float32 (float64 for float64 x) with shape x.shape[:-1] + (3,), the
  // rsqrt values of x^3, x^2, x per row.
  m.def("_poly_norm_forward(Tensor x, Tensor weight, Tensor bias, float eps) "
        "-> (Tensor, Tensor)");
  // (grad_x, grad_weight, grad_bias); an output whose output_mask entry is False is undefined.
  m.def("_poly_norm_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor bias, "
        "Tensor rstd, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("poly_norm", TORCH_BOX(&fk::ops::poly_norm_composite));
}
