// Schema of fk::rms_norm_fp8 and the checks every backend shares. Fake kernel, autograd
// formula and the documentation: python/fk/ops/rms_norm_fp8.py.
#include "ops/rms_norm_fp8/rms_norm_fp8.h"

#include "ops/rms_norm/rms_norm.h"
#include "runtime/checks.h"

namespace fk::ops {

Fp8Layout check_rms_norm_fp8(const Tensor& x, const Tensor& weight, const std::string& layout) {
  constexpr const char* op = "fk::rms_norm_fp8";
  FK_CHECK(x.dim() >= 1, op, ": x must have at least one dimension, got a scalar");
  check_fp8_input_dtype(op, x);
  check_rms_norm(x, weight, "llama", op);
  return parse_fp8_layout(op, layout);
}

}  // namespace fk::ops

STABLE_TORCH_LIBRARY_FRAGMENT(fk, m) {
  // y = fk::rms_norm(x, weight, eps) (llama casting), quantized in 1 x 128 blocks along K as
  // fk::fp8_quantize does, over x flattened to (M, K). Returns (data (M, K), scales
  // (ceil(K/128), M), data_t (K, M), scales_t (ceil(M/128), K), rstd (M,) float32, y (x's
  // shape and dtype)); the copies layout does not ask for, and y unless return_norm,
  // undefined.
  m.def("rms_norm_fp8(Tensor x, Tensor weight, float eps=1e-06, str layout='rowwise', "
        "bool pow2_scales=False, bool return_norm=False) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}
