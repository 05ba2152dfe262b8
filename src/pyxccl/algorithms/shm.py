"""The shared-memory fast path, as schedules.

On one host, pyxccl runs these primitives on a shared segment (fastpath.py):
each rank writes its data once into its own area and reads what it needs
from the others' areas. Counted as messages, that is the direct all-pairs
exchange below: one step, every rank to every rank. These schedules are what
the checker proves, what the cost model prices and what runs when the fast
path can't (ranks on several hosts).
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send
from . import direct
from .registry import register

#: primitive -> name of its fast-path function in fastpath.py
FAST = {"allreduce": "allreduce", "reduce": "allreduce", "reduce_scatter": "reduce_scatter",
        "allgather": "allgather", "gather": "allgather", "alltoall": "alltoall", "scatter": "alltoall",
        "broadcast": "broadcast", "barrier": "barrier"}


def _reduce_all(s: Schedule, count: int, dst: str, dst_off: int, src_off=lambda p: 0):
    """dst = tmp block 0 (op) tmp block 1 (op) ... in rank order: the same bits on every rank."""
    s.step(Copy("tmp", src_off(0), dst, dst_off, count),
           *(Copy("tmp", src_off(p), dst, dst_off, count, reduce=True) for p in range(1, s.nranks)))


@register("allreduce", "shm")
def allreduce(rank: int, nranks: int, count: int) -> Schedule:
    s = Schedule(rank, nranks, scratch=count * nranks)
    s.step(Copy("in", 0, "tmp", rank * count, count),
           *(Send(p, "in", 0, count) for p in range(nranks) if p != rank),
           *(Recv(p, "tmp", p * count, count) for p in range(nranks) if p != rank))
    _reduce_all(s, count, "out", 0, lambda p: p * count)
    return s


@register("reduce", "shm")
def reduce(rank: int, nranks: int, count: int, root: int) -> Schedule:
    if rank != root:
        s = Schedule(rank, nranks)
        s.step(Send(root, "in", 0, count))
        return s
    s = Schedule(rank, nranks, scratch=count * nranks)
    s.step(Copy("in", 0, "tmp", rank * count, count),
           *(Recv(p, "tmp", p * count, count) for p in range(nranks) if p != rank))
    _reduce_all(s, count, "out", 0, lambda p: p * count)
    return s


# The data-movement primitives' direct schedules are exactly what the fast path does.
for _prim, _builder in (("reduce_scatter", direct.reduce_scatter), ("allgather", direct.allgather),
                        ("gather", direct.gather), ("alltoall", direct.alltoall_direct),
                        ("scatter", direct.scatter)):
    register(_prim, "shm")(_builder)


@register("broadcast", "shm")
def broadcast(rank: int, nranks: int, count: int, root: int) -> Schedule:
    s = Schedule(rank, nranks)
    if rank == root:
        s.step(*(Send(p, "out", 0, count) for p in range(nranks) if p != root))
    else:
        s.step(Recv(root, "out", 0, count))
    return s


@register("barrier", "shm")
def barrier(rank: int, nranks: int) -> Schedule:
    s = Schedule(rank, nranks, scratch=nranks)
    s.step(*(Send(p, "tmp", rank, 1) for p in range(nranks) if p != rank),
           *(Recv(p, "tmp", p, 1) for p in range(nranks) if p != rank))
    return s
