// Shared by the elementwise gated activations c = act(a) * b (fk::swiglu, fk::geglu): the
// input checks every backend runs, with the same message everywhere (python/fk/ops/_glu.py
// raises the same ones from the fake kernels).
#pragma once

#include "runtime/checks.h"

namespace fk::ops::glu {

// The operator names of one gated activation, for error messages.
struct OpNames {
  const char* op;                 // "fk::swiglu"
  const char* backward;           // "fk::_swiglu_backward": (grad_a, grad_b) as new tensors
  const char* backward_in_place;  // "fk::_swiglu_backward_": written into a and b
};

// Whether two non-empty tensors lie in one allocation (Tensor::is_alias_of): the same base
// pointer of their storage.
inline bool share_storage(const Tensor& a, const Tensor& b) {
  auto base = [](const Tensor& t) {
    return static_cast<const char*>(t.data_ptr()) -
           t.storage_offset() * static_cast<int64_t>(t.element_size());
  };
  return base(a) == base(b);
}

// a and b: same device, same dtype, same shape, a supported dtype.
inline void check_inputs(const OpNames& names, const Tensor& a, const Tensor& b) {
  checks::check_pair(names.op, "a", a, "b", b);
  checks::check_same_shape(names.op, "a", a, "b", b);
}

// The same, and grad_c like a.
inline void check_backward(const OpNames& names, const Tensor& grad_c, const Tensor& a,
                           const Tensor& b) {
  check_inputs(names, a, b);
  checks::check_pair(names.backward, "grad_c", grad_c, "a", a);
  checks::check_same_shape(names.backward, "grad_c", grad_c, "a", a);
}

// The same, and a and b contiguous and separate, so that the gradients can be written into
// them element by element.
inline void check_backward_in_place(const OpNames& names, const Tensor& grad_c, const Tensor& a,
                                    const Tensor& b) {
  check_backward(names, grad_c, a, b);
  FK_CHECK(a.is_contiguous() && b.is_contiguous(), names.backward_in_place,
           ": a and b must be contiguous");
  FK_CHECK(a.numel() == 0 || !share_storage(a, b), names.backward_in_place,
           ": a and b must not share memory");
}

}  // namespace fk::ops::glu
