// CUDA kernels of fk::swiglu: AOT-compiled Triton (triton_src/swiglu.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/swiglu/swiglu.h"
#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops {
namespace {

using runtime::KernelArgs;

const runtime::KernelFamily& forward_kernels() {
  static const auto& fam = runtime::family("swiglu_fwd");
  return fam;
}

const runtime::KernelFamily& backward_kernels() {
  static const auto& fam = runtime::family("swiglu_bwd");
  return fam;
}

// Flattened launch over every element; non-contiguous inputs are copied once.
void launch_elementwise(const char* op, const runtime::KernelFamily& fam,
                        std::initializer_list<const at::Tensor*> tensors, KernelArgs& args,
                        const at::Tensor& like) {
  const int64_t n = like.numel();
  const uint32_t flags = runtime::aligned16(tensors) ? runtime::kFlagAligned : 0;
  const auto& k = fam.pick(op, like, 0, flags);
  args.i64(n);
  runtime::launch(op, k, like.device(), {checks::ceil_div(n, k.block), 1, 1}, args);
}

at::Tensor swiglu_cuda(const at::Tensor& a, const at::Tensor& b, bool) {
  check_swiglu(a, b);
  auto ac = a.contiguous(), bc = b.contiguous();
  auto c = at::empty(ac.sizes(), ac.options());
  if (c.numel() == 0) return c;
  KernelArgs args;
  args.ptr(ac).ptr(bc).ptr(c);
  launch_elementwise("fk::swiglu", forward_kernels(), {&ac, &bc, &c}, args, ac);
  return c;
}

std::tuple<at::Tensor, at::Tensor> swiglu_backward_cuda(const at::Tensor& grad_c,
                                                        const at::Tensor& a,
                                                        const at::Tensor& b) {
  check_swiglu_backward(grad_c, a, b);
  auto dc = grad_c.contiguous(), ac = a.contiguous(), bc = b.contiguous();
  auto da = at::empty(ac.sizes(), ac.options());
  auto db = at::empty(bc.sizes(), bc.options());
  if (da.numel() == 0) return {da, db};
  KernelArgs args;
  args.ptr(dc).ptr(ac).ptr(bc).ptr(da).ptr(db);
  launch_elementwise("fk::_swiglu_backward", backward_kernels(), {&dc, &ac, &bc, &da, &db}, args,
                     ac);
  return {da, db};
}

// Each element is read and written by the same thread, so outputs may alias the inputs.
void swiglu_backward_in_place_cuda(const at::Tensor& grad_c, at::Tensor& a, at::Tensor& b) {
  check_swiglu_backward_in_place(grad_c, a, b);
  if (a.numel() == 0) return;
  auto dc = grad_c.contiguous();
  KernelArgs args;
  args.ptr(dc).ptr(a).ptr(b).ptr(a).ptr(b);
  launch_elementwise("fk::_swiglu_backward_", backward_kernels(), {&dc, &a, &b}, args, a);
}

}  // namespace
}  // namespace fk::ops

TORCH_LIBRARY_IMPL(fk, CUDA, m) {
  m.impl("swiglu", fk::ops::swiglu_cuda);
  m.impl("_swiglu_backward", fk::ops::swiglu_backward_cuda);
  m.impl("_swiglu_backward_", fk::ops::swiglu_backward_in_place_cuda);
}
