// Schemas of fk::fp8_quantize and fk::fp8_dequantize, the checks every backend shares, and
// the dequantization (ATen operators through the stable dispatcher; CPU and CUDA).
// Fake kernels and the format: python/fk/ops/fp8_quantize.py.
#include "ops/fp8_quantize/fp8_quantize.h"

#include "runtime/checks.h"

namespace fk::ops {

namespace {

void check_block(const char* op, int64_t block_rows) {
  FK_CHECK(block_rows == 1 || block_rows == kFp8Block, op,
           ": block must be (1, 128) or (128, 128), got (", block_rows, ", 128)");
}

bool is_half_float(ScalarType st) { return st == kFloat || st == kBFloat16 || st == kHalf; }

}  // namespace

void check_fp8_input_dtype(const char* op, const Tensor& x) {
  FK_CHECK(is_half_float(x.scalar_type()), op, ": x has dtype ", x.scalar_type(),
           ", which is not supported (supported: float32, bfloat16, float16)");
}

Fp8Layout parse_fp8_layout(const char* op, const std::string& layout) {
  FK_CHECK(layout == "rowwise" || layout == "columnwise" || layout == "both", op,
           ": layout must be 'rowwise', 'columnwise' or 'both', got '", layout, "'");
  return {layout != "columnwise", layout != "rowwise"};
}

Fp8Layout check_fp8_quantize(const Tensor& x, int64_t block_rows, const std::string& layout) {
  constexpr const char* op = "fk::fp8_quantize";
  FK_CHECK(x.dim() == 2, op, ": x must be 2-D (M, K), got shape ", shape_of(x),
           " (flatten the leading dims first)");
  check_fp8_input_dtype(op, x);
  check_block(op, block_rows);
  return parse_fp8_layout(op, layout);
}

void check_fp8_dequantize(const Tensor& data, const Tensor& scales, int64_t block_rows,
                          ScalarType dtype) {
  constexpr const char* op = "fk::fp8_dequantize";
  FK_CHECK(data.dim() == 2, op, ": data must be 2-D, got shape ", shape_of(data));
  FK_CHECK(data.scalar_type() == kFloat8e4m3, op, ": data must be float8_e4m3fn, got ",
           data.scalar_type());
  FK_CHECK(scales.scalar_type() == kFloat, op, ": scales must be float32, got ",
           scales.scalar_type());
  checks::check_same_device(op, "data", data, "scales", scales);
  check_block(op, block_rows);
  FK_CHECK(is_half_float(dtype), op, ": dtype must be float32, bfloat16 or float16, got ",
           dtype);
  const int64_t r = data.size(0), c = data.size(1);
  const Shape want = block_rows == 1
                         ? Shape{checks::ceil_div(c, kFp8Block), r}
                         : Shape{checks::ceil_div(r, kFp8Block), checks::ceil_div(c, kFp8Block)};
  FK_CHECK(sizes_vec(scales) == want, op, ": scales must have shape ", ShapeText{want},
           " for data of shape ", shape_of(data), " and block (", block_rows, ", 128), got ",
           shape_of(scales));
}

namespace {

// out = data * (each element's block scale), in fp32, rounded once to dtype.
Tensor fp8_dequantize_impl(Tensor data, Tensor scales, int64_t block_rows, ScalarType dtype) {
  check_fp8_dequantize(data, scales, block_rows, dtype);
  const int64_t r = data.size(0), c = data.size(1);
  const int64_t nc = checks::ceil_div(c, kFp8Block);
  Tensor full;
  if (block_rows == 1) {
    auto s = aten::unsqueeze(aten::t(scales), 2);  // (r, nc, 1)
    full = aten::reshape(aten::expand(s, {r, nc, kFp8Block}), {r, nc * kFp8Block});
  } else {
    const int64_t nr = checks::ceil_div(r, kFp8Block);
    auto s = aten::reshape(scales, {nr, 1, nc, 1});
    full = aten::reshape(aten::expand(s, {nr, kFp8Block, nc, kFp8Block}),
                         {nr * kFp8Block, nc * kFp8Block});
    full = aten::narrow(full, 0, 0, r);
  }
  full = aten::narrow(full, 1, 0, c);
  return aten::contiguous(aten::to(aten::to(data, kFloat) * full, dtype));
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // Blockwise float8_e4m3fn quantization of a 2-D x: (data, scales, data_t, scales_t), the
  // copies layout does not ask for undefined. block_rows 1: 1 x 128 blocks; 128: 128 x 128.
  m.def("fp8_quantize(Tensor x, int block_rows=1, str layout='rowwise', "
        "bool pow2_scales=False) -> (Tensor, Tensor, Tensor, Tensor)");
  // data * its block scales, in fp32, rounded once to dtype.
  m.def("fp8_dequantize(Tensor data, Tensor scales, int block_rows, ScalarType dtype) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("fp8_dequantize", TORCH_BOX(&fk::ops::fp8_dequantize_impl));
}

STABLE_TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("fp8_dequantize", TORCH_BOX(&fk::ops::fp8_dequantize_impl));
}
