# SPDX-License-Identifier: Apache-2.0
# Conan 2 recipe for ebbflow (header-only). The optional components use the
# system's libraries, not ConanCenter packages: Debian's libboost-dev and
# libssl-dev (asio), libucx-dev (ucx), and the CUDA toolkit with its NCCL
# (cuda, nccl; root from the conf user.ebbflow:cuda_root, else $CUDA_HOME,
# else /usr/local/cuda).
#
#   conan create . --build=missing -s compiler.cppstd=20 [-o "&:ucx=True"]
#
# CMake consumers: find_package(ebbflow CONFIG REQUIRED) and link
# ebbflow::ebbflow (core) plus ebbflow::asio / ::ucx / ::cuda / ::nccl, the
# same target names as the CMake install.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout
from conan.tools.system.package_manager import Apt

required_conan_version = ">=2.0"


class EbbflowConan(ConanFile):
    name = "ebbflow"
    description = "Elastic, heterogeneity-aware data-parallel training for C++ loops (header-only)"
    license = "Apache-2.0"
    topics = ("distributed-training", "allreduce", "ucx", "nccl", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"asio": [True, False], "ucx": [True, False], "cuda": [True, False], "nccl": [True, False]}
    default_options = {"asio": True, "ucx": False, "cuda": False, "nccl": False}
    # version.hpp is the one source of truth for the version (set_version).
    exports = "include/ebbflow/version.hpp"
    exports_sources = "include/*", "single_include/*", "LICENSE*", "README.md", "CHANGELOG.md"
    no_copy_source = True

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "include", "ebbflow", "version.hpp"))
        m = re.search(r'#define\s+EBBFLOW_VERSION_STRING\s+"([^"]+)"', text)
        if not m:
            raise ConanInvalidConfiguration("EBBFLOW_VERSION_STRING not found in include/ebbflow/version.hpp")
        self.version = m.group(1)

    def layout(self):
        basic_layout(self, src_folder=".")

    def configure(self):
        if self.options.nccl and not self.options.cuda:
            raise ConanInvalidConfiguration("ebbflow: option nccl needs cuda=True")

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def system_requirements(self):
        # With Conan's default tools.system.package_manager:mode=check this
        # only reports missing Debian packages; mode=install installs them.
        pkgs = []
        if self.options.asio:
            pkgs += ["libboost-dev", "libssl-dev"]
        if self.options.ucx:
            pkgs += ["libucx-dev"]
        if pkgs:
            Apt(self).install(pkgs, update=False, check=True)

    def package_id(self):
        # The headers are the same for every configuration and option set.
        self.info.clear()

    def package(self):
        for pattern in ("*.hpp", "*.cuh"):
            copy(self, pattern, os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        copy(self, "ebbflow.hpp", os.path.join(self.source_folder, "single_include", "ebbflow"),
             os.path.join(self.package_folder, "single_include", "ebbflow"))
        copy(self, "LICENSE*", self.source_folder, os.path.join(self.package_folder, "licenses"))

    def _cuda_root(self):
        return self.conf.get("user.ebbflow:cuda_root") or os.environ.get("CUDA_HOME") or "/usr/local/cuda"

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "ebbflow")
        # The aggregate target of every component; consumers link the
        # components they use, as with the CMake install.
        self.cpp_info.set_property("cmake_target_name", "ebbflow::ebbflow_all")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.includedirs = []

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "ebbflow::ebbflow")
        core.includedirs = ["include"]
        core.bindirs = []
        core.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]

        if self.options.asio:
            self._component("ebbflow::asio", ["core"], ["ssl", "crypto"])  # Boost.Asio is header-only; TLS and HMAC from OpenSSL
        if self.options.ucx:
            self._component("ebbflow::ucx", ["core"], ["ucp", "uct", "ucs"])
        if self.options.cuda:
            self._component("ebbflow::cuda", ["core"], ["cudart"], cuda_root=self._cuda_root())
        if self.options.nccl:
            self._component("ebbflow::nccl", ["cuda"], ["nccl"], cuda_root=self._cuda_root())

    def _component(self, target, requires, system_libs, cuda_root=None):
        """The optional component behind CMake target `target` (ebbflow::<component>): the
        system libraries it links, and with `cuda_root`, the toolkit's headers and libraries."""
        c = self.cpp_info.components[target.split("::")[1]]
        c.set_property("cmake_target_name", target)
        c.requires = requires
        c.system_libs = system_libs
        c.bindirs = []
        c.includedirs = [os.path.join(cuda_root, "include")] if cuda_root else []
        c.libdirs = [os.path.join(cuda_root, "lib64")] if cuda_root else []
