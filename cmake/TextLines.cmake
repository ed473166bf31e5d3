# SPDX-License-Identifier: Apache-2.0
# Text as a CMake list of lines and back, for the -P scripts that read C++
# and Markdown (cmake/check_layering.cmake, tests/docs/check_snippets.cmake).
# CMake's list syntax must not see `;`, `[`, `]` or `\`: they are swapped for
# the control characters 1 to 4, which no source file holds, so a line is
# compared as it is and restored for messages.
#   ebbflow_text_lines(<text> <out>)     one list element per line (line
#                                        number = index + 1), blank lines kept
#   ebbflow_text_restore(<text> <out>)   the swapped characters put back
include_guard(GLOBAL)
string(ASCII 1 _ebbflow_text_sc)
string(ASCII 2 _ebbflow_text_lb)
string(ASCII 3 _ebbflow_text_rb)
string(ASCII 4 _ebbflow_text_bs)
function(ebbflow_text_lines text out)
  string(REPLACE "\\" "${_ebbflow_text_bs}" text "${text}")
  string(REPLACE ";" "${_ebbflow_text_sc}" text "${text}")
  string(REPLACE "[" "${_ebbflow_text_lb}" text "${text}")
  string(REPLACE "]" "${_ebbflow_text_rb}" text "${text}")
  string(REPLACE "\n" ";" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
function(ebbflow_text_restore text out)
  foreach(pair IN ITEMS "bs;\\" "sc;\\;" "lb;[" "rb;]")
    list(GET pair 0 code)
    list(GET pair 1 char)
    string(REPLACE "${_ebbflow_text_${code}}" "${char}" text "${text}")
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
