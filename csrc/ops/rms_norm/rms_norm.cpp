// Schemas of fk::rms_norm and its internal forward / backward, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/rms_norm.py.
#include "ops/rms_norm/rms_norm.h"

#include "runtime/checks.h"

namespace fk::ops {

RmsCasting parse_rms_casting(const std::string& mode, const char* op) {
  if (mode == "llama") return RmsCasting::Llama;
  if (mode == "gemma") return RmsCasting::Gemma;
  if (mode == "none") return RmsCasting::None;
  fail(str(op, ": casting_mode must be one of 'llama', 'gemma', 'none', got '", mode, "'"));
}

RmsCasting check_rms_norm(const Tensor& x, const std::optional<Tensor>& weight,
                          const std::string& casting_mode, const char* op) {
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  if (has(weight)) {
    checks::check_pair(op, "x", x, "weight", *weight);
    FK_CHECK(weight->dim() == 1 && weight->size(0) == x.size(-1), op,
             ": weight must have shape (", x.size(-1), ",) to match the last dim of x, got ",
             shape_of(*weight));
  }
  return parse_rms_casting(casting_mode, op);
}

RmsCasting check_rms_norm_backward(const Tensor& grad_y, const Tensor& x,
                                   const std::optional<Tensor>& weight, const Tensor& rstd,
                                   const std::string& casting_mode, const char* op,
                                   const char* forward_op) {
  auto casting = check_rms_norm(x, weight, casting_mode, forward_op);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
  checks::check_same_device(op, "rstd", rstd, "x", x);
  FK_CHECK(rstd.scalar_type() == kFloat || rstd.scalar_type() == kDouble, op,
           ": rstd must be float32 (float64 for float64 x), got ", rstd.scalar_type());
  FK_CHECK(rstd.numel() * x.size(-1) == x.numel() || x.size(-1) == 0, op,
           ": rstd must hold one value per row of x");
  return casting;
}

namespace {

// rms_norm on any backend is the first output of _rms_norm_forward, whose autograd formula
// (python/fk/ops/rms_norm.py, include/fk/autograd.h) saves the rstd it returns.
Tensor rms_norm_composite(Tensor x, std::optional<Tensor> weight, double eps, double offset,
                          std::string casting_mode) {
  check_rms_norm(x, weight, casting_mode);
  return aten::call_n<2>("fk::_rms_norm_forward", "", x, weight, eps, offset, casting_mode)[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = x * rsqrt(mean(x^2, -1) + eps) * (offset + weight), over the last dim of x.
  // weight: (x.size(-1),) of x's dtype, or None (then y = the normalized x; offset unused).
  // casting_mode: 'llama' | 'gemma' | 'none' (see python/fk/ops/rms_norm.py).
  m.def("rms_norm(Tensor x, Tensor? weight, float eps=1e-06, float offset=0.0, "
        "str casting_mode='llama') -> Tensor");
  // (y, rstd): rstd is float32 (float64 for float64 x) with shape x.shape[:-1].
  m.def("_rms_norm_forward(Tensor x, Tensor? weight, float eps, float offset, "
        "str casting_mode) -> (Tensor, Tensor)");
  // (grad_x, grad_weight); an output whose output_mask entry is False is undefined.
  m.def("_rms_norm_backward(Tensor grad_y, Tensor x, Tensor? weight, Tensor rstd, "
        "float offset, str casting_mode, bool[2] output_mask) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("rms_norm", TORCH_BOX(&fk::ops::rms_norm_composite));
}
