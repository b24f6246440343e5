# Locates torch (and the CUDA headers it needs) from a Python installation and defines the
# imported targets
#   fk::torch         LibTorch's full C++ API: for programs that use fk from C++ (the
#                     installed fkConfig.cmake), with fk's header-only autograd wrappers;
#   fk::torch_stable  PyTorch's stable C ABI only, targeting torch FK_TORCH_TARGET (2.11):
#                     what libfk itself is built with, so that it loads in any later torch.
# Neither depends on torch's CMake package, whose CUDA toolkit detection fails when the
# toolkit comes from pip.
#
# Inputs (optional): FK_TORCH_ROOT (the torch package directory), Python3_EXECUTABLE.
# Outputs: targets fk::torch and fk::torch_stable, FK_TORCH_ROOT, FK_TORCH_VERSION,
# FK_TORCH_TARGET, FK_CUDA_INCLUDE_DIR.
if(TARGET fk::torch)
  return()
endif()

if(NOT FK_TORCH_ROOT)
  if(NOT Python3_EXECUTABLE)
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])"
    OUTPUT_VARIABLE FK_TORCH_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _fk_rc)
  if(NOT _fk_rc EQUAL 0 OR NOT EXISTS "${FK_TORCH_ROOT}")
    message(FATAL_ERROR "fk: torch not found for ${Python3_EXECUTABLE}; install torch or set FK_TORCH_ROOT")
  endif()
endif()

file(STRINGS "${FK_TORCH_ROOT}/version.py" _fk_ver REGEX "^__version__")
string(REGEX REPLACE "^__version__ = '([^']*)'.*" "\\1" FK_TORCH_VERSION "${_fk_ver}")

# CUDA headers (cuda.h, cuda_runtime.h and its crt/ headers): the pip nvidia packages
# (nvidia-cuda-runtime, which torch depends on, and nvidia-cuda-crt), else a CUDA toolkit.
get_filename_component(_fk_site "${FK_TORCH_ROOT}" DIRECTORY)
set(FK_CUDA_INCLUDE_DIR "")
foreach(_d "${_fk_site}/nvidia/cu13/include" "${_fk_site}/nvidia/cuda_runtime/include")
  if(EXISTS "${_d}/cuda.h" AND EXISTS "${_d}/crt/host_config.h")
    set(FK_CUDA_INCLUDE_DIR "${_d}")
    break()
  endif()
endforeach()
if(NOT FK_CUDA_INCLUDE_DIR)
  find_package(CUDAToolkit REQUIRED)
  set(FK_CUDA_INCLUDE_DIR "${CUDAToolkit_INCLUDE_DIRS}")
endif()

# LibTorch's libraries; a CPU-only torch has no libc10_cuda.
set(_fk_torch_libs "${FK_TORCH_ROOT}/lib/libtorch.so;${FK_TORCH_ROOT}/lib/libtorch_cpu.so;${FK_TORCH_ROOT}/lib/libc10.so")
if(EXISTS "${FK_TORCH_ROOT}/lib/libc10_cuda.so")
  list(APPEND _fk_torch_libs "${FK_TORCH_ROOT}/lib/libc10_cuda.so")
endif()
add_library(fk::torch INTERFACE IMPORTED)
set_target_properties(fk::torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES
    "${FK_TORCH_ROOT}/include;${FK_TORCH_ROOT}/include/torch/csrc/api/include;${FK_CUDA_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1"
  INTERFACE_COMPILE_FEATURES "cxx_std_17"
  INTERFACE_LINK_LIBRARIES "${_fk_torch_libs}"
)
# The stable ABI: torch's headers, TORCH_TARGET_VERSION (torch's version encoding: major << 56
# | minor << 48), and libtorch_cpu.so, which exports the stable C shim. No c10, no
# libtorch_cuda: the CUDA-only shim functions are looked up at run time.
set(FK_TORCH_TARGET "2.11")
add_library(fk::torch_stable INTERFACE IMPORTED)
set_target_properties(fk::torch_stable PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${FK_TORCH_ROOT}/include;${FK_CUDA_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "TORCH_TARGET_VERSION=0x020b000000000000ULL;_GLIBCXX_USE_CXX11_ABI=1"
  INTERFACE_COMPILE_FEATURES "cxx_std_17"
  INTERFACE_LINK_LIBRARIES "${FK_TORCH_ROOT}/lib/libtorch_cpu.so")
message(STATUS "fk: torch ${FK_TORCH_VERSION} at ${FK_TORCH_ROOT}; CUDA headers at ${FK_CUDA_INCLUDE_DIR}")
