// Schemas of fk::qkv_split_norm_rope and its backward, and the shared checks.
// Fake kernels and the autograd formula: python/fk/ops/qkv_split_norm_rope.py.
#include "ops/qkv_split_norm_rope/qkv_split_norm_rope.h"

#include "ops/rope/rope.h"
#include "runtime/checks.h"

namespace fk::ops {

namespace {

bool parse_choice(const char* op, const char* arg, const std::string& v, const char* a,
                  const char* b) {
  FK_CHECK(v == a || v == b, op, ": ", arg, " must be '", a, "' or '", b, "', got '", v, "'");
  return v == a;
}

void check_norm_weight(const char* op, const char* name, const Tensor& qkv,
                       const std::optional<Tensor>& w, int64_t d) {
  if (!has(w)) return;
  checks::check_pair(op, "qkv", qkv, name, *w);
  FK_CHECK(w->dim() == 1 && w->size(0) == d, op, ": ", name, " must have shape (", d,
           ",) (head_dim), got ", shape_of(*w));
}

}  // namespace

QkvSplit check_qkv_split_norm_rope(const char* op, const Tensor& qkv,
                                   const std::optional<Tensor>& q_norm_weight,
                                   const std::optional<Tensor>& k_norm_weight,
                                   const Tensor& cos, const Tensor& sin, int64_t num_heads,
                                   int64_t num_kv_heads, std::optional<int64_t> rotary_dim,
                                   const std::string& layout, const std::string& qkv_format,
                                   const std::string& input_layout) {
  QkvSplit p{};
  p.bhsd = !parse_choice(op, "layout", layout, "bshd", "bhsd");
  p.grouped = parse_choice(op, "qkv_format", qkv_format, "grouped", "plain");
  p.tokens_sb = parse_choice(op, "input_layout", input_layout, "sbh", "bsh");
  FK_CHECK(qkv.dim() == 3, op, ": qkv must have 3 dims (", p.tokens_sb ? "seq, batch" : "batch, seq",
           ", (num_heads + 2 * num_kv_heads) * head_dim) for input_layout '", input_layout,
           "', got shape ", shape_of(qkv));
  checks::check_float(op, "qkv", qkv);
  FK_CHECK(num_heads >= 1 && num_kv_heads >= 1 && num_heads % num_kv_heads == 0, op,
           ": num_heads (", num_heads, ") must be a positive multiple of num_kv_heads (",
           num_kv_heads, ")");
  const int64_t heads = num_heads + 2 * num_kv_heads, n = qkv.size(2);
  FK_CHECK(n % heads == 0 && n > 0, op, ": the last dim of qkv (", n,
           ") must be (num_heads + 2 * num_kv_heads) * head_dim = ", heads, " * head_dim");
  p.hq = num_heads;
  p.hkv = num_kv_heads;
  p.d = n / heads;
  p.s = qkv.size(p.tokens_sb ? 0 : 1);
  p.b = qkv.size(p.tokens_sb ? 1 : 0);
  check_norm_weight(op, "q_norm_weight", qkv, q_norm_weight, p.d);
  check_norm_weight(op, "k_norm_weight", qkv, k_norm_weight, p.d);
  // cos / sin against one head of qkv seen as (B, 1, S, D): fk::rope's checks and messages.
  auto x = p.tokens_sb ? aten::transpose(qkv, 0, 1) : qkv;
  auto head = aten::unsqueeze(aten::narrow(x, 2, 0, p.d), 1);
  check_rope(op, head, head, cos, sin, rotary_dim);
  p.rot = rope_rotary_dim(cos, rotary_dim);
  return p;
}

QkvSplit check_qkv_split_norm_rope_backward(
    const char* op, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
    const Tensor& qkv, const std::optional<Tensor>& q_norm_weight,
    const std::optional<Tensor>& k_norm_weight, const Tensor& cos, const Tensor& sin,
    int64_t num_heads, int64_t num_kv_heads, std::optional<int64_t> rotary_dim,
    const std::string& layout, const std::string& qkv_format, const std::string& input_layout) {
  auto p = check_qkv_split_norm_rope(op, qkv, q_norm_weight, k_norm_weight, cos, sin,
                                     num_heads, num_kv_heads, rotary_dim, layout, qkv_format,
                                     input_layout);
  const std::pair<const char*, const Tensor*> grads[] = {
      {"grad_q", &grad_q}, {"grad_k", &grad_k}, {"grad_v", &grad_v}};
  for (int i = 0; i < 3; ++i) {
    const auto& [name, g] = grads[i];
    checks::check_pair(op, name, *g, "qkv", qkv);
    const int64_t h = i == 0 ? p.hq : p.hkv;
    const Shape want = p.bhsd ? Shape{p.b, h, p.s, p.d} : Shape{p.b, p.s, h, p.d};
    FK_CHECK(sizes_vec(*g) == want, op, ": ", name, " must have the output's shape ",
             ShapeText{want}, ", got ", shape_of(*g));
  }
  return p;
}

Tensor qkv_split_output(const QkvSplit& p, int64_t heads, const Tensor& like) {
  const Shape shape = p.bhsd ? Shape{p.b, heads, p.s, p.d} : Shape{p.b, p.s, heads, p.d};
  return aten::empty(IntArrayRef(shape.data(), shape.size()), like.scalar_type(), like.device());
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (q, k, v) from the fused QKV projection qkv: (S, B, N) (input_layout 'sbh', Megatron) or
  // (B, S, N) ('bsh'), N = (num_heads + 2 * num_kv_heads) * head_dim, heads laid out per kv
  // group as [q heads of the group..., k, v] (qkv_format 'grouped', Megatron) or as
  // [q..., k..., v...] ('plain'). q and k: RMSNorm over each head with its weight (Hugging
  // Face Qwen3 / OLMo 2 numerics; none without a weight), then the rotate-half RoPE of fk::rope
  // on the first rotary_dim dims. Outputs contiguous (B, S, H, D) (layout 'bshd') or
  // (B, H, S, D) ('bhsd').
  m.def("qkv_split_norm_rope(Tensor qkv, Tensor? q_norm_weight, Tensor? k_norm_weight, "
        "Tensor cos, Tensor sin, int num_heads, int num_kv_heads, float eps=1e-06, "
        "int? rotary_dim=None, str layout='bshd', str qkv_format='grouped', "
        "str input_layout='sbh') -> (Tensor, Tensor, Tensor)");
  // (grad_qkv, grad_q_norm_weight, grad_k_norm_weight) given the outputs' gradients; a weight
  // gradient whose output_mask entry is False (or without the weight) is undefined.
  m.def("_qkv_split_norm_rope_backward(Tensor grad_q, Tensor grad_k, Tensor grad_v, "
        "Tensor qkv, Tensor? q_norm_weight, Tensor? k_norm_weight, Tensor cos, Tensor sin, "
        "int num_heads, int num_kv_heads, float eps, int? rotary_dim, str layout, "
        "str qkv_format, str input_layout, bool[2] output_mask) -> (Tensor, Tensor, Tensor)");
}
