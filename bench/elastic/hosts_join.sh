#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A join of N newcomers into N workers, each worker on a "host" of its own:
# one network namespace per worker, all on one bridge, each host's link
# shaped to RATE both ways (tc tbf), UCX over tcp. Prints each survivor's
# stall at the switch (the state transfer to the newcomers) and the worst.
# The training state is the example's MLP at --hidden H: parameters and
# momentum, 2 x 4 x (75 H + 10) bytes. Usage (root):
#   bench/elastic/hosts_join.sh [build dir] [N] [RATE] [H] [train binary]
#   e.g. bench/elastic/hosts_join.sh build/release 4 400mbit 20000
set -euo pipefail
# shellcheck source=scripts/netns.sh
source "$(dirname "$0")/../../scripts/netns.sh"
netns_require
build=${1:-build/release}
n=${2:-4}
rate=${3:-400mbit}
hidden=${4:-20000}
train=${5:-$build/examples/elastic_train/elastic_train}
run=$build/tools/ebbflow-run/ebbflow-run
hosts=$((2 * n))
br=ebbflow-hbr
drop_hosts() {
  for ((i = 0; i < hosts; i++)); do ip netns del "ebbflow-h$i" 2>/dev/null || true; done
  ip link del "$br" 2>/dev/null || true
}
drop_hosts
work=$(mktemp -d /tmp/ebbflow-hosts.XXXXXX)
trap 'drop_hosts; rm -rf "$work"' EXIT INT TERM
ip link add "$br" type bridge
ip addr add 10.233.0.254/24 dev "$br"
ip link set "$br" up
for ((i = 0; i < hosts; i++)); do
  netns_host "ebbflow-h$i" "ebbflow-hv$i" "ebbflow-hp$i" "10.233.0.$((i + 1))/24"
  ip link set "ebbflow-hp$i" master "$br" up
  # The host's link: RATE out (its veth) and RATE in (its bridge port).
  ip netns exec "ebbflow-h$i" tc qdisc add dev "ebbflow-hv$i" root tbf rate "$rate" burst 256kb latency 50ms
  tc qdisc add dev "ebbflow-hp$i" root tbf rate "$rate" burst 256kb latency 50ms
done
ns=()
for ((i = 0; i < hosts; i++)); do ns+=("ebbflow-h$i"); done
netns_wrapper "$work/wrap" "${ns[@]}"  # worker ID on host ID
cd "$work"
# The launcher and its store stay in this namespace, on the bridge.
EBBFLOW_LOG=info timeout 600 "$OLDPWD/$run" --store 10.233.0.254:0 -n "$n" --elastic --add "3:$n" -- \
  "$work/wrap" "$(cd "$OLDPWD" && realpath "$train")" --steps 60 --hidden "$hidden" --step-us 20000 >log.txt 2>&1 ||
  { tail -20 log.txt; exit 1; }
grep -E "sent state|world changed \(join\): $n -> $hosts" log.txt | sed 's/^/  /'
worst=$(grep "world changed (join): $n -> $hosts" log.txt | grep -v "0 -> " | sed 's/.*ready after \([0-9.]*\) ms/\1/' |
  sort -g | tail -1)
echo "join $n -> $hosts, link $rate per host, state $((8 * (75 * hidden + 10) / 1000000)) MB: worst survivor's stall $worst ms"
