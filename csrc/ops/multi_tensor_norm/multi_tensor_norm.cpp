// Schemas of fk::multi_tensor_norm and fk::multi_tensor_count_zeros, and the shared checks.
// Fake kernels: python/fk/ops/multi_tensor_norm.py. No autograd (statistics for clipping).
#include "ops/multi_tensor_norm/multi_tensor_norm.h"

#include <cmath>
#include <string>

#include "runtime/checks.h"

namespace fk::ops {

void check_tensor_list(const char* op, const std::vector<Tensor>& tensors) {
  FK_CHECK(!tensors.empty(), op, ": tensors must not be empty");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = str("tensors[", i, "]");
    checks::check_float(op, name.c_str(), tensors[i]);
    if (i > 0) checks::check_same_device(op, "tensors[0]", tensors[0], name.c_str(), tensors[i]);
  }
}

void check_norm_ord(double ord) {
  FK_CHECK(ord == 2.0 || (std::isinf(ord) && ord > 0), "fk::multi_tensor_norm: ord must be 2 "
           "or inf, got ", ord);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // The norm of all elements of all tensors together: sqrt(sum of squares) for ord 2, the
  // largest |x| for ord inf; float32 accumulation, a 0-dim float32 tensor on the tensors'
  // device (NaN if any element is NaN). The tensors may differ in shape and dtype.
  m.def("multi_tensor_norm(Tensor[] tensors, float ord=2.0) -> Tensor");
  // The number of elements equal to zero (+0 or -0) over all tensors: a 0-dim int64 tensor
  // on the tensors' device.
  m.def("multi_tensor_count_zeros(Tensor[] tensors) -> Tensor");
}
