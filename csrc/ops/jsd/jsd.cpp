// Schemas of fk::jsd and its internal forward, the shared check, and the forward driver the
// CPU and CUDA backends register. Fake kernels and the autograd kernel: python/fk/ops/jsd.py.
#include "ops/jsd/jsd.h"

#include "runtime/checks.h"

namespace fk::ops {

void check_jsd(const char* op, const Tensor& input, const Tensor& target,
               const std::optional<Tensor>& shift_labels, double beta) {
  FK_CHECK(input.dim() == 2, op, ": input must have shape (BT, V), got ", shape_of(input));
  checks::check_float(op, "input", input);
  checks::check_same_device(op, "input", input, "target", target);
  checks::check_same_dtype(op, "input", input, "target", target);
  checks::check_same_shape(op, "input", input, "target", target);
  if (has(shift_labels)) {
    checks::check_same_device(op, "input", input, "shift_labels", *shift_labels);
    FK_CHECK(shift_labels->scalar_type() == kLong, op, ": shift_labels must be int64, got ",
             shift_labels->scalar_type());
    FK_CHECK(shift_labels->dim() == 1 && shift_labels->size(0) == input.size(0), op,
             ": shift_labels must have shape (", input.size(0), ",) to match input, got ",
             shape_of(*shift_labels));
  }
  FK_CHECK(beta >= 0.0 && beta <= 1.0, op, ": beta must be in [0, 1], got ", beta);
}

JsdMode jsd_mode(double beta) {
  if (beta == 0.0) return JsdMode::Forward;
  if (beta == 1.0) return JsdMode::Reverse;
  return JsdMode::General;
}

std::tuple<Tensor, Tensor> jsd_forward_impl(Tensor input, Tensor target,
                                            std::optional<Tensor> shift_labels, double beta,
                                            int64_t ignore_index, bool compute_grad) {
  check_jsd("fk::jsd", input, target, shift_labels, beta);
  auto x = aten::contiguous(input), y = aten::contiguous(target);
  Tensor grad;
  if (compute_grad) grad = aten::empty_like(x);
  if (x.numel() == 0) {
    // No rows or no columns: nothing counts, the loss is 0 (as in Liger Kernel).
    return {aten::zeros({}, x.scalar_type(), x.device()), grad};
  }
  std::optional<Tensor> labels;
  if (has(shift_labels)) labels = aten::contiguous(*shift_labels);
  auto loss = x.is_cuda() ? jsd_cuda(x, y, labels, beta, ignore_index, grad)
                          : jsd_cpu(x, y, labels, beta, ignore_index, grad);
  return {loss, grad};
}

namespace {

// fk::jsd below autograd (no gradient wanted): the loss of _jsd_forward without the
// gradient. The autograd kernel is python/fk/ops/jsd.py.
Tensor jsd_composite(Tensor input, Tensor target, std::optional<Tensor> shift_labels,
                     double beta, int64_t ignore_index) {
  check_jsd("fk::jsd", input, target, shift_labels, beta);
  auto r = aten::call_n<2>("fk::_jsd_forward", "", input, target, shift_labels, beta,
                           ignore_index, false);
  return r[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // Generalized Jensen-Shannon divergence (Liger Kernel's JSD) of (BT, V) log-probabilities:
  // input = log q (student), target = log p (teacher), m = beta p + (1 - beta) q; per row
  // beta KL(p || m) + (1 - beta) KL(q || m), with beta = 0 exactly KL(p || q) and beta = 1
  // exactly KL(q || p); summed over the rows whose shift_labels entry is not ignore_index
  // (all rows without shift_labels) and divided by their number (0 when none counts). The
  // loss is 0-dim, of input's dtype (fp32 math); gradient with respect to input only.
  m.def("jsd(Tensor input, Tensor target, Tensor? shift_labels=None, float beta=0.5, "
        "int ignore_index=-100) -> Tensor");
  // (loss, grad): grad is the gradient of loss with respect to input for a grad_output of 1
  // (a new (BT, V) tensor of input's dtype), None unless compute_grad.
  m.def("_jsd_forward(Tensor input, Tensor target, Tensor? shift_labels, float beta, "
        "int ignore_index, bool compute_grad) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("jsd", TORCH_BOX(&fk::ops::jsd_composite));
}
