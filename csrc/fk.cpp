// Library-wide pieces of libfk: build information.
#include <torch/library.h>

#include "fk/fk.h"
#include "fk_build_info.h"

const char* fk::built_torch_version() { return FK_TORCH_VERSION; }

namespace {

std::string build_info() {
  return std::string("fk ") + FK_VERSION + "; torch " + FK_TORCH_VERSION + "; archs " +
         FK_CUDA_ARCHS;
}

}  // namespace

TORCH_LIBRARY(fk, m) {
  // A line describing this build: fk version, the torch it was built for, the GPU archs.
  m.def("_build_info() -> str", [] { return build_info(); });
}
