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

uint32_t flags_for(int64_t n, std::initializer_list<const Tensor*> tensors) {
  return (n % 16 == 0 && aligned16(tensors)) ? kFlagAligned : 0;
}

PersistentGrid persistent_grid(int64_t m, const Device& device, int64_t per_sm) {
  const int64_t sms = device_sm_count(device.index());
  const int64_t rows_per_program = checks::ceil_div(m, std::min(m, per_sm * sms));
  return {rows_per_program, checks::ceil_div(m, rows_per_program)};
}

}  // namespace fk::runtime
