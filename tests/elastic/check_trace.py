#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the sample traces of an elastic job (examples/elastic_train --trace DIR).

Every process writes trace.<pid>-<random>.txt: per attempt of a step
"A generation step epoch cursor global_batch first-last ...", the positions of
the global batch it trained on, written before the gradient allreduce; and
"C generation step [H(sums) H(state)]" when that allreduce succeeded and the
update was applied (hashes of the reduced gradient and of the parameters and
optimizer state after the update). A step attempt that any
process committed summed the gradients of every member of its generation, so
the ranges of all processes' "A" lines of that (generation, step) must cover
[0, global_batch) exactly once, with one epoch, cursor and global batch, and
with --steps every step below it must be committed. (A step may show commits
in two generations: a member judged dead that finished the allreduce anyway
commits it alone, and its state is replaced when it rejoins.) Every process
that committed a (generation, step) must report the same two hashes: the
allreduce gives every member the same bits, and members of one generation hold
the same state, so a difference names a corrupted sum or a wrong state
transfer, and the step where it first showed.

With --min-spread R, heterogeneous workers must have been given unequal
slices: in some committed step the largest process's share of the global
batch must be at least R times the smallest's (else the run did not test the
gradient weighting of unequal slices).

    check_trace.py DIR [--steps N] [--min-spread R]
        exit 0: consistent; 1: the first problems, named
"""
import argparse
import collections
import glob
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, help="the job's step count: every step below it must be committed")
    ap.add_argument("--min-spread", type=float, help="some committed step's largest slice / smallest slice >= this")
    a = ap.parse_args()
    attempts = collections.defaultdict(list)  # (g, s) -> [(pid, epoch, cursor, B, ranges)]
    commits = collections.defaultdict(set)  # s -> {g}
    hashes = collections.defaultdict(dict)  # (g, s) -> {pid: (H(sums), H(state))}
    sums = collections.defaultdict(list)  # s -> [(Σ parameters, pid, g)]
    committed_heads = collections.defaultdict(set)  # s -> {(epoch, cursor, B)} of its commits
    parts = collections.defaultdict(dict)  # ("P" before / "S" after the allreduce, g, s) -> {pid: [segment sums]}
    files = sorted(glob.glob(os.path.join(a.dir, "trace.*.txt")))
    if not files:
        print(f"check_trace: no trace.*.txt in {a.dir}")
        return 1
    for f in files:
        pid = os.path.basename(f).split(".")[1]
        with open(f) as fh:
            for line in fh:
                p = line.split()
                if not p:
                    continue
                if p[0] == "A" and len(p) >= 6:
                    g, s, e, c, b = map(int, p[1:6])
                    ranges = [tuple(map(int, r.split("-"))) for r in p[6:]]
                    attempts[(g, s)].append((pid, e, c, b, ranges))
                elif p[0] in ("P", "S") and len(p) >= 4:
                    parts[(p[0], int(p[1]), int(p[2]))][pid] = [float(x) for x in p[3:]]
                elif p[0] == "C" and len(p) in (3, 5, 6, 7):
                    commits[int(p[2])].add(int(p[1]))
                    if len(p) >= 6:
                        sums[int(p[2])].append((float(p[5]), pid, int(p[1])))
                    if len(p) >= 5:
                        hashes[(int(p[1]), int(p[2]))][pid] = (p[3], p[4])
    problems = []
    spread = (0.0, None, None)  # (largest / smallest slice, step, sizes) over committed steps
    for s in sorted(commits):
        for g in sorted(commits[s]):
            att = attempts.get((g, s), [])
            sizes = [sum(hi - lo for lo, hi in r) for _, _, _, _, r in att]
            if len(sizes) > 1 and min(sizes) > 0 and max(sizes) / min(sizes) > spread[0]:
                spread = (max(sizes) / min(sizes), s, sorted(sizes))
            heads = {(e, c, b) for _, e, c, b, _ in att}
            if len(heads) != 1:
                problems.append(f"step {s} generation {g}: processes disagree on (epoch, cursor, B): {sorted(heads)}")
                continue
            (_, _, b), = heads
            committed_heads[s].add(next(iter(heads)))
            seen = collections.Counter()
            for pid, _, _, _, ranges in att:
                for lo, hi in ranges:
                    for x in range(lo, hi):
                        seen[x] += 1
            missing = [x for x in range(b) if seen[x] == 0]
            twice = sorted(x for x, n in seen.items() if n > 1)
            outside = sorted(x for x in seen if x >= b)
            if missing or twice or outside:
                who = ", ".join(f"{pid}:{' '.join(f'{lo}-{hi}' for lo, hi in r)}" for pid, _, _, _, r in att)
                problems.append(f"step {s} generation {g} (B={b}): missing {missing[:10]}, repeated {twice[:10]}, "
                                f"outside {outside[:10]}; processes {who}")
    for (g, s), by_pid in sorted(hashes.items()):
        for i, what in ((0, "reduced gradients"), (1, "parameters after the update")):
            if len({h[i] for h in by_pid.values()}) > 1:
                who = ", ".join(f"{pid}:{h[i]}" for pid, h in sorted(by_pid.items()))
                problems.append(f"step {s} generation {g}: the processes that committed it hold different "
                                f"{what}: {who}")
    # Per allreduce segment, the members' parts (P, before) add up to the
    # reduced sum (S, after): a segment whose reduction went wrong is named,
    # with the rank that reduced it.
    for (kind, g, s), after in sorted(parts.items()):
        if kind != "S" or s not in commits or g != max(commits[s]):
            continue
        before = parts.get(("P", g, s), {})
        red = next(iter(after.values()))
        if len(before) != len(red):
            continue  # not every member's part is in the trace (a killed process)
        for k, r in enumerate(red):
            total = sum(v[k] for v in before.values())
            scale = sum(abs(v[k]) for v in before.values()) + abs(r) + 1e-6
            if abs(total - r) > 1e-4 * scale:
                problems.append(f"step {s} generation {g}: segment {k} (reduced by rank {k}) sums to {r:.9e}, "
                                f"but the members' parts add up to {total:.9e}: "
                                + ", ".join(f"{pid}:{v[k]:.6e}" for pid, v in sorted(before.items())))
    # Each step starts where the one before ended: cursor + B, or the next
    # epoch at 0 (a state transfer or a recovery that lost or repeated a
    # step's position would show here, whatever the samples within a step).
    for s in sorted(committed_heads):
        if s == 0:
            if committed_heads[0] != {(0, 0, next(iter(committed_heads[0]))[2])}:
                problems.append(f"step 0 does not start at epoch 0, cursor 0: {sorted(committed_heads[0])}")
            continue
        if s - 1 not in committed_heads:
            continue
        for e, c, _ in committed_heads[s]:
            if not any((e == e0 and c == c0 + b0) or (e == e0 + 1 and c == 0) for e0, c0, b0 in committed_heads[s - 1]):
                problems.append(f"step {s} starts at epoch {e}, cursor {c}: not where step {s - 1} ended "
                                f"({sorted(committed_heads[s - 1])})")
    if a.steps is not None:
        absent = [s for s in range(a.steps) if s not in commits]
        if absent:
            problems.append(f"steps never committed: {absent[:20]}")
    # With the single-process run's trace (elastic_train --reference --trace DIR:
    # "R step Σparameters"), the first step whose parameters drift from it.
    ref_path = os.path.join(a.dir, "reference.txt")
    if os.path.exists(ref_path):
        ref = {}
        with open(ref_path) as fh:
            for line in fh:
                p = line.split()
                if len(p) == 3 and p[0] == "R":
                    ref[int(p[1])] = float(p[2])
        # Sums in another order: the difference to the reference moves by
        # rounding only (about 1e-7 a step for elastic_train's model); a
        # lost, repeated or corrupted contribution moves it at once.
        before = None
        for s in sorted(sums):
            if s not in ref:
                continue
            # A member judged dead that finished a step's allreduce anyway
            # commits it alone in its old generation, from peers' buffers
            # already reused; its state is replaced when it rejoins. The
            # step's last generation is the one the job went on from.
            last = max(g for _, _, g in sums[s])
            now = [(x, pid, g) for x, pid, g in sums[s] if g == last]
            d = now[0][0] - ref[s]
            if before is not None and before[0] == s - 1 and abs(d - before[1]) > 2e-5:
                problems.append(f"step {s}: the parameters jump away from the single-process run's: sum "
                                f"{now[0][0]:.9e} against {ref[s]:.9e} (difference {d:.3e}, after {before[1]:.3e} "
                                f"at step {s - 1}; generation {last}, processes "
                                + ", ".join(pid for _, pid, _ in now) + ")")
                break
            before = (s, d)
    if a.min_spread is not None and spread[0] < a.min_spread:
        problems.append(f"no committed step gave its processes slices {a.min_spread} times apart: the most uneven "
                        f"was {spread[0]:.2f} (step {spread[1]}, sizes {spread[2]})")
    for p in problems[:20]:
        print("check_trace:", p)
    if not problems:
        print(f"check_trace: {len(commits)} committed steps, every sample of each exactly once "
              f"({len(files)} processes, {len(attempts)} step attempts; the most uneven slices "
              f"{spread[2]} at step {spread[1]})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
