"""benchmarks/small_calls.py's loops with MPI (mpi4py): plain ``Allreduce`` in place, and a persistent
``Allreduce_init`` started and waited, each batch after a barrier; rank 0 prints the medians over the
batches in small_calls.py's form, to set beside it.

    python benchmarks/small_calls_mpi.py impi -n 2 [--bytes 8] [--iters 20000] [--batches 5]
    python benchmarks/small_calls_mpi.py mpi -n 2 ...              (MPICH)

Run with this project's Python (`make peers` installs mpi4py and Intel MPI); it starts the ranks the way
`pyxccl bench --vs` does (pyxccl.bench.compare).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def ranks(a) -> None:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    x = np.ones(max(1, a.bytes // 4), np.float32)
    req = comm.Allreduce_init(MPI.IN_PLACE, x)

    def plain():
        comm.Allreduce(MPI.IN_PLACE, x)

    def persistent():
        req.Start()
        req.Wait()

    def timed(call) -> float:
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(a.iters):
            call()
        return (time.perf_counter() - t) / a.iters

    for _ in range(2000):
        plain()
        persistent()
    times = {"plain": [], "persistent": []}
    for _ in range(a.batches):
        times["plain"].append(timed(plain))
        times["persistent"].append(timed(persistent))
    req.Free()
    if comm.rank == 0:
        for k, v in times.items():
            us = [t * 1e6 for t in v]
            print(f"{k:>10}: median {statistics.median(us):6.2f} us  batches " + " ".join(f"{t:.2f}" for t in us))
        print(f"{a.bytes} B Allreduce, {comm.size} ranks, {MPI.Get_library_version().splitlines()[0]}, "
              f"{a.iters} calls per batch")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", choices=("mpi", "impi"))
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)     # (set for the ranks)
    a = ap.parse_args()
    if a.rank:
        ranks(a)
        return
    from pyxccl.bench import compare
    env = dict(os.environ)
    mpiexec = compare._mpich_command() if a.lib == "mpi" else compare._impi(env)
    args = [a.lib, "--bytes", str(a.bytes), "--iters", str(a.iters), "--batches", str(a.batches), "--rank"]
    sys.exit(subprocess.run([*mpiexec, "-n", str(a.n), sys.executable, __file__, *args], env=env).returncode)


if __name__ == "__main__":
    main()
