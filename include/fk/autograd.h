// Autograd for fk's operators in C++ programs without Python.
//
// libfk registers the operators' schemas and their CPU and CUDA kernels only; their autograd
// formulas are registered by Python (`import fk`, python/fk/ops/<op>.py). A LibTorch program
// that links libfk and never runs Python registers the same formulas from this header:
//
//   #include <fk/autograd.h>
//   int main() {
//     fk::register_autograd();  // once; further calls do nothing
//     ...                       // fk::rms_norm(...), torch::jit::load(...) now differentiate
//   }
//
// Never call fk::register_autograd() in a process where Python imports fk (a Python
// extension, or a program embedding Python): Python's fk registers the same kernels for the
// same operators, and whichever registers last replaces the other.
//
// Header-only: compiled in the user's program against the user's LibTorch (its full C++ API:
// torch::autograd::Function, c10::Dispatcher, torch::Library), so it carries no C++ ABI of
// fk's. Each formula is a torch::autograd::Function registered for the Autograd key on
// exactly the operator Python registers it on (listed at register_autograd below): the public
// op where the backward needs only its inputs and outputs, else the internal forward
// fk::_<op>_forward that returns what the backward needs (the public op is then a
// CompositeImplicitAutograd kernel calling it), or, for the cross entropies, the public op
// with a kernel of its own. The FP8 ops' quantized copies carry no gradient (an FP8 tensor
// cannot): fk::rms_norm_fp8, fk::swiglu_fp8 and fk::moe_swiglu_fp8 differentiate through the
// unquantized output they also return (straight through), fk::moe_permute_fp8 through
// permuted_probs only, and fk::fp8_quantize not at all (its Autograd kernel, no Function,
// calls it below autograd: no output requires grad). As in Python, a backward runs once: its
// internal backward ops have no derivative, so differentiating a gradient (double backward)
// raises "<op>: double backward is not implemented (... trying to differentiate twice)".
#pragma once

#include <ATen/Functions.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <array>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fk/fk.h"

namespace fk {
namespace autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace detail {

// --- shared by the formulas ------------------------------------------------------------------

template <class Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return fk::detail::op<Signature>(name);
}

// Whether autograd records this call: grad mode is on and a tensor input requires grad.
inline bool records(std::initializer_list<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// The tensor of an optional argument (an undefined one where it is absent), for records().
inline const at::Tensor* ptr(const std::optional<at::Tensor>& t) {
  static const at::Tensor undefined;
  return t.has_value() ? &*t : &undefined;
}

// A saved tensor as the optional argument it came from.
inline std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// The error a double backward raises: `op` names the operator the formula is registered on.
inline std::string double_backward_message(const char* op) {
  return std::string(op) +
         ": double backward is not implemented (fk's backward can't be differentiated; "
         "trying to differentiate twice)";
}

// `grads` (gradients a backward returns) tied to an error node, so that differentiating them
// raises double_backward_message(op) (Python's torch.autograd.function.once_differentiable
// does the same).
inline variable_list raise_when_differentiated(const char* op, const variable_list& grads) {
  auto error = std::make_shared<torch::autograd::DelayedError>(
      double_backward_message(op), static_cast<int64_t>(grads.size()));
  variable_list inputs;
  inputs.reserve(grads.size());
  for (const at::Tensor& g : grads) {
    inputs.push_back(g.defined() ? g.detach().requires_grad_(true) : at::Tensor());
  }
  return (*error)(std::move(inputs));
}

// The backward of the formula registered on `op`, run once: `backward(create_graph)`
// computes the input gradients with grad mode off. When the caller builds a higher-order
// graph (create_graph: grad mode on) and an incoming gradient or a saved tensor (`depends`)
// requires grad, the results raise when differentiated instead of silently giving no second
// derivative: the internal backward ops have no derivative of their own.
template <class Backward>
variable_list once_differentiable(const char* op, const variable_list& grads,
                                  std::initializer_list<const at::Tensor*> depends,
                                  Backward&& backward) {
  const bool create_graph = at::GradMode::is_enabled();
  variable_list out;
  {
    at::NoGradGuard no_grad;
    out = backward(create_graph);
  }
  if (!create_graph) return out;
  bool wrap = false;
  for (const at::Tensor& g : grads) wrap = wrap || (g.defined() && g.requires_grad());
  for (const at::Tensor* t : depends) wrap = wrap || (t->defined() && t->requires_grad());
  return wrap ? raise_when_differentiated(op, out) : out;
}

// Whether this backward may overwrite saved tensors nothing else will read: it neither
// retains the graph (a second backward would read them) nor builds a higher-order graph.
inline bool may_overwrite_saved(bool create_graph) {
  return !create_graph && !torch::autograd::get_current_graph_task_keep_graph();
}

// Plain eager tensors: no dispatch mode, no functional / fake / subclass tensors (as under
// torch.compile or opcheck), strided.
inline bool plain_eager(std::initializer_list<const at::Tensor*> tensors) {
  if (c10::impl::dispatch_mode_enabled()) return false;
  const auto wrapped =
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  for (const at::Tensor* t : tensors) {
    if (t->key_set().has_any(wrapped) || t->layout() != at::kStrided) return false;
  }
  return true;
}

// The defined tensors of ts (outputs that may be left undefined, for
// mark_non_differentiable).
inline variable_list defined(std::initializer_list<at::Tensor> ts) {
  variable_list out;
  for (const at::Tensor& t : ts) {
    if (t.defined()) out.push_back(t);
  }
  return out;
}

// Marks t as modified in place, so that anything that saved it for its backward raises
// autograd's "modified by an inplace operation" error instead of reading the new values.
inline void bump_version(const at::Tensor& t) { t.unsafeGetTensorImpl()->bump_version(); }

// --- gated activations (swiglu, geglu): the backward_in_place option -----------------------

// Whether the backward may overwrite the saved a and b with their gradients: a and b are
// plain (not fake, functional or another tensor subclass), contiguous, separate, non-empty.
inline bool can_write_grads_into_inputs(const at::Tensor& a, const at::Tensor& b) {
  return plain_eager({&a, &b}) && a.is_contiguous() && b.is_contiguous() && a.numel() > 0 &&
         !a.is_alias_of(b);
}

// (grad_a, grad_b) from the saved a and b. With `write_into_inputs` and where a and b allow
// it, `in_place()` writes them into a and b (through the op's internal in-place backward)
// and a and b are returned as the gradients; otherwise `out_of_place()` returns new tensors.
template <class InPlace, class OutOfPlace>
std::tuple<at::Tensor, at::Tensor> input_grads(bool write_into_inputs, const at::Tensor& a,
                                               const at::Tensor& b, InPlace&& in_place,
                                               OutOfPlace&& out_of_place) {
  if (!write_into_inputs || !can_write_grads_into_inputs(a, b)) return out_of_place();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    in_place();
  }
  // Anything else that saved a or b for its backward now fails loudly on unpacking instead
  // of reading gradients as if they were activations.
  bump_version(a);
  bump_version(b);
  return {a.detach(), b.detach()};
}

// The FP8 ops' quantized copies (data, scales, data_t, scales_t) from `out`, the defined
// outputs a Function returned, copies first: the two of "rowwise" or "columnwise", or the
// four of "both" (the op has checked the layout). The copies the layout leaves out are
// undefined, as the op returns them.
inline std::array<at::Tensor, 4> fp8_copies(c10::string_view layout, const variable_list& out) {
  const std::string copies(layout);
  if (copies == "rowwise") return {out[0], out[1], at::Tensor(), at::Tensor()};
  if (copies == "columnwise") return {at::Tensor(), at::Tensor(), out[0], out[1]};
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace detail

// --- swiglu: on fk::swiglu (the backward needs only a and b) -------------------------------

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static constexpr const char* kOp = "fk::swiglu";

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            bool backward_in_place, double gate_multiplier,
                            double down_multiplier) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    ctx->saved_data["in_place"] = backward_in_place;
    ctx->saved_data["gate_multiplier"] = gate_multiplier;
    ctx->saved_data["down_multiplier"] = down_multiplier;
    return call(a, b, backward_in_place, gate_multiplier, down_multiplier);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor a = saved[0], b = saved[1];
    const bool in_place = ctx->saved_data["in_place"].toBool();
    const double gm = ctx->saved_data["gate_multiplier"].toDouble();
    const double dm = ctx->saved_data["down_multiplier"].toDouble();
    return detail::once_differentiable(kOp, grads, {&a, &b}, [&](bool create_graph) {
      auto [da, db] = detail::input_grads(
          in_place && detail::may_overwrite_saved(create_graph), a, b,
          [&] {
            static const auto op =
                detail::op<void(const at::Tensor&, at::Tensor&, at::Tensor&, double, double)>(
                    "fk::_swiglu_backward_");
            op.call(grads[0], a, b, gm, dm);
          },
          [&] {
            static const auto op =
                detail::op<std::tuple<at::Tensor, at::Tensor>(
                    const at::Tensor&, const at::Tensor&, const at::Tensor&, double, double)>(
                    "fk::_swiglu_backward");
            return op.call(grads[0], a, b, gm, dm);
          });
      return variable_list{da, db, at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::swiglu.
  static at::Tensor kernel(const at::Tensor& a, const at::Tensor& b, bool backward_in_place,
                           double gate_multiplier, double down_multiplier) {
    if (!detail::records({&a, &b})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(a, b, backward_in_place, gate_multiplier, down_multiplier);
    }
    return apply(a, b, backward_in_place, gate_multiplier, down_multiplier);
  }

 private:
  static at::Tensor call(const at::Tensor& a, const at::Tensor& b, bool backward_in_place,
                         double gate_multiplier, double down_multiplier) {
    static const auto op =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, bool, double, double)>(
            "fk::swiglu");
    return op.call(a, b, backward_in_place, gate_multiplier, down_multiplier);
  }
};

// --- geglu: on fk::geglu (the backward needs only a and b) ---------------------------------

class GegluFunction : public torch::autograd::Function<GegluFunction> {
 public:
  static constexpr const char* kOp = "fk::geglu";

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            c10::string_view approximate, bool backward_in_place) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->saved_data["in_place"] = backward_in_place;
    return call(a, b, approximate, backward_in_place);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor a = saved[0], b = saved[1];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    const bool in_place = ctx->saved_data["in_place"].toBool();
    return detail::once_differentiable(kOp, grads, {&a, &b}, [&](bool create_graph) {
      auto [da, db] = detail::input_grads(
          in_place && detail::may_overwrite_saved(create_graph), a, b,
          [&] {
            static const auto op =
                detail::op<void(const at::Tensor&, at::Tensor&, at::Tensor&, c10::string_view)>(
                    "fk::_geglu_backward_");
            op.call(grads[0], a, b, approximate);
          },
          [&] {
            static const auto op =
                detail::op<std::tuple<at::Tensor, at::Tensor>(
                    const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view)>(
                    "fk::_geglu_backward");
            return op.call(grads[0], a, b, approximate);
          });
      return variable_list{da, db, at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::geglu.
  static at::Tensor kernel(const at::Tensor& a, const at::Tensor& b, c10::string_view approximate,
                           bool backward_in_place) {
    if (!detail::records({&a, &b})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(a, b, approximate, backward_in_place);
    }
    return apply(a, b, approximate, backward_in_place);
  }

 private:
  static at::Tensor call(const at::Tensor& a, const at::Tensor& b, c10::string_view approximate,
                         bool backward_in_place) {
    static const auto op =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, bool)>(
            "fk::geglu");
    return op.call(a, b, approximate, backward_in_place);
  }
};

// --- rms_norm: on fk::_rms_norm_forward (the backward needs the rstd it returns) -----------

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static constexpr const char* kOp = "fk::_rms_norm_forward";
  using Result = std::tuple<at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight, double eps,
                               double offset, c10::string_view casting_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = call(x, weight, eps, offset, casting_mode);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting_mode"] = std::string(casting_mode);
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> weight = detail::optional(saved[1]);
    const bool need_dw = weight.has_value() && ctx->needs_input_grad(1);
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      static const auto op =
          detail::op<Result(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, const at::Tensor&, double,
                            c10::string_view, std::array<bool, 2>)>("fk::_rms_norm_backward");
      auto [dx, dw] = op.call(grads[0], saved[0], weight, saved[2],
                              ctx->saved_data["offset"].toDouble(),
                              ctx->saved_data["casting_mode"].toStringRef(), {true, need_dw});
      return variable_list{dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::_rms_norm_forward.
  static Result kernel(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                       double offset, c10::string_view casting_mode) {
    if (!detail::records({&x, detail::ptr(weight)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, weight, eps, offset, casting_mode);
    }
    auto out = apply(x, weight, eps, offset, casting_mode);
    return {out[0], out[1]};
  }

 private:
  static Result call(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                     double offset, c10::string_view casting_mode) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const std::optional<at::Tensor>&, double, double,
                          c10::string_view)>("fk::_rms_norm_forward");
    return op.call(x, weight, eps, offset, casting_mode);
  }
};

// --- rms_norm_fp8: on fk::rms_norm_fp8 (the gradient flows through y only) ----------------

// y carries the gradient, as fk::rms_norm's (the quantized copies are y for autograd:
// straight through); the copies and rstd are not differentiable. A call that autograd records
// without return_norm raises, as in Python, instead of dropping the gradient.
class RmsNormFp8Function : public torch::autograd::Function<RmsNormFp8Function> {
 public:
  static constexpr const char* kOp = "fk::rms_norm_fp8";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            at::Tensor>;

  // Returns the defined outputs, y last (always asked for here).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, double eps, c10::string_view layout,
                               bool pow2_scales) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q, s, qt, st, rstd, y] = call(x, weight, eps, layout, pow2_scales, true);
    ctx->save_for_backward({x, weight, rstd});
    ctx->mark_non_differentiable(detail::defined({q, s, qt, st, rstd}));
    // Undefined outputs are left out (a C++ Function cannot return them).
    return detail::defined({q, s, qt, st, rstd, y});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor grad_y = grads.back();
    if (!grad_y.defined()) return variable_list(5);
    auto saved = ctx->get_saved_variables();
    const bool need_dw = ctx->needs_input_grad(1);
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      static const auto op =
          detail::op<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
              const at::Tensor&, double, c10::string_view, std::array<bool, 2>)>(
              "fk::_rms_norm_backward");
      // rstd (M,) in the shape fk::_rms_norm_forward returns it: x's leading dims
      const auto x_sizes = saved[0].sizes();
      auto rstd = saved[2].view(x_sizes.slice(0, x_sizes.size() - 1));
      auto [dx, dw] = op.call(grad_y, saved[0], saved[1], rstd, 0.0, "llama", {true, need_dw});
      return variable_list{dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::rms_norm_fp8.
  static Result kernel(const at::Tensor& x, const at::Tensor& weight, double eps,
                       c10::string_view layout, bool pow2_scales, bool return_norm) {
    if (!detail::records({&x, &weight})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, weight, eps, layout, pow2_scales, return_norm);
    }
    TORCH_CHECK(return_norm, kOp,
                ": x or weight requires grad, but only y carries the gradient: pass "
                "return_norm=True (the quantized copies are y for autograd), or call under "
                "torch.no_grad()");
    auto out = apply(x, weight, eps, layout, pow2_scales);
    const auto c = detail::fp8_copies(layout, out);
    const size_t n = out.size();  // the copies of the layout, rstd, y
    return {c[0], c[1], c[2], c[3], out[n - 2], out[n - 1]};
  }

 private:
  static Result call(const at::Tensor& x, const at::Tensor& weight, double eps,
                     c10::string_view layout, bool pow2_scales, bool return_norm) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, double, c10::string_view, bool,
                          bool)>(kOp);
    return op.call(x, weight, eps, layout, pow2_scales, return_norm);
  }
};

// --- fp8_quantize: on fk::fp8_quantize (not differentiable) --------------------------------

// As Python's _autograd.not_differentiable: quantization is not differentiable (gradients do
// not flow through it; the data are float8, which cannot carry one), so no output requires
// grad, whatever x does. The Autograd kernel runs the backend's kernel below autograd, which
// is what Python's formula (every output marked non-differentiable) amounts to. Without it,
// the CPU backend's ATen calls record a graph (the copies require grad, and a backward
// through them gives x a gradient) and the CUDA backend none. No Function: there is no
// backward to run.
struct Fp8QuantizeKernel {
  static constexpr const char* kOp = "fk::fp8_quantize";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  // The Autograd kernel of fk::fp8_quantize.
  static Result kernel(const at::Tensor& x, int64_t block_rows, c10::string_view layout,
                       bool pow2_scales) {
    static const auto op =
        detail::op<Result(const at::Tensor&, int64_t, c10::string_view, bool)>(kOp);
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, block_rows, layout, pow2_scales);
  }
};

// --- swiglu_fp8 / moe_swiglu_fp8: on the public ops (the gradient enters through h) -------

// Straight through, as in Python: h = silu(gate) * up (* probs[:, None] in the MoE form),
// returned with return_h, carries the gradient, and the quantized copies (h's values in FP8)
// carry none (an FP8 tensor cannot). Without return_h nothing is differentiable: the op runs
// below autograd (Python's formula marks every output non-differentiable, so no output
// requires grad either way). The backwards are fk::swiglu_fp8_backward's and
// fk::moe_swiglu_fp8_backward's, with dx unquantized (grad_layout "none").
class SwigluFp8Function : public torch::autograd::Function<SwigluFp8Function> {
 public:
  static constexpr const char* kOp = "fk::swiglu_fp8";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  // Returns the defined outputs: the copies of the layout, then h (always asked for here).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               c10::string_view layout, bool pow2_scales) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q, s, qt, st, h] = call(x, layout, pow2_scales, true);
    ctx->save_for_backward({x});
    ctx->mark_non_differentiable(detail::defined({q, s, qt, st}));
    // Undefined outputs are left out (a C++ Function cannot return them).
    return detail::defined({q, s, qt, st, h});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor grad_h = grads.back();
    if (!grad_h.defined() || !ctx->needs_input_grad(0)) return variable_list(3);
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(kOp, grads, {&saved[0]}, [&](bool) {
      static const auto op =
          detail::op<Result(const at::Tensor&, const at::Tensor&, c10::string_view, bool)>(
              "fk::swiglu_fp8_backward");
      at::Tensor dx = std::get<0>(op.call(grad_h, saved[0], "none", false));
      return variable_list{dx, at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::swiglu_fp8.
  static Result kernel(const at::Tensor& x, c10::string_view layout, bool pow2_scales,
                       bool return_h) {
    if (!return_h || !detail::records({&x})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, layout, pow2_scales, return_h);
    }
    auto out = apply(x, layout, pow2_scales);
    const auto c = detail::fp8_copies(layout, out);
    return {c[0], c[1], c[2], c[3], out.back()};
  }

 private:
  static Result call(const at::Tensor& x, c10::string_view layout, bool pow2_scales,
                     bool return_h) {
    static const auto op =
        detail::op<Result(const at::Tensor&, c10::string_view, bool, bool)>(kOp);
    return op.call(x, layout, pow2_scales, return_h);
  }
};

// h is differentiable in x and probs; tokens_per_expert (integers) only places the segments
// of the column-wise copy.
class MoeSwigluFp8Function : public torch::autograd::Function<MoeSwigluFp8Function> {
 public:
  static constexpr const char* kOp = "fk::moe_swiglu_fp8";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  // Returns the defined outputs: the copies of the layout, then h (always asked for here).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& probs, const at::Tensor& tokens_per_expert,
                               c10::string_view layout, bool pow2_scales) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q, s, qt, st, h] = call(x, probs, tokens_per_expert, layout, pow2_scales, true);
    ctx->save_for_backward({x, probs});
    ctx->mark_non_differentiable(detail::defined({q, s, qt, st}));
    // Undefined outputs are left out (a C++ Function cannot return them).
    return detail::defined({q, s, qt, st, h});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor grad_h = grads.back();
    const bool want_dx = ctx->needs_input_grad(0);
    const bool want_dprobs = ctx->needs_input_grad(1);
    if (!grad_h.defined() || !(want_dx || want_dprobs)) return variable_list(5);
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      static const auto op =
          detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
              bool)>("fk::moe_swiglu_fp8_backward");
      auto [dx, dprobs, q, s] = op.call(grad_h, saved[0], saved[1], "none", false);
      return variable_list{want_dx ? dx : at::Tensor(), want_dprobs ? dprobs : at::Tensor(),
                           at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::moe_swiglu_fp8.
  static Result kernel(const at::Tensor& x, const at::Tensor& probs,
                       const at::Tensor& tokens_per_expert, c10::string_view layout,
                       bool pow2_scales, bool return_h) {
    if (!return_h || !detail::records({&x, &probs})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, probs, tokens_per_expert, layout, pow2_scales, return_h);
    }
    auto out = apply(x, probs, tokens_per_expert, layout, pow2_scales);
    const auto c = detail::fp8_copies(layout, out);
    return {c[0], c[1], c[2], c[3], out.back()};
  }

 private:
  static Result call(const at::Tensor& x, const at::Tensor& probs,
                     const at::Tensor& tokens_per_expert, c10::string_view layout,
                     bool pow2_scales, bool return_h) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          c10::string_view, bool, bool)>(kOp);
    return op.call(x, probs, tokens_per_expert, layout, pow2_scales, return_h);
  }
};

// --- neighborhood_attention: on fk::_neighborhood_attention_forward (the backward needs the
// logsumexp it returns) ---------------------------------------------------------------------

class NeighborhoodAttentionFunction
    : public torch::autograd::Function<NeighborhoodAttentionFunction> {
 public:
  static constexpr const char* kOp = "fk::_neighborhood_attention_forward";
  using Result = std::tuple<at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, int64_t kernel_size, int64_t dilation,
                               std::optional<double> scale) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = call(q, k, v, kernel_size, dilation, scale);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["kernel_size"] = kernel_size;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["has_scale"] = scale.has_value();
    ctx->saved_data["scale"] = scale.value_or(0.0);
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(
        kOp, grads, {&saved[0], &saved[1], &saved[2]}, [&](bool) {
          static const auto op =
              detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                  const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                  const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                  std::optional<double>)>("fk::_neighborhood_attention_backward");
          const std::optional<double> scale =
              ctx->saved_data["has_scale"].toBool()
                  ? std::optional<double>(ctx->saved_data["scale"].toDouble())
                  : std::nullopt;
          auto [dq, dk, dv] = op.call(grads[0], saved[0], saved[1], saved[2], saved[3],
                                      saved[4], ctx->saved_data["kernel_size"].toInt(),
                                      ctx->saved_data["dilation"].toInt(), scale);
          return variable_list{dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
        });
  }

  // The Autograd kernel of fk::_neighborhood_attention_forward.
  static Result kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       int64_t kernel_size, int64_t dilation, std::optional<double> scale) {
    if (!detail::records({&q, &k, &v})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(q, k, v, kernel_size, dilation, scale);
    }
    auto out = apply(q, k, v, kernel_size, dilation, scale);
    return {out[0], out[1]};
  }

 private:
  static Result call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     int64_t kernel_size, int64_t dilation, std::optional<double> scale) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                          int64_t, std::optional<double>)>(
            "fk::_neighborhood_attention_forward");
    return op.call(q, k, v, kernel_size, dilation, scale);
  }
};

// --- layer_norm: on fk::_layer_norm_forward (the backward needs its mean and rstd) ---------

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static constexpr const char* kOp = "fk::_layer_norm_forward";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> weight = detail::optional(saved[1]);
    // needs_input_grad counts tensor inputs only: without a weight, the bias is input 1.
    const bool has_w = weight.has_value();
    const std::array<bool, 3> mask = {
        ctx->needs_input_grad(0), has_w && ctx->needs_input_grad(1),
        ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(has_w ? 2 : 1)};
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      static const auto op =
          detail::op<Result(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, const at::Tensor&,
                            const at::Tensor&, std::array<bool, 3>)>("fk::_layer_norm_backward");
      auto [dx, dw, db] = op.call(grads[0], saved[0], weight, saved[2], saved[3], mask);
      return variable_list{dx, dw, db, at::Tensor()};
    });
  }

  // The Autograd kernel of fk::_layer_norm_forward.
  static Result kernel(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                       const std::optional<at::Tensor>& bias, double eps) {
    if (!detail::records({&x, detail::ptr(weight), detail::ptr(bias)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, weight, bias, eps);
    }
    auto out = apply(x, weight, bias, eps);
    return {out[0], out[1], out[2]};
  }

 private:
  static Result call(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, double eps) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const std::optional<at::Tensor>&,
                          const std::optional<at::Tensor>&, double)>("fk::_layer_norm_forward");
    return op.call(x, weight, bias, eps);
  }
};

// --- dyt: on fk::dyt (the backward recomputes tanh from the saved x) ----------------------

class DytFunction : public torch::autograd::Function<DytFunction> {
 public:
  static constexpr const char* kOp = "fk::dyt";
  using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& alpha,
                            const at::Tensor& gamma, const std::optional<at::Tensor>& beta) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor y = call(x, alpha, gamma, beta);
    ctx->save_for_backward({x, alpha, gamma, beta.value_or(at::Tensor())});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> beta = detail::optional(saved[3]);
    const std::array<bool, 4> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      ctx->needs_input_grad(2),
                                      beta.has_value() && ctx->needs_input_grad(3)};
    return detail::once_differentiable(
        kOp, grads, {&saved[0], &saved[1], &saved[2], &saved[3]}, [&](bool) {
          static const auto op =
              detail::op<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const std::optional<at::Tensor>&,
                               std::array<bool, 4>)>("fk::_dyt_backward");
          auto [dx, da, dg, db] = op.call(grads[0], saved[0], saved[1], saved[2], beta, mask);
          return variable_list{dx, da, dg, db};
        });
  }

  // The Autograd kernel of fk::dyt.
  static at::Tensor kernel(const at::Tensor& x, const at::Tensor& alpha,
                           const at::Tensor& gamma, const std::optional<at::Tensor>& beta) {
    if (!detail::records({&x, &alpha, &gamma, detail::ptr(beta)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, alpha, gamma, beta);
    }
    return apply(x, alpha, gamma, beta);
  }

 private:
  static at::Tensor call(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& gamma,
                         const std::optional<at::Tensor>& beta) {
    static const auto op =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&)>("fk::dyt");
    return op.call(x, alpha, gamma, beta);
  }
};

// --- poly_norm: on fk::_poly_norm_forward (the backward needs the rstd it returns) ---------

class PolyNormFunction : public torch::autograd::Function<PolyNormFunction> {
 public:
  static constexpr const char* kOp = "fk::_poly_norm_forward";
  using Result = std::tuple<at::Tensor, at::Tensor>;
  using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, rstd] = call(x, weight, bias, eps);
    ctx->save_for_backward({x, weight, bias, rstd});
    ctx->mark_non_differentiable({rstd});
    return {y, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      ctx->needs_input_grad(2)};
    return detail::once_differentiable(
        kOp, grads, {&saved[0], &saved[1], &saved[2]}, [&](bool) {
          static const auto op =
              detail::op<Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&, std::array<bool, 3>)>(
                  "fk::_poly_norm_backward");
          auto [dx, dw, db] = op.call(grads[0], saved[0], saved[1], saved[2], saved[3], mask);
          return variable_list{dx, dw, db, at::Tensor()};
        });
  }

  // The Autograd kernel of fk::_poly_norm_forward.
  static Result kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       double eps) {
    if (!detail::records({&x, &weight, &bias})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, weight, bias, eps);
    }
    auto out = apply(x, weight, bias, eps);
    return {out[0], out[1]};
  }

 private:
  static Result call(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>(
            "fk::_poly_norm_forward");
    return op.call(x, weight, bias, eps);
  }
};

// --- group_norm: on fk::_group_norm_forward (the backward needs its mean and rstd) -------

class GroupNormFunction : public torch::autograd::Function<GroupNormFunction> {
 public:
  static constexpr const char* kOp = "fk::_group_norm_forward";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, int64_t num_groups,
                               double eps) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, mean, rstd] = call(x, weight, bias, num_groups, eps);
    ctx->save_for_backward(
        {x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["num_groups"] = num_groups;
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> weight = detail::optional(saved[1]);
    const std::optional<at::Tensor> bias = detail::optional(saved[2]);
    // needs_input_grad counts tensor inputs only: without a weight, the bias is input 1.
    const bool has_w = weight.has_value();
    const std::array<bool, 3> mask = {
        ctx->needs_input_grad(0), has_w && ctx->needs_input_grad(1),
        bias.has_value() && ctx->needs_input_grad(has_w ? 2 : 1)};
    const int64_t groups = ctx->saved_data["num_groups"].toInt();
    return detail::once_differentiable(
        kOp, grads, {&saved[0], &saved[1], &saved[2]}, [&](bool) {
          static const auto op =
              detail::op<Result(const at::Tensor&, const at::Tensor&,
                                const std::optional<at::Tensor>&,
                                const std::optional<at::Tensor>&, const at::Tensor&,
                                const at::Tensor&, int64_t, std::array<bool, 3>)>(
                  "fk::_group_norm_backward");
          auto [dx, dw, db] =
              op.call(grads[0], saved[0], weight, bias, saved[3], saved[4], groups, mask);
          return variable_list{dx, dw, db, at::Tensor(), at::Tensor()};
        });
  }

  // The Autograd kernel of fk::_group_norm_forward.
  static Result kernel(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                       const std::optional<at::Tensor>& bias, int64_t num_groups, double eps) {
    if (!detail::records({&x, detail::ptr(weight), detail::ptr(bias)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, weight, bias, num_groups, eps);
    }
    auto out = apply(x, weight, bias, num_groups, eps);
    return {out[0], out[1], out[2]};
  }

 private:
  static Result call(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, int64_t num_groups, double eps) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const std::optional<at::Tensor>&,
                          const std::optional<at::Tensor>&, int64_t, double)>(
            "fk::_group_norm_forward");
    return op.call(x, weight, bias, num_groups, eps);
  }
};

// --- softmax, sparsemax: on the public op (the backward needs only the output) ------------

// fk::<op>(Tensor x, int dim) whose backward fk::_<op>_backward(grad_y, y, dim) needs only
// the output y.
template <const char* Op, const char* Backward>
class OverDimFunction : public torch::autograd::Function<OverDimFunction<Op, Backward>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor y = call(x, dim);
    ctx->saved_data["dim"] = dim;
    ctx->save_for_backward({y});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(Op, grads, {&saved[0]}, [&](bool) {
      static const auto op =
          detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>(Backward);
      return variable_list{op.call(grads[0], saved[0], ctx->saved_data["dim"].toInt()),
                           at::Tensor()};
    });
  }

  // The Autograd kernel of fk::<op>.
  static at::Tensor kernel(const at::Tensor& x, int64_t dim) {
    if (!detail::records({&x})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, dim);
    }
    return OverDimFunction::apply(x, dim);
  }

 private:
  static at::Tensor call(const at::Tensor& x, int64_t dim) {
    static const auto op = detail::op<at::Tensor(const at::Tensor&, int64_t)>(Op);
    return op.call(x, dim);
  }
};

inline constexpr char kSoftmax[] = "fk::softmax";
inline constexpr char kSoftmaxBackward[] = "fk::_softmax_backward";
using SoftmaxFunction = OverDimFunction<kSoftmax, kSoftmaxBackward>;
inline constexpr char kSparsemax[] = "fk::sparsemax";
inline constexpr char kSparsemaxBackward[] = "fk::_sparsemax_backward";
using SparsemaxFunction = OverDimFunction<kSparsemax, kSparsemaxBackward>;

// --- fused_add_rms_norm: on fk::_fused_add_rms_norm_forward (the backward needs its rstd) --

class FusedAddRmsNormFunction : public torch::autograd::Function<FusedAddRmsNormFunction> {
 public:
  static constexpr const char* kOp = "fk::_fused_add_rms_norm_forward";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight, double eps,
                               double offset, c10::string_view casting_mode) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [y, residual_out, rstd] = call(x, residual, weight, eps, offset, casting_mode);
    // An unused output's gradient stays undefined instead of a tensor of zeros.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({residual_out, weight.value_or(at::Tensor()), rstd});
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["casting_mode"] = std::string(casting_mode);
    ctx->mark_non_differentiable({rstd});
    return {y, residual_out, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> weight = detail::optional(saved[1]);
    const bool need_x = ctx->needs_input_grad(0), need_residual = ctx->needs_input_grad(1);
    const bool need_dx = need_x || need_residual;
    const bool need_dw = weight.has_value() && ctx->needs_input_grad(2);
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      const at::Tensor& grad_y = grads[0];
      const at::Tensor& grad_residual_out = grads[1];
      at::Tensor dx, dw;
      if (grad_y.defined()) {
        if (need_dx || need_dw) {
          static const auto op =
              detail::op<std::tuple<at::Tensor, at::Tensor>(
                  const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
                  const std::optional<at::Tensor>&, const at::Tensor&, double, c10::string_view,
                  std::array<bool, 2>)>("fk::_fused_add_rms_norm_backward");
          std::tie(dx, dw) = op.call(grad_y, detail::optional(grad_residual_out), saved[0],
                                     weight, saved[2], ctx->saved_data["offset"].toDouble(),
                                     ctx->saved_data["casting_mode"].toStringRef(),
                                     {need_dx, need_dw});
        }
      } else {
        // y unused: only the add is differentiated, and it passes the gradient through.
        dx = grad_residual_out;
      }
      // The add gives x and residual the same gradient: one tensor serves both.
      return variable_list{need_x ? dx : at::Tensor(), need_residual ? dx : at::Tensor(), dw,
                           at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::_fused_add_rms_norm_forward.
  static Result kernel(const at::Tensor& x, const at::Tensor& residual,
                       const std::optional<at::Tensor>& weight, double eps, double offset,
                       c10::string_view casting_mode) {
    if (!detail::records({&x, &residual, detail::ptr(weight)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, residual, weight, eps, offset, casting_mode);
    }
    auto out = apply(x, residual, weight, eps, offset, casting_mode);
    return {out[0], out[1], out[2]};
  }

 private:
  static Result call(const at::Tensor& x, const at::Tensor& residual,
                     const std::optional<at::Tensor>& weight, double eps, double offset,
                     c10::string_view casting_mode) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                          double, double, c10::string_view)>("fk::_fused_add_rms_norm_forward");
    return op.call(x, residual, weight, eps, offset, casting_mode);
  }
};

// --- rope: on fk::rope (the backward needs only cos and sin); fk::rope_ refuses autograd ---

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static constexpr const char* kOp = "fk::rope";
  using Result = std::tuple<at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               std::optional<int64_t> rotary_dim, bool interleaved) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [qo, ko] = call("fk::rope", q, k, cos, sin, rotary_dim, interleaved);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["rotary_dim"] =
        rotary_dim.has_value() ? c10::IValue(*rotary_dim) : c10::IValue();
    ctx->saved_data["interleaved"] = interleaved;
    return {qo, ko};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      auto [dq, dk] = call("fk::_rope_backward", grads[0], grads[1], saved[0], saved[1],
                           ctx->saved_data["rotary_dim"].toOptional<int64_t>(),
                           ctx->saved_data["interleaved"].toBool());
      return variable_list{dq, dk, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::rope.
  static Result kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, std::optional<int64_t> rotary_dim,
                       bool interleaved) {
    if (!detail::records({&q, &k, &cos, &sin})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call("fk::rope", q, k, cos, sin, rotary_dim, interleaved);
    }
    auto out = apply(q, k, cos, sin, rotary_dim, interleaved);
    return {out[0], out[1]};
  }

  // The Autograd kernel of fk::rope_, which has no derivative: it refuses tensors autograd
  // would need to track, and bumps the version counters of q and k so that a tensor saved
  // for some backward is not read after it was overwritten.
  static void in_place_kernel(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                              const at::Tensor& sin, std::optional<int64_t> rotary_dim,
                              bool interleaved) {
    TORCH_CHECK(!at::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad()),
                "fk::rope_ is not differentiable: q and k require grad; use fk::rope, or "
                "call it under no_grad");
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      static const auto op =
          detail::op<void(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                          std::optional<int64_t>, bool)>("fk::rope_");
      op.call(q, k, cos, sin, rotary_dim, interleaved);
    }
    detail::bump_version(q);
    detail::bump_version(k);
  }

 private:
  // fk::rope and fk::_rope_backward share their signature.
  static Result call(const char* name, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& cos, const at::Tensor& sin,
                     std::optional<int64_t> rotary_dim, bool interleaved) {
    using Signature = Result(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, std::optional<int64_t>, bool);
    static const auto rope = detail::op<Signature>("fk::rope");
    static const auto backward = detail::op<Signature>("fk::_rope_backward");
    const auto& op = std::string_view(name) == "fk::rope" ? rope : backward;
    return op.call(q, k, cos, sin, rotary_dim, interleaved);
  }
};

// --- qkv_split_norm_rope: on fk::qkv_split_norm_rope (the backward recomputes the norms from
// the saved qkv) -----------------------------------------------------------------------------

class QkvSplitNormRopeFunction : public torch::autograd::Function<QkvSplitNormRopeFunction> {
 public:
  static constexpr const char* kOp = "fk::qkv_split_norm_rope";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv,
                               const std::optional<at::Tensor>& q_norm_weight,
                               const std::optional<at::Tensor>& k_norm_weight,
                               const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads,
                               int64_t num_kv_heads, double eps,
                               std::optional<int64_t> rotary_dim, c10::string_view layout,
                               c10::string_view qkv_format, c10::string_view input_layout) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q, k, v] = fk::qkv_split_norm_rope(qkv, q_norm_weight, k_norm_weight, cos, sin,
                                             num_heads, num_kv_heads, eps, rotary_dim, layout,
                                             qkv_format, input_layout);
    ctx->save_for_backward({qkv, q_norm_weight.value_or(at::Tensor()),
                            k_norm_weight.value_or(at::Tensor()), cos, sin});
    ctx->saved_data["num_heads"] = num_heads;
    ctx->saved_data["num_kv_heads"] = num_kv_heads;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["rotary_dim"] =
        rotary_dim.has_value() ? c10::IValue(*rotary_dim) : c10::IValue();
    ctx->saved_data["layout"] = std::string(layout);
    ctx->saved_data["qkv_format"] = std::string(qkv_format);
    ctx->saved_data["input_layout"] = std::string(input_layout);
    return {q, k, v};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto qw = detail::optional(saved[1]), kw = detail::optional(saved[2]);
    const std::array<bool, 2> mask{qw.has_value() && ctx->needs_input_grad(1),
                                   kw.has_value() && ctx->needs_input_grad(2)};
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1], &saved[2]}, [&](bool) {
      static const auto op =
          detail::op<Result(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&, const at::Tensor&,
                            const at::Tensor&, int64_t, int64_t, double, std::optional<int64_t>,
                            c10::string_view, c10::string_view, c10::string_view,
                            std::array<bool, 2>)>("fk::_qkv_split_norm_rope_backward");
      auto& d = ctx->saved_data;
      auto [dqkv, dqw, dkw] =
          op.call(grads[0], grads[1], grads[2], saved[0], qw, kw, saved[3], saved[4],
                  d["num_heads"].toInt(), d["num_kv_heads"].toInt(), d["eps"].toDouble(),
                  d["rotary_dim"].toOptional<int64_t>(), d["layout"].toStringRef(),
                  d["qkv_format"].toStringRef(), d["input_layout"].toStringRef(), mask);
      variable_list out(12);
      out[0] = dqkv;
      out[1] = dqw;
      out[2] = dkw;
      return out;
    });
  }

  // The Autograd kernel of fk::qkv_split_norm_rope.
  static Result kernel(const at::Tensor& qkv, const std::optional<at::Tensor>& q_norm_weight,
                       const std::optional<at::Tensor>& k_norm_weight, const at::Tensor& cos,
                       const at::Tensor& sin, int64_t num_heads, int64_t num_kv_heads,
                       double eps, std::optional<int64_t> rotary_dim, c10::string_view layout,
                       c10::string_view qkv_format, c10::string_view input_layout) {
    if (!detail::records({&qkv, detail::ptr(q_norm_weight), detail::ptr(k_norm_weight)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return fk::qkv_split_norm_rope(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads,
                                     num_kv_heads, eps, rotary_dim, layout, qkv_format,
                                     input_layout);
    }
    auto out = apply(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads, num_kv_heads, eps,
                     rotary_dim, layout, qkv_format, input_layout);
    return {out[0], out[1], out[2]};
  }
};

// --- gated_group_rms_norm: on fk::gated_group_rms_norm (the backward recomputes the group
// statistics from x) ---------------------------------------------------------------------------

class GatedGroupRmsNormFunction : public torch::autograd::Function<GatedGroupRmsNormFunction> {
 public:
  static constexpr const char* kOp = "fk::gated_group_rms_norm";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate,
                               const std::optional<at::Tensor>& weight, int64_t group_size,
                               double eps, c10::string_view activation, bool transpose_out) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto y = fk::gated_group_rms_norm(x, gate, weight, group_size, eps, activation,
                                      transpose_out);
    ctx->save_for_backward({x, gate, weight.value_or(at::Tensor())});
    ctx->saved_data["group_size"] = group_size;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["transpose_out"] = transpose_out;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto weight = detail::optional(saved[2]);
    const bool need_dw = weight.has_value() && ctx->needs_input_grad(2);
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1], &saved[2]}, [&](bool) {
      static const auto op =
          detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, int64_t, double, c10::string_view, bool, bool)>(
              "fk::_gated_group_rms_norm_backward");
      auto& d = ctx->saved_data;
      auto [dx, dg, dw] = op.call(grads[0], saved[0], saved[1], weight, d["group_size"].toInt(),
                                  d["eps"].toDouble(), d["activation"].toStringRef(),
                                  d["transpose_out"].toBool(), need_dw);
      return variable_list{dx, dg, dw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::gated_group_rms_norm.
  static at::Tensor kernel(const at::Tensor& x, const at::Tensor& gate,
                           const std::optional<at::Tensor>& weight, int64_t group_size,
                           double eps, c10::string_view activation, bool transpose_out) {
    if (!detail::records({&x, &gate, detail::ptr(weight)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return fk::gated_group_rms_norm(x, gate, weight, group_size, eps, activation,
                                      transpose_out);
    }
    return apply(x, gate, weight, group_size, eps, activation, transpose_out)[0];
  }
};

// --- llama4_rope: on fk::llama4_rope (the backward needs only freqs_cis) ---------------------

class Llama4RopeFunction : public torch::autograd::Function<Llama4RopeFunction> {
 public:
  static constexpr const char* kOp = "fk::llama4_rope";
  using Result = std::tuple<at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& freqs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [qo, ko] = call("fk::llama4_rope", q, k, freqs);
    ctx->save_for_backward({freqs});
    return {qo, ko};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(kOp, grads, {&saved[0]}, [&](bool) {
      auto [dq, dk] = call("fk::_llama4_rope_backward", grads[0], grads[1], saved[0]);
      return variable_list{dq, dk, at::Tensor()};
    });
  }

  // The Autograd kernel of fk::llama4_rope.
  static Result kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& freqs) {
    if (!detail::records({&q, &k, &freqs})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call("fk::llama4_rope", q, k, freqs);
    }
    auto out = apply(q, k, freqs);
    return {out[0], out[1]};
  }

 private:
  // fk::llama4_rope and fk::_llama4_rope_backward share their signature.
  static Result call(const char* name, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& freqs) {
    using Signature = Result(const at::Tensor&, const at::Tensor&, const at::Tensor&);
    static const auto fwd = detail::op<Signature>("fk::llama4_rope");
    static const auto backward = detail::op<Signature>("fk::_llama4_rope_backward");
    const auto& op = std::string_view(name) == "fk::llama4_rope" ? fwd : backward;
    return op.call(q, k, freqs);
  }
};

// --- qwen2vl_mrope: on fk::qwen2vl_mrope (the backward needs only cos and sin) ---------------

class Qwen2vlMropeFunction : public torch::autograd::Function<Qwen2vlMropeFunction> {
 public:
  static constexpr const char* kOp = "fk::qwen2vl_mrope";
  using Result = std::tuple<at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               at::IntArrayRef mrope_section, bool interleaved) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [qo, ko] = call("fk::qwen2vl_mrope", q, k, cos, sin, mrope_section, interleaved);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["mrope_section"] = mrope_section.vec();
    ctx->saved_data["interleaved"] = interleaved;
    return {qo, ko};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[1]}, [&](bool) {
      const auto section = ctx->saved_data["mrope_section"].toIntVector();
      auto [dq, dk] = call("fk::_qwen2vl_mrope_backward", grads[0], grads[1], saved[0],
                           saved[1], section, ctx->saved_data["interleaved"].toBool());
      return variable_list{dq, dk, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::qwen2vl_mrope.
  static Result kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                       const at::Tensor& sin, at::IntArrayRef mrope_section, bool interleaved) {
    if (!detail::records({&q, &k, &cos, &sin})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call("fk::qwen2vl_mrope", q, k, cos, sin, mrope_section, interleaved);
    }
    auto out = apply(q, k, cos, sin, mrope_section, interleaved);
    return {out[0], out[1]};
  }

 private:
  // fk::qwen2vl_mrope and fk::_qwen2vl_mrope_backward share their signature.
  static Result call(const char* name, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& cos, const at::Tensor& sin,
                     at::IntArrayRef mrope_section, bool interleaved) {
    using Signature = Result(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, at::IntArrayRef, bool);
    static const auto fwd = detail::op<Signature>("fk::qwen2vl_mrope");
    static const auto backward = detail::op<Signature>("fk::_qwen2vl_mrope_backward");
    const auto& op = std::string_view(name) == "fk::qwen2vl_mrope" ? fwd : backward;
    return op.call(q, k, cos, sin, mrope_section, interleaved);
  }
};

// --- swiglu_linear: on fk::_swiglu_linear_forward (the backward needs the factors s, t it
// returns, or forms them again from x and the weights when they were not returned) ---------
//
// Backward: one elementwise pass forms da = dz * t and db = dz * s, written over t and s when
// nothing can read them again (not when the graph is retained or a higher-order graph is
// built; then new tensors); then the products through ATen (cuBLAS on CUDA), only those
// whose gradient is needed: dx = da w_gate + db w_up, dWg = da^T x, dWu = db^T x.

class SwigluLinearFunction : public torch::autograd::Function<SwigluLinearFunction> {
 public:
  static constexpr const char* kOp = "fk::_swiglu_linear_forward";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& w_gate, const at::Tensor& w_up,
                               std::array<bool, 2> output_mask, double gate_multiplier,
                               double down_multiplier) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [z, s, t] = call(x, w_gate, w_up, output_mask, gate_multiplier, down_multiplier);
    ctx->save_for_backward({x, w_gate, w_up, s, t});
    ctx->saved_data["gate_multiplier"] = gate_multiplier;
    ctx->saved_data["down_multiplier"] = down_multiplier;
    ctx->set_materialize_grads(false);
    // Without the factors (recompute) the results are z alone: a torch::autograd::Function
    // cannot return undefined tensors (the kernel below returns them).
    if (!s.defined()) return {z};
    // s and t are the backward's factors, not differentiable results; their gradients are
    // never formed (no zero tensors of z's size in the backward).
    ctx->mark_non_differentiable({s, t});
    return {z, s, t};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_gate = saved[1], &w_up = saved[2];
    const bool need_x = ctx->needs_input_grad(0), need_wg = ctx->needs_input_grad(1),
               need_wu = ctx->needs_input_grad(2);
    return detail::once_differentiable(kOp, grads, {&x, &w_gate, &w_up}, [&](bool create_graph) {
      const at::Tensor& dz = grads[0];
      if (!dz.defined() || !(need_x || need_wg || need_wu)) return variable_list(6);
      at::Tensor s = saved[3], t = saved[4];
      if (!s.defined()) {  // recompute
        std::tie(std::ignore, s, t) =
            call(x, w_gate, w_up, {false, true}, ctx->saved_data["gate_multiplier"].toDouble(),
                 ctx->saved_data["down_multiplier"].toDouble());
      }
      auto [da, db] = detail::input_grads(
          detail::may_overwrite_saved(create_graph), t, s,
          [&] {
            static const auto op =
                detail::op<void(const at::Tensor&, at::Tensor&, at::Tensor&)>(
                    "fk::_swiglu_linear_gate_grads_");
            op.call(dz, t, s);
          },
          [&] {
            static const auto op =
                detail::op<std::tuple<at::Tensor, at::Tensor>(
                    const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
                    "fk::_swiglu_linear_gate_grads");
            return op.call(dz, t, s);
          });
      const at::Tensor da2 = rows(da), db2 = rows(db);
      at::Tensor dx, dwg, dwu;
      // One product, the other added onto it in place.
      if (need_x) dx = at::mm(da2, w_gate).addmm_(db2, w_up).view(x.sizes());
      if (need_wg || need_wu) {
        const at::Tensor x2 = rows(x);
        if (need_wg) dwg = at::mm(da2.t(), x2);
        if (need_wu) dwu = at::mm(db2.t(), x2);
      }
      return variable_list{dx, dwg, dwu, at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::_swiglu_linear_forward.
  static Result kernel(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                       std::array<bool, 2> output_mask, double gate_multiplier,
                       double down_multiplier) {
    if (!detail::records({&x, &w_gate, &w_up})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(x, w_gate, w_up, output_mask, gate_multiplier, down_multiplier);
    }
    auto out = apply(x, w_gate, w_up, output_mask, gate_multiplier, down_multiplier);
    if (out.size() == 1) return {out[0], at::Tensor(), at::Tensor()};
    return {out[0], out[1], out[2]};
  }

 private:
  static Result call(const at::Tensor& x, const at::Tensor& w_gate, const at::Tensor& w_up,
                     std::array<bool, 2> output_mask, double gate_multiplier,
                     double down_multiplier) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          std::array<bool, 2>, double, double)>("fk::_swiglu_linear_forward");
    return op.call(x, w_gate, w_up, output_mask, gate_multiplier, down_multiplier);
  }

  // (rows, last dim) view of t (a copy only when t's layout does not allow one); also for
  // empty tensors, where -1 would be ambiguous.
  static at::Tensor rows(const at::Tensor& t) {
    int64_t n = 1;
    for (int64_t d = 0; d + 1 < t.dim(); ++d) n *= t.size(d);
    return t.reshape({n, t.size(-1)});
  }
};

// --- cross_entropy: on fk::cross_entropy (a kernel of its own, as in Python: the forward
// computes the gradient, into the logits' memory where allowed) ----------------------------

namespace detail {

// The dtype fk::cross_entropy and fk::fused_linear_cross_entropy return their losses in:
// loss_dtype, or like's dtype when unset (the message of the ops' own check).
inline at::ScalarType loss_output_dtype(const char* op, const at::Tensor& like,
                                        std::optional<at::ScalarType> loss_dtype) {
  if (!loss_dtype.has_value()) return like.scalar_type();
  const auto d = *loss_dtype;
  TORCH_CHECK(d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf, op,
              ": loss_dtype must be None, float32, float64, bfloat16 or float16, got ", d);
  return d;
}

// The backward of a gradient the forward computed for a grad_output of 1 (2-D): scaled by
// grad_loss in place where that is safe (plain eager, the graph not retained, no
// higher-order graph) and returned as a new tensor object on the same memory (so a leaf's
// .grad takes it without a copy), else into a new tensor. Under create_graph the result
// raises when differentiated (it depends on a gradient the internal ops cannot
// differentiate). `op` names the formula in that error.
// The gradient a backward op computes: into dst's own memory by in_place() where that is
// safe and may_write (plain eager, the graph not retained, no higher-order graph; dst's
// version counter bumped, a new tensor object on the same memory returned), else into a new
// tensor by out_of_place(); under create_graph the result raises when differentiated.
template <typename OutOfPlace, typename InPlace>
at::Tensor grad_in_place_or_new(const char* op, at::Tensor dst, const at::Tensor& grad_loss,
                                bool may_write, OutOfPlace out_of_place, InPlace in_place) {
  if (at::GradMode::is_enabled()) {  // create_graph
    at::Tensor out;
    {
      at::NoGradGuard no_grad;
      at::AutoDispatchBelowADInplaceOrView guard;
      out = out_of_place();
    }
    return raise_when_differentiated(op, {out})[0];
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  if (may_write && !torch::autograd::get_current_graph_task_keep_graph() &&
      dst.is_contiguous() && plain_eager({&dst, &grad_loss})) {
    in_place();
    bump_version(dst);
    return dst.detach();
  }
  return out_of_place();
}

// The backward of a gradient the forward computed for a grad_output of 1: scaled by
// grad_loss, in place where that is safe (grad_in_place_or_new).
inline at::Tensor scale_stored_grad(const char* op, at::Tensor stored,
                                    const at::Tensor& grad_loss) {
  static const auto backward =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fk::_cross_entropy_backward");
  static const auto in_place = detail::op<void(at::Tensor&, const at::Tensor&)>(
      "fk::_cross_entropy_backward_");
  return grad_in_place_or_new(
      op, stored, grad_loss, true, [&] { return backward.call(stored, grad_loss); },
      [&] { in_place.call(stored, grad_loss); });
}

}  // namespace detail

// The forward computes the gradient of the loss for a grad_output of 1 and keeps it; the
// backward scales it by grad_output.
//
// Where the gradient lives: with grad_in_logits in the logits' own memory, in plain eager
// execution only (no dispatch mode, no functional / fake / subclass tensors; else a new
// buffer). The logits' version counter is bumped, so anything else that saved them for its
// backward raises autograd's "modified by an inplace operation" error instead of reading
// gradients; the logits are saved as they are, so a later write into them makes this
// backward raise too.
class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  // (loss, z_loss, token_accuracy, predicted_tokens), the last two undefined unless asked.
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
  static constexpr const char* kOp = "fk::cross_entropy";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               int64_t ignore_index, double label_smoothing,
                               c10::string_view reduction, double lse_square_scale,
                               std::optional<double> softcap, bool grad_in_logits, bool extras,
                               const std::optional<at::Tensor>& mean_denominator) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor loss, z, grad, acc, pred;
    if (grad_in_logits && detail::plain_eager({&logits, &target})) {
      // The gradient goes into the logits, or into the one contiguous copy of them.
      at::Tensor x = logits.is_contiguous() ? logits : logits.contiguous();
      static const auto op =
          detail::op<Result(at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            int64_t, double, c10::string_view, double, std::optional<double>,
                            bool, const std::optional<at::Tensor>&)>(
              "fk::_cross_entropy_forward_");
      std::tie(loss, z, acc, pred) =
          op.call(x, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale,
                  softcap, extras, mean_denominator);
      if (x.is_same(logits)) detail::bump_version(logits);
      grad = x;
    } else {
      std::tie(loss, z, grad, acc, pred) =
          forward_op(logits, target, weight, ignore_index, label_smoothing, reduction,
                     lse_square_scale, softcap, true, extras, mean_denominator);
    }
    ctx->save_for_backward({grad});
    // z_loss is part of loss already and is returned for logging, the token accuracy and
    // predicted tokens are metrics: no gradient through them.
    ctx->mark_non_differentiable(detail::defined({z, acc, pred}));
    // Undefined outputs are left out (a C++ Function cannot return them).
    return detail::defined({loss, z, acc, pred});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(11);
    // No grad_output for the loss: only the outputs without a gradient were used.
    if (!grads[0].defined()) return out;
    out[0] = detail::scale_stored_grad(kOp, ctx->get_saved_variables()[0], grads[0]);
    return out;
  }

  // The Autograd kernel of fk::cross_entropy.
  static Result kernel(const at::Tensor& logits, const at::Tensor& target,
                       const std::optional<at::Tensor>& weight, int64_t ignore_index,
                       double label_smoothing, c10::string_view reduction,
                       double lse_square_scale, std::optional<double> softcap,
                       bool grad_in_logits, std::optional<at::ScalarType> loss_dtype,
                       bool return_token_accuracy, bool return_predicted_tokens,
                       const std::optional<at::Tensor>& mean_denominator, bool defer_grad);

 private:
  using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  static Forward forward_op(const at::Tensor& logits, const at::Tensor& target,
                            const std::optional<at::Tensor>& weight, int64_t ignore_index,
                            double label_smoothing, c10::string_view reduction,
                            double lse_square_scale, std::optional<double> softcap,
                            bool compute_grad, bool extras,
                            const std::optional<at::Tensor>& mean_denominator) {
    static const auto op =
        detail::op<Forward(const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, int64_t, double, c10::string_view,
                           double, std::optional<double>, bool, bool,
                           const std::optional<at::Tensor>&)>("fk::_cross_entropy_forward");
    return op.call(logits, target, weight, ignore_index, label_smoothing, reduction,
                   lse_square_scale, softcap, compute_grad, extras, mean_denominator);
  }
};

// defer_grad: the forward computes the losses and each row's logsumexp and keeps the logits
// (unmodified); the backward computes the gradient times grad_output from them in one pass.
// With grad_in_logits it goes into the logits' own memory (or the one contiguous copy of
// them) in plain eager execution with the graph not retained and no higher-order graph (the
// logits' version counter bumped, as in CrossEntropyFunction), else into a new buffer.
class CrossEntropyDeferredFunction
    : public torch::autograd::Function<CrossEntropyDeferredFunction> {
 public:
  static constexpr const char* kOp = "fk::cross_entropy";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               int64_t ignore_index, double label_smoothing,
                               c10::string_view reduction, double lse_square_scale,
                               std::optional<double> softcap, bool grad_in_logits, bool extras,
                               const std::optional<at::Tensor>& mean_denominator) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    const at::Tensor x = logits.is_contiguous() ? logits : logits.contiguous();
    static const auto op =
        detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                              at::Tensor>(const at::Tensor&, const at::Tensor&,
                                          const std::optional<at::Tensor>&, int64_t, double,
                                          c10::string_view, double, std::optional<double>, bool,
                                          const std::optional<at::Tensor>&)>(
            "fk::_cross_entropy_deferred_forward");
    auto [loss, z, lse, den, acc, pred] =
        op.call(x, target, weight, ignore_index, label_smoothing, reduction, lse_square_scale,
                softcap, extras, mean_denominator);
    ctx->save_for_backward({x, target, weight.value_or(at::Tensor()), lse, den});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    ctx->saved_data["lse_square_scale"] = lse_square_scale;
    ctx->saved_data["softcap"] = softcap;
    // x is the caller's tensor: written into only where the caller allowed it.
    ctx->saved_data["in_logits"] = grad_in_logits || !x.is_same(logits);
    ctx->mark_non_differentiable(detail::defined({z, acc, pred}));
    return detail::defined({loss, z, acc, pred});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(11);
    if (!grads[0].defined()) return out;
    const auto saved = ctx->get_saved_variables();
    at::Tensor x = saved[0];
    const at::Tensor& grad_loss = grads[0];
    const auto weight = detail::optional(saved[2]);
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const double label_smoothing = ctx->saved_data["label_smoothing"].toDouble();
    const double lse_square_scale = ctx->saved_data["lse_square_scale"].toDouble();
    const auto softcap = ctx->saved_data["softcap"].toOptional<double>();
    static const auto backward_op =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&, int64_t, double, double,
                              std::optional<double>)>("fk::_cross_entropy_deferred_backward");
    static const auto in_place =
        detail::op<void(at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                        const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                        double, double, std::optional<double>)>(
            "fk::_cross_entropy_deferred_backward_");
    out[0] = detail::grad_in_place_or_new(
        kOp, x, grad_loss, ctx->saved_data["in_logits"].toBool(),
        [&] {
          return backward_op.call(x, saved[1], weight, saved[3], saved[4], grad_loss,
                                  ignore_index, label_smoothing, lse_square_scale, softcap);
        },
        [&] {
          in_place.call(x, saved[1], weight, saved[3], saved[4], grad_loss, ignore_index,
                        label_smoothing, lse_square_scale, softcap);
        });
    return out;
  }
};

inline CrossEntropyFunction::Result CrossEntropyFunction::kernel(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double lse_square_scale, std::optional<double> softcap, bool grad_in_logits,
    std::optional<at::ScalarType> loss_dtype, bool return_token_accuracy,
    bool return_predicted_tokens, const std::optional<at::Tensor>& mean_denominator,
    bool defer_grad) {
  const auto dtype = detail::loss_output_dtype(kOp, logits, loss_dtype);
  const bool extras = return_token_accuracy || return_predicted_tokens;
  at::Tensor loss, z, acc, pred;
  if (!at::GradMode::is_enabled() || !logits.requires_grad()) {
    // No gradient wanted (class weights are not differentiated, as in torch): losses only.
    at::AutoDispatchBelowADInplaceOrView guard;
    std::tie(loss, z, std::ignore, acc, pred) =
        forward_op(logits, target, weight, ignore_index, label_smoothing, reduction,
                   lse_square_scale, softcap, false, extras, mean_denominator);
  } else {
    auto out = defer_grad
                   ? CrossEntropyDeferredFunction::apply(
                         logits, target, weight, ignore_index, label_smoothing, reduction,
                         lse_square_scale, softcap, grad_in_logits, extras, mean_denominator)
                   : apply(logits, target, weight, ignore_index, label_smoothing, reduction,
                           lse_square_scale, softcap, grad_in_logits, extras,
                           mean_denominator);
    loss = out[0], z = out[1];
    if (extras) {
      acc = out[2];
      pred = out[3];
    }
  }
  // Rounded once to the output dtype; autograd casts grad_output back to float32.
  return {loss.to(dtype), z.to(dtype), return_token_accuracy ? acc : at::Tensor(),
          return_predicted_tokens ? pred : at::Tensor()};
}

// --- jsd: on fk::jsd (a kernel of its own, as in Python: the forward computes the gradient
// with respect to the input; the target gets none) ------------------------------------------

class JsdFunction : public torch::autograd::Function<JsdFunction> {
 public:
  static constexpr const char* kOp = "fk::jsd";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& target,
                               const std::optional<at::Tensor>& shift_labels, double beta,
                               int64_t ignore_index) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, grad] = forward_op(input, target, shift_labels, beta, ignore_index, true);
    ctx->save_for_backward({grad});
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(5);
    if (!grads[0].defined()) return out;
    at::Tensor grad = ctx->get_saved_variables()[0];
    // The scaling takes grad_output in float32 (float64 for float64 inputs); the loss, and
    // so grad_output, has the input's dtype.
    const auto acc = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    out[0] = detail::scale_stored_grad(kOp, grad, grads[0].to(acc));
    return out;
  }

  // The Autograd kernel of fk::jsd.
  static at::Tensor kernel(const at::Tensor& input, const at::Tensor& target,
                           const std::optional<at::Tensor>& shift_labels, double beta,
                           int64_t ignore_index) {
    if (!at::GradMode::is_enabled() || !input.requires_grad()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return std::get<0>(forward_op(input, target, shift_labels, beta, ignore_index, false));
    }
    return apply(input, target, shift_labels, beta, ignore_index)[0];
  }

 private:
  static std::tuple<at::Tensor, at::Tensor> forward_op(
      const at::Tensor& input, const at::Tensor& target,
      const std::optional<at::Tensor>& shift_labels, double beta, int64_t ignore_index,
      bool compute_grad) {
    static const auto op =
        detail::op<std::tuple<at::Tensor, at::Tensor>(
            const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double,
            int64_t, bool)>("fk::_jsd_forward");
    return op.call(input, target, shift_labels, beta, ignore_index, compute_grad);
  }
};

// --- kl_div: on fk::kl_div (a kernel of its own, as in Python: for a reduction the forward
// computes the gradient, which the backward scales with cross entropy's scaling op) ----------

class KlDivFunction : public torch::autograd::Function<KlDivFunction> {
 public:
  static constexpr const char* kOp = "fk::kl_div";

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& target, c10::string_view reduction,
                            bool log_target, double eps) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, grad] = forward_op(input, target, reduction, log_target, eps, true);
    const bool none = reduction == c10::string_view("none");
    ctx->saved_data["none"] = none;
    ctx->saved_data["log_target"] = log_target;
    ctx->save_for_backward({none ? target : grad});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(5);
    if (!grads[0].defined()) return out;
    const at::Tensor saved = ctx->get_saved_variables()[0];
    if (!ctx->saved_data["none"].toBool()) {
      // The stored gradient in the (rows, last dim) form the scaling op takes.
      int64_t n = 1;
      for (int64_t d = 0; d + 1 < saved.dim(); ++d) n *= saved.size(d);
      const at::Tensor rows = saved.dim() == 0 ? saved.view({1, 1})
                                               : saved.view({n, saved.size(-1)});
      out[0] = detail::scale_stored_grad(kOp, rows, grads[0]).view(saved.sizes());
      return out;
    }
    const bool log_target = ctx->saved_data["log_target"].toBool();
    static const auto backward_op =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, bool)>(
            "fk::_kl_div_backward");
    out[0] = detail::once_differentiable(kOp, grads, {}, [&](bool) {
      at::AutoDispatchBelowADInplaceOrView below;
      return variable_list{backward_op.call(grads[0], saved, log_target)};
    })[0];
    return out;
  }

  // The Autograd kernel of fk::kl_div.
  static at::Tensor kernel(const at::Tensor& input, const at::Tensor& target,
                           c10::string_view reduction, bool log_target, double eps) {
    TORCH_CHECK(!(at::GradMode::is_enabled() && target.requires_grad()), kOp,
                ": target requires grad, but fk differentiates kl_div with respect to input "
                "only; pass target.detach() (or use torch.nn.functional.kl_div for a gradient "
                "with respect to target)");
    if (!at::GradMode::is_enabled() || !input.requires_grad()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return std::get<0>(forward_op(input, target, reduction, log_target, eps, false));
    }
    return apply(input, target, reduction, log_target, eps);
  }

 private:
  static std::tuple<at::Tensor, at::Tensor> forward_op(const at::Tensor& input,
                                                       const at::Tensor& target,
                                                       c10::string_view reduction,
                                                       bool log_target, double eps,
                                                       bool compute_grad) {
    static const auto op =
        detail::op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                      c10::string_view, bool, double, bool)>(
            "fk::_kl_div_forward");
    return op.call(input, target, reduction, log_target, eps, compute_grad);
  }
};

// --- tvd: on fk::tvd (a kernel of its own, as in Python: the forward computes the gradient
// with respect to p into a new buffer; q gets none) ---------------------------------------------

class TvdFunction : public torch::autograd::Function<TvdFunction> {
 public:
  static constexpr const char* kOp = "fk::tvd";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& p, const at::Tensor& q,
                               const std::optional<at::Tensor>& shift_labels,
                               c10::string_view reduction, int64_t ignore_index) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [loss, grad] = forward_op(p, q, shift_labels, reduction, ignore_index, true);
    ctx->save_for_backward({grad});
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(5);
    if (!grads[0].defined()) return out;
    at::Tensor stored = ctx->get_saved_variables()[0];
    static const auto scaled =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fk::_tvd_backward");
    static const auto in_place =
        detail::op<void(at::Tensor&, const at::Tensor&)>("fk::_tvd_backward_");
    out[0] = detail::grad_in_place_or_new(
        kOp, stored, grads[0], true, [&] { return scaled.call(stored, grads[0]); },
        [&] { in_place.call(stored, grads[0]); });
    return out;
  }

  // The Autograd kernel of fk::tvd.
  static at::Tensor kernel(const at::Tensor& p, const at::Tensor& q,
                           const std::optional<at::Tensor>& shift_labels,
                           c10::string_view reduction, int64_t ignore_index) {
    if (!at::GradMode::is_enabled() || !p.requires_grad()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return std::get<0>(forward_op(p, q, shift_labels, reduction, ignore_index, false));
    }
    return apply(p, q, shift_labels, reduction, ignore_index)[0];
  }

 private:
  static std::tuple<at::Tensor, at::Tensor> forward_op(
      const at::Tensor& p, const at::Tensor& q, const std::optional<at::Tensor>& shift_labels,
      c10::string_view reduction, int64_t ignore_index, bool compute_grad) {
    static const auto op =
        detail::op<std::tuple<at::Tensor, at::Tensor>(
            const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
            c10::string_view, int64_t, bool)>("fk::_tvd_forward");
    return op.call(p, q, shift_labels, reduction, ignore_index, compute_grad);
  }
};

// --- fused_linear_cross_entropy: on fk::fused_linear_cross_entropy (a kernel of its own, as
// in Python: the forward computes the gradients) ---------------------------------------------
//
// Reductions "mean" and "sum": the forward computes grad_x, grad_weight and grad_bias for a
// grad_output of 1 (only those in grad_mask) and keeps them; the backward scales them by
// grad_output (in place where safe: detail::scale_stored_grad).
// Reduction "none": each row's grad_output must weigh the logits' gradient before the
// products sum over rows, so the forward keeps x, weight, target (and bias) and the backward
// runs the chunked pass again with grad_output per row.

class FusedLinearCrossEntropyFunction
    : public torch::autograd::Function<FusedLinearCrossEntropyFunction> {
 public:
  // (loss, z_loss, token_accuracy, predicted_tokens), the last two undefined unless asked.
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
  static constexpr const char* kOp = "fk::fused_linear_cross_entropy";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& target,
                               const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& ce_weight, int64_t ignore_index,
                               double label_smoothing, c10::string_view reduction,
                               double lse_square_scale, std::optional<double> softcap,
                               std::optional<int64_t> chunk_size,
                               std::optional<at::ScalarType> accum_dtype,
                               std::array<bool, 3> grad_mask, bool use_token_scaling,
                               bool extras) {
    ctx->set_materialize_grads(false);
    const bool deferred = reduction == "none";
    const std::array<bool, 3> now =
        deferred ? std::array<bool, 3>{false, false, false} : grad_mask;
    at::Tensor loss, z, gx, gw, gb, acc, pred;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(loss, z, gx, gw, gb, acc, pred) =
          forward_op(x, weight, target, bias, ce_weight, ignore_index, label_smoothing,
                     reduction, lse_square_scale, softcap, chunk_size, accum_dtype, now,
                     std::nullopt, use_token_scaling, extras);
    }
    ctx->saved_data["deferred"] = deferred;
    if (deferred) {
      ctx->save_for_backward({x, weight, target, bias.value_or(at::Tensor()),
                              ce_weight.value_or(at::Tensor())});
      ctx->saved_data["ignore_index"] = ignore_index;
      ctx->saved_data["label_smoothing"] = label_smoothing;
      ctx->saved_data["lse_square_scale"] = lse_square_scale;
      ctx->saved_data["softcap"] = softcap;
      ctx->saved_data["chunk_size"] = chunk_size;
      ctx->saved_data["accum_dtype"] =
          accum_dtype.has_value() ? static_cast<int64_t>(*accum_dtype) : int64_t{-1};
      ctx->saved_data["grad_mask"] = std::vector<bool>(grad_mask.begin(), grad_mask.end());
      ctx->saved_data["use_token_scaling"] = use_token_scaling;
    } else {
      ctx->save_for_backward({gx, gw, gb});
    }
    // z_loss is part of loss already and is returned for logging, the token accuracy and
    // predicted tokens are metrics: no gradient through them.
    ctx->mark_non_differentiable(detail::defined({z, acc, pred}));
    // Undefined outputs are left out (a C++ Function cannot return them).
    return detail::defined({loss, z, acc, pred});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(15);
    const at::Tensor& g = grads[0];
    // No grad_output for the loss: only the outputs without a gradient were used.
    if (!g.defined()) return out;
    auto saved = ctx->get_saved_variables();
    if (ctx->saved_data["deferred"].toBool()) {
      const int64_t accum = ctx->saved_data["accum_dtype"].toInt();
      const auto mask = ctx->saved_data["grad_mask"].toBoolList();
      const bool create_graph = at::GradMode::is_enabled();
      at::Tensor gx, gw, gb;
      {
        at::NoGradGuard no_grad;
        at::AutoDispatchBelowADInplaceOrView guard;
        std::tie(std::ignore, std::ignore, gx, gw, gb, std::ignore, std::ignore) = forward_op(
            saved[0], saved[1], saved[2], detail::optional(saved[3]),
            detail::optional(saved[4]), ctx->saved_data["ignore_index"].toInt(),
            ctx->saved_data["label_smoothing"].toDouble(), "none",
            ctx->saved_data["lse_square_scale"].toDouble(),
            ctx->saved_data["softcap"].toOptional<double>(),
            ctx->saved_data["chunk_size"].toOptional<int64_t>(),
            accum < 0 ? std::nullopt
                      : std::optional<at::ScalarType>(static_cast<at::ScalarType>(accum)),
            {mask[0], mask[1], mask[2]}, g, ctx->saved_data["use_token_scaling"].toBool(),
            false);
      }
      if (create_graph) {
        const variable_list marked = detail::raise_when_differentiated(kOp, {gx, gw, gb});
        gx = marked[0], gw = marked[1], gb = marked[2];
      }
      out[0] = gx, out[1] = gw, out[3] = gb;
      return out;
    }
    if (saved[0].defined()) out[0] = detail::scale_stored_grad(kOp, saved[0], g);
    if (saved[1].defined()) out[1] = detail::scale_stored_grad(kOp, saved[1], g);
    if (saved[2].defined()) {
      out[3] = detail::scale_stored_grad(kOp, saved[2].unsqueeze(0), g).squeeze(0);
    }
    return out;
  }

  // The Autograd kernel of fk::fused_linear_cross_entropy.
  static Result kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& ce_weight, int64_t ignore_index,
                       double label_smoothing, c10::string_view reduction,
                       double lse_square_scale, std::optional<double> softcap,
                       std::optional<int64_t> chunk_size,
                       std::optional<at::ScalarType> accum_dtype,
                       std::optional<at::ScalarType> loss_dtype, bool use_token_scaling,
                       bool return_token_accuracy, bool return_predicted_tokens) {
    const auto dtype = detail::loss_output_dtype(kOp, x, loss_dtype);
    const bool extras = return_token_accuracy || return_predicted_tokens;
    const bool grad_mode = at::GradMode::is_enabled();
    const std::array<bool, 3> mask = {
        grad_mode && x.requires_grad(), grad_mode && weight.requires_grad(),
        grad_mode && bias.has_value() && bias->defined() && bias->requires_grad()};
    at::Tensor loss, z, acc, pred;
    if (!mask[0] && !mask[1] && !mask[2]) {
      // No gradient wanted (ce_weight is not differentiated): losses only.
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(loss, z, std::ignore, std::ignore, std::ignore, acc, pred) =
          forward_op(x, weight, target, bias, ce_weight, ignore_index, label_smoothing,
                     reduction, lse_square_scale, softcap, chunk_size, accum_dtype,
                     {false, false, false}, std::nullopt, use_token_scaling, extras);
    } else {
      auto out = apply(x, weight, target, bias, ce_weight, ignore_index, label_smoothing,
                       reduction, lse_square_scale, softcap, chunk_size, accum_dtype, mask,
                       use_token_scaling, extras);
      loss = out[0], z = out[1];
      if (extras) {
        acc = out[2];
        pred = out[3];
      }
    }
    // Rounded once to the output dtype; autograd casts grad_output back to float32.
    return {loss.to(dtype), z.to(dtype), return_token_accuracy ? acc : at::Tensor(),
            return_predicted_tokens ? pred : at::Tensor()};
  }

 private:
  using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                             at::Tensor, at::Tensor>;

  static Forward forward_op(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& target, const std::optional<at::Tensor>& bias,
                            const std::optional<at::Tensor>& ce_weight, int64_t ignore_index,
                            double label_smoothing, c10::string_view reduction,
                            double lse_square_scale, std::optional<double> softcap,
                            std::optional<int64_t> chunk_size,
                            std::optional<at::ScalarType> accum_dtype,
                            std::array<bool, 3> grad_mask,
                            const std::optional<at::Tensor>& grad_rows, bool use_token_scaling,
                            bool extras) {
    static const auto op =
        detail::op<Forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           int64_t, double, c10::string_view, double, std::optional<double>,
                           std::optional<int64_t>, std::optional<at::ScalarType>,
                           std::array<bool, 3>, const std::optional<at::Tensor>&, bool, bool)>(
            "fk::_fused_linear_cross_entropy_forward");
    return op.call(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
                   lse_square_scale, softcap, chunk_size, accum_dtype, grad_mask, grad_rows,
                   use_token_scaling, extras);
  }
};


// --- fused_linear_jsd: on fk::fused_linear_jsd (as in Python: the forward computes the
// gradients of the student's input and weight for a grad_output of 1, only those in
// grad_mask, and keeps them; the backward scales them by grad_output). The teacher gets no
// gradient. ------------------------------------------------------------------------------

class FusedLinearJsdFunction : public torch::autograd::Function<FusedLinearJsdFunction> {
 public:
  static constexpr const char* kOp = "fk::fused_linear_jsd";

  static variable_list forward(AutogradContext* ctx, const at::Tensor& student_input,
                               const at::Tensor& student_weight,
                               const at::Tensor& teacher_input,
                               const at::Tensor& teacher_weight,
                               const std::optional<at::Tensor>& shift_labels, double beta,
                               int64_t ignore_index, double temperature,
                               std::optional<int64_t> chunk_size,
                               std::array<bool, 2> grad_mask) {
    ctx->set_materialize_grads(false);
    at::Tensor loss, gx, gw;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(loss, gx, gw) =
          forward_op(student_input, student_weight, teacher_input, teacher_weight,
                     shift_labels, beta, ignore_index, temperature, chunk_size, grad_mask);
    }
    ctx->save_for_backward({gx, gw});
    return {loss};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(10);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    auto saved = ctx->get_saved_variables();
    if (saved[0].defined()) out[0] = detail::scale_stored_grad(kOp, saved[0], g);
    if (saved[1].defined()) out[1] = detail::scale_stored_grad(kOp, saved[1], g);
    return out;
  }

  // The Autograd kernel of fk::fused_linear_jsd.
  static at::Tensor kernel(const at::Tensor& student_input, const at::Tensor& student_weight,
                           const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
                           const std::optional<at::Tensor>& shift_labels, double beta,
                           int64_t ignore_index, double temperature,
                           std::optional<int64_t> chunk_size) {
    const bool grad_mode = at::GradMode::is_enabled();
    const std::array<bool, 2> mask = {grad_mode && student_input.requires_grad(),
                                      grad_mode && student_weight.requires_grad()};
    if (!mask[0] && !mask[1]) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return std::get<0>(forward_op(student_input, student_weight, teacher_input,
                                    teacher_weight, shift_labels, beta, ignore_index,
                                    temperature, chunk_size, {false, false}));
    }
    return apply(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                 beta, ignore_index, temperature, chunk_size, mask)[0];
  }

 private:
  using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

  static Forward forward_op(const at::Tensor& student_input, const at::Tensor& student_weight,
                            const at::Tensor& teacher_input, const at::Tensor& teacher_weight,
                            const std::optional<at::Tensor>& shift_labels, double beta,
                            int64_t ignore_index, double temperature,
                            std::optional<int64_t> chunk_size, std::array<bool, 2> grad_mask) {
    static const auto op =
        detail::op<Forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const std::optional<at::Tensor>&, double, int64_t,
                           double, std::optional<int64_t>, std::array<bool, 2>)>(
            "fk::_fused_linear_jsd_forward");
    return op.call(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                   beta, ignore_index, temperature, chunk_size, grad_mask);
  }
};

// --- moe_permute / moe_unpermute: on the public ops (the backwards need the row map) -----

class MoePermuteFunction : public torch::autograd::Function<MoePermuteFunction> {
 public:
  static constexpr const char* kOp = "fk::moe_permute";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& tokens,
                               const at::Tensor& routing_map,
                               const std::optional<at::Tensor>& probs, int64_t pad_to,
                               std::optional<int64_t> num_out_rows) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [permuted, pp, row_map, tpe] = call(tokens, routing_map, probs, pad_to, num_out_rows);
    ctx->save_for_backward({row_map});
    ctx->saved_data["rows"] = permuted.size(0);
    ctx->saved_data["hidden"] = permuted.size(1);
    ctx->saved_data["dtype"] = static_cast<int64_t>(permuted.scalar_type());
    const bool has_probs = probs.has_value() && probs->defined();
    ctx->saved_data["probs_dtype"] =
        has_probs ? static_cast<int64_t>(probs->scalar_type()) : int64_t{-1};
    ctx->mark_non_differentiable({row_map, tpe});
    return {permuted, pp, row_map, tpe};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& row_map = saved[0];
    const int64_t probs_dtype = ctx->saved_data["probs_dtype"].toInt();
    // needs_input_grad counts tensor inputs only: probs, when given, is input 2
    const bool want_probs = probs_dtype >= 0 && ctx->needs_input_grad(2);
    const bool want_tokens = ctx->needs_input_grad(0);
    if (!want_tokens && !want_probs) return variable_list(5);
    return detail::once_differentiable(kOp, grads, {}, [&](bool) {
      at::Tensor g = grads[0];
      if (!g.defined()) {  // permuted unused: only the probs' gradient flows
        const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
        g = at::zeros({}, row_map.options().dtype(dtype))
                .expand({ctx->saved_data["rows"].toInt(), ctx->saved_data["hidden"].toInt()});
      }
      static const auto op =
          detail::op<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&)>(
              "fk::_moe_permute_backward");
      auto [dtokens, dprobs] =
          op.call(g, want_probs ? detail::optional(grads[1]) : std::nullopt, row_map);
      if (want_probs) {
        const auto pdt = static_cast<at::ScalarType>(probs_dtype);
        dprobs = dprobs.defined() ? dprobs.to(pdt)
                                  : at::zeros(row_map.sizes(), row_map.options().dtype(pdt));
      }
      return variable_list{want_tokens ? dtokens : at::Tensor(), at::Tensor(),
                           want_probs ? dprobs : at::Tensor(), at::Tensor(), at::Tensor()};
    });
  }

  // The Autograd kernel of fk::moe_permute.
  static Result kernel(const at::Tensor& tokens, const at::Tensor& routing_map,
                       const std::optional<at::Tensor>& probs, int64_t pad_to,
                       std::optional<int64_t> num_out_rows) {
    if (!detail::records({&tokens, detail::ptr(probs)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(tokens, routing_map, probs, pad_to, num_out_rows);
    }
    auto out = apply(tokens, routing_map, probs, pad_to, num_out_rows);
    return {out[0], out[1], out[2], out[3]};
  }

 private:
  static Result call(const at::Tensor& tokens, const at::Tensor& routing_map,
                     const std::optional<at::Tensor>& probs, int64_t pad_to,
                     std::optional<int64_t> num_out_rows) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                          int64_t, std::optional<int64_t>)>("fk::moe_permute");
    return op.call(tokens, routing_map, probs, pad_to, num_out_rows);
  }
};

class MoeUnpermuteFunction : public torch::autograd::Function<MoeUnpermuteFunction> {
 public:
  static constexpr const char* kOp = "fk::moe_unpermute";

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& permuted,
                            const at::Tensor& row_id_map,
                            const std::optional<at::Tensor>& probs) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out = call(permuted, row_id_map, probs);
    ctx->save_for_backward({permuted, row_id_map, probs.value_or(at::Tensor())});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const std::optional<at::Tensor> probs = detail::optional(saved[2]);
    const bool want_probs = probs.has_value() && ctx->needs_input_grad(2);
    const bool want_permuted = ctx->needs_input_grad(0);
    if (!want_permuted && !want_probs) return variable_list(3);
    return detail::once_differentiable(kOp, grads, {&saved[0], &saved[2]}, [&](bool) {
      static const auto op =
          detail::op<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, bool)>("fk::_moe_unpermute_backward");
      auto [dperm, dprobs] = op.call(grads[0], saved[0], saved[1], probs, want_probs);
      return variable_list{want_permuted ? dperm : at::Tensor(), at::Tensor(), dprobs};
    });
  }

  // The Autograd kernel of fk::moe_unpermute.
  static at::Tensor kernel(const at::Tensor& permuted, const at::Tensor& row_id_map,
                           const std::optional<at::Tensor>& probs) {
    if (!detail::records({&permuted, detail::ptr(probs)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(permuted, row_id_map, probs);
    }
    return apply(permuted, row_id_map, probs);
  }

 private:
  static at::Tensor call(const at::Tensor& permuted, const at::Tensor& row_id_map,
                         const std::optional<at::Tensor>& probs) {
    static const auto op =
        detail::op<at::Tensor(const at::Tensor&, const at::Tensor&,
                              const std::optional<at::Tensor>&)>("fk::moe_unpermute");
    return op.call(permuted, row_id_map, probs);
  }
};

// --- moe_permute_fp8: on fk::moe_permute_fp8 (only permuted_probs carries a gradient) ------

// As in Python: the quantized copies carry no gradient (an FP8 tensor cannot), the row map
// and the counts are integers, so only permuted_probs is differentiable, in probs (as
// fk::moe_permute's): dprobs[t, e] is its gradient at row row_id_map[t, e], 0 where token t
// is not routed to expert e. The tokens get none here: their gradient is fk::moe_unpermute of
// the permuted rows' gradient, which the FP8 GEMM's backward gives
// (python/fk/ops/moe_permute_fp8.py). The backward is that gather in ATen operators, as
// Python's.
class MoePermuteFp8Function : public torch::autograd::Function<MoePermuteFp8Function> {
 public:
  static constexpr const char* kOp = "fk::moe_permute_fp8";
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            at::Tensor, at::Tensor>;

  // Returns the defined outputs: the copies of the layout, permuted_probs (probs is given
  // here), row_id_map, tokens_per_expert.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& tokens,
                               const at::Tensor& routing_map,
                               const std::optional<at::Tensor>& probs, int64_t pad_to,
                               std::optional<int64_t> num_out_rows, c10::string_view layout,
                               bool pow2_scales) {
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [q, s, qt, st, pp, row_map, tpe] =
        call(tokens, routing_map, probs, pad_to, num_out_rows, layout, pow2_scales);
    ctx->save_for_backward({row_map});
    ctx->mark_non_differentiable(detail::defined({q, s, qt, st, row_map, tpe}));
    // Undefined outputs are left out (a C++ Function cannot return them).
    return detail::defined({q, s, qt, st, pp, row_map, tpe});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor grad_pp = grads[grads.size() - 3];
    // needs_input_grad counts tensor inputs only: probs is input 2
    if (!grad_pp.defined() || !ctx->needs_input_grad(2)) return variable_list(7);
    auto saved = ctx->get_saved_variables();
    const at::Tensor& row_map = saved[0];
    return detail::once_differentiable(kOp, grads, {}, [&](bool) {
      // As Python's: rows past grad_pp's end read the appended zero (the entries not
      // routed, -1, and every entry when there are no rows at all).
      const int64_t n = grad_pp.size(0);
      const at::Tensor padded = at::cat({grad_pp, at::zeros({1}, grad_pp.options())});
      const at::Tensor rows = at::where(row_map.ge(0), row_map, n).to(at::kLong);
      const at::Tensor dprobs = padded.index_select(0, rows.reshape({-1})).view_as(rows);
      variable_list out(7);
      out[2] = dprobs;
      return out;
    });
  }

  // The Autograd kernel of fk::moe_permute_fp8. Without probs no output is differentiable:
  // the op runs below autograd (Python's formula marks them all non-differentiable).
  static Result kernel(const at::Tensor& tokens, const at::Tensor& routing_map,
                       const std::optional<at::Tensor>& probs, int64_t pad_to,
                       std::optional<int64_t> num_out_rows, c10::string_view layout,
                       bool pow2_scales) {
    const bool has_probs = probs.has_value() && probs->defined();
    if (!has_probs || !detail::records({&tokens, detail::ptr(probs)})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return call(tokens, routing_map, probs, pad_to, num_out_rows, layout, pow2_scales);
    }
    auto out = apply(tokens, routing_map, probs, pad_to, num_out_rows, layout, pow2_scales);
    const auto c = detail::fp8_copies(layout, out);
    const size_t n = out.size();  // the copies, permuted_probs, row_id_map, tokens_per_expert
    return {c[0], c[1], c[2], c[3], out[n - 3], out[n - 2], out[n - 1]};
  }

 private:
  static Result call(const at::Tensor& tokens, const at::Tensor& routing_map,
                     const std::optional<at::Tensor>& probs, int64_t pad_to,
                     std::optional<int64_t> num_out_rows, c10::string_view layout,
                     bool pow2_scales) {
    static const auto op =
        detail::op<Result(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                          int64_t, std::optional<int64_t>, c10::string_view, bool)>(kOp);
    return op.call(tokens, routing_map, probs, pad_to, num_out_rows, layout, pow2_scales);
  }
};

namespace detail {

// The Autograd kernels, on the operators Python registers its formulas on.
inline void register_kernels(torch::Library& m) {
  m.impl("swiglu", &SwigluFunction::kernel);
  m.impl("geglu", &GegluFunction::kernel);
  m.impl("_rms_norm_forward", &RmsNormFunction::kernel);
  m.impl("rms_norm_fp8", &RmsNormFp8Function::kernel);
  m.impl("fp8_quantize", &Fp8QuantizeKernel::kernel);
  m.impl("swiglu_fp8", &SwigluFp8Function::kernel);
  m.impl("moe_swiglu_fp8", &MoeSwigluFp8Function::kernel);
  m.impl("_neighborhood_attention_forward", &NeighborhoodAttentionFunction::kernel);
  m.impl("_layer_norm_forward", &LayerNormFunction::kernel);
  m.impl("softmax", &SoftmaxFunction::kernel);
  m.impl("dyt", &DytFunction::kernel);
  m.impl("_poly_norm_forward", &PolyNormFunction::kernel);
  m.impl("_group_norm_forward", &GroupNormFunction::kernel);
  m.impl("sparsemax", &SparsemaxFunction::kernel);
  m.impl("_fused_add_rms_norm_forward", &FusedAddRmsNormFunction::kernel);
  m.impl("rope", &RopeFunction::kernel);
  m.impl("rope_", &RopeFunction::in_place_kernel);
  m.impl("qkv_split_norm_rope", &QkvSplitNormRopeFunction::kernel);
  m.impl("gated_group_rms_norm", &GatedGroupRmsNormFunction::kernel);
  m.impl("llama4_rope", &Llama4RopeFunction::kernel);
  m.impl("qwen2vl_mrope", &Qwen2vlMropeFunction::kernel);
  m.impl("_swiglu_linear_forward", &SwigluLinearFunction::kernel);
  m.impl("cross_entropy", &CrossEntropyFunction::kernel);
  m.impl("fused_linear_cross_entropy", &FusedLinearCrossEntropyFunction::kernel);
  m.impl("jsd", &JsdFunction::kernel);
  m.impl("kl_div", &KlDivFunction::kernel);
  m.impl("tvd", &TvdFunction::kernel);
  m.impl("fused_linear_jsd", &FusedLinearJsdFunction::kernel);
  m.impl("moe_permute", &MoePermuteFunction::kernel);
  m.impl("moe_unpermute", &MoeUnpermuteFunction::kernel);
  m.impl("moe_permute_fp8", &MoePermuteFp8Function::kernel);
}

}  // namespace detail
}  // namespace autograd

// Registers the autograd formulas of fk's operators for the Autograd key, on the operators
// Python's fk registers them on:
//   the public op:        fk::swiglu, fk::geglu, fk::softmax, fk::dyt, fk::sparsemax,
//                         fk::rope, fk::rope_ (which refuses q and k that require grad),
//                         fk::llama4_rope, fk::qwen2vl_mrope,
//                         fk::cross_entropy, fk::fused_linear_cross_entropy, fk::jsd,
//                         fk::kl_div (which refuses a target that requires grad), fk::tvd,
//                         fk::fused_linear_jsd, fk::moe_permute, fk::moe_unpermute,
//                         fk::rms_norm_fp8 (through y only), fk::swiglu_fp8 and
//                         fk::moe_swiglu_fp8 (through h only), fk::moe_permute_fp8
//                         (through permuted_probs only), fk::fp8_quantize (not
//                         differentiable: called below autograd);
//   the internal forward: fk::_rms_norm_forward, fk::_fused_add_rms_norm_forward,
//                         fk::_layer_norm_forward, fk::_swiglu_linear_forward,
//                         fk::_poly_norm_forward, fk::_group_norm_forward,
//                         fk::_neighborhood_attention_forward (fk::rms_norm,
//                         fk::fused_add_rms_norm, fk::layer_norm, fk::swiglu_linear,
//                         fk::poly_norm, fk::group_norm, fk::neighborhood_attention are
//                         CompositeImplicitAutograd kernels calling them).
// Call it once in a C++ program without Python, before differentiating through fk's ops
// (directly or in a TorchScript module); further calls do nothing. Never call it in a
// process where Python imports fk (see the top of this file).
inline void register_autograd() {
  static const torch::Library* const library = [] {
    // Kept for the whole process (never deregistered).
    auto* lib = new torch::Library(torch::Library::IMPL, "fk",
                                   c10::DispatchKey::Autograd, __FILE__, __LINE__);
    autograd::detail::register_kernels(*lib);
    return lib;
  }();
  (void)library;
}

}  // namespace fk
