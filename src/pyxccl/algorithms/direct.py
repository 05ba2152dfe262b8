"""Direct algorithms: every rank talks to the ranks it has data for, in one
step (gather, scatter; the direct exchanges) or in n-1 pairwise steps (alltoall: in step k rank r
sends to r+k and receives from r-k, so each step is a perfect matching).

A direct exchange (allgather, reduce-scatter, alltoall) sends to r+1, r+2, ... and receives from
r-1, r-2, ..., round, as MPICH's do: no rank is everyone's first peer, and every host's schedules
are host 0's moved, so the tuner walks one host's for all (``tuning/symmetric.py``)."""
from __future__ import annotations

from operator import itemgetter

from ..schedule import Copy, Recv, Schedule, Send, many, offsets
from .registry import SHIFT, register


def others(rank: int, n: int) -> list[int]:
    """The ranks but ``rank``, in order."""
    return [*range(rank), *range(rank + 1, n)]


def rotated(rank: int, n: int) -> list[int]:
    """The ranks but ``rank`` from ``rank + 1`` on, round (rank + 1, ..., n - 1, 0, ..., rank - 1)."""
    return [*range(rank + 1, n), *range(rank)]


def but(xs: list, rank: int, n: int) -> list:
    """``xs[p]`` for the ranks p < n but ``rank``, in order."""
    return xs[:rank] + xs[rank + 1:n]


@register("gather", "direct", default=True, root_counts=True)
def gather(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    s = Schedule(rank, nranks)
    if rank != root:
        s.step(Send(root, "in", 0, counts[rank]))
        return s
    off, peers = offsets(counts), others(root, nranks)
    s.step(Copy("in", 0, "out", off[root], counts[root]),
           *many(Recv, peers, "out", but(off, root, nranks), but(counts, root, nranks), False))
    return s


@register("scatter", "direct", default=True, root_counts=True)
def scatter(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    s = Schedule(rank, nranks)
    if rank != root:
        s.step(Recv(root, "out", 0, counts[rank]))
        return s
    off = offsets(counts)
    s.step(Copy("in", off[root], "out", 0, counts[root]),
           *many(Send, others(root, nranks), "in", but(off, root, nranks), but(counts, root, nranks)))
    return s


@register("alltoall", "pairwise", default=True, symmetry=SHIFT, rotates=True)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    s = Schedule(rank, nranks)
    soff, roff = offsets(send_counts), offsets(recv_counts)
    s.step(Copy("in", soff[rank], "out", roff[rank], send_counts[rank]))
    n, new = nranks, tuple.__new__
    if n > 1 and min(send_counts) > 0 and min(recv_counts) > 0:       # no step left empty: made at once
        dst = rotated(rank, n)
        src = dst[::-1]
        sends = many(Send, dst, "in", *_picked(dst, soff, send_counts))
        s.steps += zip(sends, many(Recv, src, "out", *_picked(src, roff, recv_counts), False))
        return s
    for k in range(1, n):       # (Schedule.step's filter and the NamedTuples' frames, by hand: n-1 steps a rank)
        dst, src = (rank + k) % n, (rank - k) % n
        step = (new(Send, (dst, "in", soff[dst], send_counts[dst])),
                new(Recv, (src, "out", roff[src], recv_counts[src], False)))
        if send_counts[dst] <= 0 or recv_counts[src] <= 0:
            step = tuple(o for o in step if o.count > 0)
        if step:
            s.steps.append(step)
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


@register("allgather", "direct", symmetry=SHIFT, rotates=True)
def allgather(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """Every rank sends its block to every other rank in one step: n-1 messages each."""
    off = offsets(counts)
    s = Schedule(rank, nranks)
    dst = rotated(rank, nranks)
    src = dst[::-1]
    s.step(Copy("in", 0, "out", off[rank], counts[rank]), *many(Send, dst, "in", 0, counts[rank]),
           *many(Recv, src, "out", *_picked(src, off, counts), False))
    return s


@register("reduce_scatter", "direct", symmetry=SHIFT, rotates=True)
def reduce_scatter(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """Block q of every input goes straight to rank q, which reduces them in rank order."""
    off, mine = offsets(counts), counts[rank]
    s = Schedule(rank, nranks, scratch=mine * nranks)
    dst = rotated(rank, nranks)
    src = dst[::-1]
    s.step(Copy("in", off[rank], "tmp", rank * mine, mine),
           *many(Send, dst, "in", *_picked(dst, off, counts)),
           *many(Recv, src, "tmp", [p * mine for p in src], mine, False))
    s.step(Copy("tmp", 0, "out", 0, mine),
           *many(Copy, "tmp", [p * mine for p in range(1, nranks)], "out", 0, mine, True))
    return s


@register("alltoall", "direct", symmetry=SHIFT, rotates=True)
def alltoall_direct(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    """Every block in flight at once: one step."""
    so, ro = offsets(send_counts), offsets(recv_counts)
    s = Schedule(rank, nranks)
    dst = rotated(rank, nranks)
    src = dst[::-1]
    s.step(Copy("in", so[rank], "out", ro[rank], send_counts[rank]),
           *many(Send, dst, "in", *_picked(dst, so, send_counts)),
           *many(Recv, src, "out", *_picked(src, ro, recv_counts), False))
    return s


def _picked(peers: list[int], *columns: list) -> list[list]:
    """Each column's entries of ``peers``, in their order (made in C: n - 1 a rank)."""
    if len(peers) < 2:      # (itemgetter of one gives the item, of none is an error)
        return [[col[p] for p in peers] for col in columns]
    pick = itemgetter(*peers)
    return [list(pick(col)) for col in columns]
