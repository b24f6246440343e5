// Schemas of fk::llama4_rope and its backward, and the shared check.
// Fake kernels and the autograd formula: python/fk/ops/llama4_rope.py.
#include "ops/llama4_rope/llama4_rope.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {

bool is_complex(ScalarType t) {
  return t == ScalarType::ComplexFloat || t == ScalarType::ComplexDouble;
}

// The dtype of freqs' real and imaginary parts.
ScalarType part_type(const Tensor& freqs) {
  const auto t = freqs.scalar_type();
  if (t == ScalarType::ComplexFloat) return kFloat;
  if (t == ScalarType::ComplexDouble) return kDouble;
  return t;
}

}  // namespace

void check_llama4_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor& freqs) {
  FK_CHECK(q.dim() == 4 && k.dim() == 4, op,
           ": q and k must have 4 dims (batch, seq, heads, head_dim), got shapes ", shape_of(q),
           " and ", shape_of(k));
  checks::check_pair(op, "q", q, "k", k);
  FK_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op,
           ": q and k must have the same batch, seq and head_dim sizes, got shapes ",
           shape_of(q), " and ", shape_of(k));
  const int64_t d = q.size(3);
  FK_CHECK(d >= 2 && d % 2 == 0, op, ": head_dim must be even and at least 2, got ", d);
  checks::check_same_device(op, "freqs_cis", freqs, "q", q);
  const bool cplx = is_complex(freqs.scalar_type());
  const auto part = part_type(freqs);
  FK_CHECK(part == kFloat || part == q.scalar_type(), op,
           ": freqs_cis must be complex64, or float32 or q's dtype (", q.scalar_type(),
           ") holding (real, imag) pairs, got ", freqs.scalar_type());
  // The complex shape: the real view's without its last dim of 2.
  const int64_t fd = cplx ? freqs.dim() : freqs.dim() - 1;
  FK_CHECK((fd == 2 || fd == 3) && (cplx || freqs.size(-1) == 2), op,
           ": freqs_cis must have shape (seq, head_dim / 2) or (batch or 1, seq, "
           "head_dim / 2) (complex), or that shape with a last dim of 2 (real, imag), got ",
           shape_of(freqs));
  FK_CHECK(freqs.size(fd - 2) == q.size(1), op, ": freqs_cis must have q's seq length (",
           q.size(1), "), got shape ", shape_of(freqs));
  FK_CHECK(fd == 2 || freqs.size(0) == 1 || freqs.size(0) == q.size(0), op,
           ": freqs_cis must have batch size 1 or q's (", q.size(0), "), got shape ",
           shape_of(freqs));
  FK_CHECK(freqs.size(fd - 1) == d / 2, op, ": freqs_cis must have head_dim / 2 (", d / 2,
           ") entries per position, got shape ", shape_of(freqs));
}

Tensor llama4_freqs_real(const Tensor& freqs) {
  Tensor f = is_complex(freqs.scalar_type()) ? aten::call("aten::view_as_real", "", freqs)
                                             : freqs;
  return f.dim() == 3 ? aten::unsqueeze(f, 0) : f;
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (q_out, k_out): each adjacent pair (x[2i], x[2i+1]) of every head of q and k, read as
  // the complex x[2i] + i x[2i+1], times freqs_cis[..., s, i] (Llama 4's apply_rotary_emb:
  // view_as_real(view_as_complex(x.float().reshape(..., D/2, 2)) * freqs_cis)), in fp32,
  // rounded once to q's dtype. q (B, S, Hq, D), k (B, S, Hkv, D); freqs_cis complex64
  // (S, D/2) or (1 or B, S, D/2), or its real view (..., D/2, 2) in float32 or q's dtype.
  // Outputs are laid out like q and k when those are dense.
  m.def("llama4_rope(Tensor q, Tensor k, Tensor freqs_cis) -> (Tensor, Tensor)");
  // (grad_q, grad_k) given the gradients of the outputs: the pairs times conj(freqs_cis).
  m.def("_llama4_rope_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor freqs_cis) "
        "-> (Tensor, Tensor)");
}
