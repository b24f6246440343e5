// Schemas of fk::tvd and its internal ops, the shared checks, and the forward / backward
// drivers the CPU and CUDA backends register. Fake kernels and the autograd kernel:
// python/fk/ops/tvd.py.
#include "ops/tvd/tvd.h"

#include "runtime/checks.h"

namespace fk::ops {

TvdReduction check_tvd(const char* op, const Tensor& p, const Tensor& q,
                       const std::optional<Tensor>& shift_labels,
                       const std::string& reduction) {
  FK_CHECK(p.dim() == 2, op, ": p must have shape (BT, V), got ", shape_of(p));
  checks::check_pair(op, "p", p, "q", q);
  checks::check_same_shape(op, "p", p, "q", q);
  if (has(shift_labels)) {
    checks::check_same_device(op, "p", p, "shift_labels", *shift_labels);
    FK_CHECK(shift_labels->scalar_type() == kLong, op, ": shift_labels must be int64, got ",
             shift_labels->scalar_type());
    FK_CHECK(shift_labels->dim() == 1 && shift_labels->size(0) == p.size(0), op,
             ": shift_labels must have shape (", p.size(0), ",) to match p, got ",
             shape_of(*shift_labels));
  }
  if (reduction == "batchmean") return TvdReduction::BatchMean;
  if (reduction == "mean") return TvdReduction::Mean;
  if (reduction == "sum") return TvdReduction::Sum;
  if (reduction == "none") return TvdReduction::None;
  fail(str(op, ": reduction must be one of 'none', 'sum', 'mean', 'batchmean', got '",
           reduction, "'"));
}

void check_tvd_backward(const char* op, const Tensor& grad, const Tensor& grad_loss) {
  FK_CHECK(grad.dim() == 2, op, ": grad must have shape (BT, V), got ", shape_of(grad));
  checks::check_float(op, "grad", grad);
  checks::check_same_device(op, "grad", grad, "grad_loss", grad_loss);
  FK_CHECK(grad_loss.scalar_type() == checks::acc_type(grad), op, ": grad_loss must be ",
           checks::acc_type(grad), ", got ", grad_loss.scalar_type());
  FK_CHECK(grad_loss.dim() == 0 || sizes_vec(grad_loss) == sizes_vec(grad), op,
           ": grad_loss must be a scalar or have grad's shape ", shape_of(grad), ", got ",
           shape_of(grad_loss));
}

Tensor tvd_scale(const Tensor& labels, int64_t m, int64_t v, int64_t ignore_index,
                 TvdReduction r, ScalarType dtype, const Device& device) {
  if (r == TvdReduction::None || r == TvdReduction::Sum) return aten::full({}, 1.0, dtype, device);
  auto n = labels.defined()
               ? aten::to(aten::sum_all(aten::ne(labels, aten::scalar_int(ignore_index))), dtype)
               : aten::full({}, static_cast<double>(m), dtype, device);
  // (A 0-dim factor of `dtype`: a double operand would promote the 0-dim n to float64.)
  if (r == TvdReduction::Mean) n = n * aten::full({}, static_cast<double>(v), dtype, device);
  return aten::reciprocal(n);
}

std::tuple<Tensor, Tensor> tvd_forward_impl(Tensor p, Tensor q,
                                            std::optional<Tensor> shift_labels,
                                            std::string reduction, int64_t ignore_index,
                                            bool compute_grad) {
  const auto r = check_tvd("fk::tvd", p, q, shift_labels, reduction);
  const auto dtype = checks::acc_type(p);
  const int64_t m = p.size(0), v = p.size(1);
  auto pc = aten::contiguous(p), qc = aten::contiguous(q);
  Tensor labels;
  if (has(shift_labels)) labels = aten::contiguous(*shift_labels);
  Tensor grad;
  if (compute_grad) grad = aten::empty_like(pc);
  if (m * v == 0) {
    // Nothing to launch: the loss of no elements (a sum of 0, scaled: NaN for a mean over
    // no rows or no columns, as 0 / 0).
    if (r == TvdReduction::None) return {aten::empty({m, v}, dtype, p.device()), grad};
    auto zero = aten::zeros({}, dtype, p.device());
    return {zero * tvd_scale(labels, m, v, ignore_index, r, dtype, p.device()), grad};
  }
  auto loss = p.is_cuda() ? tvd_forward_cuda(pc, qc, labels, grad, r, ignore_index)
                          : tvd_forward_cpu(pc, qc, labels, grad, r, ignore_index);
  return {loss, grad};
}

namespace {

void scale_grad(const Tensor& src, const Tensor& dst, const Tensor& grad_loss) {
  if (src.numel() == 0) return;
  if (src.is_cuda()) return tvd_scale_grad_cuda(src, dst, grad_loss);
  aten::copy_(dst, aten::to(src, grad_loss.scalar_type()) * grad_loss);
}

}  // namespace

Tensor tvd_backward_impl(Tensor grad, Tensor grad_loss) {
  check_tvd_backward("fk::_tvd_backward", grad, grad_loss);
  auto src = aten::contiguous(grad);
  auto out = aten::empty_like(src);
  scale_grad(src, out, aten::contiguous(grad_loss));
  return out;
}

void tvd_backward_inplace_impl(Tensor grad, Tensor grad_loss) {
  constexpr const char* op = "fk::_tvd_backward_";
  check_tvd_backward(op, grad, grad_loss);
  FK_CHECK(grad.is_contiguous(), op, ": grad must be contiguous");
  scale_grad(grad, grad, aten::contiguous(grad_loss));
}

namespace {

// tvd below autograd (no gradient wanted, or inference): the loss of _tvd_forward without
// the gradient. The autograd kernel is python/fk/ops/tvd.py.
Tensor tvd_composite(Tensor p, Tensor q, std::optional<Tensor> shift_labels,
                     std::string reduction, int64_t ignore_index) {
  check_tvd("fk::tvd", p, q, shift_labels, reduction);
  auto r = aten::call_n<2>("fk::_tvd_forward", "", p, q, shift_labels, reduction, ignore_index,
                           false);
  return r[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // Total variation distance of Liger Kernel's LigerTVDLoss: 0.5 * |p - q| per element of
  // p, q (BT, V) (probabilities of one dtype); rows whose shift_labels (BT,) int64 equal
  // ignore_index contribute 0. reduction: "none" (BT, V), "sum", "mean" (/ (n * V)) or
  // "batchmean" (/ n), n the rows not ignored (BT without labels). The loss is float32
  // (float64 for float64 p); a gradient flows to p only.
  m.def("tvd(Tensor p, Tensor q, Tensor? shift_labels=None, str reduction='batchmean', "
        "int ignore_index=-100) -> Tensor");
  // (loss, grad): grad is the gradient of loss with respect to p for a grad_output of 1 (a
  // new (BT, V) tensor of p's dtype), None unless compute_grad.
  m.def("_tvd_forward(Tensor p, Tensor q, Tensor? shift_labels, str reduction, "
        "int ignore_index, bool compute_grad) -> (Tensor, Tensor)");
  // grad * grad_loss (a scalar, or grad's shape for reduction 'none').
  m.def("_tvd_backward(Tensor grad, Tensor grad_loss) -> Tensor");
  // The same in place (grad contiguous); on CUDA a no-op where grad_loss is a scalar 1.
  m.def("_tvd_backward_(Tensor(a!) grad, Tensor grad_loss) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("tvd", TORCH_BOX(&fk::ops::tvd_composite));
}
