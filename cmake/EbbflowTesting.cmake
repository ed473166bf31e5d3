# SPDX-License-Identifier: Apache-2.0
# ebbflow_add_test(<name> SOURCES ... [LIBS ...] [LABELS ...] [TIMEOUT s] [ARGS ...]
#                  [NO_GTEST] [RUN_SERIAL] [SHARDS n])
# Builds a test executable and registers it with CTest. Every test gets a
# timeout (default 120 s) so that no test can hang CI. SHARDS n (n > 1) runs
# the GoogleTest cases as n shards at once (tests/run_shards.sh), for cases
# that mostly wait on other processes; one CTest test still covers them all.
function(ebbflow_add_test name)
  cmake_parse_arguments(T "NO_GTEST;RUN_SERIAL" "TIMEOUT;SHARDS" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ebbflow::ebbflow ${T_LIBS})
  if(NOT T_NO_GTEST)
    target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main)
  endif()
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>)
  if(T_SHARDS AND T_SHARDS GREATER 1)
    add_test(NAME ${name} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/run_shards.sh ${T_SHARDS} $<TARGET_FILE:${name}>
                                  ${T_ARGS})
  else()
    add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  # Only GPU tests report "skipped" (no device here). Elsewhere a skip regex
  # would mark the whole binary skipped, hiding failures of its other cases.
  if("gpu" IN_LIST T_LABELS)
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
  if(T_RUN_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

# ebbflow_add_cuda_test(<name> SOURCES x.cu ... [LIBS ...] [TIMEOUT s])
# A GPU test: compiled by nvcc when it is present (so CI proves the CUDA path
# compiles), labelled `gpu`, and expected to GTEST_SKIP when no device exists.
function(ebbflow_add_cuda_test name)
  if(NOT EBBFLOW_CUDA_ENABLED)
    return()
  endif()
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ebbflow::ebbflow ebbflow::cuda GTest::gtest GTest::gtest_main ${T_LIBS})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr --extended-lambda>)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "gpu" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()
