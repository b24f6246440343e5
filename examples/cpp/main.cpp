// A LibTorch program using fk from C++, with no Python: the C++ API (fk::swiglu,
// fk::rms_norm, fk::layer_norm, fk::cross_entropy), the autograd formulas registered from
// <fk/autograd.h>, a small classifier trained through fk's ops, and a TorchScript module
// whose graph calls torch.ops.fk.* (see examples/torchscript_export.py), run with gradients.
//
//   fk_example                 check the C++ API forward and backward, and train
//   fk_example block.pt        also load the TorchScript block, run it and check it
//
// Every result is compared with a plain ATen reference computed here. Prints one "OK" line
// per check; exits non-zero on any mismatch or error.
#include <fk/autograd.h>
#include <fk/fk.h>

#include <torch/cuda.h>
#include <torch/optim.h>
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int g_failures = 0;

void fail(const std::string& what, const std::string& why) {
  std::printf("FAIL %s: %s\n", what.c_str(), why.c_str());
  ++g_failures;
}

bool check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want,
                 double rtol, double atol) {
  if (!got.defined() || !want.defined()) {
    fail(what, got.defined() ? "no expected value" : "no result (undefined tensor)");
    return false;
  }
  const at::Tensor g = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor w = want.detach().to(at::kCPU, at::kDouble);
  if (g.sizes() != w.sizes()) {
    fail(what, "shape " + c10::str(g.sizes()) + ", expected " + c10::str(w.sizes()));
    return false;
  }
  const double max_diff = g.numel() ? (g - w).abs().max().item<double>() : 0.0;
  if (!at::allclose(g, w, rtol, atol)) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "max abs diff %.3e (rtol %.1e, atol %.1e)", max_diff, rtol,
                  atol);
    fail(what, buf);
    return false;
  }
  std::printf("OK %s (max abs diff %.3e)\n", what.c_str(), max_diff);
  return true;
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// The reference of fk::rms_norm with casting_mode "llama" for float32 inputs.
at::Tensor rms_norm_ref(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor rstd = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return ((xf * rstd).to(x.scalar_type()) * w).to(x.scalar_type());
}

void check_swiglu(const at::TensorOptions& opts) {
  const at::Tensor a0 = at::randn({7, 133}, opts);
  const at::Tensor b0 = at::randn({7, 133}, opts);
  const at::Tensor gy = at::randn({7, 133}, opts);

  at::Tensor a = leaf(a0), b = leaf(b0);
  const at::Tensor y = fk::swiglu(a, b);
  (y * gy).sum().backward();

  at::Tensor ra = leaf(a0), rb = leaf(b0);
  const at::Tensor ry = at::silu(ra) * rb;
  (ry * gy).sum().backward();

  check_close("swiglu forward", y, ry, 1e-5, 1e-5);
  check_close("swiglu backward grad_a", a.grad(), ra.grad(), 1e-5, 1e-5);
  check_close("swiglu backward grad_b", b.grad(), rb.grad(), 1e-5, 1e-5);
}

void check_rms_norm(const at::TensorOptions& opts) {
  const double eps = 1e-6;
  const at::Tensor x0 = at::randn({3, 5, 96}, opts);
  const at::Tensor w0 = 1.0 + 0.1 * at::randn({96}, opts);
  const at::Tensor gy = at::randn({3, 5, 96}, opts);

  at::Tensor x = leaf(x0), w = leaf(w0);
  const at::Tensor y = fk::rms_norm(x, w, eps);
  (y * gy).sum().backward();

  at::Tensor rx = leaf(x0), rw = leaf(w0);
  const at::Tensor ry = rms_norm_ref(rx, rw, eps);
  (ry * gy).sum().backward();

  check_close("rms_norm forward", y, ry, 1e-5, 1e-5);
  check_close("rms_norm backward grad_x", x.grad(), rx.grad(), 1e-4, 1e-5);
  check_close("rms_norm backward grad_weight", w.grad(), rw.grad(), 1e-4, 1e-4);
}

// fk::layer_norm is a composite of fk::_layer_norm_forward, which carries the formula: the
// gradients flow through the internal op's Autograd kernel. Only the gradients autograd
// asks for are computed: a frozen bias gets none.
void check_layer_norm(const at::TensorOptions& opts) {
  const double eps = 1e-5;
  const at::Tensor x0 = at::randn({4, 3, 80}, opts);
  const at::Tensor w0 = 1.0 + 0.1 * at::randn({80}, opts);
  const at::Tensor b0 = 0.1 * at::randn({80}, opts);
  const at::Tensor gy = at::randn({4, 3, 80}, opts);

  at::Tensor x = leaf(x0), w = leaf(w0), b = leaf(b0);
  const at::Tensor y = fk::layer_norm(x, w, b, eps);
  (y * gy).sum().backward();

  at::Tensor rx = leaf(x0), rw = leaf(w0), rb = leaf(b0);
  const at::Tensor ry = at::layer_norm(rx, {80}, rw, rb, eps);
  (ry * gy).sum().backward();

  check_close("layer_norm forward", y, ry, 1e-5, 1e-5);
  check_close("layer_norm backward grad_x", x.grad(), rx.grad(), 1e-4, 1e-5);
  check_close("layer_norm backward grad_weight", w.grad(), rw.grad(), 1e-4, 1e-4);
  check_close("layer_norm backward grad_bias", b.grad(), rb.grad(), 1e-4, 1e-4);

  at::Tensor x2 = leaf(x0);
  fk::layer_norm(x2, w0, b0, eps).sum().backward();
  at::Tensor rx2 = leaf(x0);
  at::layer_norm(rx2, {80}, w0, b0, eps).sum().backward();
  check_close("layer_norm backward frozen weight and bias", x2.grad(), rx2.grad(), 1e-4, 1e-5);
}

// A backward of fk's runs once: differentiating a gradient (double backward) raises.
void check_double_backward_raises(const at::TensorOptions& opts) {
  const std::string what = "rms_norm double backward raises";
  at::Tensor x = leaf(at::randn({4, 32}, opts));
  const at::Tensor w = 1.0 + 0.1 * at::randn({32}, opts);
  const at::Tensor y = fk::rms_norm(x, w, 1e-6);
  const auto grads = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, /*retain_graph=*/true,
                                           /*create_graph=*/true);
  try {
    grads[0].sum().backward();
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    if (msg.find("differentiate twice") == std::string::npos) {
      fail(what, "unexpected error: " + msg.substr(0, 300));
    } else {
      std::printf("OK %s\n", what.c_str());
    }
    return;
  }
  fail(what, "the second backward did not raise");
}

// fk::cross_entropy is an Autograd kernel of its own: the forward computes the gradient,
// by default into the logits' memory (grad_in_logits), and the backward scales it.
void check_cross_entropy(const at::TensorOptions& opts) {
  const at::Tensor logits0 = at::randn({6, 50}, opts);
  const at::Tensor target = at::randint(0, 50, {6}, opts.dtype(at::kLong));
  target[2].fill_(-100);  // an ignored row

  at::Tensor logits = leaf(logits0);
  const at::Tensor loss = fk::cross_entropy(logits * 1.0, target, std::nullopt, -100, 0.1);
  loss.backward();

  at::Tensor rlogits = leaf(logits0);
  const at::Tensor rloss = at::cross_entropy_loss(rlogits, target, {}, at::Reduction::Mean,
                                                  -100, 0.1);
  rloss.backward();

  check_close("cross_entropy forward", loss, rloss, 1e-5, 1e-6);
  check_close("cross_entropy backward grad_logits", logits.grad(), rlogits.grad(), 1e-4, 1e-6);
}

// A pre-norm MLP block, a LayerNorm and a classifier head, as one function of its
// parameters, through fk's ops or through plain ATen; returns the loss.
struct TinyModel {
  std::vector<at::Tensor> params;  // norm_w, gate, up, down, ln_w, ln_b, head

  at::Tensor loss(const at::Tensor& x, const at::Tensor& target, bool use_fk) const {
    const at::Tensor &norm_w = params[0], &gate = params[1], &up = params[2],
                     &down = params[3], &ln_w = params[4], &ln_b = params[5], &head = params[6];
    const int64_t hidden = x.size(-1);
    const at::Tensor h = use_fk ? fk::rms_norm(x, norm_w, 1e-6) : rms_norm_ref(x, norm_w, 1e-6);
    const at::Tensor a = at::linear(h, gate), b = at::linear(h, up);
    const at::Tensor g = use_fk ? fk::swiglu(a, b) : at::silu(a) * b;
    const at::Tensor r = x + at::linear(g, down);
    const at::Tensor n = use_fk ? fk::layer_norm(r, ln_w, ln_b, 1e-5)
                                : at::layer_norm(r, {hidden}, ln_w, ln_b, 1e-5);
    const at::Tensor logits = at::linear(n, head);
    return use_fk ? fk::cross_entropy(logits, target) : at::cross_entropy_loss(logits, target);
  }
};

// Trains the same classifier from the same initial weights on the same data twice, through
// fk's ops and through ATen, with torch::optim::Adam; the losses must fall and stay together.
void check_training(const at::TensorOptions& opts) {
  const int64_t hidden = 32, inter = 64, classes = 10, rows = 128, steps = 40;
  const at::Tensor x = at::randn({rows, hidden}, opts);
  const at::Tensor target = at::linear(x, at::randn({classes, hidden}, opts)).argmax(-1);
  const std::vector<at::Tensor> init = {
      1.0 + 0.1 * at::randn({hidden}, opts), at::randn({inter, hidden}, opts) * 0.2,
      at::randn({inter, hidden}, opts) * 0.2, at::randn({hidden, inter}, opts) * 0.1,
      at::ones({hidden}, opts), at::zeros({hidden}, opts),
      at::randn({classes, hidden}, opts) * 0.2};

  auto train = [&](bool use_fk) {
    TinyModel model;
    for (const at::Tensor& p : init) model.params.push_back(leaf(p));
    torch::optim::Adam opt(model.params, torch::optim::AdamOptions(1e-2));
    std::vector<double> losses;
    for (int64_t step = 0; step < steps; ++step) {
      opt.zero_grad();
      const at::Tensor loss = model.loss(x, target, use_fk);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    return losses;
  };
  const std::vector<double> fk_losses = train(true);
  const std::vector<double> ref_losses = train(false);

  std::printf("training loss through fk: %.5f -> %.5f (ATen: %.5f -> %.5f)\n",
              fk_losses.front(), fk_losses.back(), ref_losses.front(), ref_losses.back());
  if (!(fk_losses.back() < 0.5 * fk_losses.front())) {
    fail("training loss falls", "final loss " + std::to_string(fk_losses.back()) +
                                    " is not below half of the first " +
                                    std::to_string(fk_losses.front()));
  } else {
    std::printf("OK training loss falls\n");
  }
  // Rounding differences grow a little step by step (Adam turns tiny gradient differences
  // into different updates): relative to the loss, with a floor once it is near 0.
  double worst = 0.0;
  for (size_t i = 0; i < fk_losses.size(); ++i) {
    worst = std::max(worst, std::abs(fk_losses[i] - ref_losses[i]) / (ref_losses[i] + 1e-2));
  }
  if (!(worst <= 1e-3)) {
    fail("training matches ATen", "relative loss difference " + std::to_string(worst));
  } else {
    std::printf("OK training matches ATen (max relative loss diff %.3e)\n", worst);
  }
}

// Loads the block written by examples/torchscript_export.py, runs it on its stored input and
// compares with (1) the block recomputed here in plain ATen from its parameters and (2) the
// output stored at export time. Then checks the gradients of the input and of every
// parameter through the loaded module.
void check_torchscript(const std::string& path, const at::Device& device) {
  torch::jit::Module block = torch::jit::load(path);
  block.eval();
  block.to(device);

  std::unordered_map<std::string, at::Tensor> p;
  for (const auto& item : block.named_parameters(/*recurse=*/false)) {
    p[item.name] = item.value;
  }
  const std::vector<std::string> names = {"norm_weight", "gate_weight", "up_weight",
                                          "down_weight"};
  for (const std::string& name : names) {
    TORCH_CHECK(p.count(name), "TorchScript module ", path, " has no parameter ", name);
  }
  const double eps = block.attr("eps").toDouble();
  const at::Tensor input = block.attr("example_input").toTensor();
  const at::Tensor stored = block.attr("expected_output").toTensor();

  at::Tensor x = leaf(input);
  const at::Tensor out = block.forward({x}).toTensor();
  out.sum().backward();

  std::unordered_map<std::string, at::Tensor> rp;
  for (const std::string& name : names) rp[name] = leaf(p[name]);
  at::Tensor rx = leaf(input);
  const at::Tensor h = rms_norm_ref(rx, rp["norm_weight"], eps);
  const at::Tensor mlp = at::linear(
      at::silu(at::linear(h, rp["gate_weight"])) * at::linear(h, rp["up_weight"]),
      rp["down_weight"]);
  const at::Tensor ref = rx + mlp;
  ref.sum().backward();

  std::printf("torchscript output shape=%s checksum sum=%.6f abs_sum=%.6f\n",
              c10::str(out.sizes()).c_str(), out.sum().item<double>(),
              out.abs().sum().item<double>());
  check_close("torchscript forward vs C++ reference", out, ref, 1e-4, 1e-5);
  check_close("torchscript forward vs exported output", out, stored, 1e-4, 1e-5);
  check_close("torchscript backward grad_input", x.grad(), rx.grad(), 1e-4, 1e-5);
  for (const std::string& name : names) {
    check_close("torchscript backward grad_" + name, p[name].grad(), rp[name].grad(), 1e-4,
                1e-4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // The autograd formulas of fk's ops (libfk registers none; Python's fk would).
    fk::register_autograd();

    const bool cuda = torch::cuda::is_available();
    const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
    std::printf("fk built for torch %s; running on %s\n", fk::built_torch_version(),
                device.str().c_str());
    at::manual_seed(0);
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);

    check_swiglu(opts);
    check_rms_norm(opts);
    check_layer_norm(opts);
    check_cross_entropy(opts);
    check_double_backward_raises(opts);
    check_training(opts);
    if (argc > 1) {
      check_torchscript(argv[1], device);
    }
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
