// Meta (shape / dtype / layout only) kernels of fk::rope, SymInt-aware for torch.compile.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/rope/rope.h"

namespace fk::ops {
namespace {

std::tuple<at::Tensor, at::Tensor> rope_meta(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& cos, const at::Tensor& sin,
                                             std::optional<int64_t> rotary_dim, bool) {
  check_rope("fk::rope", q, k, cos, sin, rotary_dim);
  return {rope_out_like(q), rope_out_like(k)};
}

std::tuple<at::Tensor, at::Tensor> rope_backward_meta(const at::Tensor& grad_q,
                                                      const at::Tensor& grad_k,
                                                      const at::Tensor& cos,
                                                      const at::Tensor& sin,
                                                      std::optional<int64_t> rotary_dim, bool) {
  check_rope("fk::_rope_backward", grad_q, grad_k, cos, sin, rotary_dim);
  return {rope_out_like(grad_q), rope_out_like(grad_k)};
}

void rope_inplace_meta(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, std::optional<int64_t> rotary_dim, bool) {
  check_rope_inplace(q, k, cos, sin, rotary_dim);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, Meta, m) {
  m.impl("rope", fk::ops::rope_meta);
  m.impl("_rope_backward", fk::ops::rope_backward_meta);
  m.impl("rope_", fk::ops::rope_inplace_meta);
}
