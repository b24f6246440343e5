// Schemas of fk::rope, its backward and the in-place fk::rope_, and the shared checks.
#include "ops/rope/rope.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "fk/fk.h"
#include "runtime/checks.h"

namespace fk::ops {

void check_rope(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                const at::Tensor& sin, std::optional<int64_t> rotary_dim) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, op,
              ": q and k must have 4 dims (batch, heads, seq, head_dim), got shapes ",
              q.sym_sizes(), " and ", k.sym_sizes());
  checks::check_pair(op, "q", q, "k", k);
  TORCH_CHECK(q.sym_size(0) == k.sym_size(0) && q.sym_size(2) == k.sym_size(2) &&
                  q.sym_size(3) == k.sym_size(3),
              op, ": q and k must have the same batch, seq and head_dim sizes, got shapes ",
              q.sym_sizes(), " and ", k.sym_sizes());
  checks::check_same_device(op, "cos", cos, "q", q);
  checks::check_same_device(op, "sin", sin, "q", q);
  checks::check_same_dtype(op, "cos", cos, "sin", sin);
  checks::check_same_shape(op, "cos", cos, "sin", sin);
  TORCH_CHECK(cos.scalar_type() == q.scalar_type() || cos.scalar_type() == at::kFloat, op,
              ": cos and sin must be float32 or q's dtype (", q.scalar_type(), "), got ",
              cos.scalar_type());
  const int64_t cd = cos.dim();
  TORCH_CHECK((cd >= 2 && cd <= 4) && (cd != 4 || cos.sym_size(1) == 1), op,
              ": cos and sin must have shape (seq, rotary_dim), (batch or 1, seq, rotary_dim) "
              "or (batch or 1, 1, seq, rotary_dim), got ",
              cos.sym_sizes());
  TORCH_CHECK(cos.sym_size(-2) == q.sym_size(2), op, ": cos and sin must have q's seq length (",
              q.sym_size(2), ") in dim -2, got shape ", cos.sym_sizes());
  TORCH_CHECK(cd == 2 || cos.sym_size(0) == 1 || cos.sym_size(0) == q.sym_size(0), op,
              ": cos and sin must have batch size 1 or q's (", q.sym_size(0), "), got shape ",
              cos.sym_sizes());
  const c10::SymInt width = cos.sym_size(-1);
  const c10::SymInt rot = rotary_dim.has_value() ? c10::SymInt(*rotary_dim) : width;
  const c10::SymInt d = q.sym_size(3);
  TORCH_CHECK(rot >= 2 && rot % 2 == 0 && rot <= d, op, ": rotary_dim (", rot,
              ") must be even and between 2 and head_dim (", d, ")");
  TORCH_CHECK(width == rot || width * 2 == rot, op,
              ": cos and sin must have rotary_dim (", rot, ") or rotary_dim / 2 entries in "
              "their last dim, got ", width);
}

void check_rope_inplace(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                        const at::Tensor& sin, std::optional<int64_t> rotary_dim) {
  constexpr const char* op = "fk::rope_";
  check_rope(op, q, k, cos, sin, rotary_dim);
  TORCH_CHECK(q.sym_stride(3) == 1 && k.sym_stride(3) == 1, op,
              ": q and k must have a contiguous last dim (stride 1), got strides ",
              q.sym_strides(), " and ", k.sym_strides());
  TORCH_CHECK(at::has_internal_overlap(q) != at::MemOverlap::Yes &&
                  at::has_internal_overlap(k) != at::MemOverlap::Yes,
              op, ": q and k must not have elements that share memory (expanded tensors)");
  TORCH_CHECK(!q.is_same(k), op, ": q and k must be different tensors");
}

at::Tensor rope_out_like(const at::Tensor& x) {
  if (x.is_non_overlapping_and_dense() && x.sym_stride(3) == 1) return at::empty_like(x);
  return at::empty_symint(x.sym_sizes(), x.options());
}

at::Tensor rope_cos_3d(const at::Tensor& cos) {
  if (cos.dim() == 2) return cos.unsqueeze(0);
  if (cos.dim() == 4) return cos.squeeze(1);
  return cos;
}

int64_t rope_rotary_dim(const at::Tensor& cos, std::optional<int64_t> rotary_dim) {
  return rotary_dim.value_or(cos.size(-1));
}

using RopeFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const at::Tensor&,
                                                  std::optional<int64_t>, bool);

std::tuple<at::Tensor, at::Tensor> rope_call(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& cos, const at::Tensor& sin,
                                             std::optional<int64_t> rotary_dim,
                                             bool interleaved) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fk::rope", "").typed<RopeFn>();
  return op.call(q, k, cos, sin, rotary_dim, interleaved);
}

std::tuple<at::Tensor, at::Tensor> rope_backward_call(const at::Tensor& grad_q,
                                                      const at::Tensor& grad_k,
                                                      const at::Tensor& cos,
                                                      const at::Tensor& sin,
                                                      std::optional<int64_t> rotary_dim,
                                                      bool interleaved) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fk::_rope_backward", "").typed<RopeFn>();
  return op.call(grad_q, grad_k, cos, sin, rotary_dim, interleaved);
}

void rope_inplace_call(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, std::optional<int64_t> rotary_dim,
                       bool interleaved) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("fk::rope_", "")
                       .typed<void(at::Tensor&, at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, std::optional<int64_t>, bool)>();
  op.call(q, k, cos, sin, rotary_dim, interleaved);
}

}  // namespace fk::ops

std::tuple<at::Tensor, at::Tensor> fk::rope(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            std::optional<int64_t> rotary_dim, bool interleaved) {
  return fk::ops::rope_call(q, k, cos, sin, rotary_dim, interleaved);
}

void fk::rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
               std::optional<int64_t> rotary_dim, bool interleaved) {
  fk::ops::rope_inplace_call(q, k, cos, sin, rotary_dim, interleaved);
}

TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (q_out, k_out) = (q * cos + rotate_half(q) * sin, the same for k) on the first
  // rotary_dim dims of each head (the rest pass through), in fp32, rounded once.
  // q (B, Hq, S, D), k (B, Hkv, S, D); cos / sin (S, W), (1 or B, S, W) or
  // (1 or B, 1, S, W), float32 or q's dtype; rotary_dim defaults to W; W = rotary_dim
  // (both halves stored, as Hugging Face returns them) or rotary_dim / 2 (one value per
  // pair). interleaved: pairs (2i, 2i + 1) and cos / sin in that layout (GPT-J).
  // Outputs are laid out like q and k when those are dense (see python/fk/ops/rope.py).
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin, int? rotary_dim=None, "
        "bool interleaved=False) -> (Tensor, Tensor)");
  // (grad_q, grad_k) given the gradients of the outputs: the transposed map (the inverse
  // rotation, sin -> -sin, for duplicated cos / sin). cos and sin get no gradient.
  m.def("_rope_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor cos, Tensor sin, "
        "int? rotary_dim, bool interleaved) -> (Tensor, Tensor)");
  // The same rotation written into q and k. Not differentiable: q and k must not require
  // grad while grad mode is on.
  m.def("rope_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int? rotary_dim=None, "
        "bool interleaved=False) -> ()");
}
