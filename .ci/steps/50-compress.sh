#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compress: accuracy goals on digits (fp16, int8, top-k+EF within 1 point of
# dense) and a smoke run of the 4-process network-namespace benchmark (needs
# root; skipped otherwise). ~20 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
b=build/release/bench/compress
cmake --build build/release --target compress_digits_accuracy compress_net_allreduce >/dev/null
if [[ -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]]; then
  "$b/compress_digits_accuracy" | tee /tmp/ebbflow-digits.txt
  awk '$1 ~ /^(fp16|int8|topk1%\+EF)$/ { d = $3 + 0; if (d < -1.0) { print "accuracy goal missed: " $0; bad = 1 } }
       END { exit bad }' /tmp/ebbflow-digits.txt
else
  echo "digits.csv.gz missing (python3-sklearn): accuracy check skipped"
fi
if [[ $(id -u) -eq 0 ]] && command -v ip >/dev/null; then
  MIB=2 ITERS=1 RATES=1gbit bench/compress/net_allreduce.sh build/release /tmp/ebbflow-net
else
  echo "not root: network-namespace smoke run skipped"
fi
