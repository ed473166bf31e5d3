#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a GoogleTest binary as N shards at once (GTEST_TOTAL_SHARDS and
# GTEST_SHARD_INDEX) and fails when any shard fails. For tests whose cases
# mostly wait on other processes (leases, deadlines): the shards overlap the
# waits. Each shard's output is printed after it ends, under its own header.
# A TERM or INT (ctest's timeout) is passed on to every shard.
#
#   tests/run_shards.sh N BINARY [ARGS...]
set -uo pipefail
n=${1:?usage: $0 N BINARY [ARGS...]}
shift
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_shards.sh: N must be a positive integer, got '$n'" >&2; exit 2; }
[[ -x ${1:-} ]] || { echo "run_shards.sh: '${1:-}' is not an executable" >&2; exit 2; }

logs=$(mktemp -d)
pids=()
# shellcheck disable=SC2317  # called by the trap below
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait
  rm -rf "$logs"
  exit 143
}
trap stop TERM INT
trap 'rm -rf "$logs"' EXIT

for ((i = 0; i < n; ++i)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$@" >"$logs/$i.log" 2>&1 &
  pids+=($!)
done
rc=0
summary=()
for ((i = 0; i < n; ++i)); do
  wait "${pids[i]}"
  s=$?
  echo "==== shard $((i + 1)) of $n (exit $s)"
  cat "$logs/$i.log"
  summary+=("shard $((i + 1)): exit $s")
  ((s == 0)) || rc=1
done
echo "==== ${summary[*]}"
exit "$rc"
