// Library-wide pieces of libfk: the operator namespace and a line describing this build.
#include "fk_build_info.h"
#include "runtime/kernels.h"
#include "runtime/tensor.h"

namespace {

std::string build_info() {
  return std::string("fk ") + FK_VERSION + "; torch " + FK_TORCH_VERSION + " (stable ABI " +
         FK_TORCH_TARGET + "); archs " + FK_CUDA_ARCHS + FK_LINE_INFO_NOTE + "; " +
         FK_KERNEL_TOOLCHAIN;
}

// What the kernel picker takes for a CUDA device's peak DRAM bandwidth, GB/s (0: unknown);
// variants tuned for GPUs below kLowBandwidthGBps run where it is lower.
double memory_bandwidth_gbps(int64_t device) {
  return fk::runtime::device_memory_bandwidth_gbps(static_cast<int>(device));
}

}  // namespace

STABLE_TORCH_LIBRARY(fk, m) {
  // A line describing this build: fk version, the torch it was built against and the oldest
  // it runs on, the GPU archs (and whether the cubins keep line info), the Triton and ptxas
  // that compiled the kernels.
  m.def("_build_info() -> str");
  // The peak memory bandwidth (GB/s) the kernel picker uses for a CUDA device index.
  m.def("_memory_bandwidth_gbps(int device) -> float");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("_build_info", TORCH_BOX(&build_info));
  m.impl("_memory_bandwidth_gbps", TORCH_BOX(&memory_bandwidth_gbps));
}
