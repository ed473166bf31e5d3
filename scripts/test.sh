#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's test command: installs what is missing, builds the release
# preset (tests, benchmarks, examples, CUDA translation units when nvcc is
# present) and runs every test. Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
jobs=$(nproc)
# In CI a warning fails the build: the headers' warnings are users' warnings.
werror=OFF
[[ -n "${CI:-}" ]] && werror=ON
cmake --preset release -DEBBFLOW_WERROR=$werror >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs" "$@"
