#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The equivalence property across two "hosts": heterogeneous workers (1, 2
# and 3 times slower) in two network namespaces joined by a veth pair (UCX
# over tcp only, no shared memory between them), with the events of one
# SCENARIO while training:
#   mixed (default): two joins, a graceful leave, a SIGKILL and a hung
#     coordinator (SIGSTOP, then SIGCONT: it rejoins);
#   kill-at-once: the 4 workers of the second namespace (of 8) SIGKILLed at
#     the same moment, with a 20 s lease. No survivor may wait for a dead
#     member's lease: no survivor shares a host with the dead, and the
#     first transport error revokes the others' transports before they see
#     theirs; the launcher saw each death and told the store.
# The parameters must equal a single-process run over the same global
# batches, and the per-process traces must show every sample of every
# committed step trained exactly once, with the same sums and state on every
# member (check_trace.py). Needs root and `ip netns`; exits 77 (skipped),
# saying why, where namespaces cannot be made or entered (netns_require).
# Usage: netns_equivalence.sh EBBFLOW_RUN ELASTIC_TRAIN [SCENARIO]
set -euo pipefail
run=$(realpath "$1") train=$(realpath "$2") scenario=${3:-mixed} here=$(cd "$(dirname "$0")" && pwd)
. "$here/job_checks.sh"
case $scenario in
  mixed) steps=1000 lease=500 events=(-n 3 --add 0.5:2 --leave 1.0:1 --kill 1.5:2 --add 2.0 --stop 2.5:0:1.5) ;;
  kill-at-once) steps=400 lease=20000 events=(-n 8 --kill 0.5:1 --kill 0.5:3 --kill 0.5:5 --kill 0.5:7) ;;
  *)
    echo "unknown scenario '$scenario' (mixed, kill-at-once)" >&2
    exit 2
    ;;
esac
# shellcheck source=scripts/netns.sh
source "$here/../../scripts/netns.sh"
netns_require  # before anything is made: a skip leaves nothing behind
id=$$
a=ebbflow-eq$id-a b=ebbflow-eq$id-b va=efq${id}a vb=efq${id}b
net=10.234.$((id % 250)).
work=$(mktemp -d /tmp/ebbflow-netns-eq.XXXXXX)
cleanup() {
  local rc=$?
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  # A failed run keeps its logs, traces and parameters for a look.
  if [[ $rc -eq 0 || $rc -eq 77 ]]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT INT TERM
netns_pair "$a" "$b" "$va" "$vb" "$net"
netns_wrapper "$work/wrap" "$a" "$b"  # even worker ids in a, odd in b
cd "$work"
# Heterogeneous: worker k is 1, 2 or 3 times slower, so slices are unequal.
common=(--steps "$steps" --sample-us 150 --step-us 1500 --slowdowns 1,2,3)
# The launcher and its store live in the first namespace.
if ! ip netns exec "$a" timeout 240 env EBBFLOW_LEASE_MS="$lease" "$run" --store "${net}1:0" \
  --event-clock training "${events[@]}" -- \
  "$work/wrap" "$train" "${common[@]}" --params-out elastic.bin --trace . >job.log 2>&1; then
  echo "FAIL: the elastic job failed"
  tail -40 job.log
  exit 1
fi
"$train" "${common[@]}" --reference --params-out ref.bin --trace . >ref.log 2>&1
# Every event took place (a test whose events missed the job proves nothing).
expect() {  # expect "LINE[|ALTERNATIVE...]"...: each is in the job's output
  local what alternatives
  for what in "$@"; do
    IFS='|' read -ra alternatives <<<"$what"
    if ! grep -qF "${alternatives[@]/#/-e}" job.log; then
      echo "FAIL: no '$what' in the job's output"
      grep -F "world changed" job.log | head -20
      exit 1
    fi
  done
}
if [[ $scenario == mixed ]]; then
  # On a loaded host the leave may still be under way when the kill lands:
  # the recovery then drops the leaver and the dead worker at once (5 -> 3);
  # and the two newcomers may register further apart than the admission
  # delay and join one at a time (3 -> 4 -> 5).
  expect "world changed (join): 3 -> 5|world changed (join): 4 -> 5" "world changed (leave): 5 -> 4|world changed (failure): 5 -> 3" \
    "world changed (failure): 4 -> 3|world changed (failure): 5 -> 3" \
    "world changed (join): 3 -> 4" "sent no heartbeat for EBBFLOW_LEASE_MS=500 ms" "left out of generation"
  # Endpoints to the hung worker close by force: no close waits for it.
  if grep -F "endpoint close(s)" job.log; then
    echo "FAIL: an endpoint close waited for a peer that does not answer"
    exit 1
  fi
else
  # The launcher's four SIGKILLs are not one instant: a recovery may form
  # before the last of them lands, and a second one ends at 4 too.
  expect "world changed (failure): 8 -> 4|world changed (failure): 7 -> 4|world changed (failure): 6 -> 4|world changed (failure): 5 -> 4"
  # Each survivor's "ready after": from its failed step to the next
  # generation's first. The lease is 20 s; half of it is far beyond a
  # recovery that does not wait for one.
  worst=$(grep -o 'world changed (failure): [0-9]* -> [0-9]* workers at step [0-9]*, ready after [0-9.]* ms' job.log |
    awk '{print $(NF-1)}' | sort -g | tail -1)
  echo "survivors' worst wait for the failure: $worst ms (lease $lease ms)"
  if ! awk -v w="$worst" 'BEGIN {exit !(w != "" && w < 10000)}'; then
    echo "FAIL: a survivor waited for a dead member's lease"
    grep -F -e "world changed" -e "is gone" -e "heartbeat" job.log | head -30
    exit 1
  fi
fi
check_job "$steps" --min-spread 3  # with reference.txt: also the first drift
