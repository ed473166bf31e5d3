# SPDX-License-Identifier: Apache-2.0
# One generated translation unit per public header that includes it alone
# (twice, to check the include guard), in the spirit of range-v3's
# TestHeaders.cmake: proves every header is self-contained. Headers of an
# optional backend are compiled only when that backend was found; .cuh files
# are compiled by the CUDA tests instead.
function(ebbflow_add_header_tests)
  set(root ${PROJECT_SOURCE_DIR}/include)
  file(GLOB_RECURSE headers RELATIVE ${root} CONFIGURE_DEPENDS ${root}/ebbflow/*.hpp)
  set(sources "")
  set(libs "")
  foreach(h IN LISTS headers)
    set(need "")
    if(h MATCHES "^ebbflow/impl/")
      set(need compiled)  # the compiled library's source: Asio and UCX
    elseif(h MATCHES "/ucx/" OR h MATCHES "ucx_")
      set(need ucx)
    elseif(h MATCHES "/nccl/" OR h MATCHES "nccl_")
      set(need nccl)
    elseif(h MATCHES "^ebbflow/elastic/" OR h MATCHES "ebbflow.hpp$" OR h MATCHES "/asio")
      set(need asio)
    endif()
    if(need AND NOT TARGET ebbflow::${need})
      continue()
    endif()
    # "_" and "/" escaped first: comm/nccl/communicator.hpp and
    # comm/nccl_communicator.hpp must not share a file name.
    string(REPLACE "_" "_u" id "${h}")
    string(REPLACE "/" "_s" id "${id}")
    string(MAKE_C_IDENTIFIER "${id}" id)
    set(src ${CMAKE_CURRENT_BINARY_DIR}/header_tests/${id}.cpp)
    file(CONFIGURE OUTPUT ${src} CONTENT "#include <${h}>\n#include <${h}>\n")
    list(APPEND sources ${src})
  endforeach()
  foreach(c asio ucx cuda nccl)
    if(TARGET ebbflow::${c})
      list(APPEND libs ebbflow::${c})
    endif()
  endforeach()
  add_library(ebbflow_header_tests OBJECT ${sources})
  target_link_libraries(ebbflow_header_tests PRIVATE ebbflow::ebbflow ${libs})
  target_compile_options(ebbflow_header_tests PRIVATE -Wall -Wextra -Wpedantic -Werror)
endfunction()
