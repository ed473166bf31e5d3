# SPDX-License-Identifier: Apache-2.0
# Checks that ebbflow, pulled in as a subproject (FetchContent or
# add_subdirectory), left the consuming project's global state alone and
# gives what a consumer links.
#   ebbflow_snapshot_globals()  before pulling ebbflow in
#   ebbflow_check_subproject()  after: checks the globals and the component
#                               targets, and builds the consumer programs
include(${CMAKE_CURRENT_LIST_DIR}/programs.cmake)
set(_ebbflow_watched CMAKE_CXX_FLAGS CMAKE_CXX_STANDARD CMAKE_CXX_EXTENSIONS CMAKE_MODULE_PATH
    CMAKE_CUDA_ARCHITECTURES CMAKE_POSITION_INDEPENDENT_CODE CMAKE_EXE_LINKER_FLAGS)
macro(ebbflow_snapshot_globals)
  foreach(v IN LISTS _ebbflow_watched)
    set(_before_${v} "${${v}}")
    set(_before_defined_${v} FALSE)
    if(DEFINED ${v})
      set(_before_defined_${v} TRUE)
    endif()
  endforeach()
  foreach(p INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS LINK_OPTIONS)
    get_directory_property(_before_dir_${p} ${p})
  endforeach()
endmacro()
macro(ebbflow_check_globals)
  foreach(v IN LISTS _ebbflow_watched)
    set(_now_defined FALSE)
    if(DEFINED ${v})
      set(_now_defined TRUE)
    endif()
    if(NOT "${${v}}" STREQUAL "${_before_${v}}" OR NOT _now_defined STREQUAL _before_defined_${v})
      message(FATAL_ERROR "ebbflow as a subproject changed ${v}: '${_before_${v}}' -> '${${v}}'")
    endif()
  endforeach()
  foreach(p INCLUDE_DIRECTORIES COMPILE_DEFINITIONS COMPILE_OPTIONS LINK_OPTIONS)
    get_directory_property(_now ${p})
    if(NOT "${_now}" STREQUAL "${_before_dir_${p}}")
      message(FATAL_ERROR "ebbflow as a subproject changed the directory property ${p}: ${_now}")
    endif()
  endforeach()
  if(DEFINED CACHE{BUILD_TESTING})
    message(FATAL_ERROR "ebbflow as a subproject defined BUILD_TESTING; that is the top-level project's option")
  endif()
  if(EBBFLOW_BUILD_TESTS OR EBBFLOW_BUILD_BENCH OR EBBFLOW_BUILD_EXAMPLES OR EBBFLOW_INSTALL)
    message(FATAL_ERROR "ebbflow as a subproject defaulted tests/benchmarks/examples/install to ON")
  endif()
  # ucx is a hard requirement here: these tests run where UCX is, so the
  # subproject must have found it.
  ebbflow_require_targets("the subproject did not find its dependencies" ebbflow::ebbflow ebbflow::asio ebbflow::ucx)
endmacro()
macro(ebbflow_check_subproject)
  ebbflow_check_globals()
  ebbflow_consumer_programs(CORE ebbflow::ebbflow ASIO ebbflow::asio UCX ebbflow::ucx)
endmacro()
