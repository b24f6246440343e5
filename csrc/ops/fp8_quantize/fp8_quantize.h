// fk::fp8_quantize / fk::fp8_dequantize: blockwise float8_e4m3fn quantization (the format:
// python/fk/ops/fp8_quantize.py).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace fk::ops {

constexpr ScalarType kFloat8e4m3 = ScalarType::Float8_e4m3fn;
constexpr int64_t kFp8Block = 128;

struct Fp8Layout {
  bool rowwise, columnwise;
};

// layout "rowwise", "columnwise" or "both" (else an error naming `op`): the copies to write.
Fp8Layout parse_fp8_layout(const char* op, const std::string& layout);

// x float32 / bfloat16 / float16 (the error names `op`).
void check_fp8_input_dtype(const char* op, const Tensor& x);

// Shared by every backend: x 2-D float32 / bfloat16 / float16, block_rows 1 or 128, layout
// "rowwise", "columnwise" or "both". Returns the copies to write.
Fp8Layout check_fp8_quantize(const Tensor& x, int64_t block_rows, const std::string& layout);

// data 2-D float8_e4m3fn, scales float32 of the shape the block and data's shape give, on
// data's device; dtype float32 / bfloat16 / float16.
void check_fp8_dequantize(const Tensor& data, const Tensor& scales, int64_t block_rows,
                          ScalarType dtype);

// CUDA: raises, naming `op`, unless x's GPU runs the sm_90+ cubins (the FP8 kernels are
// built for sm_90 and newer; 8.x GPUs run the sm_80 cubins, which have no FP8 conversions).
void check_fp8_gpu(const char* op, const Tensor& x);

// The CPU reference of 1 x 128 blocks along the rows of a 2-D float32 x (r, c) (ATen
// operators, any device): (data (r, c) float8_e4m3fn, scales (ceil(c / 128), r)).
std::pair<Tensor, Tensor> fp8_quantize_rows(const Tensor& x, bool pow2);

// Rows of the column-wise scales of a matrix of M rows quantized per segment (the MoE ops):
// the most blocks E segments of M rows in all can have, sum_e ceil(M_e / 128) <=
// (M + 127 E) / 128.
inline int64_t moe_scale_rows(int64_t m, int64_t experts) {
  return (m + (kFp8Block - 1) * experts) / kFp8Block;
}

// CUDA, the MoE FP8 ops' column-wise copies: the (rows, 3) int64 table of (first row, end
// row, expert) of the 128-row blocks of M rows counted segment by segment over the counts in
// tokens_per_expert (on x's device, contiguous, int32 or int64 as `family`'s variants take
// them; at most 1024), written by `family`'s kernel (triton_src/_common.py,
// segment_blocks_kernel; picked with x's dtype) for the op's tile kernel to read.
Tensor segment_blocks_cuda(const char* op, const char* family, const Tensor& x,
                           const Tensor& tokens_per_expert, int64_t m, int64_t rows);

// The CPU reference of the column-wise copy per segment of a 2-D float32 x (M, K) whose
// rows are segments of `counts` rows (summing to at most M): (data_t (K, M) float8_e4m3fn,
// zero in the columns of rows after the segments; scales_t (moe_scale_rows(M, E), K), 1.0
// in the rows past the last block).
std::pair<Tensor, Tensor> fp8_quantize_segments(const Tensor& x,
                                                const std::vector<int64_t>& counts, bool pow2);

// The segments' row counts of a CPU integer tensor (tokens_per_expert), on the host.
std::vector<int64_t> segment_counts(const Tensor& tokens_per_expert);

}  // namespace fk::ops
