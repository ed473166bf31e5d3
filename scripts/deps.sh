#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages ebbflow's build, tests and demo need, only
# those that are missing. Usage: scripts/deps.sh [build|test|demo|all]
set -euo pipefail
what=${1:-test}
pkgs=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libbenchmark-dev
      libboost-dev libssl-dev libucx-dev ucx-utils librange-v3-dev iproute2 procps)
case $what in
  build) ;;
  test) pkgs+=(clang libclang-rt-14-dev libopenmpi-dev openmpi-bin libgloo-dev doxygen python3-venv libtorch-dev python3-sklearn
             etcd-server etcd-client openssl) ;;
  demo) pkgs+=(libtorch-dev python3-sklearn gnuplot-nox) ;;
  all) pkgs+=(clang libclang-rt-14-dev libopenmpi-dev openmpi-bin libgloo-dev libtorch-dev python3-sklearn gnuplot-nox doxygen python3-venv
            etcd-server etcd-client openssl) ;;
  *) echo "usage: $0 [build|test|demo|all]" >&2; exit 2 ;;
esac
if [[ -n ${EBBFLOW_EXTRA_PACKAGES:-} ]]; then read -r -a extra <<<"$EBBFLOW_EXTRA_PACKAGES"; pkgs+=("${extra[@]}"); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
echo "ebbflow: installing missing Debian packages: ${missing[*]}" >&2
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq || echo "ebbflow: apt-get update failed; trying the cached package lists" >&2
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
