#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Inter-host path on one machine: two network namespaces joined by a veth
# pair (optionally shaped with tc netem), one rank in each; ebbflow runs UCX
# over tcp (shared memory and single-copy disabled) against Gloo over the
# same link. Usage (root): bench/allreduce/netns_allreduce.sh [build dir] [netem args...]
#   e.g. bench/allreduce/netns_allreduce.sh build/release rate 1gbit delay 0.1ms
set -euo pipefail
build=${1:-build/release}
shift || true
a=ebbflow-bench-a b=ebbflow-bench-b
# shellcheck source=scripts/netns.sh
source "$(dirname "$0")/../../scripts/netns.sh"
netns_require
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
cleanup
ip netns add "$a"
ip netns add "$b"
ip link add ebbflow-va type veth peer name ebbflow-vb
ip link set ebbflow-va netns "$a"
ip link set ebbflow-vb netns "$b"
ip -n "$a" link set ebbflow-va name ebb0
ip -n "$b" link set ebbflow-vb name ebb0
ip -n "$a" addr add 10.231.0.1/24 dev ebb0
ip -n "$b" addr add 10.231.0.2/24 dev ebb0
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; ip -n "$ns" link set ebb0 up; done
if (($#)); then
  for ns in "$a" "$b"; do ip netns exec "$ns" tc qdisc add dev ebb0 root netem "$@"; done
fi
python3 "$(dirname "$0")/run_allreduce_bench.py" --build "$build" --ranks 2 --netns "$a=10.231.0.1,$b=10.231.0.2" \
  --rounds "${ROUNDS:-2}" --sizes "${SIZES:-4096,65536,1048576,16777216,67108864}" --only ebbflow,gloo_ring,gloo_hd
