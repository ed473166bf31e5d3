#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's main job: installs what is missing (LibTorch, the digits data
# set, gnuplot), builds the LibTorch example and the launcher, and runs an
# elastic, heterogeneous training of an MLP on the digits with ebbflow-run:
# 4 workers of different emulated speeds, one more joins part-way, one is
# killed part-way; training goes on to its target accuracy. Then it runs the
# same global batches in one process for comparison, draws the plot and
# prints a summary. Output: report/ (metrics.csv, metrics.jsonl, events.csv,
# samples-*.log, reference.csv, demo.png, run.log).
# Environment: DEMO_STEPS, DEMO_TARGET (accuracy, default 0.95), DEMO_REPORT.
set -euo pipefail
cd "$(dirname "$0")/.."
now() { date +%s.%N; }
start=$(now)
steps=${DEMO_STEPS:-400}
target=${DEMO_TARGET:-0.95}
report=${DEMO_REPORT:-report}

scripts/deps.sh demo
echo "ebbflow demo: building the launcher and the LibTorch example (about a minute the first time)..."
cmake --preset release >/dev/null
cmake --build build/release --target ebbflow-run torch_elastic -j "$(nproc)" >/dev/null
bin=build/release/examples/torch_elastic/torch_elastic
run=build/release/tools/ebbflow-run/ebbflow-run
[[ -x $bin ]] || { echo "ebbflow demo: $bin was not built (is libtorch-dev installed?)" >&2; exit 1; }
built=$(now)

rm -rf "$report"
mkdir -p "$report"
# Emulated devices: worker k is slowdowns[k] times slower (the joiner, worker 4, is a fast one).
train_args=(--steps "$steps" --batch 128 --sample-us 2000 --step-us 4000 --slowdowns 1,1.5,2,3,1 --report "$report")

echo "ebbflow demo: single-process run of the same global batches (for comparison)..."
"$bin" --reference "${train_args[@]}" >"$report/reference.log"

echo "ebbflow demo: 4 workers (1x, 1.5x, 2x, 3x slower); worker 4 joins at 10 s; worker 2 is killed at 22 s"
if [[ -t 1 ]]; then view=(--progress); else view=(--log-every 50); fi
export EBBFLOW_LEASE_MS=1000
set +e
if [[ -t 1 ]]; then
  # The coordinator draws the progress line on the terminal; the workers' own output goes to run.log.
  "$run" -n 4 --elastic --timeout 150 --add 10 --kill 22:2 -- "$bin" "${train_args[@]}" "${view[@]}" \
    >"$report/run.log" 2>&1
else
  "$run" -n 4 --elastic --timeout 150 --add 10 --kill 22:2 -- "$bin" "${train_args[@]}" "${view[@]}" 2>&1 |
    tee "$report/run.log" | grep -v " warn: "
fi
status=${PIPESTATUS[0]}
set -e
trained=$(now)
[[ $status -eq 0 ]] || { echo "ebbflow demo: the elastic run failed (status $status); see $report/run.log" >&2; exit "$status"; }

t0=$(awk -F, 'NR == 2 { print $1; exit }' "$report/events.csv")
gnuplot -e "dir='$report'; t0=$t0; target=$target" examples/torch_elastic/plot.gp
done_at=$(now)

# The one-screen summary.
json() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }
acc=$(json "$report/result.json" test_acc)
ref=$(json "$report/reference.json" test_acc)
awk -F, -v acc="$acc" -v ref="$ref" -v target="$target" -v steps="$steps" \
    -v start="$start" -v built="$built" -v trained="$trained" -v done_at="$done_at" \
    -v events="$report/events.csv" -v report="$report" '
  BEGIN {
    while ((getline line < events) > 0) {
      if (line ~ /^time_s/) continue
      split(line, e, ",")
      if (e[3] == "initial") { t0 = e[1]; continue }
      changes = changes sprintf("\n    %6.1f s  step %4d  %-8s %d -> %d workers (ready after %.0f ms)", e[1] - t0, e[2], e[3], e[4], e[5], e[7])
    }
  }
  FNR == 1 { next }
  {
    g = $5; if (!(g in n)) order[++phases] = g
    n[g]++; r[g] += $9; w[g] = $6
    if (!(g in first)) first[g] = $1
    split($10, b, ";"); sum = 0; for (i in b) sum += b[i]
    if (sum == 128) plan[g] = $10
    if ($8 != "" && $8 >= target && !hit) hit = $1
  }
  END {
    printf "\n================================ ebbflow demo ================================\n"
    printf "  LibTorch MLP on the 8x8 digits, torch::optim::SGD (momentum 0.9), %d steps,\n", steps
    printf "  global batch 128 split by the planner over workers of emulated speeds 1x..3x\n"
    printf "  membership changes:%s\n", changes
    printf "  phases: throughput (mean of the last-10-step rate) and the planner split of 128 (rank order)\n"
    for (k = 1; k <= phases; k++) { g = order[k]
      printf "    from step %4d: %d workers %6.0f samples/s   batches %s\n", first[g] - 1, w[g], r[g] / n[g], plan[g] }
    printf "  test accuracy: elastic %.2f %%, single process %.2f %% (difference %+.2f points)\n", 100 * acc, 100 * ref, 100 * (acc - ref)
    if (hit) printf "  target %.0f %% first reached at step %d: %s\n", 100 * target, hit, (acc >= target ? "reached" : "NOT held at the end")
    else printf "  target %.0f %%: NOT reached\n", 100 * target
    printf "  time: build %.0f s, runs %.0f s, all %.0f s\n", built - start, trained - built, done_at - start
    printf "  report: %s/{metrics.csv,metrics.jsonl,events.csv,demo.png,run.log}\n", report
    printf "==============================================================================\n"
  }' "$report/metrics.csv"
awk -v acc="$acc" -v target="$target" 'BEGIN { exit !(acc >= target) }' || exit 3
