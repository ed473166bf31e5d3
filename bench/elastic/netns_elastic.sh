#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The elastic benchmark across two "hosts": network namespaces joined by a
# veth pair (optionally shaped with tc netem). Even worker ids run in one
# namespace, odd ids in the other; UCX is limited to tcp so no shared memory
# crosses the namespaces. Usage (root):
#   bench/elastic/netns_elastic.sh [build dir] [elastic_bench.py args...]
set -euo pipefail
build=${1:-build/release}
shift || true
a=ebbflow-el-a b=ebbflow-el-b
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/netns.sh
source "$here/../../scripts/netns.sh"
netns_require
wrap=$(mktemp /tmp/ebbflow-netns-wrap.XXXXXX)
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -f "$wrap"; }
trap cleanup EXIT INT TERM
cleanup
netns_pair "$a" "$b" ebbflow-ea ebbflow-eb 10.232.0.
if [[ -n ${NETEM:-} ]]; then
  # shellcheck disable=SC2086
  ip netns exec "$a" tc qdisc add dev ebbflow-ea root netem $NETEM
  # shellcheck disable=SC2086
  ip netns exec "$b" tc qdisc add dev ebbflow-eb root netem $NETEM
fi
netns_wrapper "$wrap" "$a" "$b"  # even worker ids in a, odd in b
# The launcher (and its store) live in namespace a; workers in b reach it over the veth.
ip netns exec "$a" python3 "$here/elastic_bench.py" --build "$build" --wrap "$wrap" --store 10.232.0.1:0 "$@"
