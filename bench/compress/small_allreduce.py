#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Small-tensor compressed allreduce, two builds side by side.

Runs small_allreduce (bench/compress/small_allreduce.cpp) built from two
commits, between real processes over UCX on this host: every round runs the
first build, then the second (A B A B ...), for each rank count, quiet and
then with a competing load (one busy process per core, normal priority).
Samples of all rounds are pooled per (build, ranks, load, size). Prints
nccl-tests columns (time = median) with min / p99, the bytes each rank
sends per call, and the ratio of the medians, first / second.

  small_allreduce.py --bin OLD_BINARY --bin NEW_BINARY [--ranks 2,4]
                     [--rounds 5] [--sizes 4096] [--load quiet,busy] [--json out.jsonl]
"""
import argparse, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "allreduce"))
from run_allreduce_bench import launch_env_ranks, pct  # noqa: E402


def busy_load():
    """One spinning process per core at normal priority; returns them (kill when done)."""
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(os.cpu_count() or 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="a small_allreduce binary (give two)")
    ap.add_argument("--label", action="append", default=[], help="a name per --bin (default: its path)")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="4096")
    ap.add_argument("--samples", default="15")
    ap.add_argument("--load", default="quiet,busy")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    labels = a.label + a.bin[len(a.label):]
    jf = open(a.json, "w") if a.json else None
    for load in a.load.split(","):
        for n in [int(x) for x in a.ranks.split(",")]:
            data = {}  # (label, bytes) -> samples, wrong, wire
            for rnd in range(a.rounds):
                for label, binary in zip(labels, a.bin):
                    spin = busy_load() if load == "busy" else []
                    try:
                        out = launch_env_ranks([binary, "--sizes", a.sizes, "--samples", a.samples,
                                                "--label", label], n)
                    finally:
                        for p in spin:
                            p.kill()
                            p.wait()
                    for line in out.splitlines():
                        if line.startswith("{"):
                            rec = json.loads(line)
                            s, w, _ = data.get((label, rec["bytes"]), ([], 0, 0))
                            data[(label, rec["bytes"])] = (s + rec["us"], w + rec["wrong"], rec["wire_bytes"])
                print(f"# {load}, {n} ranks: round {rnd + 1}/{a.rounds} done", file=sys.stderr, flush=True)
            print(f"\n## fp16 compressed_allreduce, {n} ranks over UCX, {load} "
                  f"(time = median us over {a.rounds} interleaved rounds)")
            print(f"{'build':<24} {'size':>7} {'count':>6} {'type':>5} {'redop':>5} {'time_us':>8} {'algbw':>6} "
                  f"{'busbw':>6} {'min_us':>8} {'p99_us':>8} {'wire_B':>7} {'#wrong':>6}")
            for sz in sorted({k[1] for k in data}):
                med = {}
                for label in labels:
                    s, w, wire = data[(label, sz)]
                    med[label] = statistics.median(s)
                    alg = sz / med[label] / 1e3  # GB/s
                    bus = alg * 2 * (n - 1) / n
                    print(f"{label:<24} {sz:>7} {sz // 4:>6} {'fp16':>5} {'sum':>5} {med[label]:>8.2f} {alg:>6.2f} "
                          f"{bus:>6.2f} {min(s):>8.2f} {pct(s, 99):>8.2f} {wire:>7} {w:>6}")
                    if jf:
                        jf.write(json.dumps({"bench": "small_allreduce", "build": label, "ranks": n, "load": load,
                                             "bytes": sz, "codec": "fp16", "median_us": med[label],
                                             "min_us": min(s), "p99_us": pct(s, 99), "wire_bytes": wire,
                                             "wrong": w}) + "\n")
                if len(labels) == 2:
                    print(f"{'ratio ' + labels[0] + ' / ' + labels[1]:<24} {sz:>7} median "
                          f"{med[labels[0]] / med[labels[1]]:.2f}x", flush=True)
    if jf:
        jf.close()


if __name__ == "__main__":
    main()
