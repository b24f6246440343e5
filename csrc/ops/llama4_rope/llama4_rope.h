// fk::llama4_rope: Llama 4's rotary embedding of q and k (adjacent pairs times the complex
// freqs_cis), fp32 math.
#pragma once

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: q (B, S, Hq, D), k (B, S, Hkv, D), D even; freqs_cis complex
// (S, D/2) or (1 or B, S, D/2), or its real view (..., D/2, 2). `op` names the operator in
// the messages.
void check_llama4_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor& freqs);

// freqs_cis as a real (1 or B, S, D/2, 2) view: (real, imag) pairs.
Tensor llama4_freqs_real(const Tensor& freqs);

}  // namespace fk::ops
