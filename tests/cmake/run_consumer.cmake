# SPDX-License-Identifier: Apache-2.0
# Driver of the packaging tests (cmake -P). Each MODE builds a separate
# consumer project the way a user would and runs its programs:
#   find_package      cmake --install of BINARY_DIR into a prefix, which is then
#                     moved (the install must be relocatable), find_package
#   install_checks    configure-only probes of the installed config: version
#                     compatibility (SameMajorVersion, ARCH_INDEPENDENT),
#                     unknown / not-built / optional components, module path
#   fetch_content     FetchContent from a file:// tarball of SOURCE_DIR
#   add_subdirectory  add_subdirectory(SOURCE_DIR)
#   single_header     the single-include header, generated afresh from
#                     SOURCE_DIR, alone on the include path
#   amalgamate_fixture  the amalgamation of the headers plus fixture headers
#                     (guards, header <-> impl/ cycles, #if includes) compiles
#                     and runs with every backend and with none
#   recipes           the vcpkg port and the Conan recipe name the same
#                     targets, components and version as the CMake install
#   readme_install    the README's install block, run as written (sh) in a
#                     copy of SOURCE_DIR with HOME in WORK_DIR, then
#                     find_package from the prefix it installed to
#   missing_deps      a requested component whose dependency is missing
#                     (hidden with CMAKE_DISABLE_FIND_PACKAGE_<P>) fails
#                     configure, naming the Debian packages: in the build
#                     tree (EBBFLOW_WITH_<C>=ON) and in find_package
# Inputs: MODE SOURCE_DIR BINARY_DIR WORK_DIR GENERATOR CXX_COMPILER BUILD_TYPE
cmake_minimum_required(VERSION 3.21)
foreach(v MODE SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()
set(here "${CMAKE_CURRENT_LIST_DIR}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

file(STRINGS "${SOURCE_DIR}/include/ebbflow/version.hpp" _v REGEX "#define EBBFLOW_VERSION_STRING")
string(REGEX MATCH "\"([0-9]+)\\.([0-9]+)\\.([0-9]+)\"" _m "${_v}")
set(version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
set(major "${CMAKE_MATCH_1}")
set(minor "${CMAKE_MATCH_2}")

set(common_args -DEBBFLOW_EXPECTED_VERSION=${version})
if(GENERATOR)
  list(APPEND common_args -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND common_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
# No optimisation unless asked: these tests prove how the package is found,
# configured and linked, and an unoptimised build of the consumer programs
# takes a fraction of the time of -O3 (the library's own tests cover -O3).
list(APPEND common_args -DCMAKE_BUILD_TYPE=${BUILD_TYPE})

# step(<name> [EXPECT_FAIL] [MATCH <regex>] [TIMEOUT s] COMMAND ...): runs a
# command, shows its output when it does not end as expected, and checks
# MATCH on the output.
function(step name)
  cmake_parse_arguments(S "EXPECT_FAIL" "MATCH;TIMEOUT" "COMMAND" ${ARGN})
  if(NOT S_TIMEOUT)
    set(S_TIMEOUT 240)
  endif()
  message(STATUS "[${MODE}] ${name}")
  execute_process(COMMAND ${S_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                  TIMEOUT ${S_TIMEOUT})
  set(ok TRUE)
  # CMake wraps the messages it prints: MATCH may also hold on the output
  # with its runs of white space made one space.
  string(REGEX REPLACE "[ \t\n]+" " " flat "${out}")
  if(S_EXPECT_FAIL AND rc EQUAL 0)
    set(ok FALSE)
    set(why "succeeded but was expected to fail")
  elseif(NOT S_EXPECT_FAIL AND NOT rc EQUAL 0)
    set(ok FALSE)
    set(why "failed (${rc})")
  elseif(S_MATCH AND NOT out MATCHES "${S_MATCH}" AND NOT flat MATCHES "${S_MATCH}")
    set(ok FALSE)
    set(why "output does not match '${S_MATCH}'")
  endif()
  if(NOT ok)
    message(FATAL_ERROR "[${MODE}] ${name}: ${why}\ncommand: ${S_COMMAND}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Configures, builds and runs a consumer project.
function(consumer project)
  set(b "${WORK_DIR}/consumer")
  step("configure ${project}" COMMAND ${CMAKE_COMMAND} -S "${here}/${project}" -B "${b}" ${common_args} ${ARGN})
  # An install built with the compiled library (the default) links it too.
  if(project STREQUAL "find_package" AND EXISTS "${BINARY_DIR}/libebbflow.a"
     AND NOT step_output MATCHES "ebbflow_compiled_FOUND=TRUE")
    message(FATAL_ERROR "[${MODE}] the build has libebbflow.a but the installed package's compiled component was not found")
  endif()
  step("build ${project}" COMMAND ${CMAKE_COMMAND} --build "${b}" -j 2)
  file(STRINGS "${b}/consumer-programs.txt" programs)
  # Every CMake route builds all three: the core with the planner (no
  # optional dependency), the asio component and the UCX collectives.
  foreach(want consumer_core consumer_asio consumer_ucx)
    if(NOT programs MATCHES "/${want}(;|$)")
      message(FATAL_ERROR "[${MODE}] ${want} was not built (programs: ${programs})")
    endif()
  endforeach()
  foreach(p IN LISTS programs)
    get_filename_component(n "${p}" NAME)
    step("run ${n}" COMMAND "${p}" MATCH "${n} OK" TIMEOUT 60)
    message(STATUS "[${MODE}]   ${step_output}")
  endforeach()
endfunction()

# Copies the source tree as a release would ship it into `dest`: tracked
# and untracked-but-not-ignored files when SOURCE_DIR is a git checkout,
# else the tree without the usual build folders.
function(copy_source_tree dest)
  execute_process(COMMAND git -C "${SOURCE_DIR}" ls-files -co --exclude-standard
                  RESULT_VARIABLE rc OUTPUT_VARIABLE files ERROR_QUIET)
  if(rc EQUAL 0 AND files)
    string(REPLACE "\n" ";" files "${files}")
  else()
    file(GLOB_RECURSE files RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/*")
    list(FILTER files EXCLUDE REGEX "^(build|\\.git|\\.whl|\\.gl|report)(/|$)")
  endif()
  foreach(f IN LISTS files)
    if(f AND EXISTS "${SOURCE_DIR}/${f}")
      get_filename_component(d "${dest}/${f}" DIRECTORY)
      file(COPY "${SOURCE_DIR}/${f}" DESTINATION "${d}")
    endif()
  endforeach()
endfunction()

function(install_into prefix bindir)
  step("cmake --install ${bindir}" COMMAND ${CMAKE_COMMAND} --install "${bindir}" --prefix "${prefix}")
  if(NOT EXISTS "${prefix}/include/ebbflow/ebbflow.hpp")
    message(FATAL_ERROR "[${MODE}] the install lacks include/ebbflow/ebbflow.hpp")
  endif()
endfunction()

if(MODE STREQUAL "find_package")
  install_into("${WORK_DIR}/prefix-at-install" "${BINARY_DIR}")
  # The installed files must not point back at the source, build or install tree.
  file(GLOB_RECURSE cfg "${WORK_DIR}/prefix-at-install/*.cmake")
  foreach(f IN LISTS cfg)
    file(READ "${f}" text)
    foreach(bad "${SOURCE_DIR}" "${BINARY_DIR}" "${WORK_DIR}")
      string(FIND "${text}" "${bad}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "[${MODE}] ${f} holds the absolute path ${bad}: the install is not relocatable")
      endif()
    endforeach()
  endforeach()
  file(RENAME "${WORK_DIR}/prefix-at-install" "${WORK_DIR}/prefix")
  consumer(find_package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)

elseif(MODE STREQUAL "install_checks")
  install_into("${WORK_DIR}/prefix" "${BINARY_DIR}")
  set(probe_args -S "${here}/probe" -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${common_args})
  set(n 0)
  macro(probe)
    math(EXPR n "${n} + 1")
    list(APPEND probe_dirs "${WORK_DIR}/probe${n}")
  endmacro()
  # Compatible versions: same major, any older minor; and another architecture.
  probe()
  step("same major version, component asio" MATCH "found ebbflow ${version}"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_VERSION=${major}.${minor} -DPROBE_COMPONENTS=asio)
  probe()
  step("ARCH_INDEPENDENT: found from a 32-bit project" MATCH "found ebbflow ${version}"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_VERSION=${major}.0 -DPROBE_SIZEOF_VOID_P=4)
  if(EXISTS "${BINARY_DIR}/libebbflow.a")
    # ...but the compiled archive is not: asked for from there, a clear error.
    probe()
    step("the compiled component from a 32-bit project is refused" EXPECT_FAIL
         MATCH "ebbflow component 'compiled' needs the asio and ucx components and a 8-byte-pointer target"
         COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_VERSION=${major}.0 -DPROBE_SIZEOF_VOID_P=4
                 -DPROBE_COMPONENTS=compiled)
  endif()
  # SameMajorVersion: the next major is refused.
  math(EXPR next "${major} + 1")
  probe()
  step("next major version is refused" EXPECT_FAIL MATCH "compatible with requested version \"${next}\\.0\""
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_VERSION=${next}.0)
  math(EXPR newer "${minor} + 1")
  probe()
  step("newer minor version is refused" EXPECT_FAIL MATCH "compatible with requested version"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_VERSION=${major}.${newer})
  # Components: unknown, optional unknown.
  probe()
  step("unknown component is a clear error" EXPECT_FAIL MATCH "ebbflow has no component 'nonexistent'"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_COMPONENTS=nonexistent)
  probe()
  step("unknown optional component is only not found" MATCH "ebbflow_nonexistent_FOUND=FALSE"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B ${WORK_DIR}/probe${n} -DPROBE_COMPONENTS=asio -DPROBE_OPTIONAL=nonexistent)
  # A known component left out of the build (EBBFLOW_WITH_UCX=OFF).
  step("configure ebbflow without ucx"
       COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/noucx-build" ${common_args}
               -DEBBFLOW_WITH_UCX=OFF -DEBBFLOW_WITH_CUDA=OFF -DBUILD_TESTING=OFF -DEBBFLOW_BUILD_BENCH=OFF
               -DEBBFLOW_BUILD_EXAMPLES=OFF -DEBBFLOW_BUILD_TOOLS=OFF -DEBBFLOW_ENABLE_CUDA=OFF)
  install_into("${WORK_DIR}/noucx" "${WORK_DIR}/noucx-build")
  probe()
  step("component not built into the install is a clear error" EXPECT_FAIL
       MATCH "ebbflow component 'ucx' was not built into this install.*apt-get install libucx-dev"
       COMMAND ${CMAKE_COMMAND} -S "${here}/probe" -B ${WORK_DIR}/probe${n} ${common_args}
               -DCMAKE_PREFIX_PATH=${WORK_DIR}/noucx -DPROBE_COMPONENTS=ucx)
  foreach(d IN LISTS probe_dirs)
    file(REMOVE_RECURSE "${d}")
  endforeach()

elseif(MODE STREQUAL "missing_deps")
  # Configure-only. The build tree: a component asked for (ON) whose
  # dependency is hidden fails, naming the packages; left at AUTO it is left
  # out with a warning that names them.
  # Configure-only installs: nothing is built, so the compiled library (which
  # an install would need built) is left out.
  set(lean -DBUILD_TESTING=OFF -DEBBFLOW_BUILD_TOOLS=OFF -DEBBFLOW_WITH_CUDA=OFF -DEBBFLOW_BUILD_COMPILED=OFF)
  step("build tree: EBBFLOW_WITH_ASIO=ON without Boost" EXPECT_FAIL
       MATCH "EBBFLOW_WITH_ASIO=ON, but the asio component needs Boost >= 1.74 \\(headers\\) and OpenSSL \\(libcrypto\\): apt-get install libboost-dev libssl-dev"
       COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/noboost" ${common_args} ${lean}
               -DEBBFLOW_WITH_ASIO=ON -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON)
  step("build tree: EBBFLOW_WITH_UCX=ON without UCX" EXPECT_FAIL
       MATCH "EBBFLOW_WITH_UCX=ON, but the ucx component needs UCX \\(ucx-config.cmake\\): apt-get install libucx-dev"
       COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/nolibucx" ${common_args} ${lean}
               -DEBBFLOW_WITH_UCX=ON -DCMAKE_DISABLE_FIND_PACKAGE_ucx=ON)
  step("build tree: AUTO without UCX leaves it out, saying so"
       MATCH "the ucx component is left out: it needs UCX \\(ucx-config.cmake\\): apt-get install libucx-dev"
       COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/autoucx" ${common_args} ${lean}
               -DCMAKE_DISABLE_FIND_PACKAGE_ucx=ON)
  # An install with every component, used where a dependency is missing.
  step("configure ebbflow with asio and ucx"
       COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/full-build" ${common_args} ${lean}
               -DEBBFLOW_WITH_ASIO=ON -DEBBFLOW_WITH_UCX=ON)
  install_into("${WORK_DIR}/prefix" "${WORK_DIR}/full-build")
  set(probe_args -S "${here}/probe" -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${common_args})
  step("find_package COMPONENTS asio without Boost" EXPECT_FAIL
       MATCH "ebbflow component 'asio' needs Boost >= 1.74 \\(headers\\) and OpenSSL \\(libcrypto\\): apt-get install libboost-dev libssl-dev"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B "${WORK_DIR}/probe-noboost" -DPROBE_COMPONENTS=asio
               -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON)
  step("find_package COMPONENTS ucx without UCX" EXPECT_FAIL
       MATCH "ebbflow component 'ucx' needs UCX \\(ucx-config.cmake\\): apt-get install libucx-dev"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B "${WORK_DIR}/probe-noucx" -DPROBE_COMPONENTS=ucx
               -DCMAKE_DISABLE_FIND_PACKAGE_ucx=ON)
  step("find_package OPTIONAL_COMPONENTS ucx without UCX is only not found" MATCH "ebbflow_ucx_FOUND=FALSE"
       COMMAND ${CMAKE_COMMAND} ${probe_args} -B "${WORK_DIR}/probe-optional" -DPROBE_OPTIONAL=ucx
               -DCMAKE_DISABLE_FIND_PACKAGE_ucx=ON)

elseif(MODE STREQUAL "readme_install")
  # The block between the README's readme-install markers, as a user copies
  # it: run by sh in a fresh copy of the tree, with HOME in WORK_DIR (the
  # block installs to ~/.local).
  file(READ "${SOURCE_DIR}/README.md" readme)
  if(NOT readme MATCHES "<!-- readme-install:begin -->\n```sh\n(.*)\n```\n<!-- readme-install:end -->")
    message(FATAL_ERROR "[${MODE}] README.md has no ```sh block between <!-- readme-install:begin --> and <!-- readme-install:end -->")
  endif()
  set(block "${CMAKE_MATCH_1}")
  file(WRITE "${WORK_DIR}/install.sh" "${block}\n")
  message(STATUS "[${MODE}] the README's install block:\n${block}")
  set(src "${WORK_DIR}/ebbflow")
  set(home "${WORK_DIR}/home")
  file(MAKE_DIRECTORY "${home}")
  copy_source_tree("${src}")
  string(TIMESTAMP t0 "%s")
  step("run the README's install block" TIMEOUT 1200
       COMMAND ${CMAKE_COMMAND} -E chdir "${src}" env "HOME=${home}" sh -e "${WORK_DIR}/install.sh")
  string(TIMESTAMP t1 "%s")
  math(EXPR took "${t1} - ${t0}")
  message(STATUS "[${MODE}] the install block took ${took} s")
  set(prefix "${home}/.local")
  foreach(want bin/ebbflow-run bin/ebbflow-store include/ebbflow/ebbflow.hpp share/cmake/ebbflow/ebbflow-config.cmake)
    if(NOT EXISTS "${prefix}/${want}")
      message(FATAL_ERROR "[${MODE}] the install lacks ${want}")
    endif()
  endforeach()
  step("the installed launcher runs" MATCH "usage: ebbflow-run" COMMAND "${prefix}/bin/ebbflow-run" --help)
  # What the block's configure chose: Release, and none of the parts for
  # working on ebbflow.
  file(GLOB cache "${src}/build/*/CMakeCache.txt")
  file(STRINGS "${cache}" build_type REGEX "^CMAKE_BUILD_TYPE:")
  if(NOT build_type MATCHES "=Release$")
    message(FATAL_ERROR "[${MODE}] the README's build is not Release: ${build_type}")
  endif()
  get_filename_component(bdir "${cache}" DIRECTORY)
  foreach(part tests bench examples)
    if(EXISTS "${bdir}/${part}")
      message(FATAL_ERROR "[${MODE}] -DBUILD_TESTING=OFF still configured ${part}/")
    endif()
  endforeach()
  file(REMOVE_RECURSE "${src}")
  consumer(find_package -DCMAKE_PREFIX_PATH=${prefix})

elseif(MODE STREQUAL "fetch_content")
  # A source tarball as a release would ship it: the tree without build
  # outputs or VCS metadata.
  set(src "${WORK_DIR}/ebbflow-${version}")
  copy_source_tree("${src}")
  step("tar the source tree" COMMAND ${CMAKE_COMMAND} -E chdir "${WORK_DIR}"
       ${CMAKE_COMMAND} -E tar czf "${WORK_DIR}/ebbflow-${version}.tar.gz" "ebbflow-${version}")
  file(REMOVE_RECURSE "${src}")
  consumer(fetch_content "-DEBBFLOW_URL=file://${WORK_DIR}/ebbflow-${version}.tar.gz"
           -DFETCHCONTENT_QUIET=OFF)

elseif(MODE STREQUAL "add_subdirectory")
  consumer(add_subdirectory -DEBBFLOW_SOURCE_DIR=${SOURCE_DIR})

elseif(MODE STREQUAL "single_header")
  step("amalgamate" COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${SOURCE_DIR}
       -DSINGLE_OUT=${WORK_DIR}/single/ebbflow/ebbflow.hpp -DUMBRELLA_OUT=${WORK_DIR}/umbrella.hpp
       -P "${SOURCE_DIR}/cmake/amalgamate.cmake")
  file(GLOB single_dir_entries RELATIVE "${WORK_DIR}/single" "${WORK_DIR}/single/*" "${WORK_DIR}/single/ebbflow/*")
  if(NOT single_dir_entries STREQUAL "ebbflow;ebbflow/ebbflow.hpp")
    message(FATAL_ERROR "[${MODE}] the single include directory holds more than ebbflow/ebbflow.hpp: ${single_dir_entries}")
  endif()
  consumer(single_header -DEBBFLOW_SINGLE_INCLUDE_DIR=${WORK_DIR}/single)

elseif(MODE STREQUAL "amalgamate_fixture")
  # The real headers plus fixture headers that need backends, include each
  # other in a cycle (header <-> impl/), and include backend headers inside
  # #if: amalgamate them, then compile and run a program against the single
  # header and against the generated umbrella, with every backend and none.
  set(tree "${WORK_DIR}/tree")
  file(COPY "${SOURCE_DIR}/include" DESTINATION "${tree}")
  file(COPY "${here}/amalgamate/fixture/ebbflow" DESTINATION "${tree}/include")
  step("amalgamate the fixture tree" COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${tree}
       -DSINGLE_OUT=${WORK_DIR}/single/ebbflow/ebbflow.hpp -P "${SOURCE_DIR}/cmake/amalgamate.cmake")
  file(READ "${WORK_DIR}/single/ebbflow/ebbflow.hpp" single)
  foreach(g "#if EBBFLOW_HAS_UCX\n" "#if EBBFLOW_HAS_ASIO\n" "#if EBBFLOW_HAS_ASIO && EBBFLOW_HAS_UCX\n")
    string(FIND "${single}" "${g}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "[${MODE}] the single header lacks the guard ${g}")
    endif()
  endforeach()
  if(NOT CXX_COMPILER)
    set(CXX_COMPILER c++)
  endif()
  set(none -DEBBFLOW_NO_ASIO -DEBBFLOW_NO_UCX -DEBBFLOW_NO_CUDA -DEBBFLOW_NO_NCCL)
  foreach(inc "${WORK_DIR}/single" "${tree}/include")
    foreach(variant all none)
      if(variant STREQUAL "all")
        set(flags -DEBBFLOW_NO_CUDA -DEBBFLOW_NO_NCCL)
        set(libs -lucp -lucs -lssl -lcrypto)
        set(want "asio=1 ucx=1")
      else()
        set(flags ${none})
        set(libs "")
        set(want "asio=0 ucx=0")
      endif()
      set(exe "${WORK_DIR}/fixture_${variant}")
      step("compile against ${inc} (${variant} backends)"
           COMMAND ${CXX_COMPILER} -std=c++20 -Wall -Wextra -Werror -I${inc} ${flags}
                   "${here}/amalgamate/main.cpp" -o "${exe}" ${libs} -pthread)
      step("run (${variant} backends)" MATCH "${want}" COMMAND "${exe}" TIMEOUT 30)
      message(STATUS "[${MODE}]   ${step_output}")
    endforeach()
  endforeach()

elseif(MODE STREQUAL "recipes")
  # vcpkg cannot be installed here (it downloads itself from GitHub), so the
  # port and the Conan recipe are checked against what the CMake install
  # exports: same target names, same components, same version.
  install_into("${WORK_DIR}/prefix" "${BINARY_DIR}")
  file(GLOB_RECURSE targets_file "${WORK_DIR}/prefix/*/ebbflow-targets.cmake")
  file(GLOB_RECURSE config_file "${WORK_DIR}/prefix/*/ebbflow-config.cmake")
  if(NOT targets_file OR NOT config_file)
    message(FATAL_ERROR "[${MODE}] the install has no ebbflow-targets.cmake / ebbflow-config.cmake")
  endif()
  file(READ "${targets_file}" text)
  string(REGEX MATCHALL "add_library\\(ebbflow::[a-z_]+ INTERFACE IMPORTED" m "${text}")
  set(exported "")
  foreach(x IN LISTS m)
    string(REGEX REPLACE "add_library\\(ebbflow::([a-z_]+) .*" "\\1" x "${x}")
    list(APPEND exported ${x})
  endforeach()
  file(STRINGS "${config_file}" known REGEX "^set\\(_ebbflow_known ")
  string(REGEX REPLACE "^set\\(_ebbflow_known ([^)]*)\\)" "\\1" known "${known}")
  separate_arguments(known UNIX_COMMAND "${known}")
  list(SORT known)
  set(all_targets ebbflow ${known})
  message(STATUS "[${MODE}] CMake install: components {${known}}, exported here {${exported}}")
  if(NOT "ebbflow" IN_LIST exported)
    message(FATAL_ERROR "[${MODE}] the install does not export ebbflow::ebbflow")
  endif()
  foreach(t IN LISTS exported)
    if(NOT t IN_LIST all_targets)
      message(FATAL_ERROR "[${MODE}] the install exports ebbflow::${t}, not a known component (${known})")
    endif()
  endforeach()
  # The recipes ship the header-only package: the compiled library is for
  # builds from source (the port configures with EBBFLOW_BUILD_COMPILED=OFF,
  # the Conan recipe is a header-library), so they name the backends only.
  list(REMOVE_ITEM known compiled)
  list(REMOVE_ITEM all_targets compiled)
  set(errors "")
  macro(same_set what got want)
    set(_g ${got})
    set(_w ${want})
    list(SORT _g)
    list(SORT _w)
    list(REMOVE_DUPLICATES _g)
    if(NOT "${_g}" STREQUAL "${_w}")
      string(APPEND errors "\n  ${what}: {${_g}} but the CMake install has {${_w}}")
    endif()
  endmacro()

  # vcpkg port
  set(port "${SOURCE_DIR}/cmake/vcpkg/ports/ebbflow")
  file(READ "${port}/vcpkg.json" json)
  string(JSON pv GET "${json}" version)
  if(NOT pv STREQUAL version)
    string(APPEND errors "\n  vcpkg.json version ${pv} != version.hpp ${version}")
  endif()
  string(JSON nf LENGTH "${json}" features)
  set(features "")
  math(EXPR last "${nf} - 1")
  foreach(i RANGE ${last})
    string(JSON f MEMBER "${json}" features ${i})
    list(APPEND features ${f})
  endforeach()
  same_set("vcpkg.json features" "${features}" "${known}")
  foreach(h vcpkg-cmake vcpkg-cmake-config)
    if(NOT json MATCHES "\"${h}\"")
      string(APPEND errors "\n  vcpkg.json lacks the host dependency ${h}")
    endif()
  endforeach()
  file(READ "${port}/usage" usage)
  string(REGEX MATCHALL "ebbflow::[a-z_]+" m "${usage}")
  string(REPLACE "ebbflow::" "" m "${m}")
  same_set("usage targets" "${m}" "${all_targets}")
  if(NOT usage MATCHES "find_package\\(ebbflow CONFIG REQUIRED")
    string(APPEND errors "\n  usage lacks find_package(ebbflow CONFIG REQUIRED ...)")
  endif()
  file(READ "${port}/portfile.cmake" portfile)
  set(mapped "")
  string(REGEX MATCHALL "\n[ \t]+[a-z]+[ \t]+EBBFLOW_WITH_[A-Z]+" m "${portfile}")
  foreach(x IN LISTS m)
    string(REGEX REPLACE "^[ \t\n]*([a-z]+)[ \t]+EBBFLOW_WITH_([A-Z]+)" "\\1;\\2" x "${x}")
    list(GET x 0 feat)
    list(GET x 1 opt)
    string(TOLOWER "${opt}" opt)
    if(NOT feat STREQUAL opt)
      string(APPEND errors "\n  portfile maps feature ${feat} onto EBBFLOW_WITH_${opt}")
    endif()
    list(APPEND mapped ${feat})
  endforeach()
  same_set("portfile feature -> EBBFLOW_WITH_* mapping" "${mapped}" "${known}")
  foreach(call vcpkg_cmake_configure vcpkg_cmake_install vcpkg_cmake_config_fixup "usage\" DESTINATION"
          "REMOVE_RECURSE \"\${CURRENT_PACKAGES_DIR}/debug\"")
    string(FIND "${portfile}" "${call}" at)
    if(at EQUAL -1)
      string(APPEND errors "\n  portfile lacks ${call}")
    endif()
  endforeach()
  # The port installs the config under share/cmake/ebbflow and fixes it up
  # from there; the CMake option it sets must exist.
  file(READ "${SOURCE_DIR}/CMakeLists.txt" top)
  file(READ "${SOURCE_DIR}/cmake/EbbflowCompiled.cmake" compiled_options)
  string(APPEND top "${compiled_options}")
  if(NOT portfile MATCHES "-DEBBFLOW_BUILD_COMPILED=OFF")
    string(APPEND errors "\n  portfile does not configure with -DEBBFLOW_BUILD_COMPILED=OFF (the port is header-only)")
  endif()
  foreach(opt IN ITEMS EBBFLOW_INSTALL_CMAKEDIR EBBFLOW_BUILD_COMPILED EBBFLOW_BUILD_TOOLS EBBFLOW_BUILD_BENCH EBBFLOW_BUILD_EXAMPLES EBBFLOW_ENABLE_CUDA)
    if(portfile MATCHES "-D${opt}=" AND NOT top MATCHES "${opt}")
      string(APPEND errors "\n  portfile sets ${opt}, which CMakeLists.txt does not know")
    endif()
  endforeach()

  # Conan recipe
  file(READ "${SOURCE_DIR}/conanfile.py" conan)
  string(REGEX MATCH "options = {[^}]*}" m "${conan}")
  string(REGEX MATCHALL "\"[a-z_]+\":" m "${m}")
  string(REGEX REPLACE "[\":]" "" m "${m}")
  same_set("conanfile.py options" "${m}" "${known}")
  # Every target it names (the string literals "ebbflow::<name>").
  string(REGEX MATCHALL "\"ebbflow::[a-z_]+\"" m "${conan}")
  string(REGEX REPLACE "\"ebbflow::([a-z_]+)\"" "\\1" m "${m}")
  list(REMOVE_ITEM m ebbflow_all)  # Conan's aggregate of every component
  same_set("conanfile.py component targets" "${m}" "${all_targets}")
  if(NOT conan MATCHES "include/ebbflow/version.hpp" OR NOT conan MATCHES "def set_version")
    string(APPEND errors "\n  conanfile.py does not take its version from include/ebbflow/version.hpp")
  endif()
  if(NOT conan MATCHES "package_type = \"header-library\"")
    string(APPEND errors "\n  conanfile.py is not a header-library")
  endif()
  if(errors)
    message(FATAL_ERROR "[${MODE}] packaging recipes disagree with the CMake install:${errors}")
  endif()
  message(STATUS "[${MODE}] vcpkg port and Conan recipe agree: targets {${all_targets}}, version ${version}")

else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
message(STATUS "[${MODE}] passed")
