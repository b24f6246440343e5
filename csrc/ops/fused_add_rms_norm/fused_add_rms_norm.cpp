// Schemas of fk::fused_add_rms_norm and its internal forward / backward, and the shared
// checks (rms_norm's, plus those of the residual and its gradient).
// Fake kernels and the autograd formula: python/fk/ops/fused_add_rms_norm.py.
#include "ops/fused_add_rms_norm/fused_add_rms_norm.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {
constexpr const char* kOp = "fk::fused_add_rms_norm";
constexpr const char* kBackwardOp = "fk::_fused_add_rms_norm_backward";
}  // namespace

RmsCasting check_fused_add_rms_norm(const Tensor& x, const Tensor& residual,
                                    const std::optional<Tensor>& weight,
                                    const std::string& casting_mode) {
  const auto casting = check_rms_norm(x, weight, casting_mode, kOp);
  checks::check_pair(kOp, "x", x, "residual", residual);
  checks::check_same_shape(kOp, "x", x, "residual", residual);
  return casting;
}

RmsCasting check_fused_add_rms_norm_backward(const Tensor& grad_y,
                                             const std::optional<Tensor>& grad_residual_out,
                                             const Tensor& residual_out,
                                             const std::optional<Tensor>& weight,
                                             const Tensor& rstd,
                                             const std::string& casting_mode) {
  // residual_out is the x of the norm: rms_norm's backward checks name it so.
  const auto casting = check_rms_norm_backward(grad_y, residual_out, weight, rstd, casting_mode,
                                               kBackwardOp, kOp);
  if (has(grad_residual_out)) {
    checks::check_pair(kBackwardOp, "grad_residual_out", *grad_residual_out, "residual_out",
                       residual_out);
    checks::check_same_shape(kBackwardOp, "grad_residual_out", *grad_residual_out,
                             "residual_out", residual_out);
  }
  return casting;
}

namespace {

// fused_add_rms_norm on any backend is the first two outputs of _fused_add_rms_norm_forward,
// whose autograd formula (python/fk/ops/fused_add_rms_norm.py, include/fk/autograd.h) saves
// the rstd it returns.
std::tuple<Tensor, Tensor> fused_add_rms_norm_composite(Tensor x, Tensor residual,
                                                        std::optional<Tensor> weight, double eps,
                                                        double offset, std::string casting_mode) {
  check_fused_add_rms_norm(x, residual, weight, casting_mode);
  auto out = aten::call_n<3>("fk::_fused_add_rms_norm_forward", "", x, residual, weight, eps,
                             offset, casting_mode);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (y, residual_out): residual_out = x + residual, added in fp32 and rounded to x's dtype
  // (as a decoder layer's `hidden_states = residual + hidden_states`); y = rms_norm of
  // residual_out with fk::rms_norm's semantics (weight optional, offset, casting_mode).
  // x and residual: same shape, dtype and device.
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps=1e-06, "
        "float offset=0.0, str casting_mode='llama') -> (Tensor, Tensor)");
  // (y, residual_out, rstd): rstd is float32 (float64 for float64 x), shape x.shape[:-1].
  m.def("_fused_add_rms_norm_forward(Tensor x, Tensor residual, Tensor? weight, float eps, "
        "float offset, str casting_mode) -> (Tensor, Tensor, Tensor)");
  // (grad_x, grad_weight); grad_x is also the gradient of residual (the add passes it to
  // both). grad_residual_out, the gradient of the second output, is optional and adds into
  // grad_x. An output whose output_mask entry is False is undefined.
  m.def("_fused_add_rms_norm_backward(Tensor grad_y, Tensor? grad_residual_out, "
        "Tensor residual_out, Tensor? weight, Tensor rstd, float offset, str casting_mode, "
        "bool[2] output_mask) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("fused_add_rms_norm", TORCH_BOX(&fk::ops::fused_add_rms_norm_composite));
}
