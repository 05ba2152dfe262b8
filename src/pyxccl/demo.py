"""`make run`'s job for now: every collective once on the ranks of this job,
with a table of what ran, over which transport and how long it took."""
from __future__ import annotations

import time

import numpy as np

import pyxccl


def main() -> None:
    comm = pyxccl.init()
    n, r = comm.size, comm.rank
    count = 1 << 20
    x = np.full(count, r + 1, np.float32)
    out = np.empty(count * n, np.float32)
    small = np.empty(count, np.float32)
    calls = [
        ("allreduce", lambda: comm.allreduce(x.copy()), n * (n + 1) / 2),
        ("broadcast", lambda: comm.broadcast(x.copy(), root=0), 1),
        ("reduce", lambda: comm.reduce(x.copy(), root=0), n * (n + 1) / 2 if r == 0 else r + 1),
        ("allgather", lambda: comm.allgather(x, out), None),
        ("gather", lambda: comm.gather(x, out if r == 0 else None, root=0), None),
        ("scatter", lambda: comm.scatter(out if r == 0 else None, small, root=0), None),
        ("reduce_scatter", lambda: comm.reduce_scatter(out, small), None),
        ("alltoall", lambda: comm.alltoall(out, np.empty_like(out)), None),
        ("barrier", lambda: comm.barrier(), None),
    ]
    rows = []
    for name, call, expect in calls:
        comm.barrier()
        t = time.perf_counter()
        res = call()
        dt = time.perf_counter() - t
        ok = expect is None or bool(np.all(np.asarray(res) == expect))
        rows.append((name, dt, ok))
    times = comm.allgather_object(rows)
    if r == 0:
        kinds = sorted({comm.transport(p) for p in range(n) if p != r} or {"self"})
        print(f"pyxccl {pyxccl.__version__}: {n} ranks, {count * 4 >> 20} MiB float32 per rank, "
              f"transport {'/'.join(kinds)}")
        print(f"{'collective':<16}{'max time (ms)':>14}{'ok':>5}")
        for i, (name, _, _) in enumerate(rows):
            t = max(rr[i][1] for rr in times) * 1e3
            ok = all(rr[i][2] for rr in times)
            print(f"{name:<16}{t:>14.2f}{'yes' if ok else 'NO':>5}")
    comm.close()


if __name__ == "__main__":
    main()
