// Schemas of fk::fused_linear_jsd and its internal forward, the shared checks, the chunk
// sizes and the chunked algorithm in ATen operators (through the stable dispatcher),
// registered for CPU and CUDA alike. Fake kernel and the autograd kernel:
// python/fk/ops/fused_linear_jsd.py.
//
// Per chunk of `rows` rows (fljsd_chunk_rows), in steps of `sub` rows (fljsd_logits_rows):
// the student's and the teacher's logits of the step in float32 (a float32 product of
// 16-bit operands on CUDA, no rounding of the logits to 16 bits) into two reused (sub, V)
// buffers; jsd_rows writes the loss rows and the student logits' gradient into the
// chunk's (rows, V) gradient buffer, in the input dtype; then grad_x_c = G @ W_s and
// grad_W_s (+)= G^T @ x_c (the first chunk writes, the others add). The gradient products
// run over whole chunks (many rows: every chunk reads and writes all of grad_W_s) while the
// float32 logits stay a quarter of the chunk's rows (16-bit inputs). The number of counted
// rows is computed on the device before the loop; the kernel divides by it.
//
// The stable dispatcher passes no Scalar argument, so addmm (beta, alpha) is out of reach:
// a product is added to grad_W_s with aten::linear.out(out, a, w, bias = out), which ATen
// runs as addmm_out(out, out, a, w^T) with beta 1.
#include "ops/fused_linear_jsd/fused_linear_jsd.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "runtime/checks.h"

namespace fk::ops {

void check_fused_linear_jsd(const Tensor& xs, const Tensor& ws, const Tensor& xt,
                            const Tensor& wt, const std::optional<Tensor>& shift_labels,
                            double beta, double temperature, std::optional<int64_t> chunk_size) {
  constexpr const char* op = "fk::fused_linear_jsd";
  FK_CHECK(xs.dim() == 2, op, ": student_input must have shape (N, H), got ", shape_of(xs));
  checks::check_pair(op, "student_input", xs, "student_weight", ws);
  FK_CHECK(ws.dim() == 2 && ws.size(1) == xs.size(1), op,
           ": student_weight must have shape (V, ", xs.size(1),
           ") to match student_input, got ", shape_of(ws));
  FK_CHECK(ws.size(0) >= 1, op,
           ": student_weight must have at least one class (row), got shape ", shape_of(ws));
  checks::check_pair(op, "student_input", xs, "teacher_input", xt);
  FK_CHECK(xt.dim() == 2 && xt.size(0) == xs.size(0), op, ": teacher_input must have shape (",
           xs.size(0), ", H') to match student_input, got ", shape_of(xt));
  checks::check_pair(op, "student_input", xs, "teacher_weight", wt);
  FK_CHECK(wt.dim() == 2 && wt.size(0) == ws.size(0) && wt.size(1) == xt.size(1), op,
           ": teacher_weight must have shape (", ws.size(0), ", ", xt.size(1),
           ") to match student_weight and teacher_input, got ", shape_of(wt));
  if (has(shift_labels)) {
    checks::check_same_device(op, "student_input", xs, "shift_labels", *shift_labels);
    FK_CHECK(shift_labels->scalar_type() == kLong, op,
             ": shift_labels must be int64, got ", shift_labels->scalar_type());
    FK_CHECK(shift_labels->dim() == 1 && shift_labels->size(0) == xs.size(0), op,
             ": shift_labels must have shape (", xs.size(0), ",) to match student_input, got ",
             shape_of(*shift_labels));
  }
  FK_CHECK(beta >= 0.0 && beta <= 1.0, op, ": beta must be in [0, 1], got ", beta);
  FK_CHECK(temperature > 0.0 && std::isfinite(temperature), op,
           ": temperature must be positive and finite, got ", temperature);
  FK_CHECK(!chunk_size.has_value() || *chunk_size >= 1, op,
           ": chunk_size must be positive, got ", chunk_size.value_or(0));
}

int64_t fljsd_chunk_rows(int64_t n, int64_t h, int64_t v, std::optional<int64_t> chunk_size) {
  if (chunk_size.has_value()) return std::max<int64_t>(1, std::min(*chunk_size, n));
  // At least 1024 rows keep the gradient products compute-bound (each chunk reads and
  // writes all of grad_W_s: see fused_linear_cross_entropy's rule).
  const int64_t rows = std::max<int64_t>(n * h / std::max<int64_t>(v, 1), 1024) / 128 * 128;
  return std::max<int64_t>(1, std::min(rows, n));
}

int64_t fljsd_logits_rows(int64_t rows, int64_t grad_elem) {
  const int64_t logit_elem = grad_elem == 8 ? 8 : 4;
  return std::max<int64_t>(1, rows * grad_elem / (2 * logit_elem));
}

void jsd_rows(const Tensor& s, const Tensor& t, const Tensor& grad, const Tensor& labels,
              const Tensor& den, const Tensor& loss_rows, double beta, int64_t ignore_index,
              double temperature) {
  if (s.size(0) == 0) return;
  if (s.is_cuda()) {
    jsd_rows_cuda(s, t, grad, labels, den, loss_rows, beta, ignore_index, temperature);
  } else {
    jsd_rows_cpu(s, t, grad, labels, den, loss_rows, beta, ignore_index, temperature);
  }
}

std::tuple<Tensor, Tensor, Tensor> fused_linear_jsd_forward_impl(
    Tensor student_input, Tensor student_weight, Tensor teacher_input, Tensor teacher_weight,
    std::optional<Tensor> shift_labels, double beta, int64_t ignore_index, double temperature,
    std::optional<int64_t> chunk_size, std::vector<bool> grad_mask) {
  check_fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                         shift_labels, beta, temperature, chunk_size);
  const int64_t n = student_input.size(0), h = student_input.size(1);
  const int64_t v = student_weight.size(0);
  const auto dtype = student_input.scalar_type();
  const auto ldtype = checks::acc_type(student_input);  // the logits' and the loss's
  const auto dev = student_input.device();
  const bool need_x = grad_mask[0], need_w = grad_mask[1], any_grad = need_x || need_w;
  auto xs = aten::contiguous(student_input);
  auto ws = aten::contiguous(student_weight);
  auto xt = aten::contiguous(teacher_input);
  auto wt = aten::contiguous(teacher_weight);
  Tensor labels;
  if (has(shift_labels)) labels = aten::contiguous(*shift_labels);

  auto loss_rows = aten::empty({n}, ldtype, dev);
  Tensor gx, gw;
  if (need_x) gx = aten::empty({n, h}, dtype, dev);
  if (n == 0) {
    if (need_w) gw = aten::zeros({v, ws.size(1)}, dtype, dev);
    return {aten::sum_all(loss_rows), gx, gw};
  }

  // The number of counted rows, on the device.
  const auto den = labels.defined()
                       ? aten::sum_all(aten::ne(labels, aten::scalar_int(ignore_index)), ldtype)
                       : aten::full({}, static_cast<double>(n), ldtype, dev);
  const int64_t rows = fljsd_chunk_rows(n, h, v, chunk_size);
  const int64_t sub = std::min(rows, fljsd_logits_rows(rows, student_input.element_size()));
  auto sbuf = aten::empty({sub, v}, ldtype, dev);
  auto tbuf = aten::empty({sub, v}, ldtype, dev);
  Tensor gbuf;
  if (any_grad) gbuf = aten::empty({rows, v}, dtype, dev);
  // The heads' logits in ldtype: on CUDA a float32 product of the operands (16-bit
  // operands: mm.dtype_out); on CPU, which has no such product, of float32 copies.
  const bool cast = dtype != ldtype;
  const bool cuda = xs.is_cuda();
  auto ws_t = aten::t(cast && !cuda ? aten::to(ws, ldtype) : ws);
  auto wt_t = aten::t(cast && !cuda ? aten::to(wt, ldtype) : wt);
  auto project = [&](const Tensor& out, const Tensor& x, const Tensor& w_t) {
    if (!cast) {
      aten::mm_out(out, x, w_t);
    } else if (cuda) {
      aten::mm_out_dtype(out, x, w_t);
    } else {
      aten::mm_out(out, aten::to(x, ldtype), w_t);
    }
  };

  for (int64_t c0 = 0; c0 < n; c0 += rows) {
    const int64_t r = std::min(rows, n - c0);
    for (int64_t s0 = 0; s0 < r; s0 += sub) {
      const int64_t q = std::min(sub, r - s0), row = c0 + s0;
      auto sl = aten::narrow(sbuf, 0, 0, q);
      auto tl = aten::narrow(tbuf, 0, 0, q);
      project(sl, aten::narrow(xs, 0, row, q), ws_t);
      project(tl, aten::narrow(xt, 0, row, q), wt_t);
      jsd_rows(sl, tl, any_grad ? aten::narrow(gbuf, 0, s0, q) : Tensor(),
               labels.defined() ? aten::narrow(labels, 0, row, q) : Tensor(), den,
               aten::narrow(loss_rows, 0, row, q), beta, ignore_index, temperature);
    }
    if (!any_grad) continue;
    auto g = aten::narrow(gbuf, 0, 0, r);
    auto xc = aten::narrow(xs, 0, c0, r);
    if (need_x) aten::mm_out(aten::narrow(gx, 0, c0, r), g, ws);
    if (need_w) {
      if (c0 == 0) {
        gw = aten::empty({v, h}, dtype, dev);
        aten::mm_out(gw, aten::t(g), xc);
      } else {
        aten::linear_out(gw, aten::t(g), aten::t(xc), gw);  // gw += g^T @ xc
      }
    }
  }
  return {aten::sum_all(loss_rows), gx, gw};
}

namespace {

// fused_linear_jsd below autograd (no gradient wanted, or inference): the loss only. The
// autograd kernel is python/fk/ops/fused_linear_jsd.py.
Tensor fused_linear_jsd_composite(Tensor student_input, Tensor student_weight,
                                  Tensor teacher_input, Tensor teacher_weight,
                                  std::optional<Tensor> shift_labels, double beta,
                                  int64_t ignore_index, double temperature,
                                  std::optional<int64_t> chunk_size) {
  check_fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                         shift_labels, beta, temperature, chunk_size);
  const std::array<bool, 2> no_grad{false, false};
  auto r = aten::call_n<3>("fk::_fused_linear_jsd_forward", "", student_input,
                           student_weight, teacher_input, teacher_weight, shift_labels, beta,
                           ignore_index, temperature, chunk_size,
                           torch::headeronly::HeaderOnlyArrayRef<bool>(no_grad.data(), 2));
  return r[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // The generalized Jensen-Shannon divergence of the student's log-probabilities
  // log q = log_softmax(student_input @ student_weight^T / temperature) (the input) and
  // the teacher's log p = log_softmax(teacher_input @ teacher_weight^T / temperature)
  // (the target): beta * KL(p || m) + (1 - beta) * KL(q || m), m = beta p + (1 - beta) q;
  // KL(p || q) for beta 0 and KL(q || p) for beta 1. Rows whose shift_labels equal
  // ignore_index count nothing; the loss is the sum over counted rows divided by their
  // number (0 when none counts). Float32 (float64 for float64 inputs). Only the student is
  // differentiated. chunk_size: rows per chunk of the gradient products (None: from the
  // shapes). See python/fk/ops/fused_linear_jsd.py.
  m.def("fused_linear_jsd(Tensor student_input, Tensor student_weight, Tensor teacher_input, "
        "Tensor teacher_weight, Tensor? shift_labels=None, float beta=0.5, "
        "int ignore_index=-100, float temperature=1.0, int? chunk_size=None) -> Tensor");
  // (loss, grad_student_input, grad_student_weight): the gradients where grad_mask asks,
  // for a grad_output of 1; None elsewhere.
  m.def("_fused_linear_jsd_forward(Tensor student_input, Tensor student_weight, "
        "Tensor teacher_input, Tensor teacher_weight, Tensor? shift_labels, float beta, "
        "int ignore_index, float temperature, int? chunk_size, bool[2] grad_mask) "
        "-> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeExplicitAutograd, m) {
  m.impl("fused_linear_jsd", TORCH_BOX(&fk::ops::fused_linear_jsd_composite));
}

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("_fused_linear_jsd_forward", TORCH_BOX(&fk::ops::fused_linear_jsd_forward_impl));
}

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("_fused_linear_jsd_forward", TORCH_BOX(&fk::ops::fused_linear_jsd_forward_impl));
}
