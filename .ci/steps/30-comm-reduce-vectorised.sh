#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The host reduction kernels must vectorise at plain -O2 (GCC 12 leaves the
# naive `a[i] += b[i]` loop scalar there). Compiles one kernel per native
# dtype at -O2 and checks that packed SSE instructions come out.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/k.cpp" <<'CPP'
#include <ebbflow/comm/reduce.hpp>
namespace c = ebbflow::comm;
using ebbflow::dtype; using ebbflow::reduce_op;
void f32_sum(void* d, const void* a, const void* b, std::size_t n) { c::reduce(dtype::f32, reduce_op::sum, d, a, b, n); }
void f64_max(void* d, const void* a, const void* b, std::size_t n) { c::reduce(dtype::f64, reduce_op::max, d, a, b, n); }
void i32_sum(void* d, const void* a, const void* b, std::size_t n) { c::reduce(dtype::i32, reduce_op::sum, d, a, b, n); }
void bf16_sum(void* d, const void* a, const void* b, std::size_t n) { c::reduce(dtype::bf16, reduce_op::sum, d, a, b, n); }
CPP
${CXX:-g++} -std=c++20 -O2 -Iinclude -S -o "$tmp/k.s" "$tmp/k.cpp"
for insn in addps maxpd paddd pslld; do
  grep -q "\b$insn\b" "$tmp/k.s" || { echo "reduce kernels not vectorised at -O2: no $insn" >&2; exit 1; }
done
echo "reduce kernels vectorised at -O2 (addps, maxpd, paddd, pslld present)"
