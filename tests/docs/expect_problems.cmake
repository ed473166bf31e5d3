# SPDX-License-Identifier: Apache-2.0
# Runs check_snippets.cmake (CHECK) on the FIXTURE tree, which holds one of
# each problem it must find, and checks that it fails naming each of them.
foreach(v CHECK FIXTURE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "expect_problems.cmake: -D${v}=... is required")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${FIXTURE} -DLOOP_USERS=example.cpp "-DLOOP=docs/snippets/loop.cpp#loop" -P ${CHECK}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "check_snippets passed on the fixture, which holds a drifted quote:\n${out}")
endif()
set(flat "${out}")
foreach(want
    "README.md:5: the quote of docs/snippets/loop.cpp#loop differs from the file"
    "README.md:20: a training loop (begin_step) written by hand"
    "include/ebbflow/fixture.hpp:3: the quote of docs/snippets/loop.cpp#loop differs from the file"
    "region docs/snippets/loop.cpp#unused is quoted nowhere"
    "example.cpp:1: lacks the documented loop head `while (g.keep_training(steps)) {`")
  string(FIND "${flat}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_snippets did not report: ${want}\n${out}")
  endif()
endforeach()
# And the quotes that agree are not reported.
foreach(quiet "README.md:11" "docs/guide.md")
  string(FIND "${flat}" "${quiet}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "check_snippets reported a quote that agrees (${quiet}):\n${out}")
  endif()
endforeach()
message(STATUS "check_snippets found every problem of the fixture")
