# SPDX-License-Identifier: Apache-2.0
# Builds and runs the same consumer programs as the CMake packaging tests
# (tests/cmake/consumer/), against the Conan package.
import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout
from conan.tools.files import load


class EbbflowTestPackage(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        dep = self.dependencies["ebbflow"]
        cmake = CMake(self)
        cmake.configure(variables={
            "EBBFLOW_EXPECTED_VERSION": str(dep.ref.version),
            "EBBFLOW_TEST_ASIO": bool(dep.options.asio),
            "EBBFLOW_TEST_UCX": bool(dep.options.ucx),
        })
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        programs = load(self, os.path.join(self.build_folder, "consumer-programs.txt")).split()
        names = {os.path.basename(p) for p in programs}
        want = {"consumer_core"}
        dep = self.dependencies["ebbflow"]
        if dep.options.asio:
            want.add("consumer_asio")
        if dep.options.ucx:
            want.add("consumer_ucx")
        assert want <= names, f"consumer programs missing: {sorted(want - names)}"
        for p in programs:
            self.run(p, env="conanrun")
