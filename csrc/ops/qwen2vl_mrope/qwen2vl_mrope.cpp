// Schemas of fk::qwen2vl_mrope and its backward, and the shared check.
// Fake kernels and the autograd formula: python/fk/ops/qwen2vl_mrope.py.
#include "ops/qwen2vl_mrope/qwen2vl_mrope.h"

#include "ops/rope/rope.h"

#include "runtime/checks.h"

namespace fk::ops {

void check_qwen2vl_mrope(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos,
                         const Tensor& sin, const std::vector<int64_t>& mrope_section) {
  check_qk_and_tables(op, q, k, cos, sin);
  const int64_t d = q.size(3);
  FK_CHECK(d >= 2 && d % 2 == 0, op, ": head_dim must be even and at least 2, got ", d);
  FK_CHECK(cos.dim() == 4 && cos.size(0) == 3, op,
           ": cos and sin must have shape (3, batch or 1, seq, head_dim), got ", shape_of(cos));
  FK_CHECK(cos.size(1) == 1 || cos.size(1) == q.size(0), op,
           ": cos and sin must have batch size 1 or q's (", q.size(0), ") in dim 1, got shape ",
           shape_of(cos));
  FK_CHECK(cos.size(2) == q.size(2), op, ": cos and sin must have q's seq length (", q.size(2),
           ") in dim 2, got shape ", shape_of(cos));
  FK_CHECK(cos.size(3) == d, op, ": cos and sin must have q's head_dim (", d,
           ") in dim 3, got shape ", shape_of(cos));
  bool ok = mrope_section.size() == 3;
  int64_t total = 0;
  for (int64_t v : mrope_section) {
    ok = ok && v >= 0;
    total += v;
  }
  FK_CHECK(ok && total == d / 2, op,
           ": mrope_section must be 3 sizes >= 0 (temporal, height, width) summing to "
           "head_dim / 2 (",
           d / 2, "), got ", ShapeText{Shape(mrope_section.begin(), mrope_section.end())});
}

int64_t mrope_stream(int64_t i, const std::vector<int64_t>& section, bool interleaved) {
  if (interleaved) {
    if (i % 3 == 1 && i < 3 * section[1]) return 1;
    if (i % 3 == 2 && i < 3 * section[2]) return 2;
    return 0;
  }
  return (i >= section[0] ? 1 : 0) + (i >= section[0] + section[1] ? 1 : 0);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // (q_out, k_out) = (q * cos_m + rotate_half(q) * sin_m, the same for k), fp32 math rounded
  // once, where cos_m / sin_m (B or 1, S, D) compose the three position streams of cos / sin
  // (3, B or 1, S, D): rotating pair i (dims i and i + D/2) takes stream 0 (temporal),
  // 1 (height) or 2 (width) by mrope_section = [t, h, w] (t + h + w = D/2):
  //   interleaved=False (Qwen2-VL, Qwen2.5-VL): the first t pairs, the next h, the last w
  //     (Hugging Face's apply_multimodal_rotary_pos_emb, mrope_section doubled over dims);
  //   interleaved=True (Qwen3-VL): stream 1 for i % 3 == 1, i < 3h; stream 2 for
  //     i % 3 == 2, i < 3w; stream 0 otherwise.
  // q (B, Hq, S, D), k (B, Hkv, S, D); cos / sin float32 or q's dtype. Outputs are laid out
  // like q and k when those are dense.
  m.def("qwen2vl_mrope(Tensor q, Tensor k, Tensor cos, Tensor sin, int[] mrope_section, "
        "bool interleaved=False) -> (Tensor, Tensor)");
  // (grad_q, grad_k) given the gradients of the outputs: the transposed map. cos and sin
  // get no gradient.
  m.def("_qwen2vl_mrope_backward(Tensor grad_q_out, Tensor grad_k_out, Tensor cos, "
        "Tensor sin, int[] mrope_section, bool interleaved) -> (Tensor, Tensor)");
}
