// fk::moe_permute_fp8: fk::moe_permute with the permuted rows quantized to float8_e4m3fn in
// 1 x 128 blocks as they are gathered (the format: python/fk/ops/fp8_quantize.py; the op:
// python/fk/ops/moe_permute_fp8.py).
#pragma once

#include <optional>
#include <string>

#include "ops/fp8_quantize/fp8_quantize.h"
#include "ops/moe_permute/moe_permute.h"
#include "runtime/tensor.h"

namespace fk::ops {

constexpr const char* kMoePermuteFp8 = "fk::moe_permute_fp8";

// moe_permute's checks (naming fk::moe_permute_fp8), tokens float32 / bfloat16 / float16 and
// the layout; returns the copies to write.
Fp8Layout check_moe_permute_fp8(const Tensor& tokens, const Tensor& routing_map,
                                const std::optional<Tensor>& probs, int64_t pad_to,
                                std::optional<int64_t> num_out_rows, const std::string& layout);

}  // namespace fk::ops
