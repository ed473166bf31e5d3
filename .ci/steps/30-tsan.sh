#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ThreadSanitizer: builds only the test executables that carry the `tsan`
# label (thread-heavy, fast unit tests) and runs them with the tsan preset.
# Bounded: no benchmarks, no CUDA, only the labelled targets.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset tsan >/dev/null
# Test names are target names (ebbflow_add_test); the preset filters label tsan.
mapfile -t targets < <(ctest --preset tsan -N | sed -n 's/^ *Test *#[0-9]*: *\([A-Za-z0-9_.-]*\).*/\1/p')
if [ "${#targets[@]}" -eq 0 ]; then
  echo "no tests labelled tsan" >&2
  exit 1
fi
echo "tsan targets: ${targets[*]}"
cmake --build build/tsan -j "$(nproc)" --target "${targets[@]}"
# halt_on_error: a race fails the test instead of only printing a report.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" ctest --preset tsan -j "$(nproc)"
