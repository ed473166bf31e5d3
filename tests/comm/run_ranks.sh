#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs N ranks of PROGRAM on this host (EBBFLOW_RANK / EBBFLOW_WORLD_SIZE,
# addresses through a fresh EBBFLOW_ADDR_DIR); fails when any rank fails.
#   run_ranks.sh N PROGRAM [ARGS...]
set -uo pipefail
n=$1
shift
dir=$(mktemp -d /tmp/ebbflow-ranks.XXXXXX)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((r = 0; r < n; ++r)); do
  EBBFLOW_RANK=$r EBBFLOW_WORLD_SIZE=$n EBBFLOW_LOCAL_RANK=$r EBBFLOW_ADDR_DIR=$dir "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
