#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Allreduce benchmark driver: ebbflow vs Open MPI vs Gloo, interleaved.

Each round runs every contestant over the whole size sweep, one after the
other (A B C A B C ...), so machine noise hits all of them alike. Samples of
all rounds are pooled per (contestant, ranks, size). Prints nccl-tests
columns (time = median) plus min/p99 and the busbw ratio ebbflow / best peer.

  run_allreduce_bench.py --build build/release [--ranks 2,4] [--rounds 3]
                         [--sizes 4096,...] [--json out.jsonl] [--only ebbflow,openmpi]
                         [--baseline OTHER_BUILD]

--baseline adds ebbflow's contestants built from another tree (e.g. the
commit before a change) as `base:ebbflow`, `base:ebbflow_shm`, interleaved
with the rest, and prints this build's time over the baseline's per size
(the regression check of a change, in one run).
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

NETNS = []  # --netns: rank r runs in NETNS[r] (ip netns exec), with the per-rank env below

def launch_env_ranks(cmd, n, extra_env=None, timeout=900):
    """Starts n processes of cmd with EBBFLOW_RANK/EBBFLOW_WORLD_SIZE; returns rank 0's stdout."""
    with tempfile.TemporaryDirectory(prefix="ebbflow-bench-") as d:
        procs = []
        for r in range(n):
            env = dict(os.environ, EBBFLOW_RANK=str(r), EBBFLOW_WORLD_SIZE=str(n), EBBFLOW_LOCAL_RANK=str(r),
                       EBBFLOW_BENCH_DIR=d, **(extra_env or {}))
            full = cmd
            if NETNS:
                ns, ip = NETNS[r].split("=")
                env.update(GLOO_HOSTNAME=ip, UCX_TLS="tcp", UCX_NET_DEVICES="ebb0", EBBFLOW_ALLREDUCE_ALGO="ring")
                full = ["ip", "netns", "exec", ns] + cmd
            procs.append(subprocess.Popen(full, env=env, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
        try:
            out, _ = procs[0].communicate(timeout=timeout)
            for p in procs[1:]:
                p.wait(timeout=60)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{cmd[0]} failed: exit codes {[p.returncode for p in procs]}")
        return out.decode()

def contestants(build, n, sizes_arg, only, baseline=""):
    c = own_contestants(build, n, sizes_arg)
    if baseline:
        base = own_contestants(baseline, n, sizes_arg)
        c.update({"base:" + k: v for k, v in base.items() if k.startswith("ebbflow")})
    return {k: v for k, v in c.items() if not only or k.removeprefix("base:") in only}

def own_contestants(build, n, sizes_arg):
    b = os.path.join(build, "bench", "allreduce")
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--bind-to", "none"]
    c = {
        "ebbflow": lambda: launch_env_ranks([os.path.join(b, "bench_allreduce_ebbflow")] + sizes_arg, n),
        # The buffer in registered shared memory (comm::shared_buffer): peers on the host map it.
        "ebbflow_shm": lambda: launch_env_ranks([os.path.join(b, "bench_allreduce_ebbflow")] + sizes_arg, n,
                                                {"EBBFLOW_BENCH_SHARED": "1"}),
        "openmpi": lambda: subprocess.run(mpirun + [os.path.join(b, "bench_allreduce_mpi")] + sizes_arg,
                                          check=True, capture_output=True, text=True, timeout=900).stdout,
        # Open MPI busy-polls without yielding; on a shared, oversubscribed
        # machine that can cost it whole time slices, so also run it with
        # yielding on (the best of both is the peer ratios are taken against).
        "openmpi_yield": lambda: subprocess.run(mpirun[:-2] + ["--mca", "mpi_yield_when_idle", "1"] + mpirun[-2:] +
                                                [os.path.join(b, "bench_allreduce_mpi")] + sizes_arg, check=True,
                                                capture_output=True, text=True, timeout=900,
                                                env=dict(os.environ, BENCH_LABEL="openmpi_yield")).stdout,
        "gloo_ring": lambda: launch_env_ranks([os.path.join(b, "bench_allreduce_gloo")] + sizes_arg + ["ring"], n),
        "gloo_hd": lambda: launch_env_ranks([os.path.join(b, "bench_allreduce_gloo")] + sizes_arg + ["hd"], n),
    }
    if NETNS:  # mpirun cannot place ranks into namespaces without a remote launcher; no shared memory across hosts
        c = {k: v for k, v in c.items() if not k.startswith("openmpi") and k != "ebbflow_shm"}
    return c

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="")
    ap.add_argument("--samples", default="5")
    ap.add_argument("--json", default="")
    ap.add_argument("--only", default="")
    ap.add_argument("--netns", default="", help="NS=IP,NS=IP: one namespace per rank (ebbflow and Gloo only)")
    ap.add_argument("--baseline", default="", help="another build whose ebbflow runs beside this one's (base:...)")
    a = ap.parse_args()
    if a.netns:
        NETNS.extend(a.netns.split(","))
    sizes_arg = (["--sizes", a.sizes] if a.sizes else []) + ["--samples", a.samples]
    only = [x for x in a.only.split(",") if x]
    jf = open(a.json, "w") if a.json else None
    for n in [int(x) for x in a.ranks.split(",")]:
        cs = contestants(a.build, n, sizes_arg, only, a.baseline)
        data = {}  # (lib, bytes) -> samples, wrong
        for rnd in range(a.rounds):
            for name, run in cs.items():
                for line in run().splitlines():
                    if not line.startswith("{"):
                        continue
                    rec = json.loads(line)
                    key = (name, rec["bytes"])
                    s, w = data.get(key, ([], 0))
                    data[key] = (s + rec["us"], w + rec["wrong"])
                print(f"# ranks {n} round {rnd + 1}/{a.rounds}: {name} done", file=sys.stderr, flush=True)
        sizes = sorted({k[1] for k in data})
        print(f"\n## allreduce, {n} ranks, f32 sum, in place (time = median us over {a.rounds} interleaved rounds)")
        hdr = f"{'size':>10} {'count':>10} {'type':>5} {'redop':>5}"
        for name in cs:
            hdr += f" | {name + ' time':>17} {'algbw':>6} {'busbw':>6} {'min':>9} {'p99':>9} {'#wrong':>6}"
        mine = [k for k in cs if k.startswith("ebbflow")]
        for k in mine:
            hdr += f" | {k}/best-peer busbw"
        based = [k for k in mine if "base:" + k in cs]
        for k in based:
            hdr += f" | {k} time/base (min, median)"
        print(hdr)
        for sz in sizes:
            row = f"{sz:>10} {sz // 4:>10} {'float':>5} {'sum':>5}"
            busbw = {}
            for name in cs:
                s, w = data.get((name, sz), ([float('nan')], -1))
                med = statistics.median(s)
                alg = sz / med / 1e3  # GB/s
                bus = alg * 2 * (n - 1) / n
                busbw[name] = bus
                row += f" | {med:>17.2f} {alg:>6.2f} {bus:>6.2f} {min(s):>9.2f} {pct(s, 99):>9.2f} {w:>6}"
                if jf:
                    jf.write(json.dumps({"bench": "allreduce", "lib": name, "ranks": n, "bytes": sz, "dtype": "f32",
                                         "op": "sum", "median_us": med, "min_us": min(s), "p99_us": pct(s, 99),
                                         "algbw_GBps": alg, "busbw_GBps": bus, "wrong": w}) + "\n")
            peers = {k: v for k, v in busbw.items() if not k.startswith(("ebbflow", "base:"))}
            if peers:
                best = max(peers, key=peers.get)
                for k in mine:
                    row += f" | {busbw[k] / peers[best]:.2f}x (vs {best})"
            for k in based:
                s_new, _ = data.get((k, sz), ([float('nan')], -1))
                s_old, _ = data.get(("base:" + k, sz), ([float('nan')], -1))
                row += f" | {min(s_new) / min(s_old):.2f} {statistics.median(s_new) / statistics.median(s_old):.2f}"
            print(row, flush=True)
    if jf:
        jf.close()

if __name__ == "__main__":
    main()
