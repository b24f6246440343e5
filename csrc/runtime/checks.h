// Input checks shared by every op and every backend, so that CPU, CUDA and Meta kernels
// raise the same message for the same mistake.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace fk::checks {

// Floating dtypes fk kernels take: float32, bfloat16, float16 everywhere, float64 on the
// CPU reference backend (and on Meta, which cannot tell).
inline void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto st = t.scalar_type();
  const bool floating = st == at::kFloat || st == at::kBFloat16 || st == at::kHalf;
  TORCH_CHECK(floating || st == at::kDouble, op, ": ", name, " has dtype ", st,
              ", which is not supported (supported: float32, bfloat16, float16; float64 on "
              "CPU only)");
  TORCH_CHECK(floating || !t.is_cuda(), op, ": ", name,
              " has dtype Double, which is not supported on CUDA (supported: float32, "
              "bfloat16, float16; float64 on CPU only)");
}

inline void check_same_device(const char* op, const char* na, const at::Tensor& a,
                              const char* nb, const at::Tensor& b) {
  TORCH_CHECK(a.device() == b.device(), op, ": ", na, " and ", nb,
              " must be on the same device, got ", a.device(), " and ", b.device());
}

inline void check_same_dtype(const char* op, const char* na, const at::Tensor& a,
                             const char* nb, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", na, " and ", nb,
              " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

inline void check_same_shape(const char* op, const char* na, const at::Tensor& a,
                             const char* nb, const at::Tensor& b) {
  TORCH_CHECK(a.sym_sizes() == b.sym_sizes(), op, ": ", na, " and ", nb,
              " must have the same shape, got ", a.sym_sizes(), " and ", b.sym_sizes());
}

// Both of a pair: same device, same dtype, a supported dtype.
inline void check_pair(const char* op, const char* na, const at::Tensor& a, const char* nb,
                       const at::Tensor& b) {
  check_same_device(op, na, a, nb, b);
  check_same_dtype(op, na, a, nb, b);
  check_float(op, na, a);
}

// Accumulation dtype of the CPU reference: float64 for float64 inputs, else float32.
inline at::ScalarType acc_type(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace fk::checks
