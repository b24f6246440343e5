// Schemas of fk::neighborhood_attention and its internal forward / backward, and the checks
// every backend shares. Fake kernels and the autograd formula:
// python/fk/ops/neighborhood_attention.py.
#include "ops/neighborhood_attention/neighborhood_attention.h"

#include <algorithm>
#include <cmath>

#include "runtime/checks.h"

namespace fk::ops {

NaParams check_neighborhood_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      int64_t kernel_size, int64_t dilation,
                                      std::optional<double> scale, const char* op) {
  FK_CHECK(q.dim() == 4, op, ": q must have 4 dimensions (batch, heads, seq_len, head_dim), "
           "got shape ", shape_of(q));
  checks::check_pair(op, "q", q, "k", k);
  checks::check_pair(op, "q", q, "v", v);
  checks::check_same_shape(op, "q", q, "k", k);
  checks::check_same_shape(op, "q", q, "v", v);
  FK_CHECK(kernel_size > 0 && kernel_size % 2 == 1, op,
           ": kernel_size must be a positive odd number, got ", kernel_size);
  FK_CHECK(dilation > 0, op, ": dilation must be positive, got ", dilation);
  NaParams p{q.size(0), q.size(1), q.size(2), q.size(3), 0, 1, 1.0};
  p.dilation = std::max<int64_t>(1, std::min(dilation, p.l));
  const int64_t n_sub = (p.l + p.dilation - 1) / p.dilation;
  p.radius = std::min(kernel_size / 2, std::max<int64_t>(n_sub - 1, 0));
  p.scale = scale.has_value() ? *scale : (p.d > 0 ? 1.0 / std::sqrt(double(p.d)) : 1.0);
  return p;
}

NaParams check_neighborhood_attention_backward(const Tensor& grad_out, const Tensor& q,
                                               const Tensor& k, const Tensor& v,
                                               const Tensor& out, const Tensor& lse,
                                               int64_t kernel_size, int64_t dilation,
                                               std::optional<double> scale) {
  constexpr const char* op = "fk::_neighborhood_attention_backward";
  auto p = check_neighborhood_attention(q, k, v, kernel_size, dilation, scale);
  checks::check_pair(op, "grad_out", grad_out, "q", q);
  checks::check_same_shape(op, "grad_out", grad_out, "q", q);
  checks::check_pair(op, "out", out, "q", q);
  checks::check_same_shape(op, "out", out, "q", q);
  checks::check_same_device(op, "lse", lse, "q", q);
  FK_CHECK(lse.scalar_type() == checks::acc_type(q), op,
           ": lse must be float32 (float64 for float64 q), got ", lse.scalar_type());
  FK_CHECK(lse.dim() == 3 && lse.size(0) == p.b && lse.size(1) == p.h && lse.size(2) == p.l,
           op, ": lse must have shape [", p.b, ", ", p.h, ", ", p.l, "], got ", shape_of(lse));
  return p;
}

namespace {

// neighborhood_attention on any backend is the first output of _neighborhood_attention_forward,
// whose autograd formula (python/fk/ops/neighborhood_attention.py, include/fk/autograd.h)
// saves the logsumexp it returns.
Tensor neighborhood_attention_composite(Tensor q, Tensor k, Tensor v, int64_t kernel_size,
                                        int64_t dilation, std::optional<double> scale) {
  check_neighborhood_attention(q, k, v, kernel_size, dilation, scale);
  return aten::call_n<2>("fk::_neighborhood_attention_forward", "", q, k, v, kernel_size,
                         dilation, scale)[0];
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // q, k, v: (batch, heads, seq_len, head_dim), one dtype. Query i attends the keys j with
  // |j - i| <= (kernel_size // 2) * dilation, (j - i) % dilation == 0 and 0 <= j < seq_len
  // (windows cut at the sequence ends, not shifted); softmax in fp32 of scale * q k^T over
  // them (scale defaults to 1 / sqrt(head_dim)), times v. kernel_size odd, dilation >= 1.
  // A contiguous result of q's shape and dtype.
  m.def("neighborhood_attention(Tensor q, Tensor k, Tensor v, int kernel_size=7, "
        "int dilation=1, float? scale=None) -> Tensor");
  // (out, lse): lse (batch, heads, seq_len) is the logsumexp of each query's scaled scores
  // over its window, float32 (float64 for float64 q).
  m.def("_neighborhood_attention_forward(Tensor q, Tensor k, Tensor v, int kernel_size, "
        "int dilation, float? scale) -> (Tensor, Tensor)");
  // (grad_q, grad_k, grad_v), from the forward's out and lse.
  m.def("_neighborhood_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, "
        "Tensor out, Tensor lse, int kernel_size, int dilation, float? scale) -> "
        "(Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("neighborhood_attention", TORCH_BOX(&fk::ops::neighborhood_attention_composite));
}
