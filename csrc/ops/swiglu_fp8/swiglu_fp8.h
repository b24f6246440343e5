// fk::swiglu_fp8 / fk::moe_swiglu_fp8: h = silu(gate) * up (times the row's router probability
// in the MoE form) of x (M, 2n) = [gate | up], rounded to x's dtype and quantized to
// float8_e4m3fn in 1 x 128 blocks (the format: python/fk/ops/fp8_quantize.py); and their
// backwards, the plain one optionally quantizing the input gradient.
#pragma once

#include <string>

#include "ops/fp8_quantize/fp8_quantize.h"

namespace fk::ops {

inline constexpr const char* kSwigluFp8 = "fk::swiglu_fp8";
inline constexpr const char* kSwigluFp8Backward = "fk::swiglu_fp8_backward";
inline constexpr const char* kMoeSwigluFp8 = "fk::moe_swiglu_fp8";
inline constexpr const char* kMoeSwigluFp8Backward = "fk::moe_swiglu_fp8_backward";

// Shared by every backend (python/fk/ops/swiglu_fp8.py raises the same messages).
// x 2-D (M, 2n) float32 / bfloat16 / float16; the copies layout asks for.
Fp8Layout check_swiglu_fp8(const Tensor& x, const std::string& layout);
// grad_h (M, n) like x; grad_layout "none" (dx in x's dtype) or a layout (quantized dx, which
// needs n to be a multiple of 128). Returns the quantized copies asked for.
Fp8Layout check_swiglu_fp8_backward(const Tensor& grad_h, const Tensor& x,
                                     const std::string& grad_layout);
// probs float32 (M,), tokens_per_expert 1-D int32 / int64 with at least one expert, on x's
// device.
Fp8Layout check_moe_swiglu_fp8(const Tensor& x, const Tensor& probs,
                               const Tensor& tokens_per_expert, const std::string& layout);
// grad_layout "none" or "rowwise" (which needs n to be a multiple of 128); returns whether dx
// is quantized.
bool check_moe_swiglu_fp8_backward(const Tensor& grad_h, const Tensor& x, const Tensor& probs,
                                   const std::string& grad_layout);

}  // namespace fk::ops
