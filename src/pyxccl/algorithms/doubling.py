"""Recursive doubling and recursive halving-doubling (Rabenseifner).

Both work on a power of two p of ranks. When n is not a power of two the
first 2(n - p) ranks fold in pairs first: the odd one sends its vector to the
even one, which reduces (or, for allgather, holds both blocks); the even ones
and the remaining ranks, p in all, run the algorithm as virtual ranks
0..p-1; at the end each even rank sends the result back to its partner. That
costs two extra steps and keeps every rank's result bit-identical (each value
is computed once, by the core, then copied).
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, offsets, split_counts
from .registry import SHIFT_XOR, register


class Fold:
    """The fold of n ranks onto p = 2^floor(log2 n) virtual ranks."""

    def __init__(self, rank: int, n: int):
        self.p = 1 << (n.bit_length() - 1)
        self.rem = n - self.p
        self.rank = rank
        self.folded_away = rank < 2 * self.rem and rank % 2 == 1    # sends to rank-1, waits for the result
        self.has_partner = rank < 2 * self.rem and rank % 2 == 0      # takes rank+1's data
        self.v = rank // 2 if rank < 2 * self.rem else rank - self.rem

    def real(self, v: int) -> int:
        return 2 * v if v < self.rem else v + self.rem

    def real_span(self, v0: int, v1: int) -> tuple[int, int]:
        """Real ranks [a, b) behind virtual ranks [v0, v1): contiguous by construction."""
        a = self.real(v0)
        last = self.real(v1 - 1)
        return a, last + (2 if v1 - 1 < self.rem else 1)


def _allreduce(rank: int, nranks: int, count: int, core) -> Schedule:
    s = Schedule(rank, nranks, scratch=count)
    s.step(Copy("in", 0, "out", 0, count))
    f = Fold(rank, nranks)
    if f.folded_away:
        s.step(Send(rank - 1, "out", 0, count))
        s.step(Recv(rank - 1, "out", 0, count))
        return s
    if f.has_partner:
        s.step(Recv(rank + 1, "tmp", 0, count))
        s.step(Copy("tmp", 0, "out", 0, count, reduce=True))
    core(s, f, count)
    if f.has_partner:
        s.step(Send(rank + 1, "out", 0, count))
    return s


def _doubling_core(s: Schedule, f: Fold, count: int) -> None:
    d = 1
    while d < f.p:
        partner = f.real(f.v ^ d)
        s.step(Send(partner, "out", 0, count), Recv(partner, "tmp", 0, count))
        s.step(Copy("tmp", 0, "out", 0, count, reduce=True))   # a+b here, b+a there: the same bits
        d <<= 1


@register("allreduce", "recursive_doubling", symmetry=SHIFT_XOR)
def allreduce_doubling(rank: int, nranks: int, count: int) -> Schedule:
    """log2(p) steps, each exchanging the whole vector: the fewest steps, the most bytes."""
    return _allreduce(rank, nranks, count, _doubling_core)


def _halving_doubling_core(s: Schedule, f: Fold, count: int) -> None:
    off = offsets(split_counts(count, f.p))
    lo, hi = 0, f.p                        # the segments this rank is responsible for
    d = f.p >> 1
    while d >= 1:                          # reduce-scatter by recursive halving
        partner = f.real(f.v ^ d)
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if f.v & d == 0 else ((mid, hi), (lo, mid))
        ka, kb, ga, gb = off[keep[0]], off[keep[1]], off[give[0]], off[give[1]]
        s.step(Send(partner, "out", ga, gb - ga), Recv(partner, "tmp", ka, kb - ka))
        s.step(Copy("tmp", ka, "out", ka, kb - ka, reduce=True))
        lo, hi = keep
        d >>= 1
    d = 1
    while d < f.p:                         # allgather by recursive doubling
        partner = f.real(f.v ^ d)
        size = hi - lo
        plo = (f.v ^ d) // size * size
        s.step(Send(partner, "out", off[lo], off[hi] - off[lo]),
               Recv(partner, "out", off[plo], off[plo + size] - off[plo]))
        lo, hi = min(lo, plo), max(hi, plo + size)
        d <<= 1


@register("allreduce", "halving_doubling", symmetry=SHIFT_XOR)
def allreduce_halving_doubling(rank: int, nranks: int, count: int) -> Schedule:
    """Rabenseifner: reduce-scatter by recursive halving, allgather by recursive doubling:
    2 log2(p) steps and 2(p-1)/p of the data per rank, like ring, in far fewer steps."""
    return _allreduce(rank, nranks, count, _halving_doubling_core)


@register("allgather", "recursive_doubling", symmetry=SHIFT_XOR)
def allgather_doubling(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """log2(p) steps doubling the block held; folded pairs gather through the even rank."""
    off = offsets(counts)
    s = Schedule(rank, nranks)
    s.step(Copy("in", 0, "out", off[rank], counts[rank]))
    f = Fold(rank, nranks)
    if f.folded_away:
        s.step(Send(rank - 1, "in", 0, counts[rank]))
        s.step(Recv(rank - 1, "out", 0, off[-1]))
        return s
    if f.has_partner:
        s.step(Recv(rank + 1, "out", off[rank + 1], counts[rank + 1]))
    lo, hi = f.v, f.v + 1                  # virtual ranks whose blocks this rank holds
    d = 1
    while d < f.p:
        plo = (f.v ^ d) // d * d
        a, b = f.real_span(lo, hi)
        pa, pb = f.real_span(plo, plo + d)
        partner = f.real(f.v ^ d)
        s.step(Send(partner, "out", off[a], off[b] - off[a]), Recv(partner, "out", off[pa], off[pb] - off[pa]))
        lo, hi = min(lo, plo), max(hi, plo + d)
        d <<= 1
    if f.has_partner:
        s.step(Send(rank + 1, "out", 0, off[-1]))
    return s


@register("reduce_scatter", "recursive_halving", symmetry=SHIFT_XOR)
def reduce_scatter_halving(rank: int, nranks: int, counts: list[int]) -> Schedule:
    """log2(p) steps halving the blocks still to reduce; folded pairs reduce through the even rank,
    which then hands its partner its block."""
    off = offsets(counts)
    total = off[-1]
    s = Schedule(rank, nranks, scratch=2 * total)
    acc, inc = 0, total                    # tmp = [accumulator | incoming]
    f = Fold(rank, nranks)
    if f.folded_away:
        s.step(Send(rank - 1, "in", 0, total))
        s.step(Recv(rank - 1, "out", 0, counts[rank]))
        return s
    s.step(Copy("in", 0, "tmp", acc, total))
    if f.has_partner:
        s.step(Recv(rank + 1, "tmp", inc, total))
        s.step(Copy("tmp", inc, "tmp", acc, total, reduce=True))
    lo, hi = 0, f.p
    d = f.p >> 1
    while d >= 1:
        partner = f.real(f.v ^ d)
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if f.v & d == 0 else ((mid, hi), (lo, mid))
        ka, kb = f.real_span(*keep)
        ga, gb = f.real_span(*give)
        s.step(Send(partner, "tmp", acc + off[ga], off[gb] - off[ga]),
               Recv(partner, "tmp", inc + off[ka], off[kb] - off[ka]))
        s.step(Copy("tmp", inc + off[ka], "tmp", acc + off[ka], off[kb] - off[ka], reduce=True))
        lo, hi = keep
        d >>= 1
    s.step(Copy("tmp", acc + off[rank], "out", 0, counts[rank]))
    if f.has_partner:
        s.step(Send(rank + 1, "tmp", acc + off[rank + 1], counts[rank + 1]))
    return s
