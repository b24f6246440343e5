// Schemas of fk::kl_div and its internal ops, the shared checks, and the forward / backward
// drivers the CPU and CUDA backends register (they call the device halves).
// Fake kernels and the autograd kernel: python/fk/ops/kl_div.py.
#include "ops/kl_div/kl_div.h"

#include <limits>

#include "runtime/checks.h"

namespace fk::ops {

KlReduction check_kl_div(const char* op, const Tensor& input, const Tensor& target,
                         const std::string& reduction, double eps) {
  checks::check_pair(op, "input", input, "target", target);
  checks::check_same_shape(op, "input", input, "target", target);
  KlReduction r;
  if (reduction == "none") {
    r = KlReduction::None;
  } else if (reduction == "sum") {
    r = KlReduction::Sum;
  } else if (reduction == "mean") {
    r = KlReduction::Mean;
  } else if (reduction == "batchmean") {
    r = KlReduction::BatchMean;
  } else {
    fail(str(op, ": reduction must be one of 'none', 'sum', 'mean', 'batchmean', got '",
             reduction, "'"));
  }
  FK_CHECK(eps >= 0.0, op, ": eps must be non-negative, got ", eps);
  return r;
}

void check_kl_div_backward(const char* op, const Tensor& grad_output, const Tensor& target) {
  checks::check_pair(op, "grad_output", grad_output, "target", target);
  checks::check_same_shape(op, "grad_output", grad_output, "target", target);
}

double kl_div_scale(KlReduction reduction, const Tensor& input) {
  switch (reduction) {
    case KlReduction::Mean:
      return 1.0 / static_cast<double>(input.numel());
    case KlReduction::BatchMean:
      return input.dim() == 0 ? 1.0 : 1.0 / static_cast<double>(input.size(0));
    default:
      return 1.0;
  }
}

std::tuple<Tensor, Tensor> kl_div_forward_impl(Tensor input, Tensor target,
                                               std::string reduction, bool log_target,
                                               double eps, bool compute_grad) {
  constexpr const char* op = "fk::kl_div";
  const auto r = check_kl_div(op, input, target, reduction, eps);
  auto x = aten::contiguous(input), t = aten::contiguous(target);
  const bool cuda = x.is_cuda();
  if (r == KlReduction::None) {
    auto out = aten::empty_like(x);
    if (x.numel() > 0) {
      if (cuda) {
        kl_div_pointwise_cuda(x, t, out, eps, log_target, false);
      } else {
        kl_div_pointwise_cpu(x, t, out, eps, log_target, false);
      }
    }
    return {out, Tensor()};
  }
  Tensor grad;
  if (compute_grad) grad = aten::empty_like(x);
  if (x.numel() == 0) {
    // torch: a sum over nothing is 0; a mean over nothing 0 / 0; a batchmean 0 / size(0).
    const bool nan = r == KlReduction::Mean || (r == KlReduction::BatchMean &&
                                                (x.dim() == 0 || x.size(0) == 0));
    auto loss = aten::full({}, nan ? std::numeric_limits<double>::quiet_NaN() : 0.0,
                           checks::acc_type(x), x.device());
    return {loss, grad};
  }
  const double scale = kl_div_scale(r, x);
  auto loss = cuda ? kl_div_reduce_cuda(x, t, grad, scale, eps, log_target)
                   : kl_div_reduce_cpu(x, t, grad, scale, eps, log_target);
  return {loss, grad};
}

Tensor kl_div_backward_impl(Tensor grad_output, Tensor target, bool log_target) {
  check_kl_div_backward("fk::_kl_div_backward", grad_output, target);
  auto g = aten::contiguous(grad_output), t = aten::contiguous(target);
  auto out = aten::empty_like(t);
  if (t.numel() > 0) {
    if (t.is_cuda()) {
      kl_div_pointwise_cuda(g, t, out, 0.0, log_target, true);
    } else {
      kl_div_pointwise_cpu(g, t, out, 0.0, log_target, true);
    }
  }
  return out;
}

namespace {

// kl_div below autograd (no gradient wanted, or inference): the loss of _kl_div_forward
// without the gradient. The autograd kernel is python/fk/ops/kl_div.py.
Tensor kl_div_composite(Tensor input, Tensor target, std::string reduction, bool log_target,
                        double eps) {
  check_kl_div("fk::kl_div", input, target, reduction, eps);
  auto r = aten::call_n<2>("fk::_kl_div_forward", "", input, target, reduction, log_target, eps,
                           false);
  return r[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // torch.nn.functional.kl_div(input, target, reduction, log_target) with the target clamped
  // to at least eps before its log (Liger Kernel's kl_div; t * log(t) is 0 where t == 0, so
  // eps = 0 is torch's xlogy exactly). input and target of one shape and floating dtype.
  // "none": the pointwise losses, input's shape and dtype; a reduction: a float32 scalar
  // (float64 for float64 input), "mean" dividing the sum by numel, "batchmean" by size(0).
  m.def("kl_div(Tensor input, Tensor target, str reduction='batchmean', bool log_target=False, "
        "float eps=1e-10) -> Tensor");
  // (loss, grad): for a reduction with compute_grad, grad is the gradient of loss with
  // respect to input for a grad_output of 1 (a new tensor of input's shape and dtype);
  // otherwise None.
  m.def("_kl_div_forward(Tensor input, Tensor target, str reduction, bool log_target, "
        "float eps, bool compute_grad) -> (Tensor, Tensor)");
  // The gradient with respect to input of reduction "none": grad_output * (-target), or
  // grad_output * (-exp(target)) with log_target; target's shape and dtype.
  m.def("_kl_div_backward(Tensor grad_output, Tensor target, bool log_target) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("kl_div", TORCH_BOX(&fk::ops::kl_div_composite));
}
