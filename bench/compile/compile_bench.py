#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Compile time of a user's translation unit, the routes side by side.

Each repetition compiles every source once per route, interleaved (A B C A B C
...), so machine noise hits the routes alike; prints min and median wall and
user seconds and the peak memory of the compiler, and each route over the
header-only one (and over the baseline, when given).

Routes:
  header-only  the default: -I<include>
  compiled     separate compilation: -DEBBFLOW_SEPARATE_COMPILATION (the
               translation unit a target linked to ebbflow::compiled builds)
  baseline     header-only against another tree's headers (--baseline-include,
               e.g. the commit before a change: git archive REV include | tar -x)

Sources: bench/compile/train_loop.cpp (a training loop with the elastic group,
the TCP store, UCX and the planner's policy; it compiles against older trees
too), examples/elastic_train/elastic_train.cpp (this tree only) and
`umbrella` (a file that includes <ebbflow/ebbflow.hpp> and nothing else).

  compile_bench.py [--reps 3] [--flags="-O2"] [--baseline-include DIR] [--sources a.cpp,umbrella]
"""
import argparse, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def compile_once(cxx, flags, include, src, defines):
    with tempfile.TemporaryDirectory(prefix="ebbflow-compile-") as d:
        cmd = ["/usr/bin/time", "-f", "%e %U %M", cxx, "-std=c++20", *flags.split(), "-I", include, *defines,
               "-c", src, "-o", os.path.join(d, "out.o")]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"compile failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
        wall, user, kb = p.stderr.strip().splitlines()[-1].split()
        return float(wall), float(user), int(kb) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cxx", default="g++")
    ap.add_argument("--flags", default="-O2", help="compiler flags of the user's build (e.g. -O2, or \"-O0 -g\")")
    ap.add_argument("--include", default=os.path.join(ROOT, "include"))
    ap.add_argument("--baseline-include", default="", help="another tree's include/ (header-only) beside this one")
    ap.add_argument("--sources", default="train_loop,elastic_train,umbrella")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ebbflow-compile-src-") as tmp:
        umbrella = os.path.join(tmp, "umbrella.cpp")
        with open(umbrella, "w") as f:
            f.write("#include <ebbflow/ebbflow.hpp>\n")
        known = {"train_loop": os.path.join(HERE, "train_loop.cpp"),
                 "elastic_train": os.path.join(ROOT, "examples", "elastic_train", "elastic_train.cpp"),
                 "umbrella": umbrella}
        sources = [(s, known.get(s, s)) for s in a.sources.split(",") if s]
        routes = [("header-only", a.include, []), ("compiled", a.include, ["-DEBBFLOW_SEPARATE_COMPILATION"])]
        if a.baseline_include:
            routes.append(("baseline", a.baseline_include, []))
        data = {}  # (source, route) -> [(wall, user, mb)]
        for rep in range(a.reps):
            for name, src in sources:
                for route, inc, defs in routes:
                    if route == "baseline" and name == "elastic_train":
                        continue  # the example follows this tree's API
                    data.setdefault((name, route), []).append(compile_once(a.cxx, a.flags, inc, src, defs))
            print(f"# repetition {rep + 1}/{a.reps} done", file=sys.stderr, flush=True)
    print(f"## compile time of one translation unit, {a.cxx} {a.flags}, {a.reps} interleaved repetitions")
    print(f"{'source':14s} {'route':12s} {'wall min':>9s} {'wall p50':>9s} {'user min':>9s} {'user p50':>9s} "
          f"{'peak MiB':>9s} {'p50 / header-only':>18s} {'p50 / baseline':>15s}")
    for name, _ in sources:
        ref = data.get((name, "header-only"))
        base = data.get((name, "baseline"))
        for route, _, _ in routes:
            xs = data.get((name, route))
            if not xs:
                continue
            wall = [x[0] for x in xs]
            user = [x[1] for x in xs]
            mb = max(x[2] for x in xs)
            r1 = statistics.median(wall) / statistics.median([x[0] for x in ref]) if ref else float("nan")
            r2 = statistics.median(wall) / statistics.median([x[0] for x in base]) if base else float("nan")
            print(f"{name:14s} {route:12s} {min(wall):9.2f} {statistics.median(wall):9.2f} {min(user):9.2f} "
                  f"{statistics.median(user):9.2f} {mb:9.0f} {r1:18.2f} {r2:15.2f}")


if __name__ == "__main__":
    main()
