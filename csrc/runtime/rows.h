// Row-wise ops (norms, softmax, ...) over the last dim: the (M, N) view, the aligned-variant
// flag and a persistent grid, shared by their CUDA kernels.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <initializer_list>

namespace fk::runtime {

struct Rows {
  Tensor x2d;  // contiguous (M, N) view of the input
  int64_t m, n;
};

// A contiguous (M, N) view of x over its last dim (a copy only when x is not contiguous).
Rows as_rows(const Tensor& x);

// x with `dim` moved last, as a contiguous (M, N) matrix (a copy unless dim is the last and
// x is contiguous); a 0-dim x is one row of one element.
Rows as_rows(const Tensor& x, int64_t dim);

// The (M, N) result of as_rows(like, dim) back in like's shape and dim order, contiguous.
Tensor from_rows(const Tensor& out, const Tensor& like, int64_t dim);

// kFlagAligned when n is a multiple of 16 and every defined tensor is 16-byte aligned.
uint32_t flags_for(int64_t n, std::initializer_list<const Tensor*> tensors);

// A persistent grid over m rows: min(m, per_sm * multiprocessors) programs, each over a
// contiguous range of rows_per_program rows (the last one may have fewer).
struct PersistentGrid {
  int64_t rows_per_program, programs;
};
PersistentGrid persistent_grid(int64_t m, const Device& device, int64_t per_sm);

// Programs of num_warps warps each that make `warps` warps a multiprocessor (at least one):
// the per_sm of the persistent grids that keep 16 warps resident.
int64_t programs_per_sm(int64_t num_warps, int64_t warps = 16);

}  // namespace fk::runtime
