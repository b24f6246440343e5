#include "runtime/rows.h"

#include <algorithm>

#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::runtime {

Rows as_rows(const Tensor& x) {
  auto xc = aten::contiguous(x);
  const int64_t n = x.size(-1);
  const int64_t m = n == 0 ? 0 : xc.numel() / n;
  return {aten::view(xc, {m, n}), m, n};
}

namespace {
bool dim_is_last(const Tensor& x, int64_t dim) { return x.dim() == 0 || dim == x.dim() - 1; }
}  // namespace

Rows as_rows(const Tensor& x, int64_t dim) {
  auto xc = aten::contiguous(dim_is_last(x, dim) ? x : aten::movedim(x, dim, -1));
  const int64_t n = x.dim() == 0 ? 1 : xc.size(-1);
  const int64_t m = n == 0 ? 0 : xc.numel() / n;
  return {aten::view(xc, {m, n}), m, n};
}

Tensor from_rows(const Tensor& out, const Tensor& like, int64_t dim) {
  if (dim_is_last(like, dim)) return aten::view(out, like.sizes());
  auto sizes = sizes_vec(like);
  sizes.erase(sizes.begin() + dim);
  sizes.push_back(like.size(dim));
  return aten::contiguous(aten::movedim(aten::view(out, sizes), -1, dim));
}

uint32_t flags_for(int64_t n, std::initializer_list<const Tensor*> tensors) {
  return (n % 16 == 0 && aligned16(tensors)) ? kFlagAligned : 0;
}

PersistentGrid persistent_grid(int64_t m, const Device& device, int64_t per_sm) {
  const int64_t sms = device_sm_count(device.index());
  const int64_t rows_per_program = checks::ceil_div(m, std::min(m, per_sm * sms));
  return {rows_per_program, checks::ceil_div(m, rows_per_program)};
}

int64_t programs_per_sm(int64_t num_warps, int64_t warps) {
  return std::max<int64_t>(1, warps / std::max<int64_t>(1, num_warps));
}

}  // namespace fk::runtime
