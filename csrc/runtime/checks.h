// Input checks shared by every op and every backend, so that the CPU and CUDA kernels raise
// the same message for the same mistake (python/fk/ops/_checks.py raises the same ones from
// the fake kernels).
#pragma once

#include "runtime/tensor.h"

namespace fk::checks {

// Floating dtypes fk kernels take: float32, bfloat16, float16 everywhere, float64 on the
// CPU reference backend.
inline void check_float(const char* op, const char* name, const Tensor& t) {
  const auto st = t.scalar_type();
  const bool floating = st == kFloat || st == kBFloat16 || st == kHalf;
  FK_CHECK(floating || st == kDouble, op, ": ", name, " has dtype ", st,
           ", which is not supported (supported: float32, bfloat16, float16; float64 on "
           "CPU only)");
  FK_CHECK(floating || !t.is_cuda(), op, ": ", name,
           " has dtype Double, which is not supported on CUDA (supported: float32, "
           "bfloat16, float16; float64 on CPU only)");
}

inline void check_same_device(const char* op, const char* na, const Tensor& a, const char* nb,
                              const Tensor& b) {
  FK_CHECK(a.device() == b.device(), op, ": ", na, " and ", nb,
           " must be on the same device, got ", a.device(), " and ", b.device());
}

inline void check_same_dtype(const char* op, const char* na, const Tensor& a, const char* nb,
                             const Tensor& b) {
  FK_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", na, " and ", nb,
           " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

inline void check_same_shape(const char* op, const char* na, const Tensor& a, const char* nb,
                             const Tensor& b) {
  FK_CHECK(sizes_vec(a) == sizes_vec(b), op, ": ", na, " and ", nb,
           " must have the same shape, got ", shape_of(a), " and ", shape_of(b));
}

// Both of a pair: same device, same dtype, a supported dtype.
inline void check_pair(const char* op, const char* na, const Tensor& a, const char* nb,
                       const Tensor& b) {
  check_same_device(op, na, a, nb, b);
  check_same_dtype(op, na, a, nb, b);
  check_float(op, na, a);
}

// Accumulation dtype of the CPU reference: float64 for float64 inputs, else float32.
inline ScalarType acc_type(const Tensor& t) {
  return t.scalar_type() == kDouble ? kDouble : kFloat;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fk::checks
