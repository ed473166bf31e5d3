# SPDX-License-Identifier: Apache-2.0
# Finds NCCL, which ships no CMake package. Looks beside the CUDA toolkit and
# in the usual prefixes; NCCL_ROOT or NCCL_HOME may point elsewhere.
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the
# imported target NCCL::nccl.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT}
    ${CUDAToolkit_TARGET_DIR} /usr/local/cuda /usr/local)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_v REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX MATCH "NCCL_MAJOR ([0-9]+)" _m "${_nccl_v}")
  set(_maj ${CMAKE_MATCH_1})
  string(REGEX MATCH "NCCL_MINOR ([0-9]+)" _m "${_nccl_v}")
  set(_min ${CMAKE_MATCH_1})
  string(REGEX MATCH "NCCL_PATCH ([0-9]+)" _m "${_nccl_v}")
  set(NCCL_VERSION "${_maj}.${_min}.${CMAKE_MATCH_1}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
