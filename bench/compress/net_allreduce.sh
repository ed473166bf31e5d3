#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compressed vs dense allreduce, 4 processes in 4 network namespaces joined by
# veth pairs to a bridge (in a fifth "switch" namespace), every veth end
# shaped with `tc netem rate R delay 0.1ms` (or tbf at rate R where the
# kernel lacks netem). Runs once per rate; rank 0's
# table goes to stdout and to OUT/net_allreduce_<rate>.txt (+ .jsonl).
# Needs root (ip netns). Everything created is removed on exit (trap).
#
#   bench/compress/net_allreduce.sh [BUILD_DIR=build/release] [OUT=.]
#   env: RATES="1gbit 10gbit" MIB=32 ITERS=5
set -euo pipefail
# shellcheck source=scripts/netns.sh
source "$(dirname "$0")/../../scripts/netns.sh"
netns_require
build=${1:-build/release}
out=${2:-.}
bin=$(realpath "$build/bench/compress/compress_net_allreduce")
rates=${RATES:-"1gbit 10gbit"}
mib=${MIB:-32}
iters=${ITERS:-5}
p=4
pre=efcx$$
mkdir -p "$out"

cleanup() {
  for ((i = 0; i < p; ++i)); do ip netns del "${pre}r$i" 2>/dev/null || true; done
  ip netns del "${pre}sw" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

ip netns add "${pre}sw"
ip -n "${pre}sw" link add br0 type bridge
ip -n "${pre}sw" link set br0 up
addrs=""
for ((i = 0; i < p; ++i)); do
  ns="${pre}r$i"
  ip netns add "$ns"
  ip link add "${pre}a$i" type veth peer name "${pre}b$i"
  ip link set "${pre}a$i" netns "$ns"
  ip link set "${pre}b$i" netns "${pre}sw"
  ip -n "$ns" link set "${pre}a$i" name eth0
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "${pre}sw" link set "${pre}b$i" master br0
  ip -n "${pre}sw" link set "${pre}b$i" up
  addrs+="${addrs:+,}10.77.0.$((i + 1)):$((47000 + i))"
done

# netem when the kernel has it; otherwise a token bucket (tbf) at the same
# rate (some kernels, e.g. Firecracker guests, ship without sch_netem).
qdisc_for() {
  if [[ $qkind == netem ]]; then echo "netem rate $1 delay 0.1ms limit 100000"
  else
    local burst=512kb
    [[ $1 == 10gbit ]] && burst=4mb
    echo "tbf rate $1 burst $burst latency 100ms"
  fi
}
qkind=netem
ip netns exec "${pre}sw" tc qdisc replace dev lo root netem delay 0.1ms 2>/dev/null || qkind=tbf
ip netns exec "${pre}sw" tc qdisc del dev lo root 2>/dev/null || true
shape() {  # both directions of every link
  local q
  q=$(qdisc_for "$1")
  for ((i = 0; i < p; ++i)); do
    # shellcheck disable=SC2086
    ip netns exec "${pre}r$i" tc qdisc replace dev eth0 root $q
    # shellcheck disable=SC2086
    ip netns exec "${pre}sw" tc qdisc replace dev "${pre}b$i" root $q
  done
  echo "# links: tc qdisc $q (both directions)"
}

for rate in $rates; do
  shape "$rate"
  pids=()
  for ((i = 1; i < p; ++i)); do
    timeout 300 ip netns exec "${pre}r$i" "$bin" --rank "$i" --addrs "$addrs" --mib "$mib" --iters "$iters" >/dev/null &
    pids+=($!)
  done
  timeout 300 ip netns exec "${pre}r0" "$bin" --rank 0 --addrs "$addrs" --mib "$mib" --iters "$iters" \
    --label "4 ranks, $(qdisc_for "$rate")" --json "$out/net_allreduce_$rate.jsonl" | tee "$out/net_allreduce_$rate.txt"
  for pid in "${pids[@]}"; do wait "$pid"; done
done
