#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Elastic scale events, measured side by side in one run.

Runs examples/elastic_train (MLP on digits, emulated device time per step so
that N workers behave like N GPUs on this 2-core machine) under ebbflow-run:

  steady     N workers, no event: steady throughput
  scaleout   N -> 2N while training (--add): survivors' throughput between the
             start of the newcomers and the switch, as a share of steady state;
             each survivor's stall at the switch; as a control, the same
             measure on the steady run in windows as long (no event in them:
             the spread is the machine's noise for a window that short)
  start      (not by default) N newcomers that start as workers do and exit
             where they would join (elastic_train --joiners-start-only): the
             survivors' share in a window as long as the scale-out's, i.e.
             what the newcomers' process start-up alone costs on this host
  leave      one worker leaves gracefully: stall per worker
  kill       one worker is SIGKILLed: time from the kill to the survivors'
             first completed step
  hang       (not by default) one worker is SIGSTOPped for --hang-for s: time
             from the stop to the survivors' first completed step without it
             (its lease, EBBFLOW_LEASE_MS, must run out first)
  restart    the usual way: stop all N workers at a step, checkpoint to disk,
             start 2N workers that reload it: time from the last step before
             the stop to the first step after the restart

and prints the ratios (restart downtime / ebbflow stall). Rounds interleave
the scenarios (A B C D E A B C D E ...). Wrap the workers in network
namespaces with --wrap (see netns_elastic.sh).
"""
import argparse
import atexit
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


class cpu_meter:
    """CPU time that processes other than this bench and its jobs took while a
    job ran, in cores (1.0 = one core kept busy): a benchmark on a host that
    something else loads measures that load, not the library. Busy time is
    /proc/stat's user + nice + system (interrupt time left out); the jobs'
    own is this process's and its reaped children's (os.times)."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK")
        self.jobs = []  # (tag, cores)

    def snap(self):
        try:
            with open("/proc/stat") as f:
                user, nice, system = (int(x) for x in f.readline().split()[1:4])
        except (OSError, ValueError):
            return None
        t = os.times()
        return ((user + nice + system) / self.hz, t.user + t.system + t.children_user + t.children_system,
                time.monotonic())

    def add(self, tag, before, after):
        if before is None or after is None or after[2] <= before[2]:
            return
        other = (after[0] - before[0]) - (after[1] - before[1])
        cores = max(0.0, other / (after[2] - before[2]))
        self.jobs.append((tag, cores))
        if cores > self.warn_at:
            print(f"warning: {tag}: other processes took {cores * 100:.0f} % of a core while the job ran "
                  f"(see top): its figures measure them too", file=sys.stderr, flush=True)

    def report(self, width):
        """One line for a bench's table, and a second one when a job was not clean."""
        if not self.jobs:
            return
        worst = max(self.jobs, key=lambda j: j[1])
        print(f"{'other processes during the jobs (cores), median':{width}s} "
              f"{statistics.median(c for _, c in self.jobs):12.3f}  (worst {worst[1]:.3f}, {worst[0]})")
        if worst[1] > self.warn_at:
            print(f"# not a clean run: something else took over {self.warn_at * 100:.0f} % of a core during "
                  f"{sum(c > self.warn_at for _, c in self.jobs)} of {len(self.jobs)} jobs")

    warn_at = 0.10


meter = cpu_meter()


def run_job(args, launcher_flags, extra, tag, env_extra=None, metrics=None):
    metrics = metrics or os.path.join(args.tmp, f"{tag}.csv")
    if os.path.exists(metrics) and "--resume" not in extra:
        os.remove(metrics)
    cmd = [args.run, "--store", args.store] + args.launcher_extra + launcher_flags + ["--"] + args.wrap + [args.train, "--steps", str(args.steps),
           "--batch", str(args.batch), "--step-us", str(args.step_us), "--sample-us", str(args.sample_us),
           "--metrics", metrics] + (["--hidden", str(args.hidden)] if args.hidden else []) + extra
    env = dict(os.environ, EBBFLOW_LOG="warn")
    env.update(env_extra or {})
    t0 = time.time()
    before = meter.snap()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=args.tmp)
    meter.add(tag, before, meter.snap())
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"{tag}: ebbflow-run exited {p.returncode}")
    rows = []
    with open(metrics) as f:
        for r in csv.DictReader(f):
            rows.append({"step": int(r["step"]), "t": float(r["time_s"]), "gen": int(r["generation"]),
                         "world": int(r["world_size"]), "samples": int(r.get("samples") or args.batch),
                         "eval": bool(r.get("test_acc"))})
    rows.sort(key=lambda r: (r["step"], r["t"]))
    return rows, p.stdout + p.stderr, time.time() - t0


def stamp(out, pattern):
    m = re.search(pattern + r".*\[t=([0-9.]+)\]", out)
    return float(m.group(1)) if m else None


def throughput(rows, t_from, t_to):
    """Samples per second of the steps that ended in (first, last] of those in [t_from, t_to].

    Counts each step's own global batch: the last step of an epoch is
    shorter, and a window that happens to hold one (or none) must not look
    faster (or slower) than it is."""
    sel = [r for r in rows if t_from <= r["t"] <= t_to]
    if len(sel) < 2:
        return float("nan")
    return sum(r["samples"] for r in sel[1:]) / (sel[-1]["t"] - sel[0]["t"])


def stalls(out, reason):
    """Stall of every member that was already training (old size > 0)."""
    found = re.findall(r"world changed \(" + reason + r"\): (\d+) -> \d+ workers at step \d+, ready after ([0-9.]+) ms", out)
    return [float(ms) for old, ms in found if int(old) > 0]


def kind(a, b):
    """What a step interval (a -> b) is compared by: the step's global batch
    (the last step of an epoch is shorter) and whether rank 0 evaluated the
    model after step a (the example does every 10 steps, before b begins)."""
    return (b["samples"], a["eval"])


def step_times(rows, t_from, t_to):
    """Mean interval of the steps that ended in (t_from, t_to], by kind().

    Comparing a window step by step with steady steps of the same kind keeps
    a short window that holds more (or fewer) short or evaluating steps than
    the steady run from looking faster (or slower) than it is."""
    by = {}
    for a, b in zip(rows, rows[1:]):
        if t_from < b["t"] <= t_to:
            by.setdefault(kind(a, b), []).append(b["t"] - a["t"])
    return {k: statistics.mean(v) for k, v in by.items()}


def expected(steady_times, steady_rate, a, b):
    """The steady time of step interval a -> b: of its kind, else of its
    size without an evaluation, else its samples at the steady rate."""
    t = steady_times.get(kind(a, b))
    if t is None:
        t = steady_times.get((b["samples"], False))
    return t if t is not None else b["samples"] / steady_rate


def window_share(rows, t_from, t_to, steady_times, steady_rate):
    """Time the steps that ended in (t_from, t_to] take in steady state, over the time they took."""
    exp = act = 0.0
    for a, b in zip(rows, rows[1:]):
        if t_from < b["t"] <= t_to:
            exp += expected(steady_times, steady_rate, a, b)
            act += b["t"] - a["t"]
    return exp / act if act > 0 else float("nan")


def baseline(rows, t):
    """What steps before time t took, warm-up (their first fifth) left out:
    (step_times by kind, throughput). A window from t on is priced by it."""
    before = [r for r in rows if r["t"] < t]
    a = before[len(before) // 5]["t"]
    return step_times(rows, a, t), throughput(rows, a, t)


def time_lost(rows, t_from, t_to, ref, base):
    """Seconds the steps that ended in (t_from, t_to] took beyond their steady time."""
    return sum(max(0.0, (b["t"] - a["t"]) - expected(ref, base, a, b))
               for a, b in zip(rows, rows[1:]) if t_from < b["t"] <= t_to)


def control_shares(rows, t_first, length):
    """The scale-out measure applied to a run without any event: windows of
    `length` seconds, back to back from `t_first` to the run's last tenth,
    each against the steps before it, as the scale-out window is.

    Their spread is this machine's noise for a window that short (a late
    wake-up, the hypervisor), the floor a scale-out's share is compared with."""
    out = []
    t_end = rows[len(rows) - 1 - len(rows) // 10]["t"]
    t = t_first
    while t + length <= t_end:
        if sum(r["t"] < t for r in rows) >= 10:
            out.append(window_share(rows, t, t + length, *baseline(rows, t)))
        t += length
    return out


def steady(rows):
    n = len(rows)
    a, b = rows[n // 5]["t"], rows[n - 1 - n // 10]["t"]
    return throughput(rows, a, b)


def add_job_args(ap, steps, n_help):
    """The options of the example's job every elastic bench shares."""
    ap.add_argument("--build", default="build/release")
    ap.add_argument("-n", type=int, default=4, help=n_help)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--step-us", type=float, default=4000, help="emulated fixed device time per step")
    ap.add_argument("--sample-us", type=float, default=400, help="emulated device time per sample")


def set_build(args, build):
    args.run = os.path.abspath(os.path.join(build, "tools/ebbflow-run/ebbflow-run"))
    args.train = os.path.abspath(os.path.join(build, "examples/elastic_train/elastic_train"))


def measure_round(args, res, scen, rnd):
    """One round of every scenario in `scen` with the build in args.run / args.train, into `res`."""
    n, ev = args.n, args.event_at
    # steady
    rows, _, _ = run_job(args, ["-n", str(n)], [], "steady")
    res["steady"].append(steady(rows))
    steady_rows = rows
    # scale-out N -> 2N
    nice = ["--join-nice", str(args.join_nice)] if args.join_nice else []
    rows, out, _ = run_job(args, ["-n", str(n), "--add", f"{ev}:{n}"] + nice, [], "scaleout")
    t_add = stamp(out, "started worker")
    switch = next(r for r in rows if r["world"] == 2 * n)
    last_small = max(r["t"] for r in rows if r["world"] == n)
    ref, base = baseline(rows, t_add)
    res["scale_share"].append(window_share(rows, t_add, last_small, ref, base))
    # The same measure on the steady run, in windows as long as this one
    # from as far into that job as the newcomers started in this one.
    ctl = control_shares(steady_rows, steady_rows[0]["t"] + (t_add - rows[0]["t"]), last_small - t_add)
    res["control_share"].append(statistics.median(ctl) if ctl else float("nan"))
    res["control_windows"].extend(ctl)
    # Time the survivors lost, from the newcomers' start to the first step
    # with 2N workers: every step interval beyond the steady one counts.
    res["scale_lost_ms"].append(time_lost(rows, t_add, switch["t"], ref, base) * 1e3)
    if args.detail:
        print(f"round {rnd + 1} scale-out window (step: ms over steady; | = switch):", " ".join(
            f"{'|' if b['world'] == 2 * n and a['world'] == n else ''}{b['step']}:"
            f"{((b['t'] - a['t']) - expected(ref, base, a, b)) * 1e3:+.2f}"
            for a, b in zip(rows, rows[1:]) if t_add < b["t"] <= switch["t"]), flush=True)
    st = stalls(out, "join")
    res["scale_stall_max"].append(max(st) if st else float("nan"))
    res["scale_done"].append(switch["t"] - t_add)
    after = [r for r in rows if r["world"] == 2 * n]
    res["steady_2n"].append(throughput(rows, after[len(after) // 5]["t"], after[-1]["t"]))
    if "start" in scen:  # the newcomers' start-up alone, in a window as long as the scale-out's
        srows, sout, _ = run_job(args, ["-n", str(n), "--add", f"{ev}:{n}"] + nice, ["--joiners-start-only"],
                                 "start")
        s_add = stamp(sout, "started worker")
        s_to = s_add + (last_small - t_add)
        s_ref, s_base = baseline(srows, s_add)
        res["start_share"].append(window_share(srows, s_add, s_to, s_ref, s_base))
        res["start_lost_ms"].append(time_lost(srows, s_add, s_to, s_ref, s_base) * 1e3)
    if "leave" in scen:  # graceful leave
        rows, out, _ = run_job(args, ["-n", str(n), "--leave", f"{ev}:{n - 1}"], [], "leave")
        st = stalls(out, "leave")
        res["leave_stall_max"].append(max(st) if st else float("nan"))
    if "kill" in scen:  # SIGKILL
        rows, out, _ = run_job(args, ["-n", str(n), "--kill", f"{ev}:{n - 1}"], [], "kill")
        t_kill = stamp(out, "killing worker")
        first = next(r for r in rows if r["t"] > t_kill and r["world"] == n - 1)
        res["kill_to_step"].append(first["t"] - t_kill)
    if "hang" in scen:  # SIGSTOP: a hung worker, noticed by its lease alone
        rows, out, _ = run_job(args, ["-n", str(n), "--stop", f"{ev}:{n - 1}:{args.hang_for}"], [], "hang")
        t_stop = stamp(out, "stopping worker")
        first = next(r for r in rows if r["t"] > t_stop and r["world"] == n - 1)
        res["hang_to_step"].append(first["t"] - t_stop)
    if "restart" not in scen:
        return
    # checkpoint-restart baseline: stop N at the step the scale-out switched at, restart 2N
    ck = os.path.join(args.tmp, "ckpt.bin")
    mpath = os.path.join(args.tmp, "restart.csv")
    if os.path.exists(mpath):
        os.remove(mpath)
    rows1, _, _ = run_job(args, ["-n", str(n)], ["--checkpoint", ck, "--checkpoint-at", str(switch["step"])],
                          "restart", metrics=mpath)
    t_stop = max(r["t"] for r in rows1)
    rows2, _, _ = run_job(args, ["-n", str(2 * n)], ["--checkpoint", ck, "--resume"], "restart", metrics=mpath)
    first2_row = min((r for r in rows2 if r["t"] > t_stop), key=lambda r: r["t"])
    first2 = first2_row["t"]
    step_time = first2_row["samples"] / res["steady"][-1]
    res["restart_down"].append(first2 - t_stop - step_time)
    res["restart_done"].append(first2 - t_stop)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_args(ap, 500, "workers before scale-out (default 4 -> 8)")
    ap.add_argument("--hidden", type=int, default=0,
                    help="hidden units of the example's MLP (default: its own, 64); the training state "
                         "(parameters and momentum) is 2 x 4 x (75 x hidden + 10) bytes")
    ap.add_argument("--event-at", type=float, default=1.5, help="seconds into the job when the event happens")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--scenarios", default="scaleout,leave,kill,restart",
                    help="which events to measure besides steady (comma list; A/B runs of one event are faster)")
    ap.add_argument("--hang-for", type=float, default=3.0, help="hang: how long the worker stays stopped (s)")
    ap.add_argument("--wrap", default="", help="command prefix for every worker (e.g. the netns wrapper)")
    ap.add_argument("--store", default="127.0.0.1:0", help="address the launcher's store binds")
    ap.add_argument("--json", help="write one JSON object per measured point")
    ap.add_argument("--join-nice", type=int, default=0,
                    help="start the newcomers this many nice levels lower (ebbflow-run --join-nice): on a shared "
                         "host their start-up then leaves the CPU to the running workers, as on separate hosts")
    ap.add_argument("--sched-slice-us", type=int, default=0,
                    help="ebbflow-run --sched-slice-us for every scenario: each member asks for this scheduler "
                         "slice (Linux 6.12+), so its wake-ups take the core from newcomers starting up beside it")
    ap.add_argument("--rt-priority", type=int, default=0,
                    help="ebbflow-run --rt-priority for every scenario: members run SCHED_RR at this priority, so "
                         "newcomers starting up beside them run only on cores the members leave idle")
    ap.add_argument("--cpu-bind", default="",
                    help="ebbflow-run --cpu-bind for every scenario (e.g. core:4: the first 4 workers on one core, "
                         "the newcomers on the next), as when newcomers start on hosts of their own")
    ap.add_argument("--store-cpu", default="",
                    help="ebbflow-run --store-cpu with --cpu-bind: the launcher and its store on this CPU (default: "
                         "worker 0's, with the running workers)")
    ap.add_argument("--baseline", default="",
                    help="another build (e.g. the commit before a change) measured in the same rounds, alternating "
                         "which goes first; prints both and this build over the baseline")
    ap.add_argument("--detail", action="store_true",
                    help="print each scale-out window step by step: its interval over the steady one (ms)")
    args = ap.parse_args()
    args.launcher_extra = ["--cpu-bind", args.cpu_bind] if args.cpu_bind else []
    if args.sched_slice_us:
        args.launcher_extra += ["--sched-slice-us", str(args.sched_slice_us)]
    if args.rt_priority:
        args.launcher_extra += ["--rt-priority", str(args.rt_priority)]
    if args.store_cpu:
        args.launcher_extra += ["--store-cpu", args.store_cpu]
    args.wrap = args.wrap.split() if args.wrap else []
    args.tmp = tempfile.mkdtemp(prefix="ebbflow-elastic-bench-")
    atexit.register(shutil.rmtree, args.tmp, ignore_errors=True)  # the jobs' metrics and checkpoint
    n, ev = args.n, args.event_at
    res = {k: [] for k in ["steady", "scale_share", "control_share", "control_windows", "scale_lost_ms",
                           "scale_stall_max", "scale_done", "leave_stall_max", "kill_to_step", "hang_to_step",
                           "restart_down", "restart_done", "steady_2n", "start_share", "start_lost_ms"]}
    scen = set(args.scenarios.split(","))
    unknown = scen - {"scaleout", "start", "leave", "kill", "hang", "restart"}
    if unknown or "scaleout" not in scen:
        raise SystemExit(f"--scenarios: scaleout is always measured; unknown: {', '.join(sorted(unknown)) or '-'}")
    builds = [("this build", args.build)] + ([("baseline", args.baseline)] if args.baseline else [])
    results = {label: {k: [] for k in res} for label, _ in builds}
    for rnd in range(args.rounds):
        # With a baseline, the two builds alternate which goes first.
        for label, build in (builds if rnd % 2 == 0 else builds[::-1]):
            set_build(args, build)
            measure_round(args, results[label], scen, rnd)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    res = results["this build"]
    med = {k: statistics.median(v) for k, v in res.items() if v}
    print(f"# elastic scale events: {n} -> {2 * n} workers, B={args.batch}, emulated device "
          f"{args.step_us:.0f} us/step + {args.sample_us:.0f} us/sample, {args.rounds} round(s), medians"
          + (f", hidden {args.hidden}" if args.hidden else "")
          + (f", newcomers started at nice +{args.join_nice}" if args.join_nice else "")
          + (f", --cpu-bind {args.cpu_bind}" if args.cpu_bind else "")
          + (f", --sched-slice-us {args.sched_slice_us}" if args.sched_slice_us else "")
          + (f", --rt-priority {args.rt_priority}" if args.rt_priority else "")
          + (f", --store-cpu {args.store_cpu}" if args.store_cpu else ""))
    print(f"{'metric':48s} {'value':>12s}")
    print(f"{'steady throughput, N workers (samples/s)':48s} {med['steady']:12.0f}")
    print(f"{'steady throughput, 2N workers (samples/s)':48s} {med['steady_2n']:12.0f}")
    print(f"{'survivors during scale-out / steady':48s} {med['scale_share'] * 100:11.2f}%")
    print(f"{'survivors time lost, start -> 2N step (ms)':48s} {med['scale_lost_ms']:12.1f}")
    print(f"{'scale-out stall, worst survivor (ms)':48s} {med['scale_stall_max']:12.1f}")
    print(f"{'scale-out: newcomer start -> 2N step (s)':48s} {med['scale_done']:12.2f}")
    print(f"{'survivors during scale-out, per round':48s} {' '.join(f'{x * 100:.2f}%' for x in res['scale_share'])}")
    cw = sorted(res["control_windows"])
    if cw:
        q = lambda f: cw[min(len(cw) - 1, int(f * len(cw)))]
        print(f"{'control: steady windows as long / steady':48s} {statistics.median(cw) * 100:11.2f}%"
              f"  (p10 {q(0.1) * 100:.2f}%, p90 {q(0.9) * 100:.2f}%, {len(cw)} windows)")
        print(f"{'control, per round (median of its windows)':48s} "
              f"{' '.join(f'{x * 100:.2f}%' for x in res['control_share'])}")
    if "start" in scen:
        print(f"{'newcomers only start (exit before joining)':48s} {med['start_share'] * 100:11.2f}%")
        print(f"{'  survivors time lost, same window (ms)':48s} {med['start_lost_ms']:12.1f}")
        print(f"{'  per round':48s} {' '.join(f'{x * 100:.2f}%' for x in res['start_share'])}")
    if "leave" in scen:
        print(f"{'graceful leave stall, worst member (ms)':48s} {med['leave_stall_max']:12.1f}")
    if "kill" in scen:
        print(f"{'SIGKILL -> first completed step (s)':48s} {med['kill_to_step']:12.3f}")
    if "hang" in scen:
        print(f"{'SIGSTOP -> first completed step (s)':48s} {med['hang_to_step']:12.3f}")
    if "restart" in scen:
        print(f"{'checkpoint-restart downtime (s)':48s} {med['restart_down']:12.2f}")
        print(f"{'ratio restart downtime / ebbflow scale-out stall':48s} {med['restart_down'] / (med['scale_stall_max'] / 1e3):11.1f}x")
    meter.report(48)
    if args.baseline:
        compare(results, args)
    if args.json:
        with open(args.json, "w") as f:
            for k, v in res.items():
                for i, x in enumerate(v):
                    f.write(json.dumps({"metric": k, "round": i, "value": x}) + "\n")


def compare(results, args):
    """This build against the baseline measured in the same rounds: median, range over rounds, ratio."""
    this, base = results["this build"], results["baseline"]
    rows = [("steady throughput, N workers (samples/s)", "steady", 1), ("survivors during scale-out (%)", "scale_share", 100),
            ("survivors time lost, start -> 2N step (ms)", "scale_lost_ms", 1),
            ("scale-out stall, worst survivor (ms)", "scale_stall_max", 1),
            ("graceful leave stall, worst member (ms)", "leave_stall_max", 1),
            ("SIGKILL -> first completed step (s)", "kill_to_step", 1), ("SIGSTOP -> first completed step (s)", "hang_to_step", 1),
            ("checkpoint-restart downtime (s)", "restart_down", 1)]
    print(f"\n# this build ({args.build}) against the baseline ({args.baseline}), {args.rounds} round(s) each, alternated")
    print(f"{'metric':44s} {'this: median (min-max)':>28s} {'baseline: median (min-max)':>28s} {'this/base':>9s}")
    for title, k, f in rows:
        if not this[k] or not base[k]:
            continue
        num = lambda x: f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
        fmt = lambda v: f"{num(statistics.median(v) * f)} ({num(min(v) * f)}-{num(max(v) * f)})"
        ratio = statistics.median(this[k]) / statistics.median(base[k]) if statistics.median(base[k]) else float("nan")
        print(f"{title:44s} {fmt(this[k]):>28s} {fmt(base[k]):>28s} {ratio:9.3f}")


if __name__ == "__main__":
    main()
