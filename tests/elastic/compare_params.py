#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compares an elastic job's parameters with the single-process reference's
(examples/elastic_train --params-out: float32 values). Sums in a different
order only: float rounding, a few ulps per step, so the worst relative
difference must stay under 1e-3. Exit status 0 when it does.

    compare_params.py ELASTIC.bin REFERENCE.bin
"""
import struct
import sys

a = open(sys.argv[1], "rb").read()
b = open(sys.argv[2], "rb").read()
if len(a) != len(b) or not a:
    sys.exit(f"FAIL: {len(a)} bytes of parameters against {len(b)} in the reference")
x = struct.unpack(f"{len(a) // 4}f", a)
y = struct.unpack(f"{len(b) // 4}f", b)
worst = max(abs(p - q) / (1e-3 + abs(q)) for p, q in zip(x, y))
print(f"{len(x)} parameters, worst relative difference {worst:.3g} (limit 1e-3)")
sys.exit(0 if worst < 1e-3 else 1)
