"""The rank side of `pyxccl bench`: time each collective the way methodology.py says."""
from __future__ import annotations

import time

import numpy as np

from ..primitives import PRIMITIVES
from . import methodology as M


class Case:
    """Buffers and expected result of one (primitive, size) on one rank."""

    def __init__(self, prim: str, nbytes: int, dtype, rank: int, n: int, inplace: bool):
        self.prim, self.rank, self.n, self.inplace = prim, rank, n, inplace
        self.dtype = np.dtype(dtype)
        self.total, self.per = M.counts(prim, nbytes, self.dtype.itemsize, n)
        self.nbytes = self.total * self.dtype.itemsize
        pat, tri = M.pattern(self.total, self.dtype), n * (n + 1) // 2
        root = 0
        if prim in ("allreduce", "reduce"):
            self.ref = pat + (rank + 1)
            exp = n * pat + tri
            self.expect = exp if prim == "allreduce" or rank == root else None
        elif prim == "broadcast":
            self.ref = pat + 1 if rank == root else np.zeros(self.total, self.dtype)
            self.expect = pat + 1
        elif prim in ("allgather", "gather"):
            self.ref = M.pattern(self.per, self.dtype) + (rank + 1)
            exp = np.tile(M.pattern(self.per, self.dtype), n) + np.repeat(np.arange(1, n + 1), self.per)
            self.expect = exp.astype(self.dtype) if prim == "allgather" or rank == root else None
        elif prim == "reduce_scatter":
            self.ref = pat + (rank + 1)
            self.expect = (n * pat + tri)[rank * self.per:(rank + 1) * self.per]
        elif prim == "scatter":
            self.ref = pat + 1 if rank == root else np.zeros(0, self.dtype)
            self.expect = (pat + 1)[rank * self.per:(rank + 1) * self.per]
        elif prim == "alltoall":
            self.ref = (np.tile(M.pattern(self.per, self.dtype), n) + 3 * rank
                        + np.repeat(np.arange(n), self.per)).astype(self.dtype)
            self.expect = (np.tile(M.pattern(self.per, self.dtype), n) + 3 * np.repeat(np.arange(n), self.per)
                           + rank).astype(self.dtype)
        self.ref = self.ref.astype(self.dtype)
        out_count = PRIMITIVES[prim].buffers(root, PRIMITIVES[prim].args(n, self.per, root))[1]   # the root's
        if inplace and prim in ("allgather", "gather"):
            self.recv = np.zeros(self.total, self.dtype)
            self.send = self.recv[rank * self.per:(rank + 1) * self.per]
        elif inplace and prim == "reduce_scatter":
            self.send = np.zeros(self.total, self.dtype)
            self.recv = self.send[rank * self.per:(rank + 1) * self.per]
        else:
            self.send = np.zeros(len(self.ref), self.dtype)
            self.recv = self.send if inplace or prim == "broadcast" else np.zeros(out_count, self.dtype)

    def reset(self) -> None:
        np.copyto(self.send, self.ref)
        if self.recv is not self.send and not np.shares_memory(self.recv, self.send):
            self.recv.fill(0)

    def wrong(self) -> int:
        if self.expect is None:
            return 0
        return int(np.count_nonzero(self.recv != self.expect))


def call_pyxccl(comm, case: Case, op, algo):
    p, s, r = case.prim, case.send, case.recv
    if p == "allreduce":
        comm.allreduce(s, op, out=None if r is s else r, algorithm=algo)
    elif p == "broadcast":
        comm.broadcast(s, 0, algorithm=algo)
    elif p == "reduce":
        comm.reduce(s, 0, op, out=None if r is s else r, algorithm=algo)
    elif p == "allgather":
        comm.allgather(s, r, algorithm=algo)
    elif p == "gather":
        comm.gather(s, r if comm.rank == 0 else None, 0, algorithm=algo)
    elif p == "scatter":
        comm.scatter(s if comm.rank == 0 else None, r, 0, algorithm=algo)
    elif p == "reduce_scatter":
        comm.reduce_scatter(s, r, op, algorithm=algo)
    elif p == "alltoall":
        comm.alltoall(s, r, algorithm=algo)


def time_case(comm, case: Case, call, iters=None, warmup=None) -> tuple[list[float], int]:
    """Per-iteration max-over-ranks times, and #wrong summed over ranks."""
    w, it = M.iters_for(case.nbytes)
    w, it = (warmup if warmup is not None else w), (iters if iters is not None else it)
    times = np.zeros(it)
    for i in range(w + it):
        case.reset()
        comm.barrier()
        t = time.perf_counter()
        call(case)
        dt = time.perf_counter() - t
        if i >= w:
            times[i - w] = dt
    comm.allreduce(times, "max")
    wrong = np.array([case.wrong()], np.int64)
    comm.allreduce(wrong)
    return times.tolist(), int(wrong[0])


def run_pyxccl(comm, prims, sizes, *, dtype="float32", op="sum", algo=None, iters=None, warmup=None,
               progress=None) -> list[dict]:
    rows = []
    for prim in prims:
        for nbytes in sizes:
            row = None
            for inplace in (False, True):
                if inplace and prim in ("broadcast", "scatter", "alltoall"):
                    part = None
                else:
                    case = Case(prim, nbytes, dtype, comm.rank, comm.size, inplace)
                    times, wrong = time_case(comm, case, lambda c: call_pyxccl(comm, c, op, algo), iters, warmup)
                    part = dict(M.summarize(times, case.nbytes, prim, comm.size), wrong=wrong,
                                algorithm=algo or comm.algorithm_for(prim, case.nbytes, case.dtype))
                if row is None:
                    row = dict(lib="pyxccl", op=prim, n=comm.size, size=case.nbytes, count=case.total,
                               type=case.dtype.name, redop=op if prim in ("allreduce", "reduce",
                                                                          "reduce_scatter") else "none",
                               root=0 if prim in ("broadcast", "reduce", "gather", "scatter") else -1)
                row["in_place" if inplace else "out_of_place"] = part
            rows.append(row)
            if progress:
                progress()
    return rows
