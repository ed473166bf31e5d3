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
wrap=$(mktemp /tmp/ebbflow-netns-wrap.XXXXXX)
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -f "$wrap"; }
trap cleanup EXIT INT TERM
cleanup
ip netns add "$a"
ip netns add "$b"
ip link add ebbflow-ea type veth peer name ebbflow-eb
ip link set ebbflow-ea netns "$a"
ip link set ebbflow-eb netns "$b"
ip -n "$a" addr add 10.232.0.1/24 dev ebbflow-ea
ip -n "$b" addr add 10.232.0.2/24 dev ebbflow-eb
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set ebbflow-ea up
ip -n "$b" link set ebbflow-eb up
if [[ -n ${NETEM:-} ]]; then
  # shellcheck disable=SC2086
  ip netns exec "$a" tc qdisc add dev ebbflow-ea root netem $NETEM
  # shellcheck disable=SC2086
  ip netns exec "$b" tc qdisc add dev ebbflow-eb root netem $NETEM
fi
cat >"$wrap" <<WRAP
#!/usr/bin/env bash
if (( \${EBBFLOW_WORKER_ID:-0} % 2 )); then ns=$b; else ns=$a; fi
exec ip netns exec "\$ns" env UCX_TLS=tcp,self UCX_NET_DEVICES=all "\$@"
WRAP
chmod +x "$wrap"
# The launcher (and its store) live in namespace a; workers in b reach it over the veth.
ip netns exec "$a" python3 "$here/elastic_bench.py" --build "$build" --wrap "$wrap" --store 10.232.0.1:0 "$@"
