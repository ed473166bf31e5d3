# SPDX-License-Identifier: Apache-2.0
# Generates the single-include header and the umbrella header from
# include/ebbflow/. Needs only CMake (no Python):
#
#   cmake -P cmake/amalgamate.cmake              # rewrite the committed files
#   cmake -DCHECK=ON -P cmake/amalgamate.cmake   # fail when they are stale (CI)
#   cmake -DSINGLE_OUT=<file> -DUMBRELLA_OUT=<file> -P cmake/amalgamate.cmake
#
# Outputs (defaults):
#   single_include/ebbflow/ebbflow.hpp  every .hpp under include/ebbflow (detail/
#       and impl/ included, .cuh excluded), each inlined once in dependency
#       order; system and third-party includes are kept. A header that needs an
#       optional backend sits behind its EBBFLOW_HAS_* guard.
#   include/ebbflow/ebbflow.hpp         umbrella: #includes every public header
#       (not detail/, impl/ or .cuh) behind the same guards.
#
# Which backend a header needs is worked out from the header itself, so new
# headers are picked up without editing this script:
#   * the path: comm/ucx/ or ucx_*.hpp -> UCX, comm/nccl/ or nccl_*.hpp -> NCCL;
#   * third-party includes at the top level of the file (not inside #if):
#       <ucp/...> <ucs/...> <uct/...>                   -> UCX
#       <boost/...> <openssl/...>                       -> ASIO
#       <cuda*.h> <cuda/...> <cub/...> <thrust/...>     -> CUDA
#       <nccl*.h>                                       -> NCCL
#   * everything a header includes at top level from ebbflow (transitively).
# The guard of a header is `EBBFLOW_HAS_X && ...` over what it needs
# (config.hpp defines the EBBFLOW_HAS_* macros and is always emitted first).
cmake_minimum_required(VERSION 3.21)

if(NOT DEFINED SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
endif()
set(_inc "${SOURCE_DIR}/include")
if(NOT DEFINED SINGLE_OUT)
  set(SINGLE_OUT "${SOURCE_DIR}/single_include/ebbflow/ebbflow.hpp")
endif()
if(NOT DEFINED UMBRELLA_OUT)
  set(UMBRELLA_OUT "${_inc}/ebbflow/ebbflow.hpp")
endif()
set(_backends ASIO UCX CUDA NCCL)  # fixed order of the terms in a guard

file(GLOB_RECURSE _headers RELATIVE "${_inc}" "${_inc}/ebbflow/*.hpp")
list(REMOVE_ITEM _headers "ebbflow/ebbflow.hpp")
list(SORT _headers)
if(NOT "ebbflow/config.hpp" IN_LIST _headers)
  message(FATAL_ERROR "amalgamate: ${_inc}/ebbflow/config.hpp not found")
endif()

# ---------------------------------------------------------------- scanning
# For header <h>, sets globals:
#   EBF_CONTENT_<id>  text with `#pragma once` dropped and ebbflow includes
#                     replaced by a marker comment
#   EBF_DEPS_<id>     ebbflow .hpp headers it includes (any depth)
#   EBF_TOPDEPS_<id>  those included at the top level (their needs propagate)
#   EBF_OWN_<id>      backends it needs itself
function(_ebf_scan h)
  string(MAKE_C_IDENTIFIER "${h}" id)
  file(READ "${_inc}/${h}" text)
  set(own "")
  if(h MATCHES "/ucx/|/ucx_[^/]*$")
    list(APPEND own UCX)
  endif()
  if(h MATCHES "/nccl/|/nccl_[^/]*$")
    list(APPEND own NCCL)
  endif()
  # Directive lines only; C++ text (semicolons, brackets, backslashes) must not
  # reach CMake's list handling, so neutralise those characters in this copy.
  string(REPLACE "\\" "" scan "\n${text}")
  string(REPLACE ";" "," scan "${scan}")
  string(REPLACE "[" "(" scan "${scan}")
  string(REPLACE "]" ")" scan "${scan}")
  string(REGEX MATCHALL "\n[ \t]*#[ \t]*(if|ifdef|ifndef|endif|include)[^\n]*" directives "${scan}")
  set(depth 0)
  set(deps "")
  set(topdeps "")
  foreach(d IN LISTS directives)
    string(STRIP "${d}" d)
    if(d MATCHES "^#[ \t]*(if|ifdef|ifndef)([ \t(]|$)")
      math(EXPR depth "${depth} + 1")
    elseif(d MATCHES "^#[ \t]*endif")
      math(EXPR depth "${depth} - 1")
    elseif(d MATCHES "^#[ \t]*include[ \t]*\"(ebbflow/[^\"]*)\"")
      message(FATAL_ERROR "amalgamate: ${h}: write #include <${CMAKE_MATCH_1}>, not quotes")
    elseif(d MATCHES "^#[ \t]*include[ \t]*<(ebbflow/[^>]*\\.hpp)>")
      set(dep "${CMAKE_MATCH_1}")
      if(NOT EXISTS "${_inc}/${dep}")
        message(FATAL_ERROR "amalgamate: ${h} includes <${dep}>, which does not exist")
      endif()
      list(APPEND deps "${dep}")
      if(depth EQUAL 0)
        list(APPEND topdeps "${dep}")
      endif()
    elseif(depth EQUAL 0 AND d MATCHES "^#[ \t]*include[ \t]*<([^>]*)>")
      set(inc "${CMAKE_MATCH_1}")
      if(inc MATCHES "^(ucp|ucs|uct)/")
        list(APPEND own UCX)
      elseif(inc MATCHES "^(boost|openssl)/")
        list(APPEND own ASIO)
      elseif(inc MATCHES "^nccl[^/]*\\.h$")
        list(APPEND own NCCL)
      elseif(inc MATCHES "^(cuda[^/]*\\.h|cuda/|cub/|thrust/)")
        list(APPEND own CUDA)
      endif()
    endif()
  endforeach()
  # Drop `#pragma once` and turn ebbflow .hpp includes into markers.
  string(REGEX REPLACE "(^|\n)[ \t]*#[ \t]*pragma[ \t]+once[^\n]*" "\\1" text "${text}")
  string(REGEX REPLACE "(^|\n)([ \t]*)#[ \t]*include[ \t]*<(ebbflow/[^>]*\\.hpp)>" "\\1\\2// #include <\\3>  (inlined)" text "${text}")
  if(NOT text MATCHES "\n$")
    string(APPEND text "\n")
  endif()
  set_property(GLOBAL PROPERTY EBF_CONTENT_${id} "${text}")
  set_property(GLOBAL PROPERTY EBF_DEPS_${id} "${deps}")
  set_property(GLOBAL PROPERTY EBF_TOPDEPS_${id} "${topdeps}")
  set_property(GLOBAL PROPERTY EBF_OWN_${id} "${own}")
endfunction()

# ---------------------------------------------------------------- ordering
# Depth-first, dependencies first; EBF_ORDER gets each header once and
# EBF_NEEDS_<id> the backends it needs, transitively over top-level includes.
set_property(GLOBAL PROPERTY EBF_ORDER "")
function(_ebf_visit h chain)
  string(MAKE_C_IDENTIFIER "${h}" id)
  get_property(state GLOBAL PROPERTY EBF_STATE_${id})
  if(state STREQUAL "done")
    return()
  elseif(state STREQUAL "visiting")
    message(FATAL_ERROR "amalgamate: include cycle: ${chain} -> ${h}")
  endif()
  set_property(GLOBAL PROPERTY EBF_STATE_${id} visiting)
  _ebf_scan("${h}")
  get_property(deps GLOBAL PROPERTY EBF_DEPS_${id})
  get_property(topdeps GLOBAL PROPERTY EBF_TOPDEPS_${id})
  get_property(needs GLOBAL PROPERTY EBF_OWN_${id})
  foreach(dep IN LISTS deps)
    _ebf_visit("${dep}" "${chain} -> ${h}")
  endforeach()
  foreach(dep IN LISTS topdeps)
    string(MAKE_C_IDENTIFIER "${dep}" did)
    get_property(dn GLOBAL PROPERTY EBF_NEEDS_${did})
    list(APPEND needs ${dn})
  endforeach()
  set(sorted "")
  foreach(b IN LISTS _backends)
    if(b IN_LIST needs)
      list(APPEND sorted ${b})
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY EBF_NEEDS_${id} "${sorted}")
  set_property(GLOBAL PROPERTY EBF_STATE_${id} done)
  set_property(GLOBAL APPEND PROPERTY EBF_ORDER "${h}")
endfunction()

_ebf_visit("ebbflow/config.hpp" "")
foreach(h IN LISTS _headers)
  _ebf_visit("${h}" "")
endforeach()
get_property(_order GLOBAL PROPERTY EBF_ORDER)

function(_ebf_guard out needs)
  set(terms "")
  foreach(b IN LISTS needs)
    list(APPEND terms "EBBFLOW_HAS_${b}")
  endforeach()
  list(JOIN terms " && " g)
  set(${out} "${g}" PARENT_SCOPE)
endfunction()

file(STRINGS "${_inc}/ebbflow/version.hpp" _ver REGEX "#define EBBFLOW_VERSION_STRING")
string(REGEX MATCH "\"([^\"]*)\"" _m "${_ver}")
set(_version "${CMAKE_MATCH_1}")
list(LENGTH _order _count)

# ---------------------------------------------------------------- single include
set(single "// SPDX-License-Identifier: Apache-2.0
// ebbflow ${_version}: single-include header.
//
// GENERATED FILE, DO NOT EDIT. Made by cmake/amalgamate.cmake from the
// ${_count} headers under include/ebbflow/ (regenerate: cmake -P cmake/amalgamate.cmake).
// Each ebbflow header appears once, in dependency order. Headers that need an
// optional backend are compiled only when its headers are on the include path
// (EBBFLOW_HAS_ASIO / _UCX / _CUDA / _NCCL, see config.hpp); define
// EBBFLOW_NO_ASIO / _UCX / _CUDA / _NCCL to leave one out. Link the backend's
// libraries yourself (e.g. -lucp -lucs, -lcrypto, -lcudart, -lnccl) and -pthread.
#ifndef EBBFLOW_SINGLE_INCLUDE_HPP
#define EBBFLOW_SINGLE_INCLUDE_HPP
//! Defined when ebbflow comes from the single-include header.
#define EBBFLOW_SINGLE_INCLUDE 1
")
foreach(h IN LISTS _order)
  string(MAKE_C_IDENTIFIER "${h}" id)
  get_property(text GLOBAL PROPERTY EBF_CONTENT_${id})
  get_property(needs GLOBAL PROPERTY EBF_NEEDS_${id})
  string(APPEND single "\n// ==== begin <${h}> ")
  string(LENGTH "${h}" _l)
  math(EXPR _pad "60 - ${_l}")
  if(_pad GREATER 0)
    string(REPEAT "=" ${_pad} _bar)
    string(APPEND single "${_bar}")
  endif()
  string(APPEND single "\n")
  if(needs)
    _ebf_guard(g "${needs}")
    string(APPEND single "#if ${g}\n${text}#endif  // ${g}\n")
  else()
    string(APPEND single "${text}")
  endif()
  string(APPEND single "// ==== end <${h}>\n")
endforeach()
string(APPEND single "\n#endif  // EBBFLOW_SINGLE_INCLUDE_HPP\n")

# ---------------------------------------------------------------- umbrella
set(umbrella "// SPDX-License-Identifier: Apache-2.0
//! @file ebbflow.hpp
//! Umbrella header: every public ebbflow header whose dependencies are on the
//! include path (optional backends behind their EBBFLOW_HAS_* guards, see
//! config.hpp). Including a piece's own headers compiles faster.
// GENERATED FILE, DO NOT EDIT: cmake/amalgamate.cmake writes it from the
// headers present (regenerate: cmake -P cmake/amalgamate.cmake).
#pragma once

#include <ebbflow/config.hpp>
")
set(_public "")
foreach(h IN LISTS _headers)
  if(NOT h MATCHES "/(detail|impl)/" AND NOT h STREQUAL "ebbflow/config.hpp")
    list(APPEND _public "${h}")
  endif()
endforeach()
# Group by guard, unguarded first, then in the fixed backend order.
set(_groups "")
foreach(h IN LISTS _public)
  string(MAKE_C_IDENTIFIER "${h}" id)
  get_property(needs GLOBAL PROPERTY EBF_NEEDS_${id})
  _ebf_guard(g "${needs}")
  if(g STREQUAL "")
    set(gid "0")  # sorts before the guarded groups
  else()
    string(MAKE_C_IDENTIFIER "1${g}" gid)
  endif()
  if(NOT gid IN_LIST _groups)
    list(APPEND _groups ${gid})
    set(_gname_${gid} "${g}")
  endif()
  list(APPEND _gmembers_${gid} "${h}")
endforeach()
list(SORT _groups)
foreach(gid IN LISTS _groups)
  set(g "${_gname_${gid}}")
  string(APPEND umbrella "\n")
  if(g)
    string(APPEND umbrella "#if ${g}\n")
  endif()
  foreach(h IN LISTS _gmembers_${gid})
    string(APPEND umbrella "#include <${h}>\n")
  endforeach()
  if(g)
    string(APPEND umbrella "#endif  // ${g}\n")
  endif()
endforeach()

# ---------------------------------------------------------------- write / check
set(_stale "")
foreach(pair "SINGLE_OUT;single" "UMBRELLA_OUT;umbrella")
  list(GET pair 0 var)
  list(GET pair 1 txt)
  set(path "${${var}}")
  if(CHECK)
    set(old "")
    if(EXISTS "${path}")
      file(READ "${path}" old)
    endif()
    if(NOT old STREQUAL "${${txt}}")
      list(APPEND _stale "${path}")
    endif()
  else()
    file(WRITE "${path}.tmp" "${${txt}}")
    file(COPY_FILE "${path}.tmp" "${path}" ONLY_IF_DIFFERENT)
    file(REMOVE "${path}.tmp")
  endif()
endforeach()
if(_stale)
  list(JOIN _stale "\n  " _s)
  message(FATAL_ERROR "amalgamate: stale generated header(s):\n  ${_s}\n"
          "Regenerate them from the repository root with: cmake -P cmake/amalgamate.cmake")
endif()
if(NOT CHECK)
  message(STATUS "amalgamate: ${_count} headers -> ${SINGLE_OUT}, ${UMBRELLA_OUT}")
endif()
