// Schemas of fk::rope, its backward and the in-place fk::rope_, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/rope.py.
#include "ops/rope/rope.h"

#include <algorithm>
#include <numeric>

#include "runtime/checks.h"

namespace fk::ops {

namespace {

ShapeText strides_of(const Tensor& t) {
  auto s = t.strides();
  return {Shape(s.begin(), s.end())};
}

// c10's is_non_overlapping_and_dense: the elements fill one block of memory with no gaps
// and no element stored twice, in some order of the dims.
bool non_overlapping_and_dense(const Tensor& t) {
  const auto sizes = sizes_vec(t);
  const auto s = t.strides();
  const Shape strides(s.begin(), s.end());
  const int64_t n = t.dim();
  if (n == 1) return sizes[0] < 2 || strides[0] == 1;
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  // By stride, dims of size 0 and 1 last.
  std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    if (sizes[a] < 2) return false;
    if (sizes[b] < 2) return true;
    return strides[a] < strides[b];
  });
  int64_t expected = 1;
  for (int64_t d : perm) {
    if (sizes[d] < 2) return true;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

// Some element stored twice: a dim of size > 1 with stride 0 (expanded tensors), what
// ATen's has_internal_overlap reports as certain.
bool has_internal_overlap(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  }
  return false;
}

// aten::is_set_to: the same storage, storage offset, sizes and strides.
bool is_set_to(const Tensor& a, const Tensor& b) {
  std::array<StableIValue, 2> stack{torch::stable::detail::from(a),
                                    torch::stable::detail::from(b)};
  TORCH_ERROR_CODE_CHECK(
      torch_call_dispatcher("aten::is_set_to", "", stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<bool>(stack[0]);
}

}  // namespace

void check_qk_and_tables(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos,
                         const Tensor& sin) {
  FK_CHECK(q.dim() == 4 && k.dim() == 4, op,
           ": q and k must have 4 dims (batch, heads, seq, head_dim), got shapes ", shape_of(q),
           " and ", shape_of(k));
  checks::check_pair(op, "q", q, "k", k);
  FK_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3), op,
           ": q and k must have the same batch, seq and head_dim sizes, got shapes ",
           shape_of(q), " and ", shape_of(k));
  checks::check_same_device(op, "cos", cos, "q", q);
  checks::check_same_device(op, "sin", sin, "q", q);
  checks::check_same_dtype(op, "cos", cos, "sin", sin);
  checks::check_same_shape(op, "cos", cos, "sin", sin);
  FK_CHECK(cos.scalar_type() == q.scalar_type() || cos.scalar_type() == kFloat, op,
           ": cos and sin must be float32 or q's dtype (", q.scalar_type(), "), got ",
           cos.scalar_type());
}

void check_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos,
                const Tensor& sin, std::optional<int64_t> rotary_dim) {
  check_qk_and_tables(op, q, k, cos, sin);
  const int64_t cd = cos.dim();
  FK_CHECK((cd >= 2 && cd <= 4) && (cd != 4 || cos.size(1) == 1), op,
           ": cos and sin must have shape (seq, rotary_dim), (batch or 1, seq, rotary_dim) "
           "or (batch or 1, 1, seq, rotary_dim), got ",
           shape_of(cos));
  FK_CHECK(cos.size(-2) == q.size(2), op, ": cos and sin must have q's seq length (",
           q.size(2), ") in dim -2, got shape ", shape_of(cos));
  FK_CHECK(cd == 2 || cos.size(0) == 1 || cos.size(0) == q.size(0), op,
           ": cos and sin must have batch size 1 or q's (", q.size(0), "), got shape ",
           shape_of(cos));
  const int64_t width = cos.size(-1);
  const int64_t rot = rotary_dim.value_or(width);
  const int64_t d = q.size(3);
  FK_CHECK(rot >= 2 && rot % 2 == 0 && rot <= d, op, ": rotary_dim (", rot,
           ") must be even and between 2 and head_dim (", d, ")");
  FK_CHECK(width == rot || width * 2 == rot, op, ": cos and sin must have rotary_dim (", rot,
           ") or rotary_dim / 2 entries in their last dim, got ", width);
}

void check_rope_inplace(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                        std::optional<int64_t> rotary_dim) {
  constexpr const char* op = "fk::rope_";
  check_rope(op, q, k, cos, sin, rotary_dim);
  FK_CHECK(q.stride(3) == 1 && k.stride(3) == 1, op,
           ": q and k must have a contiguous last dim (stride 1), got strides ", strides_of(q),
           " and ", strides_of(k));
  FK_CHECK(!has_internal_overlap(q) && !has_internal_overlap(k), op,
           ": q and k must not have elements that share memory (expanded tensors)");
  FK_CHECK(!is_set_to(q, k), op, ": q and k must be different tensors");
}

Tensor rope_out_like(const Tensor& x) {
  if (non_overlapping_and_dense(x) && x.stride(3) == 1) {
    using OptDtype = std::optional<ScalarType>;
    return aten::call("aten::empty_strided", "", x.sizes(), x.strides(),
                      OptDtype(x.scalar_type()), std::optional<torch::headeronly::Layout>(),
                      std::optional<Device>(x.device()), std::optional<bool>());
  }
  return aten::empty(x.sizes(), x.scalar_type(), x.device());
}

Tensor rope_cos_3d(const Tensor& cos) {
  if (cos.dim() == 2) return aten::unsqueeze(cos, 0);
  if (cos.dim() == 4) return aten::squeeze(cos, 1);
  return cos;
}

std::pair<Tensor, Tensor> rope_tables_3d(const Tensor& cos, const Tensor& sin) {
  auto c = rope_cos_3d(cos), s = rope_cos_3d(sin);
  if (c.stride(-1) != 1) c = aten::contiguous(c);
  if (s.stride(-1) != 1) s = aten::contiguous(s);
  if (!(strides_of(c).sizes == strides_of(s).sizes)) {
    c = aten::contiguous(c);
    s = aten::contiguous(s);
  }
  return {c, s};
}

int64_t rope_rotary_dim(const Tensor& cos, std::optional<int64_t> rotary_dim) {
  return rotary_dim.value_or(cos.size(-1));
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
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
