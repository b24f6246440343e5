// Schemas of fk::swiglu_fp8, fk::moe_swiglu_fp8 and their backwards, and the checks every
// backend shares. Fake kernels, autograd and the layouts: python/fk/ops/swiglu_fp8.py.
#include "ops/swiglu_fp8/swiglu_fp8.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {

void check_x(const char* op, const Tensor& x) {
  FK_CHECK(x.dim() == 2, op, ": x must be 2-D (M, 2n), got shape ", shape_of(x),
           " (flatten the leading dims first)");
  const auto st = x.scalar_type();
  FK_CHECK(st == kFloat || st == kBFloat16 || st == kHalf, op, ": x has dtype ", st,
           ", which is not supported (supported: float32, bfloat16, float16)");
  FK_CHECK(x.size(1) % 2 == 0, op, ": x's last dim must be even (gate then up), got ",
           x.size(1));
}

void check_grad_h(const char* op, const Tensor& grad_h, const Tensor& x) {
  checks::check_same_device(op, "grad_h", grad_h, "x", x);
  checks::check_same_dtype(op, "grad_h", grad_h, "x", x);
  const Shape want{x.size(0), x.size(1) / 2};
  FK_CHECK(sizes_vec(grad_h) == want, op, ": grad_h must have shape ", ShapeText{want},
           " (M, n) for x of shape ", shape_of(x), ", got ", shape_of(grad_h));
}

void check_probs(const char* op, const Tensor& probs, const Tensor& x) {
  checks::check_same_device(op, "probs", probs, "x", x);
  FK_CHECK(probs.scalar_type() == kFloat, op, ": probs must be float32, got ",
           probs.scalar_type());
  const Shape want{x.size(0)};
  FK_CHECK(sizes_vec(probs) == want, op, ": probs must have shape ", ShapeText{want},
           " (one per row of x), got ", shape_of(probs));
}

}  // namespace

Fp8Layout check_swiglu_fp8(const Tensor& x, const std::string& layout) {
  check_x(kSwigluFp8, x);
  return parse_fp8_layout(kSwigluFp8, layout);
}

Fp8Layout check_swiglu_fp8_backward(const Tensor& grad_h, const Tensor& x,
                                     const std::string& grad_layout) {
  constexpr const char* op = kSwigluFp8Backward;
  check_x(op, x);
  check_grad_h(op, grad_h, x);
  FK_CHECK(grad_layout == "none" || grad_layout == "rowwise" || grad_layout == "columnwise" ||
               grad_layout == "both",
           op, ": grad_layout must be 'none', 'rowwise', 'columnwise' or 'both', got '",
           grad_layout, "'");
  if (grad_layout == "none") return {false, false};
  const int64_t n = x.size(1) / 2;
  FK_CHECK(n % kFp8Block == 0, op, ": a quantized gradient (grad_layout '", grad_layout,
           "') needs n (x's last dim / 2) to be a multiple of 128, got n = ", n);
  return {grad_layout != "columnwise", grad_layout != "rowwise"};
}

Fp8Layout check_moe_swiglu_fp8(const Tensor& x, const Tensor& probs,
                               const Tensor& tokens_per_expert, const std::string& layout) {
  constexpr const char* op = kMoeSwigluFp8;
  check_x(op, x);
  check_probs(op, probs, x);
  const Tensor& tpe = tokens_per_expert;
  checks::check_same_device(op, "tokens_per_expert", tpe, "x", x);
  FK_CHECK(tpe.dim() == 1 && (tpe.scalar_type() == kInt || tpe.scalar_type() == kLong), op,
           ": tokens_per_expert must be a 1-D int32 or int64 tensor, got dtype ",
           tpe.scalar_type(), " and shape ", shape_of(tpe));
  FK_CHECK(tpe.size(0) >= 1, op, ": tokens_per_expert must have at least one expert");
  return parse_fp8_layout(op, layout);
}

bool check_moe_swiglu_fp8_backward(const Tensor& grad_h, const Tensor& x, const Tensor& probs,
                                   const std::string& grad_layout) {
  constexpr const char* op = kMoeSwigluFp8Backward;
  check_x(op, x);
  check_grad_h(op, grad_h, x);
  check_probs(op, probs, x);
  FK_CHECK(grad_layout == "none" || grad_layout == "rowwise", op,
           ": grad_layout must be 'none' or 'rowwise' (a column-wise copy per expert segment "
           "is not implemented), got '", grad_layout, "'");
  if (grad_layout == "none") return false;
  const int64_t n = x.size(1) / 2;
  FK_CHECK(n % kFp8Block == 0, op, ": a quantized gradient (grad_layout '", grad_layout,
           "') needs n (x's last dim / 2) to be a multiple of 128, got n = ", n);
  return true;
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // h = silu(gate) * up of x (M, 2n) = [gate | up], in fp32, rounded to x's dtype, quantized
  // in 1 x 128 blocks: (data (M, n), scales (ceil(n / 128), M), data_t (n, M), scales_t
  // (ceil(M / 128), n), h (M, n)), the copies layout does not ask for (and h without
  // return_h) undefined.
  m.def("swiglu_fp8(Tensor x, str layout='rowwise', bool pow2_scales=False, "
        "bool return_h=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // dx (M, 2n) of h = silu(gate) * up given grad_h (M, n), in x's dtype (grad_layout 'none'),
  // or quantized in 1 x 128 blocks: (dx, data (M, 2n), scales (2n / 128, M), data_t (2n, M),
  // scales_t (ceil(M / 128), 2n)), what is not asked for undefined.
  m.def("swiglu_fp8_backward(Tensor grad_h, Tensor x, str grad_layout='none', "
        "bool pow2_scales=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // The MoE form: h = silu(gate) * up * probs[:, None] over the concatenated expert segments
  // of tokens_per_expert; the column-wise copy is quantized per segment: data_t (n, M),
  // scales_t ((M + 127 E) / 128, n) (python/fk/ops/swiglu_fp8.py defines the layout).
  m.def("moe_swiglu_fp8(Tensor x, Tensor probs, Tensor tokens_per_expert, "
        "str layout='rowwise', bool pow2_scales=False, bool return_h=False) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // (dx in x's dtype, dprobs float32, undefined x 2) of the MoE form; grad_layout 'rowwise':
  // (undefined, dprobs, data (M, 2n), scales (2n / 128, M)) of dx quantized in 1 x 128 blocks.
  m.def("moe_swiglu_fp8_backward(Tensor grad_h, Tensor x, Tensor probs, "
        "str grad_layout='none', bool pow2_scales=False) -> (Tensor, Tensor, Tensor, Tensor)");
}
