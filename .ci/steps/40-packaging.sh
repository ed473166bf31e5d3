#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packaging checks beyond the ctest ones (which scripts/test.sh already ran):
# the committed generated headers are fresh, and `conan create` with its
# test_package passes, with Conan from PyPI in a venv (kept in build/ and
# reused) and a throw-away CONAN_HOME with a detected profile. No ConanCenter:
# the recipe uses the system's libraries, so --no-remote. build_type=Debug: the
# test_package programs compile unoptimised (they prove the packaging, not speed).
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)

cmake -DCHECK=ON -P cmake/amalgamate.cmake

venv=build/conan-venv
if [[ ! -x $venv/bin/conan ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'conan>=2.0,<3'
fi
conan=$venv/bin/conan
CONAN_HOME=$(mktemp -d)
export CONAN_HOME
trap 'rm -rf "$CONAN_HOME"' EXIT
"$conan" profile detect >/dev/null 2>&1
# Default options (asio), then the UCX component without asio.
for opts in "" "-o &:ucx=True -o &:asio=False"; do
  echo "== conan create . ${opts:-(default options)}"
  # shellcheck disable=SC2086
  timeout 600 "$conan" create . --build=missing --no-remote -s compiler.cppstd=20 -s build_type=Debug $opts
done
echo "== packaging step took $(( $(date +%s) - start )) s"
