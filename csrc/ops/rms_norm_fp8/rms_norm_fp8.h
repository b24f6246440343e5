// fk::rms_norm_fp8: RMSNorm (fk::rms_norm's llama casting) with its output quantized to
// blockwise float8_e4m3fn (fk::fp8_quantize's 1 x 128 format).
#pragma once

#include <string>

#include "ops/fp8_quantize/fp8_quantize.h"
#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: x (..., K) float32 / bfloat16 / float16, weight (K,) of x's dtype
// and device, layout "rowwise" | "columnwise" | "both". Returns the copies to write.
Fp8Layout check_rms_norm_fp8(const Tensor& x, const Tensor& weight, const std::string& layout);

}  // namespace fk::ops
