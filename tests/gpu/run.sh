#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs every GPU test (CTest label `gpu`, i.e. every
# ebbflow_add_cuda_test of every component) and every GPU benchmark (any
# build target whose name ends in `_gpu_bench`), on a machine with a device.
# Results go to OUT_DIR: configure/build logs, ctest log + JUnit XML, one
# .txt and .jsonl per benchmark, and a summary. Bounded: the whole script is
# meant to finish within 10 minutes (compile ~ minutes, tests <= 300 s each
# by their own timeout, benchmarks 120 s each).
#
#   tests/gpu/run.sh OUT_DIR [CUDA_ARCHITECTURES=90]
set -uo pipefail
out=${1:?usage: $0 OUT_DIR [CUDA_ARCHITECTURES]}
arch=${2:-90}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
build=build/gpu
start=$(date +%s)
stamp() { echo "== [$(($(date +%s) - start))s] $*" | tee -a "$out/summary.txt"; }
jobs=$(nproc)

stamp "configure ($build, CUDA architectures $arch)"
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEBBFLOW_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DEBBFLOW_BUILD_EXAMPLES=OFF >"$out/configure.log" 2>&1; then
  stamp "configure FAILED (see configure.log)"
  exit 1
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true

mapfile -t tests < <(ctest --test-dir "$build" -L gpu -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *//p')
mapfile -t benches < <(cmake --build "$build" --target help 2>/dev/null | sed -n 's/^\([A-Za-z0-9_]*_gpu_bench\):.*/\1/p')
stamp "build ${#tests[@]} gpu tests, ${#benches[@]} gpu benchmarks"
if ((${#tests[@]} + ${#benches[@]} == 0)) || ! timeout 420 cmake --build "$build" -j "$jobs" --target "${tests[@]}" "${benches[@]}" >"$out/build.log" 2>&1; then
  stamp "build FAILED or nothing to build (see build.log)"
  exit 1
fi

stamp "ctest -L gpu"
timeout 300 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120 --output-junit "$out/gpu-tests.xml" \
  >"$out/ctest.log" 2>&1
rc=$?
tail -n 5 "$out/ctest.log" | tee -a "$out/summary.txt"

for b in "${benches[@]}"; do
  exe=$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)
  [[ -n $exe ]] || continue
  stamp "benchmark $b"
  timeout 120 "$exe" --json "$out/$b.jsonl" >"$out/$b.txt" 2>&1 || echo "$b exited with $?" | tee -a "$out/summary.txt"
done
stamp "done (ctest exit $rc)"
exit $rc
