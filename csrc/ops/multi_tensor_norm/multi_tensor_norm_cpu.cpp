// CPU reference of fk::multi_tensor_norm / fk::multi_tensor_count_zeros in ATen operators:
// per tensor a float32 (float64 for float64 tensors) sum of squares or max of |x|, combined
// in float64, then rounded once to float32.
#include <cmath>

#include "ops/multi_tensor_norm/multi_tensor_norm.h"
#include "runtime/checks.h"

namespace fk::ops {
namespace {

Tensor multi_tensor_norm_cpu(std::vector<Tensor> tensors, double ord) {
  check_tensor_list("fk::multi_tensor_norm", tensors);
  check_norm_ord(ord);
  const bool inf = std::isinf(ord);
  Tensor acc = aten::zeros({}, kDouble, tensors[0].device());
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    Tensor v = aten::to(t, checks::acc_type(t));
    if (inf) {
      Tensor m = aten::amax(aten::maximum(v, aten::neg(v)), {}, false);
      // maximum propagates NaN; amax of a NaN-holding tensor is NaN
      acc = aten::maximum(acc, aten::to(m, kDouble));
    } else {
      acc = acc + aten::to(aten::sum_all(v * v), kDouble);
    }
  }
  return aten::to(inf ? acc : aten::sqrt(acc), kFloat);
}

Tensor multi_tensor_count_zeros_cpu(std::vector<Tensor> tensors) {
  check_tensor_list("fk::multi_tensor_count_zeros", tensors);
  std::vector<Tensor> counts;  // per tensor, summed at the end (no integer add in fk::aten)
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) counts.push_back(aten::sum_all(aten::eq(t, aten::scalar(0.0)), kLong));
  }
  if (counts.empty()) return aten::zeros({}, kLong, tensors[0].device());
  return aten::sum_all(aten::stack(counts, 0), kLong);
}

}  // namespace
}  // namespace fk::ops

STABLE_TORCH_LIBRARY_IMPL(fk, CPU, m) {
  m.impl("multi_tensor_norm", TORCH_BOX(&fk::ops::multi_tensor_norm_cpu));
  m.impl("multi_tensor_count_zeros", TORCH_BOX(&fk::ops::multi_tensor_count_zeros_cpu));
}
