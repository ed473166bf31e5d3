#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Accuracy of the elastic heterogeneous run per --codec vs the single-process run
# (docs/benchmarks/torch.md). Prints one markdown table row per codec.
# usage: codec-bench.sh BUILD_DIR OUT_DIR codecs...
set -euo pipefail
b=$1; out=$2; shift 2
bin=$b/examples/torch_elastic/torch_elastic; run=$b/tools/ebbflow-run/ebbflow-run
rm -rf "$out"; mkdir -p "$out"
common=(--steps 400 --batch 128 --sample-us 300 --step-us 1000 --slowdowns 1,1.5,2,3,1)
"$bin" --reference "${common[@]}" --report "$out/ref" > /dev/null
ref=$(sed -n 's/.*"test_acc":\([^,]*\).*/\1/p' "$out/ref/reference.json")
for c in "$@"; do
  EBBFLOW_LEASE_MS=500 timeout 120 "$run" -n 4 --elastic --add 2 --kill 4:2 -- "$bin" "${common[@]}" --codec "$c" --report "$out/$c" > "$out/$c.log" 2>&1
  acc=$(sed -n 's/.*"test_acc":\([^,]*\).*/\1/p' "$out/$c/result.json")
  ev=$(awk -F, 'NR>1 {printf "%s%s(%d->%d)@%d", s, $3, $4, $5, $2; s=" "}' "$out/$c/events.csv")
  wall=$(sed -n 's/.*"wall_s":\([^,]*\).*/\1/p' "$out/$c/result.json")
  awk -v c="$c" -v a="$acc" -v r="$ref" -v w="$wall" -v ev="$ev" 'BEGIN { printf "| %s | %.2f | %.2f | %+.2f | %.1f | %s |\n", c, 100*a, 100*r, 100*(a-r), w, ev }'
done
