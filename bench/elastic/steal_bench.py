#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""In-step work stealing in the elastic group, measured side by side in one run.

Runs examples/elastic_train under ebbflow-run with N workers (emulated device
time per step, as elastic_bench.py) in four configurations, interleaved per
round (A B C D A B C D ...):

  plan            the planner's per-worker batches, no straggler
  plan+steal      the same with group::steal_step (--steal)
  plan, strag     worker 1 is FACTOR times slower in SLOW of every PERIOD steps
                  (--straggle): a transient straggler the planner's robust
                  models do not chase
  plan+steal, strag

and prints each one's steady throughput (samples/s, the middle of the run)
and the ratios steal / plan: the gain with the straggler and the cost of
the claims without one.
"""
import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import elastic_bench as eb  # noqa: E402  (run_job, steady)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    eb.add_job_args(ap, 400, "workers (default 4)")
    ap.add_argument("--straggle", default="1:0:3:3:20",
                    help="elastic_train --straggle ID:FROM:TO:FACTOR[:PERIOD] (default: worker 1, 3x slower in "
                         "3 of every 20 steps)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu-bind", default="", help="ebbflow-run --cpu-bind for every run")
    args = ap.parse_args()
    args.launcher_extra = ["--cpu-bind", args.cpu_bind] if args.cpu_bind else []
    eb.set_build(args, args.build)
    args.wrap = []
    args.store = "127.0.0.1:0"
    args.hidden = 0
    args.tmp = tempfile.mkdtemp(prefix="ebbflow-steal-bench-")
    atexit.register(shutil.rmtree, args.tmp, ignore_errors=True)  # the jobs' metrics and checkpoint
    configs = [("plan", []), ("plan+steal", ["--steal"]),
               ("plan, straggler", ["--straggle", args.straggle]),
               ("plan+steal, straggler", ["--steal", "--straggle", args.straggle])]
    res = {name: [] for name, _ in configs}
    for rnd in range(args.rounds):
        for name, extra in configs:
            rows, _, _ = eb.run_job(args, ["-n", str(args.n)], extra, name.replace(" ", "").replace(",", "_"))
            res[name].append(eb.steady(rows))
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"# in-step work stealing: {args.n} workers, B={args.batch}, emulated device {args.step_us:.0f} us/step + "
          f"{args.sample_us:.0f} us/sample, straggler {args.straggle}, {args.rounds} round(s), medians"
          + (f", --cpu-bind {args.cpu_bind}" if args.cpu_bind else ""))
    print(f"{'configuration':28s} {'samples/s':>10s}   per round")
    for name, _ in configs:
        print(f"{name:28s} {med[name]:10.0f}   {' '.join(f'{x:.0f}' for x in res[name])}")
    gain = [s / p for s, p in zip(res["plan+steal, straggler"], res["plan, straggler"])]
    cost = [s / p for s, p in zip(res["plan+steal"], res["plan"])]
    print(f"{'ratio steal / plan, straggler':28s} {statistics.median(gain):10.3f}x  {' '.join(f'{x:.3f}' for x in gain)}")
    print(f"{'ratio steal / plan, none':28s} {statistics.median(cost):10.3f}x  {' '.join(f'{x:.3f}' for x in cost)}")
    print(f"{'straggler kept, steal':28s} {med['plan+steal, straggler'] / med['plan'] * 100:9.2f}%  "
          f"(of the no-straggler plan; without stealing "
          f"{med['plan, straggler'] / med['plan'] * 100:.2f}%)")
    eb.meter.report(28)


if __name__ == "__main__":
    main()
