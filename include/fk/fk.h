// fk's C++ API: the ops of libfk, callable from LibTorch programs.
//
// Header-only: compiled in the program that includes it, against that program's LibTorch,
// so it carries no C++ ABI of fk's. Each function calls the registered torch operator
// (torch.ops.fk.<name>, or the internal op that operator's composite kernel calls) through
// the dispatcher, so CPU / CUDA / autograd behave exactly as from Python. Linking against
// libfk (find_package(fk) -> fk::fk) registers the operators (schemas, CPU and CUDA kernels).
//
// Gradients: libfk registers no autograd kernels (Python's `import fk` does). A C++ program
// without Python gets them from <fk/autograd.h>: call fk::register_autograd() once.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>

namespace fk {

namespace detail {

// The typed handle of the operator `name` ("fk::swiglu"), looked up once per call site.
template <class Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace detail

// silu(a * gate_multiplier) * b * down_multiplier, elementwise (Falcon-H1's MLP multipliers;
// silu(a) * b by default). a and b: same shape, dtype (float32 / bfloat16 / float16, or
// float64 on CPU) and device. backward_in_place: the backward may write the gradients into
// a's and b's memory (for intermediates nothing else reads, e.g. inside an MLP).
inline at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b,
                         bool backward_in_place = false, double gate_multiplier = 1.0,
                         double down_multiplier = 1.0) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, bool, double, double)>(
          "fk::swiglu");
  return op.call(a, b, backward_in_place, gate_multiplier, down_multiplier);
}

// 1-D neighborhood attention: q, k, v (batch, heads, seq_len, head_dim); query i attends the
// keys j with |j - i| <= (kernel_size / 2) * dilation, (j - i) % dilation == 0, inside the
// sequence (windows cut at the ends); fp32 softmax of scale * q k^T (scale defaults to
// 1 / sqrt(head_dim)) over them, times v. kernel_size odd. CUDA takes head_dim <= 128.
inline at::Tensor neighborhood_attention(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, int64_t kernel_size = 7,
                                         int64_t dilation = 1,
                                         std::optional<double> scale = std::nullopt) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                            int64_t, std::optional<double>)>("fk::neighborhood_attention");
  return op.call(q, k, v, kernel_size, dilation, scale);
}

// RMSNorm over the last dimension: x * rsqrt(mean(x^2) + eps) * (offset + weight).
// casting_mode: "llama" (Hugging Face Llama), "gemma" (all fp32), "none".
inline at::Tensor rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                           double eps = 1e-6, double offset = 0.0,
                           const std::string& casting_mode = "llama") {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double, double,
                            c10::string_view)>("fk::rms_norm");
  return op.call(x, weight, eps, offset, casting_mode);
}

// Residual add fused with RMSNorm, as in a decoder layer: residual_out = x + residual (in
// x's dtype), y = rms_norm(residual_out, weight, eps, offset, casting_mode). Returns
// (y, residual_out).
inline std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(
    const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    double eps = 1e-6, double offset = 0.0, const std::string& casting_mode = "llama") {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const std::optional<at::Tensor>&, double,
                                                    double, c10::string_view)>(
          "fk::fused_add_rms_norm");
  return op.call(x, residual, weight, eps, offset, casting_mode);
}

// Cross entropy of (N, V) logits and (N,) int64 targets with torch's weight, ignore_index,
// label_smoothing and reduction ("mean" / "sum" / "none"), plus lse_square_scale *
// logsumexp^2 per row (z-loss) and an optional softcap (logits -> softcap * tanh(logits /
// softcap)). Returns the loss in loss_dtype (unset: the logits' dtype), computed in
// float32. A target neither ignore_index nor in [0, V) raises (a device-side assert on
// CUDA). grad_in_logits: the gradient is written into the logits' memory during the
// forward (when they require grad); their values are gone after.
inline at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                const std::optional<at::Tensor>& weight = std::nullopt,
                                int64_t ignore_index = -100, double label_smoothing = 0.0,
                                const std::string& reduction = "mean",
                                double lse_square_scale = 0.0,
                                std::optional<double> softcap = std::nullopt,
                                bool grad_in_logits = true,
                                std::optional<at::ScalarType> loss_dtype = std::nullopt);

// What cross_entropy_outputs and fused_linear_cross_entropy_outputs return; the outputs not
// asked for are undefined tensors.
struct CrossEntropyOutput {
  at::Tensor loss;
  at::Tensor z_loss;          // the z-loss part of loss, reduced like it (no gradient)
  at::Tensor token_accuracy;  // float32: the fraction of non-ignored rows whose argmax is
                              // the target (NaN without any); per row for "none"
  at::Tensor predicted_tokens;  // (N,) int64 argmax of each row, -100 for ignored rows
};

// cross_entropy with every output: the loss, the z-loss, and where asked for the token
// accuracy and the predicted tokens (the argmax over the softcapped logits, the first
// maximum as torch.argmax, from the forward's own pass; neither has a gradient).
// mean_denominator (one element on the logits' device, reduction "mean" only): the sum of
// the rows' losses is divided by it instead of by the count of non-ignored rows (Hugging
// Face's num_items_in_batch), on the device. defer_grad: the gradient is computed in the
// backward from the logits (kept unmodified until then) times grad_output, in one pass:
// faster for a loss that is scaled before backward().
inline CrossEntropyOutput cross_entropy_outputs(
    const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& weight = std::nullopt, int64_t ignore_index = -100,
    double label_smoothing = 0.0, const std::string& reduction = "mean",
    double lse_square_scale = 0.0, std::optional<double> softcap = std::nullopt,
    bool grad_in_logits = true, std::optional<at::ScalarType> loss_dtype = std::nullopt,
    bool return_token_accuracy = false, bool return_predicted_tokens = false,
    const std::optional<at::Tensor>& mean_denominator = std::nullopt, bool defer_grad = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t,
          double, c10::string_view, double, std::optional<double>, bool,
          std::optional<at::ScalarType>, bool, bool, const std::optional<at::Tensor>&, bool)>(
          "fk::cross_entropy");
  auto [loss, z, acc, pred] =
      op.call(logits, target, weight, ignore_index, label_smoothing, reduction,
              lse_square_scale, softcap, grad_in_logits, loss_dtype, return_token_accuracy,
              return_predicted_tokens, mean_denominator, defer_grad);
  return {loss, z, acc, pred};
}

inline at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                const std::optional<at::Tensor>& weight, int64_t ignore_index,
                                double label_smoothing, const std::string& reduction,
                                double lse_square_scale, std::optional<double> softcap,
                                bool grad_in_logits, std::optional<at::ScalarType> loss_dtype) {
  return cross_entropy_outputs(logits, target, weight, ignore_index, label_smoothing,
                               reduction, lse_square_scale, softcap, grad_in_logits,
                               loss_dtype)
      .loss;
}

// Generalized Jensen-Shannon divergence (Liger Kernel's JSD) of (BT, V) student
// log-probabilities `input` and teacher log-probabilities `target`: per row beta KL(p || m)
// + (1 - beta) KL(q || m), m = beta p + (1 - beta) q (beta 0: KL(p || q), beta 1: KL(q ||
// p)), summed over the rows whose shift_labels entry is not ignore_index and divided by
// their number. Returns the 0-dim loss of input's dtype; gradient with respect to input only.
inline at::Tensor jsd(const at::Tensor& input, const at::Tensor& target,
                      const std::optional<at::Tensor>& shift_labels = std::nullopt,
                      double beta = 0.5, int64_t ignore_index = -100) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, double, int64_t)>("fk::jsd");
  return op.call(input, target, shift_labels, beta, ignore_index);
}

// torch.nn.functional.kl_div(input, target, reduction, log_target) with the target clamped
// to at least eps before its log (t * log(t) = 0 where t == 0): input log-probabilities,
// target probabilities (log-probabilities with log_target) of the same shape and dtype;
// reduction "none" / "sum" / "mean" / "batchmean" (note the default). A reduction returns a
// float32 scalar; "none" the pointwise losses. Differentiable in input only (a target that
// requires grad raises).
inline at::Tensor kl_div(const at::Tensor& input, const at::Tensor& target,
                         const std::string& reduction = "batchmean", bool log_target = false,
                         double eps = 1e-10) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, bool,
                            double)>("fk::kl_div");
  return op.call(input, target, reduction, log_target, eps);
}

// cross_entropy(x @ weight^T + bias, target, ce_weight, ...) without the (N, V) logits:
// x (N, H), weight (V, H), bias (V,); chunk_size rows at a time (from the shapes when
// unset); grad_weight / grad_bias summed in accum_dtype (default: the weight's dtype); the
// loss in loss_dtype (unset: x's dtype), computed in float32. use_token_scaling: each row's
// loss times softmax(logits)_target, taken as a constant (Liger Kernel's token scaling).
// fused_linear_cross_entropy_outputs also returns the z-loss and, where asked for, the token
// accuracy and the predicted tokens, as cross_entropy_outputs.
inline CrossEntropyOutput fused_linear_cross_entropy_outputs(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias = std::nullopt,
    const std::optional<at::Tensor>& ce_weight = std::nullopt, int64_t ignore_index = -100,
    double label_smoothing = 0.0, const std::string& reduction = "mean",
    double lse_square_scale = 0.0, std::optional<double> softcap = std::nullopt,
    std::optional<int64_t> chunk_size = std::nullopt,
    std::optional<at::ScalarType> accum_dtype = std::nullopt,
    std::optional<at::ScalarType> loss_dtype = std::nullopt, bool use_token_scaling = false,
    bool return_token_accuracy = false, bool return_predicted_tokens = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const at::Tensor&,
          const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, int64_t, double,
          c10::string_view, double, std::optional<double>, std::optional<int64_t>,
          std::optional<at::ScalarType>, std::optional<at::ScalarType>, bool, bool, bool)>(
          "fk::fused_linear_cross_entropy");
  auto [loss, z, acc, pred] =
      op.call(x, weight, target, bias, ce_weight, ignore_index, label_smoothing, reduction,
              lse_square_scale, softcap, chunk_size, accum_dtype, loss_dtype, use_token_scaling,
              return_token_accuracy, return_predicted_tokens);
  return {loss, z, acc, pred};
}

inline at::Tensor fused_linear_cross_entropy(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias = std::nullopt,
    const std::optional<at::Tensor>& ce_weight = std::nullopt, int64_t ignore_index = -100,
    double label_smoothing = 0.0, const std::string& reduction = "mean",
    double lse_square_scale = 0.0, std::optional<double> softcap = std::nullopt,
    std::optional<int64_t> chunk_size = std::nullopt,
    std::optional<at::ScalarType> accum_dtype = std::nullopt,
    std::optional<at::ScalarType> loss_dtype = std::nullopt, bool use_token_scaling = false) {
  return fused_linear_cross_entropy_outputs(x, weight, target, bias, ce_weight, ignore_index,
                                            label_smoothing, reduction, lse_square_scale,
                                            softcap, chunk_size, accum_dtype, loss_dtype,
                                            use_token_scaling)
      .loss;
}

// Total variation distance 0.5 * |p - q| between (BT, V) probabilities p and q (one dtype),
// as Liger Kernel's LigerTVDLoss: rows whose shift_labels (BT,) int64 equal ignore_index
// contribute 0 and are not counted; reduction "none" ((BT, V)), "sum", "mean" (/ (n * V)) or
// "batchmean" (/ n). Returns the float32 loss; the gradient flows to p only.
inline at::Tensor tvd(const at::Tensor& p, const at::Tensor& q,
                      const std::optional<at::Tensor>& shift_labels = std::nullopt,
                      const std::string& reduction = "batchmean", int64_t ignore_index = -100) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::string_view, int64_t)>(
          "fk::tvd");
  return op.call(p, q, shift_labels, reduction, ignore_index);
}

// The generalized Jensen-Shannon divergence between a student's and a frozen teacher's heads
// without their logits: log_softmax(student_input @ student_weight^T / temperature) (log q)
// against log_softmax(teacher_input @ teacher_weight^T / temperature) (log p), beta *
// KL(p || m) + (1 - beta) * KL(q || m) with m = beta p + (1 - beta) q (beta 0: KL(p || q),
// beta 1: KL(q || p)), summed over rows whose shift_labels are not ignore_index and divided
// by their number. student_input (N, H), student_weight (V, H), teacher_input (N, H'),
// teacher_weight (V, H'); differentiable in the student's input and weight only.
inline at::Tensor fused_linear_jsd(const at::Tensor& student_input,
                                   const at::Tensor& student_weight,
                                   const at::Tensor& teacher_input,
                                   const at::Tensor& teacher_weight,
                                   const std::optional<at::Tensor>& shift_labels = std::nullopt,
                                   double beta = 0.5, int64_t ignore_index = -100,
                                   double temperature = 1.0,
                                   std::optional<int64_t> chunk_size = std::nullopt) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const std::optional<at::Tensor>&, double,
                            int64_t, double, std::optional<int64_t>)>("fk::fused_linear_jsd");
  return op.call(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                 beta, ignore_index, temperature, chunk_size);
}

// A line describing the loaded libfk: fk version, the torch it was built against and the
// oldest it runs on, the GPU archs, the Triton and ptxas that compiled the kernels
// (torch.ops.fk._build_info, as fk.build_info() in Python).
inline std::string build_info() {
  static const auto op = detail::op<std::string()>("fk::_build_info");
  return op.call();
}

// The version of the torch this libfk was built against, e.g. "2.11.0+cu130".
inline const char* built_torch_version() {
  static const std::string version = [] {
    // build_info(): "fk <version>; torch <version> (stable ABI <version>); archs <archs>;
    // triton <version>; ptxas <version> (sm<arch>, ...)".
    const std::string info = build_info();
    const std::string key = "; torch ";
    const auto at = info.find(key);
    if (at == std::string::npos) return std::string();
    const auto begin = at + key.size();
    return info.substr(begin, info.find_first_of(" ;", begin) - begin);
  }();
  return version.c_str();
}

// silu(x @ w_gate^T * gate_multiplier) * (x @ w_up^T) * down_multiplier in one GEMM kernel
// (Falcon-H1's MLP multipliers; 1 by default). x: (..., K); w_gate, w_up: (N, K) (nn.Linear
// weights) of x's dtype and device; result (..., N). recompute: keep only x and the weights
// for the backward, which then repeats the forward GEMM.
inline at::Tensor swiglu_linear(const at::Tensor& x, const at::Tensor& w_gate,
                                const at::Tensor& w_up, bool recompute = false,
                                double gate_multiplier = 1.0, double down_multiplier = 1.0) {
  // fk::swiglu_linear is this call to its internal forward (its composite kernel), which
  // returns (z, s, t); here the factors s, t for the backward are skipped also when grad
  // mode is on but no input requires grad.
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const at::Tensor&, std::array<bool, 2>, double,
          double)>("fk::_swiglu_linear_forward");
  const bool keep_factors =
      !recompute && at::GradMode::is_enabled() &&
      (x.requires_grad() || w_gate.requires_grad() || w_up.requires_grad());
  return std::get<0>(
      op.call(x, w_gate, w_up, {true, keep_factors}, gate_multiplier, down_multiplier));
}

// Softmax over dim, computed in fp32 and rounded to x's dtype (like torch.softmax; a row of
// only -inf gives NaN). Any dim; the last one is the fast path (others cost a copy in and out).
inline at::Tensor softmax(const at::Tensor& x, int64_t dim = -1) {
  static const auto op = detail::op<at::Tensor(const at::Tensor&, int64_t)>("fk::softmax");
  return op.call(x, dim);
}

// Dynamic Tanh over the last dim: gamma * tanh(alpha * x) + beta, in fp32, rounded once to
// x's dtype. alpha: one element; gamma, beta: (x.size(-1),), beta optional; the parameters
// share one dtype, float32 or x's.
inline at::Tensor dyt(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& gamma,
                      const std::optional<at::Tensor>& beta = std::nullopt) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&)>("fk::dyt");
  return op.call(x, alpha, gamma, beta);
}

// PolyNorm over the last dim: w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b with
// norm(u) = u * rsqrt(mean(u^2) + eps), in fp32, rounded once to x's dtype. weight: (3,);
// bias: one element; both float32 or x's dtype.
inline at::Tensor poly_norm(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps = 1e-6) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>(
          "fk::poly_norm");
  return op.call(x, weight, bias, eps);
}

// Sparsemax over dim: the projection of each slice onto the probability simplex,
// max(x - tau, 0) with tau chosen so that the slice sums to 1, in fp32, rounded to x's dtype
// (a slice with +inf or NaN, or only -inf, gives NaN). Any dim; the last one is the fast path.
// CUDA takes slices of up to 32768 elements.
inline at::Tensor sparsemax(const at::Tensor& x, int64_t dim = -1) {
  static const auto op = detail::op<at::Tensor(const at::Tensor&, int64_t)>("fk::sparsemax");
  return op.call(x, dim);
}

// gelu(a) * b, elementwise, like swiglu. approximate: "tanh" (Gemma's gelu_pytorch_tanh) or
// "none" (exact, erf), as in torch.nn.functional.gelu. backward_in_place: as swiglu's.
inline at::Tensor geglu(const at::Tensor& a, const at::Tensor& b,
                        const std::string& approximate = "tanh",
                        bool backward_in_place = false) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, bool)>(
          "fk::geglu");
  return op.call(a, b, approximate, backward_in_place);
}

// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias, with
// mean and biased variance in fp32; weight and bias (shape (x.size(-1),)) each optional.
inline at::Tensor layer_norm(const at::Tensor& x,
                             const std::optional<at::Tensor>& weight = std::nullopt,
                             const std::optional<at::Tensor>& bias = std::nullopt,
                             double eps = 1e-5) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&, double)>("fk::layer_norm");
  return op.call(x, weight, bias, eps);
}

// Rotary position embedding of q (B, Hq, S, D) and k (B, Hkv, S, D), Hugging Face
// convention: x * cos + rotate_half(x) * sin on the first rotary_dim dims (default: cos's
// last dim), in fp32. cos / sin: (S, W), (1 or B, S, W) or (1 or B, 1, S, W), float32 or
// q's dtype, W = rotary_dim or rotary_dim / 2. interleaved: pairs (2i, 2i + 1) (GPT-J).
// Returns new (q_out, k_out) laid out like q and k; rope_ writes into q and k instead.
inline std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               std::optional<int64_t> rotary_dim = std::nullopt,
                                               bool interleaved = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, const at::Tensor&,
                                                    std::optional<int64_t>, bool)>("fk::rope");
  return op.call(q, k, cos, sin, rotary_dim, interleaved);
}
inline void rope_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                  std::optional<int64_t> rotary_dim = std::nullopt, bool interleaved = false) {
  static const auto op =
      detail::op<void(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                      std::optional<int64_t>, bool)>("fk::rope_");
  op.call(q, k, cos, sin, rotary_dim, interleaved);
}

// Attention inputs from a fused QKV projection in one kernel: qkv (S, B, N) (input_layout
// "sbh") or (B, S, N) ("bsh"), N = (num_heads + 2 * num_kv_heads) * head_dim, heads per kv
// group [q heads..., k, v] (qkv_format "grouped", Megatron) or [q..., k..., v...] ("plain"),
// split; q and k RMS-normalized per head with their weights (Hugging Face Qwen3 numerics;
// none without a weight) and rotated as fk::rope does (rotate-half, the first rotary_dim
// dims). Returns contiguous (q, k, v) as (B, S, H, D) (layout "bshd") or (B, H, S, D)
// ("bhsd").
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_split_norm_rope(
    const at::Tensor& qkv, const std::optional<at::Tensor>& q_norm_weight,
    const std::optional<at::Tensor>& k_norm_weight, const at::Tensor& cos, const at::Tensor& sin,
    int64_t num_heads, int64_t num_kv_heads, double eps = 1e-6,
    std::optional<int64_t> rotary_dim = std::nullopt, c10::string_view layout = "bshd",
    c10::string_view qkv_format = "grouped", c10::string_view input_layout = "sbh") {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
          const at::Tensor&, const at::Tensor&, int64_t, int64_t, double,
          std::optional<int64_t>, c10::string_view, c10::string_view, c10::string_view)>(
          "fk::qkv_split_norm_rope");
  return op.call(qkv, q_norm_weight, k_norm_weight, cos, sin, num_heads, num_kv_heads, eps,
                 rotary_dim, layout, qkv_format, input_layout);
}

// Gated group RMSNorm (the output gate of linear-attention layers, Hugging Face
// Qwen3NextRMSNormGated): round(weight * round(x_hat)) * act(gate) with x_hat the RMS-normalized
// x over each group of group_size elements of the last dim, act = silu or sigmoid ("silu" |
// "sigmoid") of the float32 gate. weight (N,) or (group_size,), or none. transpose_out: x
// (B, S, H, D) -> y (S, B, H * D).
inline at::Tensor gated_group_rms_norm(const at::Tensor& x, const at::Tensor& gate,
                                       const std::optional<at::Tensor>& weight,
                                       int64_t group_size, double eps = 1e-6,
                                       c10::string_view activation = "silu",
                                       bool transpose_out = false) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, int64_t, double, c10::string_view,
                            bool)>("fk::gated_group_rms_norm");
  return op.call(x, gate, weight, group_size, eps, activation, transpose_out);
}

// Llama 4's rotary embedding of q (B, S, Hq, D) and k (B, S, Hkv, D): each adjacent pair
// (x[2i], x[2i+1]) read as a complex number times freqs_cis[..., s, i], in fp32. freqs_cis:
// complex64 (S, D/2) or (1 or B, S, D/2), or its view_as_real (..., D/2, 2) in float32 or
// q's dtype. Returns new (q_out, k_out) laid out like q and k.
inline std::tuple<at::Tensor, at::Tensor> llama4_rope(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& freqs_cis) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&)>("fk::llama4_rope");
  return op.call(q, k, freqs_cis);
}

// Multimodal rotary embedding (Qwen2-VL / Qwen2.5-VL; Qwen3-VL with interleaved) of
// q (B, Hq, S, D) and k (B, Hkv, S, D): x * cos_m + rotate_half(x) * sin_m, in fp32, where
// rotating pair i takes cos / sin (3, 1 or B, S, D) from the temporal, height or width stream
// as mrope_section = {t, h, w} (summing to D / 2) assigns it. Returns new (q_out, k_out)
// laid out like q and k.
inline std::tuple<at::Tensor, at::Tensor> qwen2vl_mrope(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& cos,
                                                        const at::Tensor& sin,
                                                        at::IntArrayRef mrope_section,
                                                        bool interleaved = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, const at::Tensor&,
                                                    at::IntArrayRef, bool)>("fk::qwen2vl_mrope");
  return op.call(q, k, cos, sin, mrope_section, interleaved);
}

// GroupNorm of x (N, C, *): C split into num_groups groups of consecutive channels; per
// (sample, group), (x - mean) * rsqrt(var + eps) (biased variance over the group's channels
// and trailing positions) * weight[c] + bias[c], in fp32, rounded once to x's dtype.
// weight, bias: (C,) or absent, float32 or x's dtype. eps defaults to 1e-6 (torch's
// nn.GroupNorm: 1e-5).
inline at::Tensor group_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& bias, int64_t num_groups,
                             double eps = 1e-6) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&, int64_t, double)>(
          "fk::group_norm");
  return op.call(x, weight, bias, num_groups, eps);
}

// Blockwise float8_e4m3fn quantization of a 2-D x (float32 / bfloat16 / float16); the format
// is fk.fp8_quantize's (python/fk/ops/fp8_quantize.py). block_rows 1: 1 x 128 blocks (data
// (M, K), scales (ceil(K/128), M)); 128: 128 x 128 blocks (scales (ceil(M/128),
// ceil(K/128))). Returns (data, scales, data_t, scales_t): layout "rowwise" leaves the last
// two undefined, "columnwise" the first two, "both" defines all four. Not differentiable.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fp8_quantize(
    const at::Tensor& x, int64_t block_rows = 1, const std::string& layout = "rowwise",
    bool pow2_scales = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, int64_t, c10::string_view, bool)>("fk::fp8_quantize");
  return op.call(x, block_rows, layout, pow2_scales);
}

// data * its block scales (fk::fp8_quantize's row-wise or column-wise copy), in fp32,
// rounded once to dtype (float32 / bfloat16 / float16).
inline at::Tensor fp8_dequantize(const at::Tensor& data, const at::Tensor& scales,
                                 int64_t block_rows = 1,
                                 at::ScalarType dtype = at::ScalarType::BFloat16) {
  static const auto op = detail::op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t,
                                               at::ScalarType)>("fk::fp8_dequantize");
  return op.call(data, scales, block_rows, dtype);
}

// Mixture-of-experts tokens (T, H) gathered into expert-major rows, each expert's segment
// padded to a multiple of pad_to rows (fk.moe_permute, python/fk/ops/moe_permute.py):
// routing_map (T, E) bool or integers, probs (T, E) float32 or tokens' dtype (optional).
// Returns (permuted (N, H), permuted_probs (N,) or undefined, row_id_map (T, E) int32 with
// the row of token t for expert e or -1, tokens_per_expert (E,) int32: the padded segment
// sizes). num_out_rows: N, with no host synchronisation (moe_permute_bound gives the bound
// for top-k routing); without it N is exactly the rows the segments need (one sync).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_permute(
    const at::Tensor& tokens, const at::Tensor& routing_map,
    const std::optional<at::Tensor>& probs = std::nullopt, int64_t pad_to = 16,
    std::optional<int64_t> num_out_rows = std::nullopt) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t,
          std::optional<int64_t>)>("fk::moe_permute");
  return op.call(tokens, routing_map, probs, pad_to, num_out_rows);
}

// The most rows moe_permute's segments need when each of num_tokens tokens goes to at most
// topk of num_experts experts (fk.ops.moe_permute.moe_permute_bound).
inline int64_t moe_permute_bound(int64_t num_tokens, int64_t num_experts, int64_t topk,
                                 int64_t pad_to = 16) {
  const int64_t routed = num_tokens * topk;
  const int64_t bound = routed + std::min(num_experts, routed) * (pad_to - 1);
  return std::min(bound, num_experts * ((num_tokens + pad_to - 1) / pad_to * pad_to));
}

// moe_permute with the permuted rows quantized to float8_e4m3fn in 1 x 128 blocks as they are
// gathered (fk.moe_permute_fp8, python/fk/ops/moe_permute_fp8.py); layout "rowwise",
// "columnwise" (per expert segment) or "both". Returns (data (N, H), scales (ceil(H/128), N),
// data_t (H, N), scales_t ((N + 127 E) / 128, H), permuted_probs, row_id_map,
// tokens_per_expert), the copies not asked for undefined. Not differentiable.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                  at::Tensor>
moe_permute_fp8(const at::Tensor& tokens, const at::Tensor& routing_map,
                const std::optional<at::Tensor>& probs = std::nullopt, int64_t pad_to = 16,
                std::optional<int64_t> num_out_rows = std::nullopt,
                c10::string_view layout = "rowwise", bool pow2_scales = false) {
  using Out = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                         at::Tensor>;
  static const auto op =
      detail::op<Out(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                     int64_t, std::optional<int64_t>, c10::string_view, bool)>(
          "fk::moe_permute_fp8");
  return op.call(tokens, routing_map, probs, pad_to, num_out_rows, layout, pow2_scales);
}

// out (T, H): per token the sum over its experts of probs[t, e] * permuted[row_id_map[t, e]]
// (weights 1 without probs), accumulated in fp32, in permuted's dtype.
inline at::Tensor moe_unpermute(const at::Tensor& permuted, const at::Tensor& row_id_map,
                                const std::optional<at::Tensor>& probs = std::nullopt) {
  static const auto op =
      detail::op<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&)>("fk::moe_unpermute");
  return op.call(permuted, row_id_map, probs);
}

// silu(gate) * up of x (M, 2n) = [gate | up] (float32 / bfloat16 / float16), in fp32, rounded
// to x's dtype and quantized in 1 x 128 blocks (fk.swiglu_fp8, python/fk/ops/swiglu_fp8.py):
// (data (M, n), scales (ceil(n/128), M), data_t (n, M), scales_t (ceil(M/128), n), h (M, n)),
// the copies layout does not ask for and h without return_h undefined. Not differentiable
// here; swiglu_fp8_backward is the backward.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> swiglu_fp8(
    const at::Tensor& x, const std::string& layout = "rowwise", bool pow2_scales = false,
    bool return_h = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, c10::string_view, bool, bool)>("fk::swiglu_fp8");
  return op.call(x, layout, pow2_scales, return_h);
}

// dx (M, 2n) of h = silu(gate) * up given grad_h (M, n): grad_layout "none" returns (dx,
// undefined x 4); "rowwise" / "columnwise" / "both" return (undefined, data (M, 2n), scales
// (2n/128, M), data_t (2n, M), scales_t (ceil(M/128), 2n)) of dx quantized (n % 128 == 0).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
swiglu_fp8_backward(const at::Tensor& grad_h, const at::Tensor& x,
                    const std::string& grad_layout = "none", bool pow2_scales = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, c10::string_view, bool)>(
          "fk::swiglu_fp8_backward");
  return op.call(grad_h, x, grad_layout, pow2_scales);
}

// The MoE form of swiglu_fp8: h = silu(gate) * up * probs[:, None] (probs float32 (M,)) over
// the expert segments of tokens_per_expert ((E,) int32 / int64 on x's device, summing to M);
// the column-wise copy is quantized per segment, scales_t ((M + 127 E) / 128, n) (the layout:
// fk.moe_swiglu_fp8's docstring).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_swiglu_fp8(
    const at::Tensor& x, const at::Tensor& probs, const at::Tensor& tokens_per_expert,
    const std::string& layout = "rowwise", bool pow2_scales = false, bool return_h = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view, bool,
          bool)>("fk::moe_swiglu_fp8");
  return op.call(x, probs, tokens_per_expert, layout, pow2_scales, return_h);
}

// (dx in x's dtype, dprobs float32, undefined, undefined) of moe_swiglu_fp8's h given grad_h
// (M, n); grad_layout "rowwise": (undefined, dprobs, data (M, 2n), scales (2n/128, M)) of dx
// quantized in 1 x 128 blocks (n % 128 == 0).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_swiglu_fp8_backward(
    const at::Tensor& grad_h, const at::Tensor& x, const at::Tensor& probs,
    const std::string& grad_layout = "none", bool pow2_scales = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view, bool)>(
          "fk::moe_swiglu_fp8_backward");
  return op.call(grad_h, x, probs, grad_layout, pow2_scales);
}

// RMSNorm (fk::rms_norm, casting "llama", offset 0) of x (..., K) with its output y
// quantized as fk::fp8_quantize quantizes y.reshape(M, K) in 1 x 128 blocks. Returns (data,
// scales, data_t, scales_t, rstd (M,) float32, y): the copies layout does not ask for, and y
// unless return_norm, undefined. Differentiable through y only (the copies are y for autograd;
// include/fk/autograd.h), which needs return_norm when x or weight requires grad.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
rms_norm_fp8(const at::Tensor& x, const at::Tensor& weight, double eps = 1e-6,
             const std::string& layout = "rowwise", bool pow2_scales = false,
             bool return_norm = false) {
  static const auto op =
      detail::op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                            at::Tensor>(const at::Tensor&, const at::Tensor&, double,
                                        c10::string_view, bool, bool)>("fk::rms_norm_fp8");
  return op.call(x, weight, eps, layout, pow2_scales, return_norm);
}

}  // namespace fk
