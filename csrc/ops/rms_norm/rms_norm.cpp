// Schemas of fk::rms_norm and its internal forward / backward, and the shared checks.
#include "ops/rms_norm/rms_norm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

RmsCasting parse_rms_casting(std::string_view mode, const char* op) {
  if (mode == "llama") return RmsCasting::Llama;
  if (mode == "gemma") return RmsCasting::Gemma;
  if (mode == "none") return RmsCasting::None;
  TORCH_CHECK(false, op, ": casting_mode must be one of 'llama', 'gemma', 'none', got '", mode,
              "'");
}

RmsCasting check_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          std::string_view casting_mode, const char* op) {
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  checks::check_float(op, "x", x);
  if (weight.has_value() && weight->defined()) {
    checks::check_pair(op, "x", x, "weight", *weight);
    TORCH_CHECK(weight->dim() == 1 && weight->sym_size(0) == x.sym_size(-1), op,
                ": weight must have shape (", x.sym_size(-1), ",) to match the last dim of x, got ",
                weight->sym_sizes());
  }
  return parse_rms_casting(casting_mode, op);
}

RmsCasting check_rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const at::Tensor& rstd, std::string_view casting_mode,
                                   const char* op, const char* forward_op) {
  auto casting = check_rms_norm(x, weight, casting_mode, forward_op);
  checks::check_pair(op, "grad_y", grad_y, "x", x);
  checks::check_same_shape(op, "grad_y", grad_y, "x", x);
  checks::check_same_device(op, "rstd", rstd, "x", x);
  TORCH_CHECK(rstd.scalar_type() == at::kFloat || rstd.scalar_type() == at::kDouble, op,
              ": rstd must be float32 (float64 for float64 x), got ", rstd.scalar_type());
  TORCH_CHECK(rstd.sym_numel() * x.sym_size(-1) == x.sym_numel() || x.sym_size(-1) == 0, op,
              ": rstd must hold one value per row of x");
  return casting;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_call(const at::Tensor& x,
                                                         const std::optional<at::Tensor>& weight,
                                                         double eps, double offset,
                                                         std::string_view casting_mode) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_rms_norm_forward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const std::optional<at::Tensor>&, double, double,
                           c10::string_view)>();
  return op.call(x, weight, eps, offset, casting_mode);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_call(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
    const at::Tensor& rstd, double offset, std::string_view casting_mode,
    std::array<bool, 2> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::_rms_norm_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, const at::Tensor&, double,
                           c10::string_view, std::array<bool, 2>)>();
  return op.call(grad_y, x, weight, rstd, offset, casting_mode, output_mask);
}

}  // namespace fk::ops

at::Tensor fk::rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                        double offset, const std::string& casting_mode) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::rms_norm", "")
                       .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                                         double, double, c10::string_view)>();
  return op.call(x, weight, eps, offset, casting_mode);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
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

namespace fk::ops {
namespace {

// rms_norm on any backend is the first output of _rms_norm_forward.
at::Tensor rms_norm_composite(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                              double eps, double offset, c10::string_view casting_mode) {
  return std::get<0>(rms_norm_forward_call(x, weight, eps, offset, casting_mode));
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("rms_norm", fk::ops::rms_norm_composite);
}
