# SPDX-License-Identifier: Apache-2.0
# vcpkg overlay port for ebbflow (header-only). It builds the ebbflow source
# tree that contains this port (cmake/vcpkg/ports/ebbflow/ -> ../../../..):
#   vcpkg install ebbflow[asio,ucx] --overlay-ports=<ebbflow>/cmake/vcpkg/ports
# Features map onto EBBFLOW_WITH_<C>=ON (the component is required) / OFF.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/ebbflow/version.hpp")
  message(FATAL_ERROR "ebbflow port: use it as an overlay port inside an ebbflow source tree "
                      "(${SOURCE_PATH} is not one)")
endif()

# The version lives in include/ebbflow/version.hpp alone; vcpkg.json must agree.
file(STRINGS "${SOURCE_PATH}/include/ebbflow/version.hpp" _ver REGEX "#define EBBFLOW_VERSION_STRING")
string(REGEX MATCH "\"([^\"]+)\"" _m "${_ver}")
if(NOT CMAKE_MATCH_1 STREQUAL VERSION)
  message(FATAL_ERROR "ebbflow port: vcpkg.json says ${VERSION}, include/ebbflow/version.hpp says ${CMAKE_MATCH_1}")
endif()

set(VCPKG_BUILD_TYPE release)  # header-only: one configuration is enough

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    asio EBBFLOW_WITH_ASIO
    ucx  EBBFLOW_WITH_UCX
    cuda EBBFLOW_WITH_CUDA
    nccl EBBFLOW_WITH_NCCL
)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DBUILD_TESTING=OFF
    -DEBBFLOW_BUILD_BENCH=OFF
    -DEBBFLOW_BUILD_EXAMPLES=OFF
    -DEBBFLOW_BUILD_TOOLS=OFF
    -DEBBFLOW_BUILD_COMPILED=OFF
    -DEBBFLOW_ENABLE_CUDA=OFF
    -DEBBFLOW_INSTALL=ON
    -DEBBFLOW_INSTALL_CMAKEDIR=share/cmake/ebbflow
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME ebbflow CONFIG_PATH share/cmake/ebbflow)

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
if(EXISTS "${SOURCE_PATH}/LICENSE")
  vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
else()
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "SPDX-License-Identifier: Apache-2.0\n")
endif()
