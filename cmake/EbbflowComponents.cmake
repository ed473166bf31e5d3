# SPDX-License-Identifier: Apache-2.0
# Optional component targets. Each carries the link dependencies of one
# optional piece; a consumer links the ones it uses:
#   ebbflow::asio  Boost.Asio + OpenSSL (rendezvous store with TLS, etcd client, elastic control plane)
#   ebbflow::ucx   UCX (host collectives)
#   ebbflow::cuda  CUDA runtime (device executors, pinned memory)
#   ebbflow::nccl  NCCL (device collectives)
# EBBFLOW_WITH_<ASIO|UCX|CUDA|NCCL> = AUTO (default: defined when its
# dependency is found, else left out with a line that names the missing
# packages), ON (required: configuring fails without it, naming the Debian
# packages that provide it) or OFF (never defined). Package recipes (Conan
# options, vcpkg features) set these; so does a user who wants a component
# rather than a build without it.
set(EBBFLOW_INSTALL_TARGETS ebbflow)
foreach(_c ASIO UCX CUDA NCCL)
  set(EBBFLOW_WITH_${_c} AUTO CACHE STRING "ebbflow::${_c} component: AUTO, ON (required) or OFF")
  set_property(CACHE EBBFLOW_WITH_${_c} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${EBBFLOW_WITH_${_c}}" _v)
  if(_v MATCHES "^(ON|TRUE|YES|Y|1|REQUIRED)$")
    set(_ebbflow_want_${_c} REQUIRED)
  elseif(_v MATCHES "^(OFF|FALSE|NO|N|0)$")
    set(_ebbflow_want_${_c} "")
  else()
    set(_ebbflow_want_${_c} AUTO)
  endif()
endforeach()
set(EBBFLOW_COMPONENTS "")
# What each component needs, and where Debian 12 / Ubuntu have it (the same
# words in ebbflow-config.cmake.in, for an install used where one is missing).
set(_ebbflow_needs_ASIO "Boost >= 1.74 (headers) and OpenSSL (libcrypto): apt-get install libboost-dev libssl-dev")
set(_ebbflow_needs_UCX "UCX (ucx-config.cmake): apt-get install libucx-dev")
set(_ebbflow_needs_CUDA "the CUDA toolkit: NVIDIA's cuda-toolkit package (Debian non-free: nvidia-cuda-toolkit)")
set(_ebbflow_needs_NCCL "NCCL 2.28 or newer: libnccl-dev from NVIDIA's CUDA repository (NCCL_ROOT may point to it)")

# Called when component C's dependency is missing: an error when it was
# asked for (EBBFLOW_WITH_C=ON), else a line saying what is left out.
function(_ebbflow_missing c)
  string(TOLOWER "${c}" _lc)
  if(_ebbflow_want_${c} STREQUAL "REQUIRED")
    message(FATAL_ERROR "ebbflow: EBBFLOW_WITH_${c}=ON, but the ${_lc} component needs ${_ebbflow_needs_${c}}")
  endif()
  set(_level STATUS)
  if(EBBFLOW_MASTER_PROJECT AND (c STREQUAL "ASIO" OR c STREQUAL "UCX"))
    set(_level WARNING)  # without them: no launcher, no elastic group, no host collectives
  endif()
  message(${_level} "ebbflow: the ${_lc} component is left out: it needs ${_ebbflow_needs_${c}} "
                    "(-DEBBFLOW_WITH_${c}=ON makes this an error, OFF silences it)")
endfunction()

macro(_ebbflow_component name)
  add_library(ebbflow_${name} INTERFACE)
  add_library(ebbflow::${name} ALIAS ebbflow_${name})
  set_target_properties(ebbflow_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(ebbflow_${name} INTERFACE ebbflow)
  list(APPEND EBBFLOW_INSTALL_TARGETS ebbflow_${name})
  list(APPEND EBBFLOW_COMPONENTS ${name})
endmacro()

# QUIET always: a missing dependency is reported by _ebbflow_missing, in
# words that name the packages (and CMAKE_DISABLE_FIND_PACKAGE_<P>, with
# which the tests hide one, refuses a REQUIRED find_package outright).
if(_ebbflow_want_ASIO)
  find_package(Boost 1.74 QUIET CONFIG)
  find_package(OpenSSL QUIET COMPONENTS Crypto SSL)
  if(Boost_FOUND AND OPENSSL_FOUND)
    _ebbflow_component(asio)
    # SSL: TLS for the store and for etcd (elastic/detail/tls.hpp).
    target_link_libraries(ebbflow_asio INTERFACE Boost::headers OpenSSL::SSL OpenSSL::Crypto)
  else()
    _ebbflow_missing(ASIO)
  endif()
endif()

if(_ebbflow_want_UCX)
  find_package(ucx QUIET CONFIG)
  if(ucx_FOUND)
    _ebbflow_component(ucx)
    target_link_libraries(ebbflow_ucx INTERFACE ucx::ucp ucx::ucs)
  else()
    _ebbflow_missing(UCX)
  endif()
endif()

if(_ebbflow_want_NCCL STREQUAL "REQUIRED" AND NOT _ebbflow_want_CUDA)
  message(FATAL_ERROR "ebbflow: EBBFLOW_WITH_NCCL=ON needs the cuda component: EBBFLOW_WITH_CUDA=OFF leaves it out")
endif()
if(_ebbflow_want_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    _ebbflow_component(cuda)
    target_link_libraries(ebbflow_cuda INTERFACE CUDA::cudart)
    if(_ebbflow_want_NCCL)
      find_package(NCCL QUIET)
      if(NCCL_FOUND)
        _ebbflow_component(nccl)
        target_link_libraries(ebbflow_nccl INTERFACE ebbflow_cuda NCCL::nccl)
      else()
        _ebbflow_missing(NCCL)
      endif()
    endif()
  else()
    _ebbflow_missing(CUDA)
    if(_ebbflow_want_NCCL)
      _ebbflow_missing(NCCL)
    endif()
  endif()
endif()

# nvcc for the .cu tests and kernels (not needed by consumers of the headers).
set(EBBFLOW_CUDA_ENABLED OFF)
if(EBBFLOW_ENABLE_CUDA AND CUDAToolkit_FOUND)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # 80 and 90 unless chosen (-DCMAKE_CUDA_ARCHITECTURES, or CMake's CUDAARCHS
    # environment variable, which enable_language reads).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS} AND EBBFLOW_MASTER_PROJECT)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    set(EBBFLOW_CUDA_ENABLED ON)
  endif()
endif()
message(STATUS "ebbflow ${PROJECT_VERSION}: components [${EBBFLOW_COMPONENTS}], nvcc ${EBBFLOW_CUDA_ENABLED}")
