# The Triton that compiles fk's kernels ahead of time (cmake/fk_aot.py), kept apart from the build
# environment. libfk carries cubins and never imports Triton, so this Triton is a build choice of
# its own, not the one torch pins: requirements-triton.txt names it, the build installs that wheel
# with `pip install --no-deps --target` into a folder of its own (cached across builds in
# FK_TRITON_CACHE) and runs the compiler with that folder first on PYTHONPATH.
#
# Inputs: Python3_EXECUTABLE, FK_TRITON_VERSION (empty: requirements-triton.txt's pin),
# FK_TRITON_PATH (a folder holding a triton package to use as it is), FK_TRITON_CACHE,
# FK_CUDA_ARCHS.
# Outputs: FK_TRITON_DIR (the folder put on PYTHONPATH), FK_TRITON_PYTHON (the command running a
# script with that Triton), FK_TRITON_STAMP (a file of that Triton: the kernels depend on it),
# FK_TRITON_BUILT_VERSION ("3.9.0"), FK_PTXAS ("12.9.86 (sm80), 13.4.59 (sm90)": the ptxas that
# assembles each arch's cubins; Triton bundles ptxas and picks it by arch) and
# FK_KERNEL_TOOLCHAIN ("triton <version>; ptxas <FK_PTXAS>").
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             "${CMAKE_SOURCE_DIR}/requirements-triton.txt")
file(STRINGS "${CMAKE_SOURCE_DIR}/requirements-triton.txt" _fk_pin REGEX "^triton==")
string(REGEX REPLACE "^triton==([^ #]+).*" "\\1" _fk_pin "${_fk_pin}")
set(_fk_triton_version "${FK_TRITON_VERSION}")
if(NOT _fk_triton_version)
  set(_fk_triton_version "${_fk_pin}")
endif()

if(FK_TRITON_PATH)
  get_filename_component(FK_TRITON_DIR "${FK_TRITON_PATH}" ABSOLUTE)
  if(NOT EXISTS "${FK_TRITON_DIR}/triton/__init__.py")
    message(FATAL_ERROR "fk: FK_TRITON_PATH=${FK_TRITON_PATH} holds no triton package "
                        "(no triton/__init__.py)")
  endif()
else()
  set(_fk_root "${FK_TRITON_CACHE}")
  if(NOT _fk_root)
    set(_fk_root "${CMAKE_BINARY_DIR}")
  endif()
  # The wheel is specific to the Python version: one folder per (Triton, Python).
  set(FK_TRITON_DIR
      "${_fk_root}/triton-${_fk_triton_version}-py${Python3_VERSION_MAJOR}${Python3_VERSION_MINOR}")
  if(NOT EXISTS "${FK_TRITON_DIR}/triton-${_fk_triton_version}.dist-info/RECORD")
    message(STATUS "fk: installing triton==${_fk_triton_version} into ${FK_TRITON_DIR}")
    string(RANDOM LENGTH 8 _fk_tag)
    set(_fk_tmp "${FK_TRITON_DIR}.tmp-${_fk_tag}")
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -m pip install --quiet --no-deps --disable-pip-version-check
              --target "${_fk_tmp}" "triton==${_fk_triton_version}"
      RESULT_VARIABLE _fk_rc)
    if(NOT _fk_rc EQUAL 0)
      file(REMOVE_RECURSE "${_fk_tmp}")
      message(FATAL_ERROR "fk: `${Python3_EXECUTABLE} -m pip install --no-deps --target ... "
                          "triton==${_fk_triton_version}` failed. Set FK_TRITON_PATH to a folder "
                          "holding a triton package (e.g. one made with pip install --target).")
    endif()
    # Installed whole or not at all: another build never sees a half-written folder (and where
    # one installed it meanwhile, that copy stays).
    if(EXISTS "${FK_TRITON_DIR}/triton-${_fk_triton_version}.dist-info/RECORD")
      file(REMOVE_RECURSE "${_fk_tmp}")
    else()
      file(REMOVE_RECURSE "${FK_TRITON_DIR}")
      file(RENAME "${_fk_tmp}" "${FK_TRITON_DIR}")
    endif()
  endif()
endif()

set(FK_TRITON_STAMP "${FK_TRITON_DIR}/triton/__init__.py")
set(FK_TRITON_PYTHON "${CMAKE_COMMAND}" -E env "PYTHONPATH=${FK_TRITON_DIR}"
    "${Python3_EXECUTABLE}")
execute_process(
  COMMAND ${FK_TRITON_PYTHON} "${CMAKE_SOURCE_DIR}/cmake/fk_aot.py" --describe
          --archs "${FK_CUDA_ARCHS}"
  OUTPUT_VARIABLE FK_KERNEL_TOOLCHAIN ERROR_VARIABLE _fk_err RESULT_VARIABLE _fk_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _fk_rc EQUAL 0 OR NOT FK_KERNEL_TOOLCHAIN MATCHES "^triton ([^;]+); ptxas (.+)$")
  message(FATAL_ERROR "fk: the Triton in ${FK_TRITON_DIR} does not run:\n${_fk_err}")
endif()
set(FK_TRITON_BUILT_VERSION "${CMAKE_MATCH_1}")
set(FK_PTXAS "${CMAKE_MATCH_2}")
if(NOT FK_TRITON_PATH AND NOT FK_TRITON_BUILT_VERSION STREQUAL _fk_triton_version)
  message(FATAL_ERROR "fk: ${FK_TRITON_DIR} holds triton ${FK_TRITON_BUILT_VERSION}, not "
                      "${_fk_triton_version}: remove it")
endif()
message(STATUS "fk: kernels compiled with ${FK_KERNEL_TOOLCHAIN} from ${FK_TRITON_DIR}")
