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

# The identifier of header h in property names: "_" becomes "_u" and "/" "_s"
# first, so that distinct paths never share one (MAKE_C_IDENTIFIER alone maps
# comm/nccl/communicator.hpp and comm/nccl_communicator.hpp alike).
function(_ebf_id out h)
  string(REPLACE "_" "_u" x "${h}")
  string(REPLACE "/" "_s" x "${x}")
  string(MAKE_C_IDENTIFIER "${x}" x)
  set(${out} "${x}" PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------- scanning
# For header <h>, sets globals:
#   EBF_CONTENT_<id>  text with `#pragma once` dropped and ebbflow includes
#                     replaced by a marker comment
#   EBF_DEPS_<id>     ebbflow .hpp headers it includes (any depth)
#   EBF_TOPDEPS_<id>  those included at the top level (their needs propagate)
#   EBF_OWN_<id>      backends it needs itself
function(_ebf_scan h)
  _ebf_id(id "${h}")
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

# ---------------------------------------------------------------- needs
foreach(h IN LISTS _headers)
  _ebf_scan("${h}")
endforeach()
# EBF_NEEDS_<id>: own needs plus those of every top-level ebbflow include,
# to a fixed point (a header and its impl/ file include each other).
foreach(h IN LISTS _headers)
  _ebf_id(id "${h}")
  get_property(n GLOBAL PROPERTY EBF_OWN_${id})
  set_property(GLOBAL PROPERTY EBF_NEEDS_${id} "${n}")
endforeach()
set(_changed TRUE)
while(_changed)
  set(_changed FALSE)
  foreach(h IN LISTS _headers)
    _ebf_id(id "${h}")
    get_property(needs GLOBAL PROPERTY EBF_NEEDS_${id})
    get_property(topdeps GLOBAL PROPERTY EBF_TOPDEPS_${id})
    set(all ${needs})
    foreach(dep IN LISTS topdeps)
      _ebf_id(did "${dep}")
      get_property(dn GLOBAL PROPERTY EBF_NEEDS_${did})
      list(APPEND all ${dn})
    endforeach()
    set(sorted "")
    foreach(b IN LISTS _backends)
      if(b IN_LIST all)
        list(APPEND sorted ${b})
      endif()
    endforeach()
    if(NOT "${sorted}" STREQUAL "${needs}")
      set_property(GLOBAL PROPERTY EBF_NEEDS_${id} "${sorted}")
      set(_changed TRUE)
    endif()
  endforeach()
endwhile()

function(_ebf_guard out needs)
  set(terms "")
  foreach(b IN LISTS needs)
    list(APPEND terms "EBBFLOW_HAS_${b}")
  endforeach()
  list(JOIN terms " && " g)
  set(${out} "${g}" PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------- ordering
# A header is inlined where it is first included, as the preprocessor would,
# when it needs the same backends as the includer and is included at top
# level; such a group (e.g. a header and its impl/ file, which include each
# other) shares one guard. Everything else a group includes (headers that
# need fewer backends, or included inside an #if) is emitted before the group,
# under its own guard, so that it is present whenever something needs it.
# EBF_STATE_<id>: "open" while being emitted, "done" after.
set_property(GLOBAL PROPERTY EBF_OUT "")
set_property(GLOBAL PROPERTY EBF_COUNT 0)

# The same-needs, top-level closure of h among headers not yet emitted.
function(_ebf_group out h)
  _ebf_id(id "${h}")
  get_property(needs GLOBAL PROPERTY EBF_NEEDS_${id})
  set(group "${h}")
  set(todo "${h}")
  while(todo)
    list(POP_FRONT todo cur)
    _ebf_id(cid "${cur}")
    get_property(topdeps GLOBAL PROPERTY EBF_TOPDEPS_${cid})
    foreach(dep IN LISTS topdeps)
      _ebf_id(did "${dep}")
      get_property(st GLOBAL PROPERTY EBF_STATE_${did})
      get_property(dn GLOBAL PROPERTY EBF_NEEDS_${did})
      if(NOT st AND "${dn}" STREQUAL "${needs}" AND NOT dep IN_LIST group)
        list(APPEND group "${dep}")
        list(APPEND todo "${dep}")
      endif()
    endforeach()
  endwhile()
  set(${out} "${group}" PARENT_SCOPE)
endfunction()

# Text of h with the group members it includes inlined in place.
function(_ebf_inline out h group)
  _ebf_id(id "${h}")
  set_property(GLOBAL PROPERTY EBF_STATE_${id} open)
  get_property(n GLOBAL PROPERTY EBF_COUNT)
  math(EXPR n "${n} + 1")
  set_property(GLOBAL PROPERTY EBF_COUNT ${n})
  get_property(text GLOBAL PROPERTY EBF_CONTENT_${id})
  get_property(topdeps GLOBAL PROPERTY EBF_TOPDEPS_${id})
  foreach(dep IN LISTS topdeps)
    _ebf_id(did "${dep}")
    get_property(st GLOBAL PROPERTY EBF_STATE_${did})
    if(dep IN_LIST group AND NOT st)
      _ebf_inline(inner "${dep}" "${group}")
      # Replace the whole marker line (it may carry a trailing comment).
      string(FIND "${text}" "// #include <${dep}>  (inlined)" at)
      if(at EQUAL -1)
        message(FATAL_ERROR "amalgamate: lost the include of <${dep}> in <${h}>")
      endif()
      string(SUBSTRING "${text}" 0 ${at} before)
      string(SUBSTRING "${text}" ${at} -1 after)
      string(FIND "${after}" "\n" eol)
      math(EXPR eol "${eol} + 1")
      string(SUBSTRING "${after}" ${eol} -1 after)
      set(text "${before}// #include <${dep}>  (inlined here)\n// ---- begin <${dep}>\n${inner}// ---- end <${dep}>\n${after}")
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY EBF_STATE_${id} done)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(_ebf_emit h)
  _ebf_id(id "${h}")
  get_property(st GLOBAL PROPERTY EBF_STATE_${id})
  if(st)
    return()  # done, or open: an include cycle, already being emitted
  endif()
  _ebf_group(group "${h}")
  # First everything the group needs from outside it.
  foreach(m IN LISTS group)
    _ebf_id(mid "${m}")
    get_property(deps GLOBAL PROPERTY EBF_DEPS_${mid})
    foreach(dep IN LISTS deps)
      if(NOT dep IN_LIST group)
        _ebf_emit("${dep}")
      endif()
    endforeach()
  endforeach()
  get_property(st GLOBAL PROPERTY EBF_STATE_${id})
  if(st)
    return()
  endif()
  # Members emitted meanwhile (through another path) are not inlined again.
  set(left "")
  foreach(m IN LISTS group)
    _ebf_id(mid "${m}")
    get_property(mst GLOBAL PROPERTY EBF_STATE_${mid})
    if(NOT mst)
      list(APPEND left "${m}")
    endif()
  endforeach()
  _ebf_inline(text "${h}" "${left}")
  get_property(needs GLOBAL PROPERTY EBF_NEEDS_${id})
  string(LENGTH "${h}" l)
  math(EXPR pad "60 - ${l}")
  set(bar "")
  if(pad GREATER 0)
    string(REPEAT "=" ${pad} bar)
  endif()
  set(block "\n// ==== begin <${h}> ${bar}\n")
  if(needs)
    _ebf_guard(g "${needs}")
    string(APPEND block "#if ${g}\n${text}#endif  // ${g}\n")
  else()
    string(APPEND block "${text}")
  endif()
  string(APPEND block "// ==== end <${h}>\n")
  set_property(GLOBAL APPEND_STRING PROPERTY EBF_OUT "${block}")
endfunction()

# Roots: config.hpp, then public headers, then detail/ and impl/ ones (which
# thus mostly get inlined where their public header includes them).
set(_roots "ebbflow/config.hpp")
set(_private "")
foreach(h IN LISTS _headers)
  if(h MATCHES "/(detail|impl)/")
    list(APPEND _private "${h}")
  else()
    list(APPEND _roots "${h}")
  endif()
endforeach()
foreach(h IN LISTS _roots _private)
  _ebf_emit("${h}")
endforeach()
get_property(_body GLOBAL PROPERTY EBF_OUT)
get_property(_emitted GLOBAL PROPERTY EBF_COUNT)

file(STRINGS "${_inc}/ebbflow/version.hpp" _ver REGEX "#define EBBFLOW_VERSION_STRING")
string(REGEX MATCH "\"([^\"]*)\"" _m "${_ver}")
set(_version "${CMAKE_MATCH_1}")
list(LENGTH _headers _count)
if(NOT _emitted EQUAL _count)
  message(FATAL_ERROR "amalgamate: emitted ${_emitted} of ${_count} headers")
endif()

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
${_body}
#endif  // EBBFLOW_SINGLE_INCLUDE_HPP
")

# ---------------------------------------------------------------- umbrella
set(umbrella "// SPDX-License-Identifier: Apache-2.0
//! @file ebbflow.hpp
//! Umbrella header: every public ebbflow header whose dependencies are on the
//! include path (optional backends behind their EBBFLOW_HAS_* guards, see
//! config.hpp). Including a piece's own headers compiles faster.
//! prefetch/cuda_stage.hpp is included in every build but needs CUDA:
//! `prefetch::cuda_stage` and `cuda_host_allocator()` exist only when
//! EBBFLOW_HAS_CUDA is 1 (CUDA headers present, no EBBFLOW_NO_CUDA).
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
  _ebf_id(id "${h}")
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
