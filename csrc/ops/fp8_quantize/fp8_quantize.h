// fk::fp8_quantize / fk::fp8_dequantize: blockwise float8_e4m3fn quantization (the format:
// python/fk/ops/fp8_quantize.py).
#pragma once

#include <string>

#include "runtime/tensor.h"

namespace fk::ops {

constexpr ScalarType kFloat8e4m3 = ScalarType::Float8_e4m3fn;
constexpr int64_t kFp8Block = 128;

struct Fp8Layout {
  bool rowwise, columnwise;
};

// x float32 / bfloat16 / float16 (the error names `op`).
void check_fp8_input_dtype(const char* op, const Tensor& x);

// "rowwise", "columnwise" or "both": the copies to write; anything else an error naming op.
Fp8Layout parse_fp8_layout(const char* op, const std::string& layout);

// The CUDA kernels of every quantizing op need compute capability 9.0 or newer (8.x GPUs
// run the sm_80 cubins, which have no FP8 conversions); an error naming op otherwise.
void check_fp8_gpu(const char* op, const Tensor& x);

// Shared by every backend: x 2-D float32 / bfloat16 / float16, block_rows 1 or 128, layout
// "rowwise", "columnwise" or "both". Returns the copies to write.
Fp8Layout check_fp8_quantize(const Tensor& x, int64_t block_rows, const std::string& layout);

// data 2-D float8_e4m3fn, scales float32 of the shape the block and data's shape give, on
// data's device; dtype float32 / bfloat16 / float16.
void check_fp8_dequantize(const Tensor& data, const Tensor& scales, int64_t block_rows,
                          ScalarType dtype);

}  // namespace fk::ops
