"""Direct algorithms: every rank talks to the ranks it has data for, in one
step (gather, scatter) or in n-1 pairwise steps (alltoall: in step k rank r
sends to r+k and receives from r-k, so each step is a perfect matching)."""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, offsets
from .registry import SHIFT, register


@register("gather", "direct", default=True, root_counts=True)
def gather(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    s = Schedule(rank, nranks)
    if rank != root:
        s.step(Send(root, "in", 0, counts[rank]))
        return s
    off = offsets(counts)
    s.step(Copy("in", 0, "out", off[root], counts[root]),
           *(Recv(p, "out", off[p], counts[p]) for p in range(nranks) if p != root))
    return s


@register("scatter", "direct", default=True, root_counts=True)
def scatter(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    s = Schedule(rank, nranks)
    if rank != root:
        s.step(Recv(root, "out", 0, counts[rank]))
        return s
    off = offsets(counts)
    s.step(Copy("in", off[root], "out", 0, counts[root]),
           *(Send(p, "in", off[p], counts[p]) for p in range(nranks) if p != root))
    return s


@register("alltoall", "pairwise", default=True, symmetry=SHIFT)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    s = Schedule(rank, nranks)
    soff, roff = offsets(send_counts), offsets(recv_counts)
    s.step(Copy("in", soff[rank], "out", roff[rank], send_counts[rank]))
    for k in range(1, nranks):
        dst, src = (rank + k) % nranks, (rank - k) % nranks
        s.step(Send(dst, "in", soff[dst], send_counts[dst]),
               Recv(src, "out", roff[src], recv_counts[src]))
    return s


@register("barrier", "dissemination", default=True)
def barrier(rank: int, nranks: int) -> Schedule:
    """ceil(log2 n) rounds of one-element messages to rank + 2^k (Hensgen et al.)."""
    s = Schedule(rank, nranks, scratch=2)
    k = 1
    while k < nranks:
        s.step(Send((rank + k) % nranks, "tmp", 0, 1), Recv((rank - k) % nranks, "tmp", 1, 1))
        k <<= 1
    return s


@register("allgather", "direct")
def allgather(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """Every rank sends its block to every other rank in one step: n-1 messages each."""
    off = offsets(counts)
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", off[rank], counts[rank]),
           *(Send(p, "in", 0, counts[rank]) for p in range(nranks) if p != rank),
           *(Recv(p, "out", off[p], counts[p]) for p in range(nranks) if p != rank))
    return s


@register("reduce_scatter", "direct")
def reduce_scatter(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """Block q of every input goes straight to rank q, which reduces them in rank order."""
    off, mine = offsets(counts), counts[rank]
    s = Schedule(rank, nranks, scratch=mine * nranks)
    s.step(Copy("in", off[rank], "tmp", rank * mine, mine),
           *(Send(p, "in", off[p], counts[p]) for p in range(nranks) if p != rank),
           *(Recv(p, "tmp", p * mine, mine) for p in range(nranks) if p != rank))
    s.step(Copy("tmp", 0, "out", 0, mine),
           *(Copy("tmp", p * mine, "out", 0, mine, reduce=True) for p in range(1, nranks)))
    return s


@register("alltoall", "direct")
def alltoall_direct(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    """Every block in flight at once: one step."""
    so, ro = offsets(send_counts), offsets(recv_counts)
    s = Schedule(rank, nranks)
    s.step(Copy("in", so[rank], "out", ro[rank], send_counts[rank]),
           *(Send(p, "in", so[p], send_counts[p]) for p in range(nranks) if p != rank),
           *(Recv(p, "out", ro[p], recv_counts[p]) for p in range(nranks) if p != rank))
    return s
