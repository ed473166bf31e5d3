#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The network-namespace tests skip, and say why, where namespaces cannot be
# used. On a bare Debian root (debootstrap, a chroot, many containers) `/` is
# not a mount point: `ip netns add` works, but `ip netns exec` fails with
# `"mount --make-rslave /" failed: Invalid argument`, and the tests used to
# fail there instead of skipping. This makes that situation: a private mount
# namespace whose root is a plain folder (every top-level folder of this one
# bound into it at the same path, /run and /tmp fresh), runs
# netns_equivalence.sh in it with the given arguments, and expects exit 77
# with the reason. Exits 77 itself where it cannot make the situation (not
# root, no unshare or chroot).
# Usage: netns_probe_test.sh NETNS_EQUIVALENCE_SH EBBFLOW_RUN ELASTIC_TRAIN
set -euo pipefail
script=$(realpath "$1") run=$(realpath "$2") train=$(realpath "$3")
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null || ! command -v chroot >/dev/null; then
  echo "skipped: needs root, unshare and chroot to make a root that is not a mount point"
  exit 77
fi
root=$(mktemp -d /tmp/ebbflow-netns-probe.XXXXXX)
cleanup() {
  # The binds lived in the private mount namespace, gone with it: what is
  # left are empty folders and symbolic links (never a recursive remove).
  local e
  for e in "$root"/* "$root"/.[!.]*; do
    if [[ -L $e ]]; then rm -f "$e"; elif [[ -d $e ]]; then rmdir "$e" 2>/dev/null || true; fi
  done
  rmdir "$root" 2>/dev/null || echo "left $root (not empty)"
}
trap cleanup EXIT INT TERM
out=$(
  unshare --mount --propagation private bash -s "$root" "$script" "$run" "$train" <<'INSIDE' 2>&1
set -euo pipefail
root=$1
shift
for e in /* /.[!.]*; do
  [[ -e $e || -L $e ]] || continue
  name=${e#/}
  if [[ -L $e ]]; then
    ln -s "$(readlink "$e")" "$root/$name"
  elif [[ -d $e ]]; then
    mkdir -p "$root/$name"
    case $name in
      run | tmp) mount -t tmpfs tmpfs "$root/$name" ;;
      *) mount --rbind "$e" "$root/$name" ;;
    esac
  fi
done
# The tree under test may live in /tmp or /run itself (a clone in a
# temporary folder): its top folder there is bound in too.
for p in "$@"; do
  case $p in
    /tmp/?* | /run/?*)
      top=$(cut -d/ -f1-3 <<<"$p")
      if [[ ! -e $root$top ]]; then
        mkdir -p "$root$top"
        mount --rbind "$top" "$root$top"
      fi
      ;;
  esac
done
if findmnt --mountpoint "$root" >/dev/null 2>&1; then
  echo "setup: $root is a mount point"
  exit 3
fi
rc=0
chroot "$root" /usr/bin/env bash "$@" || rc=$?
echo "exit status $rc"
INSIDE
) || true
echo "$out"
if [[ $out != *"exit status 77"* ]]; then
  echo "FAIL: $script did not skip (exit 77) where / is not a mount point"
  exit 1
fi
if [[ $out != *"skipped: network namespaces cannot be used here: ip netns exec failed: \"mount --make-rslave /\" failed: Invalid argument"* ]]; then
  echo "FAIL: the skip does not give the reason"
  exit 1
fi
echo "PASS: it skipped with the reason"
