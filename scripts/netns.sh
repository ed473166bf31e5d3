# shellcheck shell=bash
# SPDX-License-Identifier: Apache-2.0
# Network namespaces standing in for separate hosts, for the tests and
# benchmarks that need them. Sourced, not run; needs root. Callers delete
# what they create (ip netns del; a veth goes with its namespace), and call
# netns_require before they make any.

# netns_probe: whether network namespaces can be made and used here; when
# not, prints why (one line) and fails. It makes a namespace of its own,
# enters it and adds a veth pair there, then removes it: `ip netns add`
# alone succeeds where entering then fails, e.g. in a chroot or a container
# whose / is not a mount point (`ip netns exec`: "mount --make-rslave /"
# failed: Invalid argument).
netns_probe() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "needs root (ip netns)"
    return 1
  fi
  if ! command -v ip >/dev/null; then
    echo "needs iproute2 (ip)"
    return 1
  fi
  local ns=ebbflow-probe-$$ out
  if ! out=$(ip netns add "$ns" 2>&1); then
    echo "ip netns add failed: ${out//$'\n'/; }"
    return 1
  fi
  if ! out=$(ip netns exec "$ns" ip link add ebbflow-p0 type veth peer name ebbflow-p1 2>&1); then
    ip netns del "$ns" 2>/dev/null || true
    echo "ip netns exec failed: ${out//$'\n'/; }"
    return 1
  fi
  ip netns del "$ns"
}

# netns_require: exits 77 (what CTest counts as skipped) with the reason
# unless netns_probe passes.
netns_require() {
  local why
  if ! why=$(netns_probe); then
    echo "skipped: network namespaces cannot be used here: $why"
    exit 77
  fi
}

# netns_pair A B DEV_A DEV_B NET: namespaces A and B joined by a veth pair
# DEV_A/DEV_B, at NET.1 in A and NET.2 in B (NET like 10.232.0.), /24.
netns_pair() {
  local a=$1 b=$2 va=$3 vb=$4 net=$5
  ip netns add "$a"
  ip netns add "$b"
  ip link add "$va" type veth peer name "$vb"
  ip link set "$va" netns "$a"
  ip link set "$vb" netns "$b"
  ip -n "$a" addr add "${net}1/24" dev "$va"
  ip -n "$b" addr add "${net}2/24" dev "$vb"
  local ns
  for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
  ip -n "$a" link set "$va" up
  ip -n "$b" link set "$vb" up
}

# netns_host NS DEV PEER ADDR: namespace NS with one end (DEV) of a veth pair
# at ADDR (CIDR) and lo up; the other end, PEER, stays here (e.g. for a bridge).
netns_host() {
  local ns=$1 dev=$2 peer=$3 addr=$4
  ip netns add "$ns"
  ip link add "$dev" type veth peer name "$peer"
  ip link set "$dev" netns "$ns"
  ip -n "$ns" addr add "$addr" dev "$dev"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$dev" up
}

# netns_wrapper FILE NS...: writes FILE, a command prefix for ebbflow-run's
# workers: worker ID (EBBFLOW_WORKER_ID) runs in namespace number ID modulo
# the count, with UCX over tcp only, so no shared memory crosses "hosts".
netns_wrapper() {
  local file=$1
  shift
  # shellcheck disable=SC2016  # the wrapper expands these, not this function
  {
    echo '#!/usr/bin/env bash'
    echo "hosts=($*)"
    echo 'ns=${hosts[$((${EBBFLOW_WORKER_ID:-0} % ${#hosts[@]}))]}'
    echo 'exec ip netns exec "$ns" env UCX_TLS=tcp,self UCX_NET_DEVICES=all "$@"'
  } >"$file"
  chmod +x "$file"
}
