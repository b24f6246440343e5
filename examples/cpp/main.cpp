// A LibTorch program using fk from C++: the C++ API (fk::swiglu, fk::rms_norm) and a
// TorchScript module whose graph calls torch.ops.fk.* (see examples/torchscript_export.py).
//
//   fk_example                 check fk::swiglu / fk::rms_norm forward and backward
//   fk_example block.pt        also load the TorchScript block, run it and check it
//
// Every result is compared with a plain ATen reference computed here. Prints one "OK" line
// per check; exits non-zero on any mismatch or error.
#include <fk/fk.h>

#include <torch/cuda.h>
#include <torch/script.h>

#include <cstdio>
#include <string>
#include <unordered_map>

namespace {

int g_failures = 0;

bool check_close(const std::string& what, const at::Tensor& got, const at::Tensor& want,
                 double rtol, double atol) {
  const at::Tensor g = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor w = want.detach().to(at::kCPU, at::kDouble);
  if (g.sizes() != w.sizes()) {
    std::printf("FAIL %s: shape %s, expected %s\n", what.c_str(),
                c10::str(g.sizes()).c_str(), c10::str(w.sizes()).c_str());
    ++g_failures;
    return false;
  }
  const double max_diff = g.numel() ? (g - w).abs().max().item<double>() : 0.0;
  if (!at::allclose(g, w, rtol, atol)) {
    std::printf("FAIL %s: max abs diff %.3e (rtol %.1e, atol %.1e)\n", what.c_str(), max_diff,
                rtol, atol);
    ++g_failures;
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

// Loads the block written by examples/torchscript_export.py, runs it on its stored input and
// compares with (1) the block recomputed here in plain ATen from its parameters and (2) the
// output stored at export time. Then checks the input gradient through the loaded module.
void check_torchscript(const std::string& path, const at::Device& device) {
  torch::jit::Module block = torch::jit::load(path);
  block.eval();
  block.to(device);

  std::unordered_map<std::string, at::Tensor> p;
  for (const auto& item : block.named_parameters(/*recurse=*/false)) {
    p[item.name] = item.value.detach();
  }
  for (const char* name : {"norm_weight", "gate_weight", "up_weight", "down_weight"}) {
    TORCH_CHECK(p.count(name), "TorchScript module ", path, " has no parameter ", name);
  }
  const double eps = block.attr("eps").toDouble();
  const at::Tensor input = block.attr("example_input").toTensor();
  const at::Tensor stored = block.attr("expected_output").toTensor();

  at::Tensor x = leaf(input);
  const at::Tensor out = block.forward({x}).toTensor();
  out.sum().backward();

  at::Tensor rx = leaf(input);
  const at::Tensor h = rms_norm_ref(rx, p["norm_weight"], eps);
  const at::Tensor mlp = at::linear(
      at::silu(at::linear(h, p["gate_weight"])) * at::linear(h, p["up_weight"]),
      p["down_weight"]);
  const at::Tensor ref = rx + mlp;
  ref.sum().backward();

  std::printf("torchscript output shape=%s checksum sum=%.6f abs_sum=%.6f\n",
              c10::str(out.sizes()).c_str(), out.sum().item<double>(),
              out.abs().sum().item<double>());
  check_close("torchscript forward vs C++ reference", out, ref, 1e-4, 1e-5);
  check_close("torchscript forward vs exported output", out, stored, 1e-4, 1e-5);
  check_close("torchscript backward grad_input", x.grad(), rx.grad(), 1e-4, 1e-5);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const bool cuda = torch::cuda::is_available();
    const at::Device device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
    std::printf("fk built for torch %s; running on %s\n", fk::built_torch_version(),
                device.str().c_str());
    at::manual_seed(0);
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);

    check_swiglu(opts);
    check_rms_norm(opts);
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
