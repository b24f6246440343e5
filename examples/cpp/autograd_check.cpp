// Checks every autograd formula of <fk/autograd.h> from C++, with no Python: for each op and
// a few of its options, the gradients autograd computes through fk::register_autograd()'s
// kernels against central finite differences, in float64 on fk's CPU backend (small
// shapes). Also: a double backward raises, frozen inputs get no gradient, fk::rope_ refuses
// tensors that require grad, and the backward_in_place options write into the inputs.
// The FP8 ops take no float64, so their formulas are checked in float32 against independent
// paths: fk::rms_norm_fp8 against fk::rms_norm's gradients, fk::swiglu_fp8 and
// fk::moe_swiglu_fp8 against ATen's autograd of silu(gate) * up (* probs) and fk::swiglu,
// fk::moe_permute_fp8's probs gradient against fk::moe_permute's; none of fk::fp8_quantize's
// outputs requires grad.
//
//   fk_autograd_check          prints one "OK" line per check; exits non-zero on a failure
#include <fk/autograd.h>
#include <fk/fk.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using Tensors = std::vector<at::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;

int g_failures = 0;

void fail(const std::string& what, const std::string& why) {
  std::printf("FAIL %s: %s\n", what.c_str(), why.c_str());
  ++g_failures;
}

void ok(const std::string& what) { std::printf("OK %s\n", what.c_str()); }

const auto kOpts = at::TensorOptions().dtype(at::kDouble);

at::Tensor randn(at::IntArrayRef shape) { return at::randn(shape, kOpts); }

// sum_i <outputs_i, weights_i>: one scalar of every output (undefined outputs skipped).
at::Tensor project(const Tensors& outputs, const Tensors& weights) {
  at::Tensor total = at::zeros({}, kOpts);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && weights[i].defined()) {
      total = total + (outputs[i] * weights[i]).sum();
    }
  }
  return total;
}

// Gradients of f at `inputs` (the entries of `differentiable` require grad) from autograd
// against central differences. `used[i]`: whether output i enters the loss.
void gradcheck(const std::string& name, const Fn& f, const Tensors& inputs,
               const std::vector<bool>& differentiable, std::vector<bool> used = {}) {
  const std::string what = "gradcheck " + name;
  try {
    Tensors leaves;
    for (size_t i = 0; i < inputs.size(); ++i) {
      leaves.push_back(differentiable[i] ? inputs[i].detach().clone().requires_grad_(true)
                                         : inputs[i]);
    }
    const Tensors out = f(leaves);
    if (used.empty()) used.assign(out.size(), true);
    Tensors weights;
    for (size_t i = 0; i < out.size(); ++i) {
      weights.push_back(used[i] && out[i].defined() ? randn(out[i].sizes()) : at::Tensor());
    }
    Tensors wrt;
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (differentiable[i]) wrt.push_back(leaves[i]);
    }
    const Tensors analytic = torch::autograd::grad({project(out, weights)}, wrt, {}, false,
                                                   false, /*allow_unused=*/true);
    at::NoGradGuard no_grad;
    const double eps = 1e-6;
    double worst = 0.0;
    size_t k = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!differentiable[i]) continue;
      const at::Tensor grad = analytic[k++];
      Tensors probe(inputs.begin(), inputs.end());
      probe[i] = inputs[i].clone();
      at::Tensor flat = probe[i].view({-1});
      at::Tensor numeric = at::zeros({flat.numel()}, kOpts);
      for (int64_t j = 0; j < flat.numel(); ++j) {
        const double v = flat[j].item<double>();
        flat[j] = v + eps;
        const double up = project(f(probe), weights).item<double>();
        flat[j] = v - eps;
        const double down = project(f(probe), weights).item<double>();
        flat[j] = v;
        numeric[j] = (up - down) / (2 * eps);
      }
      if (!grad.defined()) {
        if (numeric.abs().max().item<double>() > 1e-6) {
          fail(what, "input " + std::to_string(i) + " got no gradient");
          return;
        }
        continue;
      }
      const double diff = (grad.reshape({-1}) - numeric).abs().max().item<double>();
      worst = std::max(worst, diff);
      if (!at::allclose(grad.reshape({-1}), numeric, 1e-5, 1e-6)) {
        fail(what, "input " + std::to_string(i) + ": max abs diff " + std::to_string(diff));
        return;
      }
    }
    std::printf("OK %s (max abs diff %.3e)\n", what.c_str(), worst);
  } catch (const std::exception& e) {
    fail(what, std::string("error: ") + std::string(e.what()).substr(0, 400));
  }
}

// Differentiating the gradient of f raises autograd's "differentiate twice" error.
void check_double_backward(const std::string& name, const Fn& f, const Tensors& inputs,
                           size_t wrt_index) {
  const std::string what = "double backward raises " + name;
  try {
    Tensors leaves(inputs.begin(), inputs.end());
    leaves[wrt_index] = inputs[wrt_index].detach().clone().requires_grad_(true);
    const Tensors out = f(leaves);
    const at::Tensor loss = out[0].pow(2).sum();
    const Tensors g = torch::autograd::grad({loss}, {leaves[wrt_index]}, {}, true, true);
    try {
      g[0].pow(2).sum().backward();
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("differentiate twice") == std::string::npos) {
        fail(what, std::string("unexpected error: ") + std::string(e.what()).substr(0, 300));
      } else {
        ok(what);
      }
      return;
    }
    fail(what, "the second backward did not raise");
  } catch (const std::exception& e) {
    fail(what, std::string("error: ") + std::string(e.what()).substr(0, 400));
  }
}

Tensors one(at::Tensor t) { return {std::move(t)}; }
std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

void check_glu() {
  const Tensors ab = {randn({3, 7}), randn({3, 7})};
  gradcheck("swiglu", [](const Tensors& t) { return one(fk::swiglu(t[0], t[1])); }, ab,
            {true, true});
  gradcheck("swiglu gate_multiplier=0.6 down_multiplier=1.7",
            [](const Tensors& t) { return one(fk::swiglu(t[0], t[1], false, 0.6, 1.7)); }, ab,
            {true, true});
  gradcheck("swiglu multipliers, backward in place",
            [](const Tensors& t) {
              return one(fk::swiglu(t[0] * 1.0, t[1] * 1.0, true, 2.5, 0.25));
            },
            ab, {true, true});
  for (const char* approximate : {"tanh", "none"}) {
    gradcheck(std::string("geglu approximate=") + approximate,
              [=](const Tensors& t) { return one(fk::geglu(t[0], t[1], approximate)); }, ab,
              {true, true});
  }
  check_double_backward("swiglu", [](const Tensors& t) { return one(fk::swiglu(t[0], t[1])); },
                        ab, 0);
  check_double_backward("geglu", [](const Tensors& t) { return one(fk::geglu(t[0], t[1])); },
                        ab, 1);

  // backward_in_place: the gradients land in a's and b's memory (intermediates here).
  for (const bool geglu : {false, true}) {
    const std::string what = std::string(geglu ? "geglu" : "swiglu") +
                             " backward_in_place writes into a and b";
    at::Tensor a0 = ab[0].clone().requires_grad_(true), b0 = ab[1].clone().requires_grad_(true);
    at::Tensor a = a0 * 1.0, b = b0 * 1.0;
    const void* a_data = a.data_ptr();
    at::Tensor c = geglu ? fk::geglu(a, b, "tanh", true) : fk::swiglu(a, b, true);
    at::Tensor ga, gb;
    std::tie(ga, gb) = [&] {
      const Tensors g = torch::autograd::grad({c.sum()}, {a, b});
      return std::make_tuple(g[0], g[1]);
    }();
    at::Tensor ra = ab[0].clone().requires_grad_(true), rb = ab[1].clone().requires_grad_(true);
    const at::Tensor rc = geglu ? fk::geglu(ra, rb, "tanh") : fk::swiglu(ra, rb);
    const Tensors rg = torch::autograd::grad({rc.sum()}, {ra, rb});
    if (ga.data_ptr() != a_data) {
      fail(what, "grad_a is not in a's memory");
    } else if (!at::allclose(ga, rg[0]) || !at::allclose(gb, rg[1])) {
      fail(what, "gradients differ from the out-of-place backward");
    } else {
      ok(what);
    }
  }
}

void check_norms() {
  const at::Tensor x = randn({2, 3, 6}), w = 1.0 + 0.1 * randn({6}), b = 0.1 * randn({6});
  for (const char* mode : {"llama", "gemma", "none"}) {
    gradcheck(std::string("rms_norm casting_mode=") + mode,
              [=](const Tensors& t) { return one(fk::rms_norm(t[0], t[1], 1e-6, 0.5, mode)); },
              {x, w}, {true, true});
  }
  gradcheck("rms_norm without weight",
            [](const Tensors& t) { return one(fk::rms_norm(t[0], std::nullopt)); }, {x}, {true});
  gradcheck("rms_norm frozen weight",
            [](const Tensors& t) { return one(fk::rms_norm(t[0], t[1])); }, {x, w},
            {true, false});
  check_double_backward("rms_norm", [](const Tensors& t) { return one(fk::rms_norm(t[0], t[1])); },
                        {x, w}, 0);

  const at::Tensor r = randn({2, 3, 6});
  auto fused = [](const Tensors& t) {
    auto [y, residual_out] = fk::fused_add_rms_norm(t[0], t[1], opt(t[2]), 1e-6, 0.0, "llama");
    return Tensors{y, residual_out};
  };
  gradcheck("fused_add_rms_norm", fused, {x, r, w}, {true, true, true});
  gradcheck("fused_add_rms_norm y only", fused, {x, r, w}, {true, true, true}, {true, false});
  gradcheck("fused_add_rms_norm residual_out only", fused, {x, r, w}, {true, true, true},
            {false, true});
  gradcheck("fused_add_rms_norm without weight", fused, {x, r, at::Tensor()},
            {true, true, false});
  check_double_backward("fused_add_rms_norm", fused, {x, r, w}, 0);

  auto ln = [](const Tensors& t) { return one(fk::layer_norm(t[0], opt(t[1]), opt(t[2]))); };
  gradcheck("layer_norm", ln, {x, w, b}, {true, true, true});
  gradcheck("layer_norm without weight", ln, {x, at::Tensor(), b}, {true, false, true});
  gradcheck("layer_norm without bias", ln, {x, w, at::Tensor()}, {true, true, false});
  gradcheck("layer_norm frozen x", ln, {x, w, b}, {false, true, true});
  check_double_backward("layer_norm", ln, {x, w, b}, 0);
}

void check_dyt() {
  const at::Tensor x = 2.0 * randn({2, 3, 6}), a = 0.7 + 0.1 * randn({1}), g = randn({6}),
                   b = randn({6});
  auto full = [](const Tensors& t) { return one(fk::dyt(t[0], t[1], t[2], t[3])); };
  gradcheck("dyt", full, {x, a, g, b}, {true, true, true, true});
  gradcheck("dyt frozen x and beta", full, {x, a, g, b}, {false, true, true, false});
  gradcheck("dyt without beta",
            [](const Tensors& t) { return one(fk::dyt(t[0], t[1], t[2])); }, {x, a, g},
            {true, true, true});
  check_double_backward("dyt", full, {x, a, g, b}, 0);
}

void check_poly_norm() {
  const at::Tensor x = randn({2, 3, 6}), w = 0.3 + 0.3 * randn({3}), b = randn({1});
  auto full = [](const Tensors& t) { return one(fk::poly_norm(t[0], t[1], t[2])); };
  gradcheck("poly_norm", full, {x, w, b}, {true, true, true});
  gradcheck("poly_norm frozen weight", full, {x, w, b}, {true, false, true});
  check_double_backward("poly_norm", full, {x, w, b}, 0);
}

void check_group_norm() {
  const at::Tensor x = randn({2, 6, 5}), w = 1.0 + 0.3 * randn({6}), b = randn({6});
  auto full = [](const Tensors& t) {
    return one(fk::group_norm(t[0], opt(t[1]), opt(t[2]), 3));
  };
  gradcheck("group_norm", full, {x, w, b}, {true, true, true});
  gradcheck("group_norm frozen weight", full, {x, w, b}, {true, false, true});
  gradcheck("group_norm without weight", full, {x, at::Tensor(), b}, {true, false, true});
  gradcheck("group_norm without parameters", full, {x, at::Tensor(), at::Tensor()},
            {true, false, false});
  check_double_backward("group_norm", full, {x, w, b}, 0);
}

void check_softmax() {
  const at::Tensor x = randn({3, 4, 5});
  for (const int64_t dim : {-1, 0, 1}) {
    gradcheck("softmax dim=" + std::to_string(dim),
              [=](const Tensors& t) { return one(fk::softmax(t[0], dim)); }, {x}, {true});
  }
  check_double_backward("softmax", [](const Tensors& t) { return one(fk::softmax(t[0])); }, {x},
                        0);
}

void check_sparsemax() {
  const at::Tensor x = randn({3, 4, 5});
  for (const int64_t dim : {-1, 0, 1}) {
    gradcheck("sparsemax dim=" + std::to_string(dim),
              [=](const Tensors& t) { return one(fk::sparsemax(t[0], dim)); }, {x}, {true});
  }
  check_double_backward("sparsemax", [](const Tensors& t) { return one(fk::sparsemax(t[0])); },
                        {x}, 0);
}

void check_neighborhood_attention() {
  const at::Tensor q = randn({1, 2, 9, 3}), k = randn({1, 2, 9, 3}), v = randn({1, 2, 9, 3});
  auto na = [](int64_t ks, int64_t dil, std::optional<double> scale) {
    return [=](const Tensors& t) {
      return one(fk::neighborhood_attention(t[0], t[1], t[2], ks, dil, scale));
    };
  };
  gradcheck("neighborhood_attention", na(3, 1, std::nullopt), {q, k, v}, {true, true, true});
  gradcheck("neighborhood_attention dilation=2 scale=0.7", na(5, 2, 0.7), {q, k, v},
            {true, true, true});
  gradcheck("neighborhood_attention frozen k", na(3, 1, std::nullopt), {q, k, v},
            {true, false, true});
  check_double_backward("neighborhood_attention", na(3, 1, std::nullopt), {q, k, v}, 0);
}

void check_rope() {
  const at::Tensor q = randn({2, 3, 4, 8}), k = randn({2, 1, 4, 8});
  const at::Tensor cos = randn({1, 4, 8}), sin = randn({1, 4, 8});
  for (const bool interleaved : {false, true}) {
    gradcheck(std::string("rope interleaved=") + (interleaved ? "true" : "false"),
              [=](const Tensors& t) {
                auto [qo, ko] = fk::rope(t[0], t[1], cos, sin, std::nullopt, interleaved);
                return Tensors{qo, ko};
              },
              {q, k}, {true, true});
  }
  const at::Tensor cos_half = randn({1, 4, 2}), sin_half = randn({1, 4, 2});
  gradcheck("rope rotary_dim=4", [=](const Tensors& t) {
    auto [qo, ko] = fk::rope(t[0], t[1], cos_half, sin_half, 4);
    return Tensors{qo, ko};
  }, {q, k}, {true, true});
  check_double_backward("rope", [=](const Tensors& t) {
    auto [qo, ko] = fk::rope(t[0], t[1], cos, sin);
    return Tensors{qo, ko};
  }, {q, k}, 0);

  {
    const std::string what = "rope_ refuses q and k that require grad";
    at::Tensor qg = q.clone().requires_grad_(true), kk = k.clone();
    try {
      fk::rope_(qg, kk, cos, sin);
      fail(what, "no error");
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("fk::rope_ is not differentiable") == std::string::npos) {
        fail(what, std::string("unexpected error: ") + std::string(e.what()).substr(0, 300));
      } else {
        ok(what);
      }
    }
  }
  {
    const std::string what = "rope_ in place equals rope and bumps versions";
    at::Tensor qi = q.clone(), ki = k.clone();
    const auto version = qi.unsafeGetTensorImpl()->version_counter().current_version();
    fk::rope_(qi, ki, cos, sin);
    auto [qo, ko] = fk::rope(q, k, cos, sin);
    if (!at::allclose(qi, qo) || !at::allclose(ki, ko)) {
      fail(what, "results differ from fk::rope");
    } else if (qi.unsafeGetTensorImpl()->version_counter().current_version() <= version) {
      fail(what, "q's version counter did not move");
    } else {
      ok(what);
    }
  }
}

void check_llama4_rope() {
  const at::Tensor q = randn({2, 4, 3, 8}), k = randn({2, 4, 1, 8});
  const at::Tensor freqs = at::view_as_complex(randn({2, 4, 4, 2}));
  for (const bool real : {false, true}) {
    const at::Tensor f = real ? at::view_as_real(freqs) : freqs;
    gradcheck(std::string("llama4_rope freqs ") + (real ? "real" : "complex"),
              [=](const Tensors& t) {
                auto [qo, ko] = fk::llama4_rope(t[0], t[1], f);
                return Tensors{qo, ko};
              },
              {q, k}, {true, true});
  }
  check_double_backward("llama4_rope", [=](const Tensors& t) {
    auto [qo, ko] = fk::llama4_rope(t[0], t[1], freqs);
    return Tensors{qo, ko};
  }, {q, k}, 0);
}

void check_qwen2vl_mrope() {
  const at::Tensor q = randn({2, 3, 4, 8}), k = randn({2, 1, 4, 8});
  const at::Tensor cos = randn({3, 2, 4, 8}), sin = randn({3, 2, 4, 8});
  for (const bool interleaved : {false, true}) {
    gradcheck(std::string("qwen2vl_mrope interleaved=") + (interleaved ? "true" : "false"),
              [=](const Tensors& t) {
                auto [qo, ko] = fk::qwen2vl_mrope(t[0], t[1], cos, sin, {2, 1, 1}, interleaved);
                return Tensors{qo, ko};
              },
              {q, k}, {true, true});
  }
  check_double_backward("qwen2vl_mrope", [=](const Tensors& t) {
    auto [qo, ko] = fk::qwen2vl_mrope(t[0], t[1], cos, sin, {2, 1, 1});
    return Tensors{qo, ko};
  }, {q, k}, 0);
}

void check_qkv_split_norm_rope() {
  // qkv (S 3, B 2, (2 + 2 * 1) * 8), partial rotary (cos width 4), both norm weights.
  const at::Tensor qkv = randn({3, 2, 32}), qw = randn({8}) + 1, kw = randn({8}) + 1;
  const at::Tensor cos = randn({3, 4}), sin = randn({3, 4});
  for (const char* layout : {"bshd", "bhsd"}) {
    gradcheck(std::string("qkv_split_norm_rope layout=") + layout, [=](const Tensors& t) {
      auto [q, k, v] = fk::qkv_split_norm_rope(t[0], t[1], t[2], cos, sin, 2, 1, 1e-6,
                                               std::nullopt, layout);
      return Tensors{q, k, v};
    }, {qkv, qw, kw}, {true, true, true});
  }
  gradcheck("qkv_split_norm_rope plain bsh frozen k weight", [=](const Tensors& t) {
    auto [q, k, v] = fk::qkv_split_norm_rope(t[0], t[1], t[2], cos, sin, 2, 1, 1e-6,
                                             std::nullopt, "bshd", "plain", "bsh");
    return Tensors{q, k, v};
  }, {qkv.transpose(0, 1).contiguous(), qw, kw}, {true, true, false});
  check_double_backward("qkv_split_norm_rope", [=](const Tensors& t) {
    auto [q, k, v] = fk::qkv_split_norm_rope(t[0], t[1], t[2], cos, sin, 2, 1);
    return Tensors{q, k, v};
  }, {qkv, qw, kw}, 0);
}

void check_gated_group_rms_norm() {
  const at::Tensor x = randn({2, 3, 2, 8}), gate = randn({2, 3, 2, 8});
  const at::Tensor w_group = randn({4}) + 1, w_full = randn({8}) + 1;
  for (const char* act : {"silu", "sigmoid"}) {
    gradcheck(std::string("gated_group_rms_norm ") + act + " transposed", [=](const Tensors& t) {
      return one(fk::gated_group_rms_norm(t[0], t[1], t[2], 4, 1e-6, act, true));
    }, {x, gate, w_group}, {true, true, true});
  }
  gradcheck("gated_group_rms_norm full weight frozen gate", [=](const Tensors& t) {
    return one(fk::gated_group_rms_norm(t[0], t[1], t[2], 4));
  }, {x, gate, w_full}, {true, false, true});
  check_double_backward("gated_group_rms_norm", [=](const Tensors& t) {
    return one(fk::gated_group_rms_norm(t[0], t[1], t[2], 4));
  }, {x, gate, w_full}, 0);
}

void check_swiglu_linear() {
  const at::Tensor x = randn({2, 3, 8}), wg = 0.3 * randn({5, 8}), wu = 0.3 * randn({5, 8});
  for (const bool recompute : {false, true}) {
    gradcheck(std::string("swiglu_linear recompute=") + (recompute ? "true" : "false"),
              [=](const Tensors& t) { return one(fk::swiglu_linear(t[0], t[1], t[2], recompute)); },
              {x, wg, wu}, {true, true, true});
  }
  gradcheck("swiglu_linear gate_multiplier=0.6 down_multiplier=1.7",
            [](const Tensors& t) {
              return one(fk::swiglu_linear(t[0], t[1], t[2], false, 0.6, 1.7));
            },
            {x, wg, wu}, {true, true, true});
  gradcheck("swiglu_linear multipliers, recompute",
            [](const Tensors& t) {
              return one(fk::swiglu_linear(t[0], t[1], t[2], true, 2.5, 0.25));
            },
            {x, wg, wu}, {true, true, true});
  gradcheck("swiglu_linear frozen weights",
            [](const Tensors& t) { return one(fk::swiglu_linear(t[0], t[1], t[2])); },
            {x, wg, wu}, {true, false, false});
  gradcheck("swiglu_linear frozen x",
            [](const Tensors& t) { return one(fk::swiglu_linear(t[0], t[1], t[2])); },
            {x, wg, wu}, {false, true, true});
  check_double_backward("swiglu_linear",
                        [](const Tensors& t) { return one(fk::swiglu_linear(t[0], t[1], t[2])); },
                        {x, wg, wu}, 0);
}

void check_cross_entropy() {
  const at::Tensor logits = randn({5, 7});
  const at::Tensor target = at::tensor({1, 0, -100, 6, 3}, at::kLong);
  const at::Tensor class_weight = at::rand({7}, kOpts) + 0.5;
  for (const char* reduction : {"mean", "sum", "none"}) {
    for (const bool in_logits : {true, false}) {
      gradcheck(std::string("cross_entropy reduction=") + reduction +
                    (in_logits ? "" : " grad_in_logits=false"),
                [=](const Tensors& t) {
                  return one(fk::cross_entropy(t[0], target, std::nullopt, -100, 0.0, reduction,
                                               0.0, std::nullopt, in_logits));
                },
                {logits}, {true});
    }
  }
  gradcheck("cross_entropy weight, label_smoothing, z-loss, softcap",
            [=](const Tensors& t) {
              return one(fk::cross_entropy(t[0], target, class_weight, -100, 0.1, "mean", 1e-2,
                                           3.0));
            },
            {logits}, {true});
  check_double_backward(
      "cross_entropy",
      [=](const Tensors& t) { return one(fk::cross_entropy(t[0] * 1.0, target)); }, {logits},
      0);
  // defer_grad (the gradient computed in the backward) and mean_denominator.
  const at::Tensor denominator = at::full({}, 2.5, kOpts);
  for (const char* reduction : {"mean", "sum", "none"}) {
    const bool mean = std::string(reduction) == "mean";
    for (const bool in_logits : {true, false}) {
      gradcheck(std::string("cross_entropy defer_grad reduction=") + reduction +
                    (mean ? " mean_denominator" : "") +
                    (in_logits ? "" : " grad_in_logits=false"),
                [=](const Tensors& t) {
                  return one(fk::cross_entropy_outputs(
                                 t[0] * 1.0, target, class_weight, -100, 0.1, reduction, 1e-2,
                                 3.0, in_logits, std::nullopt, false, false,
                                 mean ? std::optional<at::Tensor>(denominator) : std::nullopt,
                                 true)
                                 .loss);
                },
                {logits}, {true});
    }
  }
  check_double_backward("cross_entropy defer_grad",
                        [=](const Tensors& t) {
                          return one(fk::cross_entropy_outputs(
                                         t[0] * 1.0, target, std::nullopt, -100, 0.0, "mean",
                                         0.0, std::nullopt, true, std::nullopt, false, false,
                                         std::nullopt, true)
                                         .loss);
                        },
                        {logits}, 0);

  const std::string what = "cross_entropy grad_in_logits writes the gradient into the logits";
  at::Tensor leaf_logits = logits.clone().requires_grad_(true);
  const void* data = leaf_logits.data_ptr();
  fk::cross_entropy(leaf_logits, target).backward();
  at::Tensor ref = logits.clone().requires_grad_(true);
  fk::cross_entropy(ref, target, std::nullopt, -100, 0.0, "mean", 0.0, std::nullopt, false)
      .backward();
  if (!leaf_logits.grad().defined() || leaf_logits.grad().data_ptr() != data) {
    fail(what, "the gradient is not in the logits' memory");
  } else if (!at::allclose(leaf_logits.grad(), ref.grad())) {
    fail(what, "the gradient differs from grad_in_logits=false");
  } else {
    ok(what);
  }

  // The loss comes in the logits' dtype unless loss_dtype says otherwise; the gradient is
  // the same either way.
  const std::string what_dtype = "cross_entropy loss_dtype";
  at::Tensor a = logits.to(at::kFloat).requires_grad_(true);
  at::Tensor b = logits.to(at::kFloat).requires_grad_(true);
  const at::Tensor loss_default = fk::cross_entropy(a, target);
  const at::Tensor loss_double = fk::cross_entropy(b, target, std::nullopt, -100, 0.0, "mean",
                                                   0.0, std::nullopt, true, at::kDouble);
  loss_default.backward();
  loss_double.backward();
  if (loss_default.scalar_type() != at::kFloat || loss_double.scalar_type() != at::kDouble) {
    fail(what_dtype, "wrong loss dtype");
  } else if (!at::equal(loss_double.to(at::kFloat), loss_default) ||
             !at::equal(a.grad(), b.grad())) {
    fail(what_dtype, "the loss or the gradient depends on loss_dtype");
  } else {
    ok(what_dtype);
  }

  // Token accuracy and predicted tokens: the argmax of each row (-100 where ignored), no
  // gradient; the loss and its gradient as without them.
  const std::string what_extra = "cross_entropy token accuracy and predicted tokens";
  at::Tensor c = logits.to(at::kFloat).requires_grad_(true);
  const auto out = fk::cross_entropy_outputs(c * 1.0, target, std::nullopt, -100, 0.0, "mean",
                                             0.0, std::nullopt, true, std::nullopt, true, true);
  out.loss.backward();
  const at::Tensor keep = target.ne(-100);
  const at::Tensor want_pred = at::where(keep, logits.to(at::kFloat).argmax(1),
                                         at::full_like(target, -100));
  const at::Tensor want_acc =
      at::logical_and(want_pred.eq(target), keep).to(at::kFloat).sum() / keep.sum();
  if (out.z_loss.scalar_type() != at::kFloat || !at::equal(out.predicted_tokens, want_pred) ||
      !at::allclose(out.token_accuracy, want_acc) || out.token_accuracy.requires_grad()) {
    fail(what_extra, "wrong predicted tokens or accuracy");
  } else if (!at::equal(out.loss, loss_default) || !at::equal(c.grad(), a.grad())) {
    fail(what_extra, "the loss or the gradient depends on the extra outputs");
  } else {
    ok(what_extra);
  }
}

void check_jsd() {
  const at::Tensor x = at::log_softmax(randn({5, 7}), 1);
  const at::Tensor y = at::log_softmax(randn({5, 7}), 1);
  const at::Tensor labels = at::tensor({1, 0, -100, 6, 3}, at::kLong);
  for (const double beta : {0.0, 0.3, 1.0}) {
    gradcheck("jsd beta=" + std::to_string(beta),
              [=](const Tensors& t) { return one(fk::jsd(t[0], y, labels, beta)); }, {x},
              {true});
  }
  gradcheck("jsd no labels", [=](const Tensors& t) { return one(fk::jsd(t[0], y)); }, {x},
            {true});
  check_double_backward(
      "jsd", [=](const Tensors& t) { return one(fk::jsd(t[0] * 1.0, y, labels)); }, {x}, 0);
}

void check_kl_div() {
  const at::Tensor input = at::log_softmax(randn({5, 7}), -1);
  const at::Tensor target = at::softmax(randn({5, 7}), -1);
  for (const char* reduction : {"batchmean", "sum", "mean", "none"}) {
    for (const bool log_target : {false, true}) {
      const at::Tensor t = log_target ? at::log(target) : target;
      gradcheck(std::string("kl_div reduction=") + reduction +
                    (log_target ? " log_target" : ""),
                [=](const Tensors& x) { return one(fk::kl_div(x[0], t, reduction, log_target)); },
                {input}, {true});
    }
  }
  for (const char* reduction : {"batchmean", "none"}) {
    check_double_backward(
        std::string("kl_div reduction=") + reduction,
        [=](const Tensors& x) { return one(fk::kl_div(x[0] * 1.0, target, reduction)); },
        {input}, 0);
  }
  const std::string what = "kl_div refuses a target that requires grad";
  try {
    fk::kl_div(input.clone().requires_grad_(true), target.clone().requires_grad_(true));
    fail(what, "no error");
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("target requires grad") == std::string::npos) {
      fail(what, e.what());
    } else {
      ok(what);
    }
  }
}

void check_fused_linear_cross_entropy() {
  const at::Tensor x = randn({5, 4}), w = randn({7, 4}), b = 0.1 * randn({7});
  const at::Tensor target = at::tensor({1, 0, -100, 6, 3}, at::kLong);
  for (const char* reduction : {"mean", "sum", "none"}) {
    gradcheck(std::string("fused_linear_cross_entropy reduction=") + reduction,
              [=](const Tensors& t) {
                return one(fk::fused_linear_cross_entropy(t[0], t[1], target, t[2],
                                                          std::nullopt, -100, 0.1, reduction,
                                                          1e-2, 3.0, /*chunk_size=*/2));
              },
              {x, w, b}, {true, true, true});
  }
  gradcheck("fused_linear_cross_entropy frozen weight",
            [=](const Tensors& t) {
              return one(fk::fused_linear_cross_entropy(t[0], t[1], target));
            },
            {x, w}, {true, false});
  for (const char* reduction : {"mean", "none"}) {
    check_double_backward(
        std::string("fused_linear_cross_entropy reduction=") + reduction,
        [=](const Tensors& t) {
          return one(fk::fused_linear_cross_entropy(t[0], t[1], target, std::nullopt,
                                                    std::nullopt, -100, 0.0, reduction));
        },
        {x, w}, 0);
  }
  // Token scaling: the loss times p_y (a constant of the gradient), checked against a
  // plain ATen reference with p_y detached.
  for (const char* reduction : {"mean", "none"}) {
    const std::string what =
        std::string("fused_linear_cross_entropy token scaling ") + reduction;
    at::Tensor xs = x.clone().requires_grad_(true);
    at::Tensor xr = x.clone().requires_grad_(true);
    const auto out = fk::fused_linear_cross_entropy_outputs(
        xs, w, target, b, std::nullopt, -100, 0.0, reduction, 0.0, std::nullopt, 2,
        std::nullopt, std::nullopt, /*use_token_scaling=*/true, false, true);
    const at::Tensor logits = at::linear(xr, w, b);
    const at::Tensor keep = target.ne(-100);
    const at::Tensor y = at::where(keep, target, at::zeros_like(target)).unsqueeze(1);
    const at::Tensor p = logits.detach().softmax(1).gather(1, y).squeeze(1);
    at::Tensor ref = at::cross_entropy_loss(logits, target, {}, at::Reduction::None) * p;
    if (std::string(reduction) == "mean") ref = ref.sum() / keep.sum();
    const at::Tensor g = at::ones_like(ref);
    out.loss.backward(g);
    ref.backward(g);
    if (!at::allclose(out.loss, ref, 1e-5, 1e-6) ||
        !at::allclose(xs.grad(), xr.grad(), 1e-4, 1e-6) ||
        out.predicted_tokens.size(0) != 5 || out.token_accuracy.defined()) {
      fail(what, "differs from the reference");
    } else {
      ok(what);
    }
  }
}

void check_tvd() {
  // Random p and q never tie (the loss is linear in p between ties).
  const at::Tensor p = randn({5, 7}), q = randn({5, 7});
  const at::Tensor labels = at::tensor({1, 0, -100, 6, 3}, at::kLong);
  for (const char* reduction : {"batchmean", "mean", "sum", "none"}) {
    gradcheck(std::string("tvd reduction=") + reduction,
              [=](const Tensors& t) { return one(fk::tvd(t[0], q, labels, reduction)); }, {p},
              {true});
  }
  gradcheck("tvd without labels", [=](const Tensors& t) { return one(fk::tvd(t[0], q)); },
            {p}, {true});
  check_double_backward(
      "tvd", [=](const Tensors& t) { return one(fk::tvd(t[0] * 1.0, q, labels)); }, {p}, 0);
}

void check_fused_linear_jsd() {
  const at::Tensor xs = randn({5, 4}), ws = randn({7, 4}), xt = randn({5, 3}), wt = randn({7, 3});
  const at::Tensor labels = at::tensor({1, 0, -100, 6, 3}, at::kLong);
  for (const double beta : {0.0, 0.5, 1.0}) {
    gradcheck("fused_linear_jsd beta=" + std::to_string(beta),
              [=](const Tensors& t) {
                return one(fk::fused_linear_jsd(t[0], t[1], xt, wt, labels, beta, -100, 1.5,
                                                /*chunk_size=*/2));
              },
              {xs, ws}, {true, true});
  }
  gradcheck("fused_linear_jsd frozen weight",
            [=](const Tensors& t) { return one(fk::fused_linear_jsd(t[0], t[1], xt, wt)); },
            {xs, ws}, {true, false});
  check_double_backward(
      "fused_linear_jsd",
      [=](const Tensors& t) { return one(fk::fused_linear_jsd(t[0], t[1], xt, wt, labels)); },
      {xs, ws}, 0);
}

void check_moe() {
  const int64_t t = 7, e = 5, k = 2, pad_to = 4;
  const at::Tensor x = randn({t, 3}), probs = at::rand({t, e}, kOpts);
  const at::Tensor rmap =
      at::zeros({t, e}, at::kBool).scatter_(1, std::get<1>(at::randn({t, e}).topk(k, 1)), true);
  const int64_t bound = fk::moe_permute_bound(t, e, k, pad_to);
  auto permute = [=](const Tensors& in) {
    auto [permuted, pp, map, tpe] = fk::moe_permute(in[0], rmap, in[1], pad_to, bound);
    return Tensors{permuted, pp};
  };
  gradcheck("moe_permute", permute, {x, probs}, {true, true});
  gradcheck("moe_permute frozen probs", permute, {x, probs}, {true, false});
  gradcheck("moe_permute permuted unused", permute, {x, probs}, {true, true}, {false, true});
  check_double_backward("moe_permute", permute, {x, probs}, 0);
  const at::Tensor map = std::get<2>(fk::moe_permute(x, rmap, probs, pad_to));
  const at::Tensor y = randn({map.max().item<int64_t>() + 3, 3});
  auto unpermute = [=](const Tensors& in) { return one(fk::moe_unpermute(in[0], map, in[1])); };
  gradcheck("moe_unpermute", unpermute, {y, probs}, {true, true});
  gradcheck("moe_unpermute frozen permuted", unpermute, {y, probs}, {false, true});
  gradcheck("moe_unpermute without probs",
            [=](const Tensors& in) { return one(fk::moe_unpermute(in[0], map)); }, {y}, {true});
  check_double_backward("moe_unpermute", unpermute, {y, probs}, 0);
}

// fk::rms_norm_fp8 takes no float64 (its outputs are float8): its formula is checked in
// float32 against fk::rms_norm's, whose backward it shares (gradients bit for bit), plus the
// straight-through contract: only y carries a gradient, and a recorded call without y raises.
void check_rms_norm_fp8() {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::randn({2, 3, 260}, f32), w = at::randn({260}, f32);
  const at::Tensor dy = at::randn({2, 3, 260}, f32);
  {
    const std::string what = "rms_norm_fp8 gradient through y equals rms_norm's";
    at::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true);
    auto [q, s, qt, st, rstd, y] = fk::rms_norm_fp8(x1, w1, 1e-6, "both", false, true);
    at::Tensor x2 = x.clone().requires_grad_(true), w2 = w.clone().requires_grad_(true);
    const at::Tensor y2 = fk::rms_norm(x2, w2, 1e-6);
    y.backward(dy);
    y2.backward(dy);
    if (!y.requires_grad() || q.requires_grad() || s.requires_grad() || qt.requires_grad() ||
        st.requires_grad() || rstd.requires_grad()) {
      fail(what, "only y may require grad");
    } else if (!at::equal(y, y2) || !at::equal(x1.grad(), x2.grad()) ||
               !at::equal(w1.grad(), w2.grad())) {
      fail(what, "y or its gradients differ from fk::rms_norm's");
    } else {
      ok(what);
    }
  }
  {
    const std::string what = "rms_norm_fp8 refuses a recorded call without y";
    try {
      fk::rms_norm_fp8(x.clone().requires_grad_(true), w);
      fail(what, "no error");
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("only y carries the gradient") == std::string::npos) {
        fail(what, std::string("unexpected error: ") + std::string(e.what()).substr(0, 300));
      } else {
        ok(what);
      }
    }
  }
  check_double_backward("rms_norm_fp8", [=](const Tensors& t) {
    return Tensors{std::get<5>(fk::rms_norm_fp8(t[0], t[1], 1e-6, "rowwise", false, true))};
  }, {x, w}, 0);
}

// --- the other FP8 ops: no float64 either (their outputs are float8), so their formulas are
// checked in float32 against independent paths: ATen autograd of the unquantized formula, or
// the unquantized fk op. Their "gradcheck" lines name the reference; the tolerances are
// stated where they are set. Without the formulas, the CPU backend's ATen calls would record
// a graph that gives ATen's gradients too: what tells the formulas from it is that only the
// differentiable output requires grad (the quantized copies do not) and that a double
// backward raises.

const auto kF32 = at::TensorOptions().dtype(at::kFloat);

// Whether each of ts (undefined ones: false) requires grad as `want` says.
bool requires_grad_is(const Tensors& ts, const std::vector<bool>& want) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if ((ts[i].defined() && ts[i].requires_grad()) != want[i]) return false;
  }
  return true;
}

// "" when the gradients `got` match `want` pairwise (both undefined, or the same shape and
// dtype and allclose within rtol / atol; rtol = atol = 0: equal), else what differs. *worst:
// the largest absolute difference.
std::string grads_differ(const Tensors& got, const Tensors& want, double rtol, double atol,
                         double* worst) {
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string which = "gradient " + std::to_string(i);
    if (!got[i].defined() || !want[i].defined()) {
      if (got[i].defined()) return which + " should be undefined (no gradient)";
      if (want[i].defined()) return which + " is undefined";
      continue;
    }
    if (got[i].sizes() != want[i].sizes() || got[i].scalar_type() != want[i].scalar_type()) {
      return which + " has the wrong shape or dtype";
    }
    if (got[i].numel() == 0) continue;
    const double diff = (got[i] - want[i]).abs().max().item<double>();
    *worst = std::max(*worst, diff);
    if (!at::allclose(got[i], want[i], rtol, atol)) {
      return which + ": max abs diff " + std::to_string(diff);
    }
  }
  return "";
}

// Prints "OK <what> (max abs diff ...)" when `problem` is empty, else a FAIL line.
void report(const std::string& what, const std::string& problem, double worst) {
  if (!problem.empty()) {
    fail(what, problem);
  } else {
    std::printf("OK %s (max abs diff %.3e)\n", what.c_str(), worst);
  }
}

// Runs check(), which reports `what` itself; an exception fails `what`.
void guarded(const std::string& what, const std::function<void()>& check) {
  try {
    check();
  } catch (const std::exception& e) {
    fail(what, std::string("error: ") + std::string(e.what()).substr(0, 400));
  }
}

// Whether a and b hold the same values (float8: the same bytes), or are both undefined.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.scalar_type() != b.scalar_type()) return false;
  if (a.scalar_type() == at::kFloat8_e4m3fn) {
    return at::equal(a.view(at::kByte), b.view(at::kByte));
  }
  return at::equal(a, b);
}

// fk::fp8_quantize is not differentiable: no output requires grad, whatever x does (a leaf
// or an intermediate that requires grad), and the values are those of x detached.
void check_fp8_quantize() {
  const std::string what = "fp8_quantize outputs do not require grad";
  guarded(what, [&] {
    const at::Tensor x = at::randn({3, 260}, kF32);
    const at::Tensor leaf = x.clone().requires_grad_(true);
    for (const at::Tensor& in : {leaf, leaf * 2.0}) {
      for (const int64_t block_rows : {1, 128}) {
        for (const char* layout : {"rowwise", "columnwise", "both"}) {
          const std::string where = std::string("block_rows ") + std::to_string(block_rows) +
                                    ", layout " + layout;
          auto [q, s, qt, st] = fk::fp8_quantize(in, block_rows, layout);
          auto [rq, rs, rqt, rst] = fk::fp8_quantize(in.detach(), block_rows, layout);
          if (!requires_grad_is({q, s, qt, st}, {false, false, false, false})) {
            return fail(what, "an output requires grad (" + where + ")");
          }
          if (!same_bits(q, rq) || !same_bits(s, rs) || !same_bits(qt, rqt) ||
              !same_bits(st, rst)) {
            return fail(what, "the outputs differ from x detached's (" + where + ")");
          }
        }
      }
    }
    ok(what);
  });
}

// silu(gate) * up (* p[:, None]) of x = [gate | up] in ATen operators: the reference h of
// swiglu_fp8 and moe_swiglu_fp8, and through ATen's autograd the reference gradients.
at::Tensor silu_mul(const at::Tensor& x, const at::Tensor& p = at::Tensor()) {
  const int64_t n = x.size(1) / 2;
  const at::Tensor h = at::silu(x.narrow(1, 0, n)) * x.narrow(1, n, n);
  return p.defined() ? h * p.unsqueeze(1) : h;
}

// Tolerances of dx against ATen's autograd (float32): both evaluate dh * up * silu'(gate) and
// dh * silu(gate) in a few float32 roundings, by different expressions (fk's CPU backend:
// sg + silu (1 - sg); ATen: sg (1 + gate (1 - sg))), so they differ by a few ulp relative
// (rtol 1e-5), and near the zero of silu' (gate ~ -1.28) by a few ulp of the terms' size
// (|dh * up| < ~30 here: atol 1e-5). The differences seen here are at most ~1e-6.
constexpr double kDxRtol = 1e-5, kDxAtol = 1e-5;

// fk::swiglu_fp8: only h carries the gradient (straight through), dx as ATen's autograd of
// silu(gate) * up and as fk::swiglu's gradient.
void check_swiglu_fp8() {
  const int64_t m = 5, n = 130;  // n: a full and a partial block of 128
  const at::Tensor x = 2.0 * at::randn({m, 2 * n}, kF32), dh = at::randn({m, n}, kF32);
  at::Tensor xr = x.clone().requires_grad_(true);
  const at::Tensor hr = silu_mul(xr);
  const at::Tensor gr = torch::autograd::grad({hr}, {xr}, {dh})[0];
  for (const char* layout : {"rowwise", "columnwise", "both"}) {
    const std::string what =
        std::string("gradcheck swiglu_fp8 layout=") + layout + " vs ATen silu(gate) * up";
    guarded(what, [&] {
      at::Tensor x8 = x.clone().requires_grad_(true);
      auto [q, s, qt, st, h] = fk::swiglu_fp8(x8, layout, false, true);
      if (!requires_grad_is({q, s, qt, st, h}, {false, false, false, false, true})) {
        return fail(what, "only h may require grad");
      }
      // h: the same float32 product by another silu (g * sigmoid(g) against ATen's):
      // within a few ulp.
      if (!at::allclose(h, hr, 1e-5, 1e-6)) return fail(what, "h differs from ATen's");
      double worst = 0.0;
      const Tensors g = torch::autograd::grad({h}, {x8}, {dh});
      report(what, grads_differ(g, {gr}, kDxRtol, kDxAtol, &worst), worst);
    });
  }
  {
    const std::string what = "gradcheck swiglu_fp8 vs swiglu";
    guarded(what, [&] {
      at::Tensor x8 = x.clone().requires_grad_(true), xs = x.clone().requires_grad_(true);
      auto [q, s, qt, st, h] = fk::swiglu_fp8(x8, "rowwise", false, true);
      if (!requires_grad_is({q, s, h}, {false, false, true})) {
        return fail(what, "only h may require grad");
      }
      const at::Tensor c =
          fk::swiglu(xs.narrow(1, 0, n).contiguous(), xs.narrow(1, n, n).contiguous());
      double worst = 0.0;
      // Both in float32 from the same inputs, each by its own kernel: the tolerances above.
      report(what,
             grads_differ(torch::autograd::grad({h}, {x8}, {dh}),
                          torch::autograd::grad({c}, {xs}, {dh}), kDxRtol, kDxAtol, &worst),
             worst);
    });
  }
  {
    const std::string what = "swiglu_fp8 without return_h: no output requires grad";
    guarded(what, [&] {
      auto [q, s, qt, st, h] = fk::swiglu_fp8(x.clone().requires_grad_(true), "both");
      if (h.defined() || !requires_grad_is({q, s, qt, st}, {false, false, false, false})) {
        return fail(what, "an output requires grad, or h is defined");
      }
      ok(what);
    });
  }
  check_double_backward("swiglu_fp8", [](const Tensors& t) {
    return Tensors{std::get<4>(fk::swiglu_fp8(t[0], "rowwise", false, true))};
  }, {x}, 0);
}

// fk::moe_swiglu_fp8: h is differentiable in x and probs; dx and dprobs as ATen's autograd of
// silu(gate) * up * probs[:, None]; a frozen x or probs gets no gradient.
void check_moe_swiglu_fp8() {
  const int64_t m = 9, n = 130;
  const at::Tensor tpe = at::tensor({3, 0, 6}, at::kInt);  // an empty segment among them
  const at::Tensor x = 2.0 * at::randn({m, 2 * n}, kF32), p = at::rand({m}, kF32);
  const at::Tensor dh = at::randn({m, n}, kF32);
  at::Tensor xr = x.clone().requires_grad_(true), pr = p.clone().requires_grad_(true);
  const Tensors ref = torch::autograd::grad({silu_mul(xr, pr)}, {xr, pr}, {dh});
  // dprobs: a sum of n = 130 float32 products per row, accumulated in another order (and the
  // products associated differently) than ATen's: its rounding errors grow with n and the
  // terms' size: at most ~2e-3 here (n * 2^-24 * sum |terms|, the sums of |terms| ~300), and
  // far less in practice, the roundings being random (6e-6 seen here): rtol 1e-5, atol 1e-4.
  const double dp_atol = 1e-4;
  auto moe = [=](const at::Tensor& xx, const at::Tensor& pp, const char* layout) {
    return fk::moe_swiglu_fp8(xx, pp, tpe, layout, false, true);
  };
  for (const char* layout : {"rowwise", "columnwise", "both"}) {
    const std::string what = std::string("gradcheck moe_swiglu_fp8 layout=") + layout +
                             " vs ATen silu(gate) * up * probs";
    guarded(what, [&] {
      at::Tensor x8 = x.clone().requires_grad_(true), p8 = p.clone().requires_grad_(true);
      auto [q, s, qt, st, h] = moe(x8, p8, layout);
      if (!requires_grad_is({q, s, qt, st, h}, {false, false, false, false, true})) {
        return fail(what, "only h may require grad");
      }
      if (!at::allclose(h, silu_mul(x, p), 1e-5, 1e-6)) return fail(what, "h differs");
      const Tensors g = torch::autograd::grad({h}, {x8, p8}, {dh});
      double worst = 0.0;
      std::string problem = grads_differ({g[0]}, {ref[0]}, kDxRtol, kDxAtol, &worst);
      if (problem.empty()) problem = grads_differ({g[1]}, {ref[1]}, 1e-5, dp_atol, &worst);
      report(what, problem, worst);
    });
  }
  // A frozen input: the other's gradient as above, none for it (h.backward, so that a
  // gradient computed for the frozen input would show in its .grad).
  for (const bool freeze_x : {true, false}) {
    const std::string what =
        std::string("gradcheck moe_swiglu_fp8 frozen ") + (freeze_x ? "x" : "probs");
    guarded(what, [&] {
      at::Tensor x8 = x.clone().requires_grad_(!freeze_x);
      at::Tensor p8 = p.clone().requires_grad_(freeze_x);
      auto [q, s, qt, st, h] = moe(x8, p8, "both");
      if (!requires_grad_is({q, s, qt, st, h}, {false, false, false, false, true})) {
        return fail(what, "only h may require grad");
      }
      h.backward(dh);
      double worst = 0.0;
      const std::string problem =
          freeze_x ? grads_differ({x8.grad(), p8.grad()}, {at::Tensor(), ref[1]}, 1e-5, dp_atol,
                                  &worst)
                   : grads_differ({x8.grad(), p8.grad()}, {ref[0], at::Tensor()}, kDxRtol,
                                  kDxAtol, &worst);
      report(what, problem, worst);
    });
  }
  {
    const std::string what = "moe_swiglu_fp8 without return_h: no output requires grad";
    guarded(what, [&] {
      auto [q, s, qt, st, h] = fk::moe_swiglu_fp8(x.clone().requires_grad_(true),
                                                  p.clone().requires_grad_(true), tpe, "both");
      if (h.defined() || !requires_grad_is({q, s, qt, st}, {false, false, false, false})) {
        return fail(what, "an output requires grad, or h is defined");
      }
      ok(what);
    });
  }
  auto h_of = [=](const Tensors& t) {
    return Tensors{std::get<4>(moe(t[0], t[1], "rowwise"))};
  };
  check_double_backward("moe_swiglu_fp8", h_of, {x, p}, 0);
  check_double_backward("moe_swiglu_fp8 probs", h_of, {x, p}, 1);
}

// fk::moe_permute_fp8: only permuted_probs requires grad, and its gradient reaches probs as
// through fk::moe_permute (both gathers of the same incoming gradient: equal); the tokens get
// none.
void check_moe_permute_fp8() {
  const int64_t t = 7, e = 5, k = 2, pad_to = 4, hidden = 130;
  const at::Tensor x = at::randn({t, hidden}, kF32), probs = at::rand({t, e}, kF32);
  const at::Tensor rmap =
      at::zeros({t, e}, at::kBool).scatter_(1, std::get<1>(at::randn({t, e}).topk(k, 1)), true);
  const int64_t bound = fk::moe_permute_bound(t, e, k, pad_to);
  // (tokens' gradient, probs' gradient) of permuted_probs given a random incoming gradient,
  // through fk::moe_permute_fp8 (with `layout`) and through fk::moe_permute.
  auto both = [&](const at::Tensor& map, std::optional<int64_t> rows, const char* layout,
                  bool tokens_grad, bool probs_grad, std::string* problem) {
    at::Tensor x8 = x.clone().requires_grad_(tokens_grad);
    at::Tensor p8 = probs.clone().requires_grad_(probs_grad);
    auto [q, s, qt, st, pp8, row_map, tpe] =
        fk::moe_permute_fp8(x8, map, p8, pad_to, rows, layout);
    if (!requires_grad_is({q, s, qt, st, pp8, row_map, tpe},
                          {false, false, false, false, true, false, false})) {
      *problem = "only permuted_probs may require grad";
      return std::make_pair(Tensors{}, Tensors{});
    }
    at::Tensor xr = x.clone().requires_grad_(tokens_grad);
    at::Tensor pr = probs.clone().requires_grad_(probs_grad);
    const at::Tensor ppr = std::get<1>(fk::moe_permute(xr, map, pr, pad_to, rows));
    if (!at::equal(pp8, ppr)) *problem = "permuted_probs differ from fk::moe_permute's";
    const at::Tensor gp = at::randn(ppr.sizes(), kF32);
    pp8.backward(gp);
    ppr.backward(gp);
    // fk::moe_permute gives the tokens a gradient through permuted only: none here either.
    return std::make_pair(Tensors{x8.grad(), p8.grad()}, Tensors{at::Tensor(), pr.grad()});
  };
  for (const std::optional<int64_t> rows : {std::optional<int64_t>(bound),
                                            std::optional<int64_t>()}) {
    for (const char* layout : {"rowwise", "columnwise", "both"}) {
      const std::string what = std::string("gradcheck moe_permute_fp8 layout=") + layout +
                               (rows ? " num_out_rows" : "") + " vs moe_permute";
      guarded(what, [&] {
        std::string problem;
        auto [got, want] = both(rmap, rows, layout, true, true, &problem);
        double worst = 0.0;
        if (problem.empty()) problem = grads_differ(got, want, 0.0, 0.0, &worst);
        report(what, problem, worst);
      });
    }
  }
  {
    // As in Python, permuted_probs requires grad when only the tokens do (a Function's output
    // does), and the backward gives nothing.
    const std::string what = "gradcheck moe_permute_fp8 frozen probs";
    guarded(what, [&] {
      std::string problem;
      auto [got, want] = both(rmap, bound, "rowwise", true, false, &problem);
      double worst = 0.0;
      if (problem.empty()) {
        problem = grads_differ(got, {at::Tensor(), at::Tensor()}, 0.0, 0.0, &worst);
      }
      report(what, problem, worst);
    });
  }
  {
    // No rows at all: permuted_probs is empty, dprobs zero (as fk::moe_permute's).
    const std::string what = "gradcheck moe_permute_fp8 nothing routed vs moe_permute";
    guarded(what, [&] {
      std::string problem;
      auto [got, want] =
          both(at::zeros({t, e}, at::kBool), std::nullopt, "both", false, true, &problem);
      double worst = 0.0;
      if (problem.empty()) problem = grads_differ(got, want, 0.0, 0.0, &worst);
      report(what, problem, worst);
    });
  }
  {
    const std::string what = "moe_permute_fp8 without probs: no output requires grad";
    guarded(what, [&] {
      auto [q, s, qt, st, pp, row_map, tpe] = fk::moe_permute_fp8(
          x.clone().requires_grad_(true), rmap, std::nullopt, pad_to, bound, "both");
      if (pp.defined() || !requires_grad_is({q, s, qt, st, row_map, tpe},
                                            {false, false, false, false, false, false})) {
        return fail(what, "an output requires grad, or permuted_probs is defined");
      }
      ok(what);
    });
  }
  check_double_backward("moe_permute_fp8", [=](const Tensors& in) {
    return Tensors{std::get<4>(fk::moe_permute_fp8(in[0], rmap, in[1], pad_to, bound))};
  }, {x, probs}, 1);
}

}  // namespace

int main() {
  try {
    fk::register_autograd();
    at::manual_seed(0);
    check_glu();
    check_norms();
    check_softmax();
    check_dyt();
    check_poly_norm();
    check_group_norm();
    check_sparsemax();
    check_neighborhood_attention();
    check_rope();
    check_llama4_rope();
    check_qwen2vl_mrope();
    check_qkv_split_norm_rope();
    check_gated_group_rms_norm();
    check_swiglu_linear();
    check_cross_entropy();
    check_fused_linear_cross_entropy();
    check_jsd();
    check_kl_div();
    check_tvd();
    check_fused_linear_jsd();
    check_moe();
    check_rms_norm_fp8();
    check_fp8_quantize();
    check_swiglu_fp8();
    check_moe_swiglu_fp8();
    check_moe_permute_fp8();
  } catch (const std::exception& e) {
    std::printf("FAIL error: %s\n", e.what());
    return 2;
  }
  if (g_failures) {
    std::printf("FAILED: %d check(s)\n", g_failures);
    return 1;
  }
  std::printf("OK all checks passed\n");
  return 0;
}
