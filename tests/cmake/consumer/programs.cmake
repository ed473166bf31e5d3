# SPDX-License-Identifier: Apache-2.0
# The programs every consumer project builds; run_consumer.cmake runs each one
# listed in <build>/consumer-programs.txt and expects exit code 0.
#   ebbflow_consumer_programs(CORE <libs> [ASIO <libs>] [UCX <libs>] [COMPILED <libs>] [DEFINES <defs>] [SET_STANDARD])
# CORE: what a program using only the core links (ebbflow::ebbflow, or nothing
# but the single header); consumer_core (the core and the batch planner, which
# needs no optional dependency) links it. ASIO / UCX: what a program using the asio /
# ucx component links (consumer_asio; consumer_ucx, a two-process allreduce
# over UCX); each is built only when given. COMPILED: ebbflow::compiled, the
# separately compiled library; consumer_compiled is the asio program (store,
# group, keep_training) linked against it instead of the header-only bodies.
function(ebbflow_consumer_programs)
  cmake_parse_arguments(C "SET_STANDARD" "" "CORE;ASIO;UCX;COMPILED;DEFINES" ${ARGN})
  set(dir ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  # The programs that do not link the asio component say so (EBBFLOW_NO_ASIO):
  # with Boost.Asio and OpenSSL on the machine the umbrella includes the
  # store, whose TLS (Boost.Asio's ssl) needs libssl linked
  # (docs/packaging.md, "Configuration macros").
  add_executable(consumer_core ${dir}/core_main.cpp)
  target_link_libraries(consumer_core PRIVATE ${C_CORE})
  target_compile_definitions(consumer_core PRIVATE EBBFLOW_NO_ASIO)
  set(programs consumer_core)
  if(C_ASIO)  # only the Conan test_package built without its asio option omits it
    add_executable(consumer_asio ${dir}/asio_main.cpp)
    target_link_libraries(consumer_asio PRIVATE ${C_ASIO})
    list(APPEND programs consumer_asio)
  endif()
  if(C_UCX)  # the Conan test_package built without its ucx option omits it
    add_executable(consumer_ucx ${dir}/ucx_main.cpp)
    target_link_libraries(consumer_ucx PRIVATE ${C_UCX})
    target_compile_definitions(consumer_ucx PRIVATE EBBFLOW_NO_ASIO)
    list(APPEND programs consumer_ucx)
  endif()
  if(C_COMPILED)
    add_executable(consumer_compiled ${dir}/asio_main.cpp)
    target_link_libraries(consumer_compiled PRIVATE ${C_COMPILED})
    target_compile_definitions(consumer_compiled PRIVATE CONSUMER_NAME="consumer_compiled" CONSUMER_COMPILED)
    list(APPEND programs consumer_compiled)
  endif()
  set(list "")
  foreach(p IN LISTS programs)
    target_compile_definitions(${p} PRIVATE ${C_DEFINES}
      $<$<BOOL:${EBBFLOW_EXPECTED_VERSION}>:EBBFLOW_EXPECTED_VERSION="${EBBFLOW_EXPECTED_VERSION}">)
    target_compile_options(${p} PRIVATE -Wall -Wextra -Werror)
    if(C_SET_STANDARD)
      target_compile_features(${p} PRIVATE cxx_std_20)
    endif()
    string(APPEND list "$<TARGET_FILE:${p}>\n")
  endforeach()
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/consumer-programs.txt CONTENT "${list}")
endfunction()

# ebbflow_require_targets(<why one is missing> <targets>...): stops with an
# error naming a target that is not defined.
function(ebbflow_require_targets why)
  foreach(t IN LISTS ARGN)
    if(NOT TARGET ${t})
      message(FATAL_ERROR "${t} is not defined: ${why}")
    endif()
  endforeach()
endfunction()
