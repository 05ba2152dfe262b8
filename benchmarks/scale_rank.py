"""One rank of benchmarks/scale.py's job, with pyxccl or with MPI (mpi4py), writing what it measured.

    pyxccl run -n N benchmarks/scale_rank.py pyxccl OUTDIR [CALLS]
    mpiexec -n N python benchmarks/scale_rank.py mpi OUTDIR [CALLS]

The job (issue 26's): init, one 8 B allreduce, one 1 MiB allreduce, CALLS (20) more 8 B allreduces,
all float32, in place. Every moment is an absolute time.time() (one clock for every rank of the
machine, emulated hosts included), so scale.py can take the slowest rank of each step. After the
calls the rank reads its own threads (/proc/self/task), open descriptors (/proc/self/fd) and VmRSS
(/proc/self/status). Only public API: pyxccl.init / Communicator.allreduce / close, MPI.Init /
Allreduce / Finalize. One JSON file per rank, OUTDIR/rank<R>.json, written before close (a close that
hangs still leaves the figures); OUTDIR/pid.<pid> at start, so the driver can kill a hung job's ranks.
"""
from __future__ import annotations

import json
import os
import sys
import time


def started_at() -> float:
    """This process's start as a time.time() value, from /proc/self/stat (resolution 1/CLK_TCK, 10 ms)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_boot


def resources() -> dict:
    """Threads, open descriptors (sockets among them) and resident memory of this process, now."""
    fds = os.listdir("/proc/self/fd")           # (the listing's own descriptor is among them: one less)
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:                          # the listing's descriptor, closed by now
            pass
    rss_kib = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return dict(threads=len(os.listdir("/proc/self/task")), fds=len(links),
                sockets=sum(link.startswith("socket:") for link in links), rss_mib=rss_kib / 1024)


def main() -> None:
    lib, out = sys.argv[1], sys.argv[2]
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    t = {"start": started_at()}
    with open(os.path.join(out, f"pid.{os.getpid()}"), "w"):
        pass
    import numpy as np
    if lib == "pyxccl":
        import pyxccl
        t["init0"] = time.time()
        comm = pyxccl.init()
        t["init1"] = time.time()
        rank, size = comm.rank, comm.size

        def allreduce(a):
            comm.allreduce(a)
        close = comm.close
    elif lib == "mpi":
        import mpi4py
        mpi4py.rc.initialize = False             # time MPI_Init itself, not the import
        mpi4py.rc.finalize = False
        from mpi4py import MPI
        t["init0"] = time.time()
        MPI.Init()
        t["init1"] = time.time()
        c = MPI.COMM_WORLD
        rank, size = c.Get_rank(), c.Get_size()

        def allreduce(a):
            c.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        close = MPI.Finalize
    else:
        raise SystemExit(f"scale_rank.py: library {lib!r} is not pyxccl or mpi")
    small, big = np.ones(2, np.float32), np.ones(1 << 18, np.float32)
    wrong = 0
    allreduce(small)
    t["first8"] = time.time()
    wrong += int((small != size).sum())
    allreduce(big)
    t["first1m"] = time.time()
    wrong += int((big != size).sum())
    steady = []
    for _ in range(calls):
        small[:] = 1                             # (untimed: the sum would overflow float32 otherwise)
        t0 = time.perf_counter()
        allreduce(small)
        steady.append(time.perf_counter() - t0)
        wrong += int((small != size).sum())
    t["calls"] = time.time()
    rec = dict(lib=lib, rank=rank, size=size, host=os.uname().nodename, times=t, steady=steady, wrong=wrong,
               **resources())
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    close()


if __name__ == "__main__":
    main()
