// fk::qwen2vl_mrope: the multimodal rotary embedding of Qwen2-VL / Qwen2.5-VL (sectioned) and
// Qwen3-VL (interleaved) of q and k, fp32 math.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: q (B, Hq, S, D), k (B, Hkv, S, D), cos / sin (3, 1 or B, S, D),
// mrope_section three sizes >= 0 summing to D / 2. `op` names the operator in the messages.
void check_qwen2vl_mrope(const char* op, const Tensor& q, const Tensor& k, const Tensor& cos,
                         const Tensor& sin, const std::vector<int64_t>& mrope_section);

// The position stream (0 temporal, 1 height, 2 width) whose cos / sin rotating pair i
// (of half = D / 2) takes.
int64_t mrope_stream(int64_t i, const std::vector<int64_t>& section, bool interleaved);

}  // namespace fk::ops
