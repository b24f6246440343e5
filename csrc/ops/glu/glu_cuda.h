// CUDA launches shared by the elementwise gated activations (fk::swiglu, fk::geglu): one
// program per block of the flattened tensors. Kernel parameters: the tensors' pointers,
// then the element count n (int64), then the op's float32 scalars (swiglu's multipliers);
// `flags` adds the op's own variant flags to the alignment flag. Callers run their op's
// checks first.
#pragma once

#include <initializer_list>
#include <tuple>

#include "runtime/checks.h"
#include "runtime/kernels.h"

namespace fk::ops::glu {

// Launches `fam` over every element of the first tensor; all are contiguous, of its size.
struct Scalars {
  int count = 0;  // values passed, after n
  double values[2] = {0.0, 0.0};
  uint32_t flags = 0;
};

inline void launch(const char* op, const runtime::KernelFamily& fam,
                   std::initializer_list<const Tensor*> tensors, const Scalars& scalars) {
  const Tensor& like = **tensors.begin();
  const int64_t n = like.numel();
  const uint32_t flags =
      (runtime::aligned16(tensors) ? runtime::kFlagAligned : 0) | scalars.flags;
  const auto& k = fam.pick(op, like, 0, flags);
  runtime::KernelArgs args;
  for (const Tensor* t : tensors) args.ptr(*t);
  args.i64(n);
  for (int i = 0; i < scalars.count; ++i) args.f32(scalars.values[i]);
  runtime::launch(op, k, like.device(), {checks::ceil_div(n, k.block), 1, 1}, args);
}

// c = act(a) * b with a kernel (a, b, c, n). Non-contiguous inputs are copied once.
inline Tensor forward(const char* op, const runtime::KernelFamily& fam, const Tensor& a,
                      const Tensor& b, const Scalars& scalars = {}) {
  auto ac = aten::contiguous(a), bc = aten::contiguous(b);
  auto c = aten::empty(ac.sizes(), ac.scalar_type(), ac.device());
  if (c.numel() == 0) return c;
  launch(op, fam, {&ac, &bc, &c}, scalars);
  return c;
}

// (grad_a, grad_b) as new tensors with a kernel (dc, a, b, da, db, n).
inline std::tuple<Tensor, Tensor> backward(const char* op, const runtime::KernelFamily& fam,
                                           const Tensor& grad_c, const Tensor& a,
                                           const Tensor& b, const Scalars& scalars = {}) {
  auto dc = aten::contiguous(grad_c), ac = aten::contiguous(a), bc = aten::contiguous(b);
  auto da = aten::empty(ac.sizes(), ac.scalar_type(), ac.device());
  auto db = aten::empty(bc.sizes(), bc.scalar_type(), bc.device());
  if (da.numel() == 0) return {da, db};
  launch(op, fam, {&dc, &ac, &bc, &da, &db}, scalars);
  return {da, db};
}

// The same kernel writing grad_a into a and grad_b into b (contiguous, separate): each
// element is read and written by the same thread, so the outputs may alias the inputs.
inline void backward_in_place(const char* op, const runtime::KernelFamily& fam,
                              const Tensor& grad_c, const Tensor& a, const Tensor& b,
                              const Scalars& scalars = {}) {
  if (a.numel() == 0) return;
  auto dc = aten::contiguous(grad_c);
  launch(op, fam, {&dc, &a, &b, &a, &b}, scalars);
}

}  // namespace fk::ops::glu
