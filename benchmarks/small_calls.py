"""The small-call floor: time per blocking allreduce of a few bytes, plain and persistent.

    pyxccl run -n 2 benchmarks/small_calls.py [--bytes 8] [--iters 20000] [--batches 5] [--profile DIR]

Each batch times ``--iters`` plain calls (``comm.allreduce(x)``), then ``--iters`` blocking starts of
a persistent request (``req()`` of ``comm.allreduce_init(x)``), after a barrier so both ranks enter
together; rank 0 prints each batch and the medians over the batches (one batch is at the mercy of
whatever else the machine runs). ``--profile DIR``: rank 0 also writes cProfile dumps of one more
batch of each form, DIR/plain.prof and DIR/persistent.prof (``python -m pstats``). The same loops with
Intel MPI or MPICH (mpi4py's ``Allreduce`` and ``Allreduce_init``): benchmarks/small_calls_mpi.py.
"""
import argparse
import os
import statistics
import time

import numpy as np

import pyxccl


def timed(call, iters: int, comm) -> float:
    """Seconds per call of ``call()`` over ``iters`` calls, both ranks starting together."""
    comm.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=8, help="payload per call (float32 elements: bytes // 4)")
    ap.add_argument("--iters", type=int, default=20000, help="calls per batch")
    ap.add_argument("--batches", type=int, default=5, help="batches of each form (medians are over these)")
    ap.add_argument("--profile", metavar="DIR", help="rank 0 writes cProfile dumps here")
    a = ap.parse_args()

    comm = pyxccl.init()
    x = np.ones(max(1, a.bytes // 4), np.float32)
    req = comm.allreduce_init(x)
    plain = lambda: comm.allreduce(x)       # noqa: E731
    for _ in range(2000):                   # warm: plans, prepared calls, the segment's rounds
        plain()
        req()
    times = {"plain": [], "persistent": []}
    for _ in range(a.batches):
        times["plain"].append(timed(plain, a.iters, comm))
        times["persistent"].append(timed(req, a.iters, comm))
    if a.profile:
        import cProfile
        os.makedirs(a.profile, exist_ok=True)
        for name, call in (("plain", plain), ("persistent", req)):
            comm.barrier()
            if comm.rank == 0:
                prof = cProfile.Profile()
                prof.runcall(lambda: [call() for _ in range(a.iters)])
                prof.dump_stats(os.path.join(a.profile, f"{name}.prof"))
            else:
                for _ in range(a.iters):
                    call()
    req.free()
    if comm.rank == 0:
        us = {k: [t * 1e6 for t in v] for k, v in times.items()}
        for k, v in us.items():
            print(f"{k:>10}: median {statistics.median(v):6.2f} us  batches " + " ".join(f"{t:.2f}" for t in v))
        print(f"{a.bytes} B allreduce, {comm.size} ranks, algorithm {req.algorithm}, {a.iters} calls per batch")
    comm.close()


if __name__ == "__main__":
    main()
