# SPDX-License-Identifier: Apache-2.0
# Runs cmake/check_layering.cmake over the fixture tree of deliberate
# violations and passes only when the check fails there with exactly the
# violations in expected.txt: each named by file, line and rule, none missing,
# none extra. The fixture also holds includes the rules allow (a folder's own
# detail/ from a sub-folder, a .cuh from a .cuh, the umbrella): a false
# positive there is an extra violation.
#   cmake -DSOURCE_DIR=<repo> -P tests/layering/expect_violations.cmake
cmake_minimum_required(VERSION 3.21)
if(NOT DEFINED SOURCE_DIR)
  get_filename_component(SOURCE_DIR "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
endif()
set(_here "${SOURCE_DIR}/tests/layering")
execute_process(COMMAND "${CMAKE_COMMAND}" -DROOT=${_here}/fixture -P "${SOURCE_DIR}/cmake/check_layering.cmake"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(out "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the layering check passed over the violations in ${_here}/fixture:\n${out}")
endif()

# The reported violations as `<file under fixture/>:<line>: [<rule>]`.
string(REGEX MATCHALL "fixture/ebbflow/[^\n:]*:[0-9]+: \\[[a-z]+\\]" got "${out}")
list(TRANSFORM got REPLACE "^fixture/" "")
file(STRINGS "${_here}/expected.txt" want REGEX "^[^#]")
list(SORT got)
list(SORT want)
set(missing ${want})
list(REMOVE_ITEM missing ${got})
set(extra ${got})
list(REMOVE_ITEM extra ${want})
list(LENGTH got ngot)
list(LENGTH want nwant)
if(missing OR extra OR NOT ngot EQUAL nwant)
  string(REPLACE ";" "\n  " missing "${missing}")
  string(REPLACE ";" "\n  " extra "${extra}")
  message(FATAL_ERROR "layering check over the fixture: ${ngot} violations, ${nwant} expected\n"
                      "missing:\n  ${missing}\nunexpected:\n  ${extra}\nits output:\n${out}")
endif()
message(STATUS "layering check failed over the fixture as expected: ${ngot} violations, each named by file, line and rule")
