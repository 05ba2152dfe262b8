"""Soak: many mixed collectives, then many close/init cycles, watching memory, descriptors and threads.

    .venv/bin/python benchmarks/soak.py [--calls 20000] [--cycles 100] [-n 4]

For each transport (shared memory, then TCP) it starts ``-n`` ranks with
``pyxccl run`` that make ``--calls`` collectives (allreduce, allgather,
alltoall, broadcast, reduce_scatter, gather, scatter, reduce, barrier and a
send/recv pair, with varying sizes, dtypes, ops and roots), checking every
result against numpy. RSS, open descriptors and threads are read after a
warm-up of 5,000 calls (the flight recorder, plans and prepared calls full) and at the end. Then
``--cycles`` init/close cycles in one process: descriptors, shared-memory
maps and threads after the third cycle and after the last. A table per
phase; figures per rank are the worst rank's.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

WARMUP = 5000      # calls before the first reading: with random sizes the caches are full by then
# Element counts drawn from a menu, as a training loop's are (--sizes menu, the default), or any count
# (--sizes random: every call a new shape, so the plans' and prepared calls' caches turn over).
MENU = (1, 2, 7, 64, 1000, 1001, 4096, 65536, 131072)
SIZES = MENU if os.environ.get("SOAK_SIZES", "menu") == "menu" else ()


def state() -> dict:
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if "memfd" in line or "/dev/shm" in line)
    return dict(rss=rss, fds=len(os.listdir("/proc/self/fd")), threads=threading.active_count(), maps=maps)


def mixed(comm, i: int, rng) -> int:
    """Collective number ``i`` of the soak, checked; returns how many it made."""
    n, r = comm.size, comm.rank
    kind = i % 10
    count = int(rng.choice(SIZES)) if SIZES else int(rng.integers(1, 3000)) if i % 7 else int(rng.integers(1, 1 << 17))
    dt = (np.float32, np.float64, np.int32, np.int64)[i % 4]
    base = np.arange(count, dtype=dt) % 7
    mine = base + r
    if kind == 0:
        x = mine.copy()
        comm.allreduce(x)
        want = base * n + n * (n - 1) // 2
    elif kind == 1:
        out = np.empty(count * n, dt)
        comm.allgather(mine, out)
        x, want = out, np.concatenate([base + q for q in range(n)])
    elif kind == 2:
        send = np.concatenate([base + 10 * r + q for q in range(n)])
        x = np.empty_like(send)
        comm.alltoall(send, x)
        want = np.concatenate([base + 10 * q + r for q in range(n)])
    elif kind == 3:
        root = i % n
        x = mine.copy()
        comm.broadcast(x, root=root)
        want = base + root
    elif kind == 4:
        send = np.concatenate([base + r] * n)
        x = np.empty(count, dt)
        comm.reduce_scatter(send, x, op="max")
        want = base + n - 1
    elif kind == 5:
        root = (i // 10) % n
        out = np.empty(count * n, dt) if r == root else None
        comm.gather(mine, out, root=root)
        x, want = (out, np.concatenate([base + q for q in range(n)])) if r == root else (None, None)
    elif kind == 6:
        root = (i // 10 + 1) % n
        send = np.concatenate([base + q for q in range(n)]) if r == root else None
        x = np.empty(count, dt)
        comm.scatter(send, x, root=root)
        want = base + r
    elif kind == 7:
        root = (i // 10 + 2) % n
        x = mine.copy()
        comm.reduce(x, root=root, op="min")
        x, want = (x, base) if r == root else (None, None)
    elif kind == 8:
        comm.barrier()
        x = want = None
    else:
        x = mine.copy()
        if r == 0:
            comm.send(x, 1)
            x = want = None
        elif r == 1:
            comm.recv(x, 0)
            want = base
        else:
            x = want = None
    if want is not None and not np.array_equal(x, want):
        raise AssertionError(f"rank {r}: call {i} ({kind}) wrong")
    return 1


def rank_calls(calls: int) -> None:
    import gc

    import pyxccl
    comm = pyxccl.init(timeout=60)
    rng = np.random.default_rng(7)        # the same sizes on every rank
    for i in range(WARMUP):
        mixed(comm, i, rng)
    comm.barrier()
    gc.collect()
    before, t0 = state(), time.perf_counter()
    for i in range(WARMUP, WARMUP + calls):
        mixed(comm, i, rng)
    comm.barrier()          # every rank still connected while it counts threads and descriptors
    gc.collect()
    after = state()
    comm.barrier()
    print("SOAK " + json.dumps(dict(before=before, after=after, seconds=time.perf_counter() - t0)), flush=True)
    comm.close()


def rank_cycles(cycles: int) -> None:
    import pyxccl
    x = np.ones(4096, np.float32)
    seen = {}
    for i in range(cycles):
        comm = pyxccl.init(timeout=60)
        comm.allreduce(x)
        comm.allgather(x, np.empty(4096 * comm.size, np.float32))
        comm.close()
        if i == 2:
            seen["before"] = state()
        if i == cycles - 1:
            seen["after"] = state()
    print("SOAK " + json.dumps(seen), flush=True)


def launch(n: int, transport: str, mode: str, amount: int, sizes: str) -> list[dict]:
    env = dict(os.environ, PYXCCL_TRANSPORT=transport, SOAK_SIZES=sizes)
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", str(n), __file__, f"--{mode}", str(amount)],
                       env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"soak {mode} over {transport} failed:\n{p.stdout}\n{p.stderr}")
    return [json.loads(line.split("SOAK ", 1)[1]) for line in p.stdout.splitlines() if "SOAK " in line]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--sizes", choices=("menu", "random"), default="menu",
                    help="element counts from a menu of 9 (as a training loop's), or any (every call a new shape)")
    ap.add_argument("--rank-calls", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank-cycles", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_calls:
        return rank_calls(a.rank_calls)
    if a.rank_cycles:
        return rank_cycles(a.rank_cycles)
    print("| transport | phase | per rank | RSS growth (MB) | fds | threads | shm maps | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for transport in ("shm", "tcp"):
        for mode, amount, what in (("rank-calls", a.calls, f"{a.calls} calls ({a.sizes} sizes), all right"),
                                   ("rank-cycles", a.cycles, f"{a.cycles} init/close")):
            t0 = time.perf_counter()
            res = launch(a.n, transport, mode, amount, a.sizes)
            grow = max((r["after"]["rss"] - r["before"]["rss"]) / 1e6 for r in res)

            def delta(k):
                return " / ".join(f"{r['before'][k]}->{r['after'][k]}" for r in res)
            secs = max(r.get("seconds", 0) for r in res) or time.perf_counter() - t0
            print(f"| {transport} | {what} | {len(res)} ranks | {grow:+.2f} | {delta('fds')} | {delta('threads')} "
                  f"| {delta('maps')} | {secs:.1f} |", flush=True)


if __name__ == "__main__":
    main()
