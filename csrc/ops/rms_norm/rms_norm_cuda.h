// CUDA launch pieces of fk::rms_norm, shared with fk::fused_add_rms_norm: row views,
// variant flags, the persistent backward grid and the reduction of fp32 partial weight
// gradients (kernel family rms_norm_dw of triton_src/rms_norm.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>

namespace fk::ops::rms_cuda {

struct Rows {
  at::Tensor x2d;  // contiguous (M, N) view of the input
  int64_t m, n;
};

// A contiguous (M, N) view of x over its last dim (a copy only when x is not contiguous).
Rows as_rows(const at::Tensor& x);

// kFlagAligned when n is a multiple of 16 and every defined tensor is 16-byte aligned.
uint32_t flags_for(int64_t n, std::initializer_list<const at::Tensor*> tensors);

// A persistent grid over m rows: min(m, per_sm * multiprocessors) programs, each over a
// contiguous range of rows_per_program rows (the last one may have fewer).
struct PersistentGrid {
  int64_t rows_per_program, programs;
};
PersistentGrid persistent_grid(int64_t m, const at::Device& device, int64_t per_sm);

// dw (weight's shape and dtype) = the sum over rows of the fp32 (programs, N) partials.
at::Tensor reduce_dw(const char* op, const at::Tensor& partial, const at::Tensor& weight);

}  // namespace fk::ops::rms_cuda
