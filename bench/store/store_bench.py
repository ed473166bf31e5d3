#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The rendezvous store side by side: ebbflow's embedded store (plaintext and
TLS), etcd (1 member and 3) and PyTorch's c10d TCPStore, in one run,
interleaved round by round (A B C ... A B C ...), with the same operations.

Per operation (set, get, add, compare-and-set, wait wake-up): the latency of
one client, min / p50 / p99 over every round. Throughput: K client processes
doing `add` at once, ops/s, for each K in --clients; the ratio embedded /
TCPStore at equal K is the goal's (>= 2). Then the load: M simulated members
of an elastic job heartbeating at the group's default interval (50 ms, what
the group's heartbeat thread does: a batched add, a wait for the abort key
until the next beat; member 0 reads every counter) against the embedded store
and etcd, for each M in --members; the largest M whose p99 stays within
--p99-ms (10 ms) is reported per backend.

ebbflow's clients are build/bench/store/store_bench (C++); TCPStore's are
Python processes (PyPI torch, a benchmark peer only; --python names an
interpreter that has it). etcd (Debian etcd-server) keeps its data in
/dev/shm: the figures are etcd's protocol and CPU, not a disk's fsync.

    store_bench.py --build BUILD [--rounds 3] [--n 2000] [--clients 1,4,16]
                   [--members 100,250,500,1000,1500,2000] [--json FILE]
                   [--quick] [--load-only] [--no-load]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKEN = "store-bench-token"

TCPSTORE_SERVER = r"""
import sys
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
print(s.port, flush=True)
sys.stdin.read()
"""

TCPSTORE_CLIENT = r"""
import json, sys, threading, time
from datetime import timedelta
from torch.distributed import TCPStore
port, op, n, key = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
def client():
    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
s = client()
s.set(key + "/v", "x")
s.set(key + "/cas", "0")
lat = []
mono = time.monotonic_ns
def ready_then_wait_for_go():
    print("ready", flush=True)
    sys.stdin.readline()
if op == "wait":
    setter = client()
    ready_then_wait_for_go()
    nxt = [-1]
    cv = threading.Condition()
    def run():
        for i in range(n):
            with cv:
                cv.wait_for(lambda: nxt[0] >= i)
            time.sleep(200e-6)
            setter.set(f"{key}/w/{i}", str(mono()))
    t = threading.Thread(target=run)
    t.start()
    t0 = mono()
    for i in range(n):
        k = f"{key}/w/{i}"
        with cv:
            nxt[0] = i
            cv.notify()
        s.wait([k])
        woke = mono()
        lat.append(woke - int(s.get(k)))
    t1 = mono()
    t.join()
else:
    ready_then_wait_for_go()
    t0 = mono()
    for i in range(n):
        a = mono()
        if op == "set":
            s.set(key + "/v", "value-of-16bytes")
        elif op == "get":
            s.get(key + "/v")
        elif op == "add":
            s.add(key + "/n", 1)
        elif op == "cas":
            if s.compare_set(key + "/cas", str(i), str(i + 1)) != str(i + 1).encode():
                sys.exit("compare_set did not swap")
        lat.append(mono() - a)
    t1 = mono()
lat.sort()
print(json.dumps({"op": op, "n": n, "t0_ns": t0, "t1_ns": t1, "lat_ns": lat}))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backend:
    """A running store and how its clients reach it."""

    def __init__(self, name):
        self.name, self.procs, self.address, self.env = name, [], None, {}

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def start_embedded(args, tls_dir=None):
    b = Backend("embedded-tls" if tls_dir else "embedded")
    cmd = [os.path.join(args.build, "tools/ebbflow-store/ebbflow-store"), "--port", "0", "--token", TOKEN]
    if tls_dir:
        cmd += ["--tls-cert", f"{tls_dir}/server.pem", "--tls-key", f"{tls_dir}/server.key"]
        b.env = {"EBBFLOW_TLS_CA": f"{tls_dir}/ca.pem"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    b.procs.append(p)
    line = p.stdout.readline()  # "ebbflow-store: listening on ADDR"
    b.address = line.strip().split("listening on ")[1]
    return b


def start_etcd(args, members, work):
    b = Backend(f"etcd{members}")
    names = [f"b{members}m{i}" for i in range(members)]
    cports = [free_port() for _ in names]
    pports = [free_port() for _ in names]
    initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, pports))
    for n, c, pp in zip(names, cports, pports):
        b.procs.append(subprocess.Popen(
            ["etcd", "--name", n, "--data-dir", os.path.join(work, n), "--listen-client-urls",
             f"http://127.0.0.1:{c}", "--advertise-client-urls", f"http://127.0.0.1:{c}", "--listen-peer-urls",
             f"http://127.0.0.1:{pp}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
             "--initial-cluster", initial, "--initial-cluster-state", "new", "--log-level", "error",
             "--max-txn-ops", "4096"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    eps = ",".join(f"http://127.0.0.1:{c}" for c in cports)
    for _ in range(200):
        r = subprocess.run(["etcdctl", "--endpoints", eps, "endpoint", "health"], capture_output=True,
                           env={**os.environ, "ETCDCTL_API": "3"})
        if r.returncode == 0:
            break
        time.sleep(0.1)
    b.address = "etcd://" + ",".join(f"127.0.0.1:{c}" for c in cports) + "/bench"
    return b


def start_tcpstore(args):
    b = Backend("tcpstore")
    p = subprocess.Popen([args.python, "-c", TCPSTORE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    b.procs.append(p)
    b.address = p.stdout.readline().strip()
    return b


def client_cmd(args, b, op, n, key):
    if b.name == "tcpstore":
        return [args.python, "-c", TCPSTORE_CLIENT, b.address, op, str(n), key]
    return [os.path.join(args.build, "bench/store/store_bench"), "ops", "--store", b.address, "--op", op, "--n",
            str(n), "--key", key]


def start_together(ps, what):
    """Each client says "ready" once connected; then all are told "go" at once."""
    for p in ps:
        line = p.stdout.readline()
        if line.strip() != "ready":
            for q in ps:
                q.kill()
            raise RuntimeError(f"{what}: a client did not get ready ({line.strip()!r}): "
                               f"{p.stderr.read().strip()[-500:]}")
    for p in ps:
        p.stdin.write("go\n")
        p.stdin.flush()


def run_clients(args, b, op, n, k, tag):
    """k client processes at once, started together; their JSON results."""
    env = {**os.environ, "EBBFLOW_TOKEN": TOKEN, **b.env}
    ps = [subprocess.Popen(client_cmd(args, b, op, n, f"{tag}/{i}"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env) for i in range(k)]
    start_together(ps, f"{b.name} {op}")
    out = []
    for p in ps:
        o, e = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{b.name} {op}: client failed ({p.returncode}): {e.strip()[-500:]}")
        out.append(json.loads(o.strip().splitlines()[-1]))
    return out


def pct(v, p):
    return v[min(len(v) - 1, int(p * len(v)))]


def load_point(args, b, members):
    """Members of one simulated job, split over processes; the worst p99 over them."""
    procs = min(args.load_procs, members)
    env = {**os.environ, "EBBFLOW_TOKEN": TOKEN, **b.env}
    per = [members // procs + (1 if i < members % procs else 0) for i in range(procs)]
    firsts = [sum(per[:i]) for i in range(procs)]
    ps = [subprocess.Popen([os.path.join(args.build, "bench/store/store_bench"), "load", "--store", b.address,
                            "--members", str(m), "--first", str(f), "--total", str(members), "--seconds",
                            str(args.load_seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env) for m, f in zip(per, firsts)]
    start_together(ps, f"{b.name} load of {members}")
    rs = []
    for p in ps:
        o, e = p.communicate(timeout=args.load_seconds * 4 + 120)
        if p.returncode != 0 or not o.strip():
            rs.append({"errors": 1, "why": e.strip()[-300:]})
            continue
        rs.append(json.loads(o.strip().splitlines()[-1]))
    ok = [r for r in rs if "hb_p99_ms" in r]
    agg = {
        "backend": b.name, "members": members, "processes": procs,
        "errors": sum(r.get("errors", 0) for r in rs),
        "hb_ops_per_s": sum(r["hb_n"] for r in ok) / max(1e-9, max((r["seconds"] for r in ok), default=1)),
        "hb_p50_ms": max((r["hb_p50_ms"] for r in ok), default=float("nan")),
        "hb_p99_ms": max((r["hb_p99_ms"] for r in ok), default=float("nan")),
        "wait_late_p99_ms": max((r["wait_late_p99_ms"] for r in ok), default=float("nan")),
        "coord_p99_ms": max((r["coord_p99_ms"] for r in ok), default=0.0),
    }
    agg["p99_ms"] = max(agg["hb_p99_ms"], agg["wait_late_p99_ms"])
    return agg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000, help="operations per latency sample")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--ops-per-client", type=int, default=2000)
    ap.add_argument("--members", default="100,250,500,1000,1500,2000")
    ap.add_argument("--load-seconds", type=float, default=10)
    ap.add_argument("--load-procs", type=int, default=4)
    ap.add_argument("--load-backends", default="embedded,etcd1,etcd3")
    ap.add_argument("--p99-ms", type=float, default=10.0)
    ap.add_argument("--python", default="/opt/ebbflow-bench-venv/bin/python"
                    if os.path.exists("/opt/ebbflow-bench-venv/bin/python") else sys.executable)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 round, few operations, small loads")
    ap.add_argument("--load-only", action="store_true")
    ap.add_argument("--no-load", action="store_true")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.quick:
        args.rounds, args.n, args.ops_per_client, args.clients = 1, 200, 200, "1,4"
        args.members, args.load_seconds, args.load_backends = "20,50", 2, "embedded,etcd1"
    jsonl = open(args.json, "w") if args.json else None

    def emit(obj):
        if jsonl:
            jsonl.write(json.dumps(obj) + "\n")

    work = tempfile.mkdtemp(prefix="ebbflow-store-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    backends = []
    try:
        have_torch = subprocess.run([args.python, "-c", "import torch.distributed"], capture_output=True).returncode == 0
        have_etcd = shutil.which("etcd") is not None and shutil.which("etcdctl") is not None
        certs = os.path.join(work, "certs")
        subprocess.run(["bash", os.path.join(ROOT, "tests/elastic/tls/make_certs.sh"), certs], check=True,
                       capture_output=True)
        backends.append(start_embedded(args))
        backends.append(start_embedded(args, certs))
        if have_etcd:
            backends.append(start_etcd(args, 1, work))
            backends.append(start_etcd(args, 3, work))
        else:
            print("etcd is not installed (Debian etcd-server, etcd-client): its columns are left out")
        if have_torch:
            backends.append(start_tcpstore(args))
        else:
            print(f"{args.python} cannot import torch (pip install torch): TCPStore's columns are left out")
        print(f"store benchmark: {', '.join(b.name for b in backends)}; {os.cpu_count()} cores; "
              f"{time.strftime('%Y-%m-%d')}")
        ops = ["set", "get", "add", "cas", "wait"]
        clients = [int(x) for x in args.clients.split(",")]
        if not args.load_only:
            lat = {(b.name, op): [] for b in backends for op in ops}
            thr = {(b.name, k): [] for b in backends for k in clients}
            for r in range(args.rounds):
                for op in ops:
                    for b in backends:  # interleaved: every backend in each round, in turn
                        res = run_clients(args, b, op, args.n if op != "wait" else max(50, args.n // 10), 1,
                                          f"lat{r}")
                        lat[(b.name, op)].extend(res[0]["lat_ns"])
                for k in clients:
                    for b in backends:
                        res = run_clients(args, b, "add", args.ops_per_client, k, f"thr{r}k{k}")
                        span = max(x["t1_ns"] for x in res) - min(x["t0_ns"] for x in res)
                        thr[(b.name, k)].append(sum(x["n"] for x in res) / (span / 1e9))
            print("\nper-operation latency, one client (us): min / p50 / p99 over all rounds")
            print(f"{'op':6}" + "".join(f"{b.name:>26}" for b in backends))
            for op in ops:
                row = f"{op:6}"
                for b in backends:
                    v = sorted(lat[(b.name, op)])
                    row += f"{v[0] / 1e3:>9.1f} {pct(v, 0.5) / 1e3:>7.1f} {pct(v, 0.99) / 1e3:>8.1f}"
                    emit({"kind": "latency", "backend": b.name, "op": op, "n": len(v), "min_us": v[0] / 1e3,
                          "p50_us": pct(v, 0.5) / 1e3, "p99_us": pct(v, 0.99) / 1e3})
                print(row)
            print("\nthroughput of `add`, K client processes at once (ops/s, median of rounds)")
            print(f"{'K':>4}" + "".join(f"{b.name:>14}" for b in backends) +
                  ("   embedded/tcpstore" if have_torch else ""))
            for k in clients:
                row, med = f"{k:>4}", {}
                for b in backends:
                    med[b.name] = statistics.median(thr[(b.name, k)])
                    row += f"{med[b.name]:>14.0f}"
                    emit({"kind": "throughput", "backend": b.name, "clients": k, "op": "add",
                          "ops_per_s": med[b.name], "rounds": thr[(b.name, k)]})
                if have_torch:
                    row += f"{med['embedded'] / med['tcpstore']:>20.2f}"
                print(row)
            # Latency ratio too, for the record.
            if have_torch:
                p50 = {b: pct(sorted(lat[(b, 'add')]), 0.5) for b in ("embedded", "tcpstore")}
                print(f"\nadd p50: embedded / tcpstore = {p50['embedded'] / p50['tcpstore']:.2f}")
        if not args.no_load:
            print(f"\nload: M members heartbeating every 50 ms for {args.load_seconds} s; p99 = the worse of the "
                  f"heartbeat's batched add and the wait's lateness past its deadline (goal <= {args.p99_ms} ms)")
            print(f"{'backend':>10} {'M':>6} {'hb ops/s':>9} {'hb p50':>8} {'hb p99':>8} {'wait late p99':>14} "
                  f"{'coord p99':>10} {'errors':>7}")
            wanted = set(args.load_backends.split(","))
            for b in backends:
                if b.name not in wanted:
                    continue
                best = 0
                for m in [int(x) for x in args.members.split(",")]:
                    a = load_point(args, b, m)
                    emit({"kind": "load", **a})
                    print(f"{b.name:>10} {m:>6} {a['hb_ops_per_s']:>9.0f} {a['hb_p50_ms']:>8.2f} "
                          f"{a['hb_p99_ms']:>8.2f} {a['wait_late_p99_ms']:>14.2f} {a['coord_p99_ms']:>10.2f} "
                          f"{a['errors']:>7}", flush=True)
                    if a["errors"] == 0 and a["p99_ms"] <= args.p99_ms:
                        best = m
                    else:
                        break  # a larger job only does worse
                print(f"{b.name:>10}: the largest member count within p99 <= {args.p99_ms} ms: "
                      f"{best if best else 'none measured'}")
                emit({"kind": "load_max", "backend": b.name, "members": best, "p99_ms": args.p99_ms})
    finally:
        for b in backends:
            b.stop()
        shutil.rmtree(work, ignore_errors=True)
        if jsonl:
            jsonl.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
