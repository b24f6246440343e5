// Library-wide pieces of libfk: the operator namespace and a line describing this build.
#include "fk_build_info.h"
#include "runtime/tensor.h"

namespace {

std::string build_info() {
  return std::string("fk ") + FK_VERSION + "; torch " + FK_TORCH_VERSION + " (stable ABI " +
         FK_TORCH_TARGET + "); archs " + FK_CUDA_ARCHS + FK_LINE_INFO_NOTE + "; " +
         FK_KERNEL_TOOLCHAIN;
}

}  // namespace

STABLE_TORCH_LIBRARY(fk, m) {
  // A line describing this build: fk version, the torch it was built against and the oldest
  // it runs on, the GPU archs (and whether the cubins keep line info), the Triton and ptxas
  // that compiled the kernels.
  m.def("_build_info() -> str");
}

STABLE_TORCH_LIBRARY_IMPL(fk, CompositeImplicitAutograd, m) {
  m.impl("_build_info", TORCH_BOX(&build_info));
}
