// fk::rms_norm: RMSNorm over the last dimension with Llama / Gemma / plain casting.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "runtime/tensor.h"

namespace fk::ops {

// Casting modes; the values are what the Triton kernels take (triton_src/rms_norm.py).
enum class RmsCasting : int { None = 0, Llama = 1, Gemma = 2 };

// Parses "none" / "llama" / "gemma"; anything else is an error naming `op` and listing the
// valid modes.
RmsCasting parse_rms_casting(const std::string& mode, const char* op = "fk::rms_norm");

// Shared by every backend: x and weight checks, returns the parsed casting mode. `op` names
// the operator in error messages (fused_add_rms_norm shares these checks); the backward
// check names `op` for its own arguments and `forward_op` for x and weight.
RmsCasting check_rms_norm(const Tensor& x, const std::optional<Tensor>& weight,
                          const std::string& casting_mode, const char* op = "fk::rms_norm");
RmsCasting check_rms_norm_backward(const Tensor& grad_y, const Tensor& x,
                                   const std::optional<Tensor>& weight, const Tensor& rstd,
                                   const std::string& casting_mode,
                                   const char* op = "fk::_rms_norm_backward",
                                   const char* forward_op = "fk::rms_norm");

// The CPU reference (no checks), shared with fused_add_rms_norm's CPU backend. Forward:
// (y, rstd). Backward: (dx, dw); dw only when want_dw and there is a weight; grad_add, when
// defined, is added to dx before its one rounding to x's dtype.
std::tuple<Tensor, Tensor> rms_norm_forward_reference(const Tensor& x,
                                                      const std::optional<Tensor>& weight,
                                                      double eps, double offset,
                                                      RmsCasting casting);
std::tuple<Tensor, Tensor> rms_norm_backward_reference(
    const Tensor& grad_y, const Tensor& x, const std::optional<Tensor>& weight,
    const Tensor& rstd, double offset, RmsCasting casting, bool want_dw,
    const Tensor& grad_add = Tensor());

}  // namespace fk::ops
