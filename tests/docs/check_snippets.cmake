# SPDX-License-Identifier: Apache-2.0
# The docs quote their code from files that the tests compile: this checks
# that every quote still equals the file's text (cmake -P, no build needed).
#
#   cmake -DSOURCE_DIR=<tree> -P tests/docs/check_snippets.cmake
#
# A snippet file (docs/snippets/*.cpp) marks regions with a line `// [name]`
# before and after them. A quote is a fenced block right after a marker line:
#
#   Markdown (README.md, docs/**/*.md):   <!-- snippet: docs/snippets/f.cpp#name -->
#                                         ```cpp ... ```
#   a doc comment (include/**/*.hpp):     //! <!-- snippet: docs/snippets/f.cpp#name -->
#                                         //! @code ... //! @endcode
#
# The quote must equal the region, both taken without their common
# indentation (a region inside a function body is quoted from column 0).
# Also checked: every region is quoted somewhere (a snippet nobody shows
# rots); a ```cpp block in the Markdown that calls `begin_step(` is a quote
# (a training loop written by hand would drift from the one the tests run);
# and each file in LOOP_USERS (;-separated, relative to SOURCE_DIR) holds the
# loop head of LOOP (default docs/snippets/training_loop.cpp#loop), the line
# that calls `keep_training`, verbatim.
#
# Each problem prints `<file>:<line>: <what>` and the script fails.
#
# After changing a snippet file, -DUPDATE=ON rewrites every quote from it
# (and checks the rest as above):
#
#   cmake -DUPDATE=ON -P tests/docs/check_snippets.cmake
cmake_minimum_required(VERSION 3.21)
if(NOT DEFINED SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()

# CMake's list syntax must not see the text: `;` `[` `]` and `\` become
# control characters (compared as they are; shown restored).
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/TextLines.cmake)

# `lines` (a list, blank lines kept) without their common leading spaces,
# joined by newlines.
function(_snip_dedent out lines)
  set(indent 100000)
  foreach(l IN LISTS lines)
    if(l MATCHES "^( *)[^ ]")
      string(LENGTH "${CMAKE_MATCH_1}" n)
      if(n LESS indent)
        set(indent ${n})
      endif()
    endif()
  endforeach()
  set(text "")
  set(first TRUE)
  foreach(l IN LISTS lines)
    if(l MATCHES "^ *$")
      set(l "")
    else()
      string(SUBSTRING "${l}" ${indent} -1 l)
    endif()
    if(first)
      set(text "${l}")
      set(first FALSE)
    else()
      string(APPEND text "\n${l}")
    endif()
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(_problems "")
macro(_snip_problem file line what)
  file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${file}")
  string(APPEND _problems "\n${_rel}:${line}: ${what}")
endmacro()

# ---------------------------------------------------------------- the regions
# _snip_regions: "<file>#<name>" for every region; _snip_text_<file>+<name>
# its dedented text; _snip_quoted_<file>+<name> set once a quote of it is
# seen (`#` is no character of a variable name).
set(_snip_regions "")
file(GLOB_RECURSE _snippet_files "${SOURCE_DIR}/docs/snippets/*.cpp" "${SOURCE_DIR}/docs/snippets/*.hpp")
foreach(f IN LISTS _snippet_files)
  file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
  file(READ "${f}" text)
  ebbflow_text_lines("${text}" lines)
  set(open "")
  set(n 0)
  foreach(l IN LISTS lines)
    math(EXPR n "${n} + 1")
    if(l MATCHES "^ *// ${_ebbflow_text_lb}([a-z_0-9]+)${_ebbflow_text_rb}$")
      set(name "${CMAKE_MATCH_1}")
      if(open STREQUAL "")
        if("${rel}#${name}" IN_LIST _snip_regions)
          _snip_problem("${f}" ${n} "region '${name}' opened a second time")
        endif()
        set(open "${name}")
        set(open_at ${n})
        set(body "")
      elseif(open STREQUAL name)
        _snip_dedent(t "${body}")
        set("_snip_text_${rel}+${name}" "${t}")
        list(APPEND _snip_regions "${rel}#${name}")
        set(open "")
      else()
        _snip_problem("${f}" ${n} "region '${name}' starts inside region '${open}'")
      endif()
    elseif(NOT open STREQUAL "")
      list(APPEND body "${l}")
    endif()
  endforeach()
  if(NOT open STREQUAL "")
    _snip_problem("${f}" ${open_at} "region '${open}' is not closed")
  endif()
endforeach()

# Compares the quote `body` (a list of lines) in `file`, marked at `line`,
# with region `ref` ("<file>#<name>").
function(_snip_compare file line ref body)
  if(NOT ref IN_LIST _snip_regions)
    _snip_problem("${file}" ${line} "quotes ${ref}, which is no region of a docs/snippets file")
    set(_problems "${_problems}" PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "#" "+" key "${ref}")
  set("_snip_quoted_${key}" TRUE PARENT_SCOPE)
  _snip_dedent(got "${body}")
  if(NOT UPDATE AND NOT got STREQUAL "${_snip_text_${key}}")  # UPDATE rewrites it
    ebbflow_text_restore("${got}" shown_got)
    ebbflow_text_restore("${_snip_text_${key}}" shown_want)
    _snip_problem("${file}" ${line} "the quote of ${ref} differs from the file:\n--- quoted\n${shown_got}\n--- ${ref}\n${shown_want}\n---")
  endif()
  set(_problems "${_problems}" PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------- the quotes
set(_marker "<!-- snippet: ([^ #]+)#([a-z_0-9]+) -->")
file(GLOB_RECURSE _markdown "${SOURCE_DIR}/docs/*.md")
list(PREPEND _markdown "${SOURCE_DIR}/README.md")
# With UPDATE, _snip_out collects the file's text with each quote replaced
# by its region (`prefix` before each line), and _snip_write writes it back.
# (Takes the name of the variable that holds the line: a macro argument is
# pasted into the body as text, so a line holding `${...}`, e.g. a shell
# command in a doc, would be evaluated.)
macro(_snip_emit line_var)
  if(n EQUAL 1)
    set(_snip_out "${${line_var}}")
  else()
    string(APPEND _snip_out "\n${${line_var}}")
  endif()
endmacro()
macro(_snip_emit_region ref prefix)
  string(REPLACE "#" "+" _key "${ref}")
  if(DEFINED "_snip_text_${_key}")
    string(REPLACE "\n" ";" _rl "${_snip_text_${_key}}")
    foreach(_r IN LISTS _rl)
      if(_r STREQUAL "")
        string(REGEX REPLACE " +$" "" _p "${prefix}")
        string(APPEND _snip_out "\n${_p}")
      else()
        string(APPEND _snip_out "\n${prefix}${_r}")
      endif()
    endforeach()
  endif()
endmacro()
function(_snip_write f text)
  ebbflow_text_restore("${text}" new)
  file(READ "${f}" old)
  if(NOT new STREQUAL old)
    file(WRITE "${f}" "${new}")
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
    message(STATUS "check_snippets: rewrote the quotes in ${rel}")
  endif()
endfunction()

# Scans file `f` for quotes: a line matching `^<lead> *<marker>$`, then a
# line `<open>`, the quote, a line `<close>`; each line of a quote matches
# `^<lead>(.*)$` and is taken without `lead`. With `hand_loops`, a block
# opened by `open` without a marker must not call begin_step (Markdown).
# A macro: the problems and the quotes seen are this script's.
macro(_snip_scan f lead open close hand_loops)
  file(READ "${f}" text)
  ebbflow_text_lines("${text}" lines)
  set(state none)  # none | expect_open | quote | block
  set(n 0)
  foreach(l IN LISTS lines)
    math(EXPR n "${n} + 1")
    # UPDATE: every line but a quote's own, and the region before its close.
    if(NOT state STREQUAL "quote" OR l STREQUAL "${close}")
      if(UPDATE AND state STREQUAL "quote")
        if("${lead}" STREQUAL "")
          _snip_emit_region("${ref}" "")
        else()
          _snip_emit_region("${ref}" "${lead}   ")
        endif()
        string(APPEND _snip_out "\n${l}")
      else()
        _snip_emit(l)
      endif()
    endif()
    if(state STREQUAL "expect_open")
      if(l STREQUAL "${open}")
        set(state quote)
        set(body "")
      else()
        _snip_problem("${f}" ${n} "a snippet marker must be followed by ${open}")
        set(state none)
      endif()
    elseif(state STREQUAL "quote" OR state STREQUAL "block")
      if(l STREQUAL "${close}")
        if(state STREQUAL "quote")
          _snip_compare("${f}" ${at} "${ref}" "${body}")
        elseif(calls_step)
          _snip_problem("${f}" ${at} "a training loop (begin_step) written by hand: quote it from docs/snippets/")
        endif()
        set(state none)
      elseif(l MATCHES "^${lead}(.*)$")
        list(APPEND body "${CMAKE_MATCH_1}")
        if(l MATCHES "begin_step\\(")
          set(calls_step TRUE)
        endif()
      else()
        _snip_problem("${f}" ${n} "the quote ends before ${close}")
        set(state none)
      endif()
    elseif(l MATCHES "^${lead} *${_marker}$")
      set(ref "${CMAKE_MATCH_1}#${CMAKE_MATCH_2}")
      set(at ${n})
      set(state expect_open)
    elseif(${hand_loops} AND l STREQUAL "${open}")
      set(state block)
      set(at ${n})
      set(body "")
      set(calls_step FALSE)
    endif()
  endforeach()
  if(UPDATE)
    _snip_write("${f}" "${_snip_out}")
  endif()
endmacro()

foreach(f IN LISTS _markdown)
  _snip_scan("${f}" "" "```cpp" "```" TRUE)
endforeach()
file(GLOB_RECURSE _headers "${SOURCE_DIR}/include/*.hpp")
foreach(f IN LISTS _headers)
  file(STRINGS "${f}" has REGEX "^//! <!-- snippet: " LIMIT_COUNT 1)
  if(has)
    _snip_scan("${f}" "//!" "//! @code" "//! @endcode" FALSE)
  endif()
endforeach()

foreach(r IN LISTS _snip_regions)
  string(REPLACE "#" "+" key "${r}")
  if(NOT _snip_quoted_${key})
    string(REGEX REPLACE "#.*" "" rf "${r}")
    _snip_problem("${SOURCE_DIR}/${rf}" 1 "region ${r} is quoted nowhere (README.md, docs/, include/)")
  endif()
endforeach()

# ---------------------------------------------------------------- the loop head
if(NOT DEFINED LOOP)
  set(LOOP "docs/snippets/training_loop.cpp#loop")
endif()
if(DEFINED LOOP_USERS)
  string(REPLACE "#" "+" _key "${LOOP}")
  if(NOT LOOP IN_LIST _snip_regions)
    _snip_problem("${SOURCE_DIR}/${LOOP}" 1 "no such region (the documented loop)")
  else()
    string(REGEX MATCH "[^\n]*keep_training[^\n]*" _head "${_snip_text_${_key}}")
    string(STRIP "${_head}" _head)
    ebbflow_text_restore("${_head}" _head_shown)
    foreach(u IN LISTS LOOP_USERS)
      file(READ "${SOURCE_DIR}/${u}" text)
      ebbflow_text_lines("${text}" lines)
      set(found FALSE)
      foreach(l IN LISTS lines)
        string(STRIP "${l}" l)
        if(l STREQUAL _head)
          set(found TRUE)
          break()
        endif()
      endforeach()
      if(NOT found)
        _snip_problem("${SOURCE_DIR}/${u}" 1 "lacks the documented loop head `${_head_shown}` (${LOOP})")
      endif()
    endforeach()
  endif()
endif()

if(_problems)
  ebbflow_text_restore("${_problems}" _shown)
  message(NOTICE "check_snippets: the docs and their snippet files disagree:${_shown}")
  message(FATAL_ERROR "check_snippets: failed (-DUPDATE=ON rewrites the quotes from the snippet files)")
endif()
list(LENGTH _snip_regions _count)
message(STATUS "check_snippets: ${_count} regions, every quote equal to its file")
