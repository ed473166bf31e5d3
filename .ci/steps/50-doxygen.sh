#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# API reference from the //! comments of the public headers; any warning
# (an undocumented public entity, a broken doc command) fails the step.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v doxygen >/dev/null || EBBFLOW_EXTRA_PACKAGES=doxygen scripts/deps.sh build
export EBBFLOW_DOCS_OUT=build/docs
rm -rf "$EBBFLOW_DOCS_OUT"
mkdir -p "$EBBFLOW_DOCS_OUT"
timeout 300 doxygen docs/Doxyfile
echo "== API reference: $EBBFLOW_DOCS_OUT/html/index.html"
