// Schemas of fk::group_norm and its internal forward / backward, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/group_norm.py.
#include "ops/group_norm/group_norm.h"

#include "runtime/checks.h"

namespace fk::ops {

GroupNormShape group_norm_shape(const Tensor& x) {
  int64_t hw = 1;
  for (int64_t d = 2; d < x.dim(); ++d) hw *= x.size(d);
  return {x.size(0), x.size(1), hw};
}

namespace {

void check_param(const char* op, const char* name, const Tensor& p, const Tensor& x) {
  checks::check_same_device(op, name, p, "x", x);
  checks::check_float(op, name, p);
  FK_CHECK(p.dim() == 1 && p.size(0) == x.size(1), op, ": ", name, " must have shape (",
           x.size(1), ",) to match the channel dim of x, got ", shape_of(p));
  FK_CHECK(p.scalar_type() == kFloat || p.scalar_type() == x.scalar_type(), op,
           ": weight and bias must be float32 or x's dtype (", x.scalar_type(), "), got ",
           p.scalar_type());
}

}  // namespace

void check_group_norm(const Tensor& x, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, int64_t num_groups) {
  constexpr const char* op = "fk::group_norm";
  FK_CHECK(x.dim() >= 2, op, ": x must have at least two dimensions (N, C, *), got ",
           shape_of(x));
  checks::check_float(op, "x", x);
  FK_CHECK(num_groups > 0, op, ": num_groups must be positive, got ", num_groups);
  FK_CHECK(x.size(1) % num_groups == 0, op, ": num_groups (", num_groups,
           ") must divide the number of channels (", x.size(1), ")");
  if (has(weight)) check_param(op, "weight", *weight, x);
  if (has(bias)) check_param(op, "bias", *bias, x);
  if (has(weight) && has(bias)) checks::check_same_dtype(op, "weight", *weight, "bias", *bias);
}

void check_group_norm_backward(const Tensor& grad_y, const Tensor& x,
                               const std::optional<Tensor>& weight,
                               const std::optional<Tensor>& bias, const Tensor& mean,
                               const Tensor& rstd, int64_t num_groups) {
  constexpr const char* op = "fk::_group_norm_backward";
  check_group_norm(x, weight, bias, num_groups);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
  for (const auto* t : {&mean, &rstd}) {
    const char* name = t == &mean ? "mean" : "rstd";
    checks::check_same_device(op, name, *t, "x", x);
    FK_CHECK(t->scalar_type() == kFloat || t->scalar_type() == kDouble, op, ": ", name,
             " must be float32 (float64 for float64 x), got ", t->scalar_type());
    FK_CHECK(t->numel() == x.size(0) * num_groups, op, ": ", name,
             " must hold one value per (sample, group) of x (", x.size(0) * num_groups,
             "), got ", shape_of(*t));
  }
}

namespace {

// group_norm on any backend is the first output of _group_norm_forward, whose autograd
// formula (python/fk/ops/group_norm.py, include/fk/autograd.h) saves the mean and rstd it
// returns.
Tensor group_norm_composite(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias,
                            int64_t num_groups, double eps) {
  check_group_norm(x, weight, bias, num_groups);
  return aten::call_n<3>("fk::_group_norm_forward", "", x, weight, bias, num_groups, eps)[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // GroupNorm of x (N, C, *) with num_groups groups of C / num_groups consecutive channels:
  // per (sample, group), y = (x - mean) * rsqrt(var + eps) * weight[c] + bias[c] with the
  // biased variance over the group's channels and every trailing position, in fp32, rounded
  // once to x's dtype (torch.nn.functional.group_norm's numbers). weight, bias: (C,) or None
  // (1 and 0), float32 or x's dtype.
  m.def("group_norm(Tensor x, Tensor? weight, Tensor? bias, int num_groups, "
        "float eps=1e-06) -> Tensor");
  // (y, mean, rstd): mean and rstd are float32 (float64 for float64 x), shape (N, num_groups).
  m.def("_group_norm_forward(Tensor x, Tensor? weight, Tensor? bias, int num_groups, "
        "float eps) -> (Tensor, Tensor, Tensor)");
  // (grad_x, grad_weight, grad_bias); an output whose output_mask entry is False (or whose
  // parameter is None) is undefined.
  m.def("_group_norm_backward(Tensor grad_y, Tensor x, Tensor? weight, Tensor? bias, "
        "Tensor mean, Tensor rstd, int num_groups, bool[3] output_mask) "
        "-> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("group_norm", TORCH_BOX(&fk::ops::group_norm_composite));
}
