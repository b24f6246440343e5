// CUDA launches shared by the elementwise gated activations (fk::swiglu, fk::geglu): one
// program per block of the flattened tensors. Kernel parameters: the tensors' pointers,
// then the element count n (int64). Callers run their op's checks first.
#pragma once

#include <initializer_list>
#include <tuple>

#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops::glu {

// Launches `fam` over every element of the first tensor; all are contiguous, of its size.
inline void launch(const char* op, const runtime::KernelFamily& fam,
                   std::initializer_list<const Tensor*> tensors) {
  const Tensor& like = **tensors.begin();
  const int64_t n = like.numel();
  const uint32_t flags = runtime::aligned16(tensors) ? runtime::kFlagAligned : 0;
  const auto& k = fam.pick(op, like, 0, flags);
  runtime::KernelArgs args;
  for (const Tensor* t : tensors) args.ptr(*t);
  args.i64(n);
  runtime::launch(op, k, like.device(), {checks::ceil_div(n, k.block), 1, 1}, args);
}

// c = act(a) * b with a kernel (a, b, c, n). Non-contiguous inputs are copied once.
inline Tensor forward(const char* op, const runtime::KernelFamily& fam, const Tensor& a,
                      const Tensor& b) {
  auto ac = aten::contiguous(a), bc = aten::contiguous(b);
  auto c = aten::empty(ac.sizes(), ac.scalar_type(), ac.device());
  if (c.numel() == 0) return c;
  launch(op, fam, {&ac, &bc, &c});
  return c;
}

// (grad_a, grad_b) as new tensors with a kernel (dc, a, b, da, db, n).
inline std::tuple<Tensor, Tensor> backward(const char* op, const runtime::KernelFamily& fam,
                                           const Tensor& grad_c, const Tensor& a,
                                           const Tensor& b) {
  auto dc = aten::contiguous(grad_c), ac = aten::contiguous(a), bc = aten::contiguous(b);
  auto da = aten::empty(ac.sizes(), ac.scalar_type(), ac.device());
  auto db = aten::empty(bc.sizes(), bc.scalar_type(), bc.device());
  if (da.numel() == 0) return {da, db};
  launch(op, fam, {&dc, &ac, &bc, &da, &db});
  return {da, db};
}

// The same kernel writing grad_a into a and grad_b into b (contiguous, separate): each
// element is read and written by the same thread, so the outputs may alias the inputs.
inline void backward_in_place(const char* op, const runtime::KernelFamily& fam,
                              const Tensor& grad_c, const Tensor& a, const Tensor& b) {
  if (a.numel() == 0) return;
  auto dc = aten::contiguous(grad_c);
  launch(op, fam, {&dc, &a, &b, &a, &b});
}

}  // namespace fk::ops::glu
