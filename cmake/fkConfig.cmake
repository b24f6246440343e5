# CMake package config of fk, installed inside the Python package:
#   cmake -DCMAKE_PREFIX_PATH="$(python -c 'import fk; print(fk.cmake_prefix_path)')" ...
#   find_package(fk REQUIRED)
#   target_link_libraries(app PRIVATE fk::fk)
# fk::fk brings libfk (which registers torch.ops.fk.*), fk's headers (the C++ API
# <fk/fk.h> and the autograd formulas <fk/autograd.h>, compiled in the program), and torch
# (LibTorch's full C++ API from the torch package next to fk, or FK_TORCH_ROOT), with the C++
# standard that torch's headers require (C++17 up to torch 2.13, C++20 from torch 2.14 on).
get_filename_component(_fk_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT FK_TORCH_ROOT)
  get_filename_component(_fk_site "${_fk_prefix}" DIRECTORY)
  if(EXISTS "${_fk_site}/torch/version.py")
    set(FK_TORCH_ROOT "${_fk_site}/torch")
  endif()
endif()
include("${CMAKE_CURRENT_LIST_DIR}/FkTorch.cmake")

# The C++ standard LibTorch's full API needs, as ATen/ATen.h checks it.
set(_fk_cxx_std cxx_std_17)
file(STRINGS "${FK_TORCH_ROOT}/include/ATen/ATen.h" _fk_aten_std REGEX "__cplusplus < 202002L")
if(_fk_aten_std)
  set(_fk_cxx_std cxx_std_20)
endif()

if(NOT TARGET fk::fk)
  add_library(fk::fk SHARED IMPORTED)
  set_target_properties(fk::fk PROPERTIES
    IMPORTED_LOCATION "${_fk_prefix}/lib/libfk.so"
    IMPORTED_NO_SONAME FALSE
    INTERFACE_INCLUDE_DIRECTORIES "${_fk_prefix}/include"
    INTERFACE_LINK_LIBRARIES fk::torch
    INTERFACE_COMPILE_FEATURES "${_fk_cxx_std}"
    # libfk registers its operators when loaded; keep it linked even where the program
    # calls none of its functions (e.g. only runs TorchScript that uses torch.ops.fk.*).
    INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed")
endif()
set(fk_FOUND TRUE)
