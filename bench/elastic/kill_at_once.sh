#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Several workers SIGKILLed at the same moment: 8 workers, workers 1, 4 and 6
# killed 0.5 s into training. Prints, per round and build, the survivors'
# worst stall for that failure ("ready after" of "world changed (failure)"),
# then each build's median, and with two builds the ratio of the medians.
# Builds alternate within a round (A B A B ...), so they share the machine's
# state. With NETNS=1 (root), the workers run in two network namespaces as
# two hosts (even worker ids in one, odd in the other; UCX over tcp), and
# every worker of the second, 1, 3, 5 and 7, is killed: a host's workers
# dying together while its launcher lives. KILL="..." names other workers.
# Usage:
#   [NETNS=1] [KILL="1 4 6"] bench/elastic/kill_at_once.sh [ROUNDS] [LEASE_MS] BUILD [BUILD2]
#   e.g. bench/elastic/kill_at_once.sh 6 1000 /tmp/old/build/release build/release
set -euo pipefail
rounds=${1:-6}
lease=${2:-1000}
shift 2 || true
builds=()
for b in "${@:-build/release}"; do builds+=("$(realpath "$b")"); done
if [[ ${NETNS:-0} == 1 ]]; then
  # shellcheck source=scripts/netns.sh
  source "$(dirname "$0")/../../scripts/netns.sh"
  netns_require  # before anything is made
fi
work=$(mktemp -d /tmp/ebbflow-kill-at-once.XXXXXX)
prefix=() wrap=() store=()
if [[ ${NETNS:-0} == 1 ]]; then
  kill_ids=${KILL:-1 3 5 7}
  id=$$
  ns_a=ebbflow-ko$id-a ns_b=ebbflow-ko$id-b
  trap 'ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; rm -rf "$work"' EXIT INT TERM
  netns_pair "$ns_a" "$ns_b" "eko${id}a" "eko${id}b" "10.236.$((id % 250))."
  netns_wrapper "$work/wrap" "$ns_a" "$ns_b"
  prefix=(ip netns exec "$ns_a") wrap=("$work/wrap") store=(--store "10.236.$((id % 250)).1:0")
else
  kill_ids=${KILL:-1 4 6}
  trap 'rm -rf "$work"' EXIT INT TERM
fi
kills=()
for k in $kill_ids; do kills+=(--kill "0.5:$k"); done
declare -A all
for ((r = 1; r <= rounds; r++)); do
  for b in "${builds[@]}"; do
    out="$work/out.txt"
    (cd "$work" && "${prefix[@]}" timeout 120 env EBBFLOW_LEASE_MS="$lease" "$b/tools/ebbflow-run/ebbflow-run" \
      "${store[@]}" --event-clock training -n 8 "${kills[@]}" -- \
      "${wrap[@]}" "$b/examples/elastic_train/elastic_train" --steps 400 --sample-us 150 --step-us 1500 >"$out" 2>&1) ||
      { echo "round $r, $b: the job failed" >&2; tail -20 "$out" >&2; exit 1; }
    worst=$(grep -o 'failure): 8 -> [0-9]* workers at step [0-9]*, ready after [0-9.]* ms' "$out" |
      awk '{print $(NF-1)}' | sort -g | tail -1)
    echo "round $r  $b  worst survivor ready after ${worst} ms"
    all[$b]+="$worst "
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
for b in "${builds[@]}"; do echo "median  $b  $(echo "${all[$b]}" | median) ms (lease $lease ms, $rounds rounds)"; done
if ((${#builds[@]} == 2)); then
  a=$(echo "${all[${builds[0]}]}" | median) c=$(echo "${all[${builds[1]}]}" | median)
  awk -v a="$a" -v c="$c" 'BEGIN {printf "ratio   first / second: %.1fx\n", a / c}'
fi
