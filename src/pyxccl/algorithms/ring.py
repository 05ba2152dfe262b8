"""Ring algorithms (seeds: Ring AllReduce = Scatter-Reduce then AllGather).

Ranks form a ring r -> r+1. The data is cut into n chunks; in each of n-1
steps every rank passes one chunk to its right neighbour and takes one from
its left, so every link carries (n-1)/n of the data per phase, whatever n is
(no power-of-two restriction: chunk sizes differ by at most one element).
"""
from __future__ import annotations

from functools import lru_cache
from itertools import compress

from ..schedule import Copy, Recv, Schedule, Send, offsets, split_counts
from .registry import SHIFT, register


#: the chunks' offsets and the non-empty chunks of the last counts seen (every rank of a call has the
#: same counts: at a few elements on thousands of ranks those O(n) lists were most of a rank's build)
_LAST: list = [None]


def _chunks(counts, n: int):
    """(offsets of ``counts``, the indices below n of its non-empty chunks or None when none is
    empty), computed once for the same counts (read only)."""
    got = _LAST[0]
    if got is None or got[0] is not counts or got[2] != n or got[1] != counts:
        full = None if all(counts) else list(compress(range(n), counts))
        got = _LAST[0] = (counts, list(counts), n, offsets(counts), full)
    return got[3], got[4]


@lru_cache(maxsize=16)
def shared_split(count: int, n: int) -> list[int]:
    """``split_counts``, one list for every rank of a call (read only)."""
    return split_counts(count, n)


def shared_offsets(counts, n: int) -> list[int]:
    """``offsets(counts)``, one list for every rank of a call with the same ``counts`` (read only)."""
    return _chunks(counts, n)[0]


def _steps(full, n: int, a: int):
    """The steps k < n - 1 in which chunk (a - k) % n or (a - k - 1) % n is not empty (``full``: the
    non-empty chunks, None when all are): the others move nothing (a few elements on many ranks),
    and looping over them made every rank's schedule cost O(n) however little it holds."""
    if full is None:
        return range(n - 1)
    return sorted({k for c in full for k in ((a - c) % n, (a - c - 1) % n) if k < n - 1})


def _full_steps(s: Schedule, off, counts, buf: str, right: int, left: int, a: int, reduce: bool):
    """The n-1 steps of a phase whose chunks are all non-empty: in step k, Send chunk (a - k) % n to
    ``right`` and Recv chunk (a - k - 1) % n from ``left``: what the loop through ``Schedule.step``
    appends, without its filter (nothing is empty) or the NamedTuples' ``__new__`` frames (a rooted
    algorithm's schedules are built for every rank of a large communicator: issue 26)."""
    n, new = s.nranks, tuple.__new__
    order = [*range(a % n, -1, -1), *range(n - 1, a % n, -1)]     # (a - k) % n for k = 0 .. n-1
    s.steps += [(new(Send, (right, buf, off[c], counts[c])), new(Recv, (left, buf, off[d], counts[d], reduce)))
                for c, d in zip(order, order[1:])]


def reduce_scatter_phase(s: Schedule, counts, buf: str, last: int):
    """n-1 steps after which ``buf``'s chunk ``last`` on this rank holds the full reduction."""
    r, n = s.rank, s.nranks
    off, full = _chunks(counts, n)
    right, left = (r + 1) % n, (r - 1) % n
    if full is None:
        _full_steps(s, off, counts, buf, right, left, last - 1, True)
        return
    for k in _steps(full, n, last - 1):
        send_c = (last - k - 1) % n
        recv_c = (last - k - 2) % n
        s.step(Send(right, buf, off[send_c], counts[send_c]),
               Recv(left, buf, off[recv_c], counts[recv_c], reduce=True))


def allgather_phase(s: Schedule, counts, buf: str, have: int):
    """n-1 steps that spread every rank's chunk (this rank holds chunk ``have``)."""
    r, n = s.rank, s.nranks
    off, full = _chunks(counts, n)
    right, left = (r + 1) % n, (r - 1) % n
    if full is None:
        _full_steps(s, off, counts, buf, right, left, have, False)
        return
    for k in _steps(full, n, have):
        send_c = (have - k) % n
        recv_c = (have - k - 1) % n
        s.step(Send(right, buf, off[send_c], counts[send_c]),
               Recv(left, buf, off[recv_c], counts[recv_c]))


@register("allreduce", "ring", default=True, settles=True, symmetry=SHIFT, rotates=True)
def allreduce(rank: int, nranks: int, count: int) -> Schedule:
    """Reduce-scatter then allgather around the ring: 2(n-1) steps, 2(n-1)/n of the data per rank."""
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", 0, count))          # a no-op when in-place
    counts = shared_split(count, nranks)
    reduce_scatter_phase(s, counts, "out", last=(rank + 1) % nranks)
    allgather_phase(s, counts, "out", have=(rank + 1) % nranks)
    return s


@register("reduce_scatter", "ring", default=True, settles=True, symmetry=SHIFT, rotates=True)
def reduce_scatter(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """Rank r ends with chunk r of the reduction; works on a scratch copy of the input."""
    s = Schedule(rank, nranks, scratch=sum(counts))
    off = offsets(counts)
    s.step(Copy("in", 0, "tmp", 0, sum(counts)))
    reduce_scatter_phase(s, counts, "tmp", last=rank)
    s.step(Copy("tmp", off[rank], "out", 0, counts[rank]))
    return s


@register("allgather", "ring", default=True, settles=True, symmetry=SHIFT, rotates=True)
def allgather(rank: int, nranks: int, counts: list[int]) -> Schedule:
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", offsets(counts)[rank], counts[rank]))
    allgather_phase(s, counts, "out", have=rank)
    return s
