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
            c = self.cpp_info.components["asio"]
            c.set_property("cmake_target_name", "ebbflow::asio")
            c.requires = ["core"]
            c.system_libs = ["crypto"]  # Boost.Asio is header-only; HMAC from OpenSSL
            c.bindirs, c.libdirs, c.includedirs = [], [], []
        if self.options.ucx:
            c = self.cpp_info.components["ucx"]
            c.set_property("cmake_target_name", "ebbflow::ucx")
            c.requires = ["core"]
            c.system_libs = ["ucp", "uct", "ucs"]
            c.bindirs, c.libdirs, c.includedirs = [], [], []
        if self.options.cuda:
            root = self._cuda_root()
            c = self.cpp_info.components["cuda"]
            c.set_property("cmake_target_name", "ebbflow::cuda")
            c.requires = ["core"]
            c.includedirs = [os.path.join(root, "include")]
            c.libdirs = [os.path.join(root, "lib64")]
            c.system_libs = ["cudart"]
            c.bindirs = []
        if self.options.nccl:
            root = self._cuda_root()
            c = self.cpp_info.components["nccl"]
            c.set_property("cmake_target_name", "ebbflow::nccl")
            c.requires = ["cuda"]
            c.includedirs = [os.path.join(root, "include")]
            c.libdirs = [os.path.join(root, "lib64")]
            c.system_libs = ["nccl"]
            c.bindirs = []
