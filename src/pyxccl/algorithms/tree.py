"""Binomial trees rooted anywhere (ranks renumbered so the root is 0).

Broadcast: in step k, the ranks that already hold the data (virtual rank
< 2^k) send it to virtual rank + 2^k: ceil(log2 n) steps for any n.
Reduce runs the same tree backwards, each rank reducing what its children
send into its accumulator before passing it to its parent.
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, offsets
from .registry import register


def _rounds(n: int) -> int:
    return max(0, (n - 1).bit_length())


@register("broadcast", "binomial", default=True)
def broadcast(rank: int, nranks: int, count: int, root: int) -> Schedule:
    s = Schedule(rank, nranks)
    vr = (rank - root) % nranks
    for k in range(_rounds(nranks)):
        bit = 1 << k
        if vr < bit and vr + bit < nranks:
            s.step(Send((rank + bit) % nranks, "out", 0, count))
        elif bit <= vr < 2 * bit:
            s.step(Recv((rank - bit) % nranks, "out", 0, count))
    return s


@register("reduce", "binomial", default=True)
def reduce(rank: int, nranks: int, count: int, root: int) -> Schedule:
    """The root accumulates in "out", the others in "tmp" (their input stays intact)."""
    acc = "out" if rank == root else "tmp"
    s = Schedule(rank, nranks, scratch=0 if rank == root else count)
    s.step(Copy("in", 0, acc, 0, count))
    vr = (rank - root) % nranks
    for k in range(_rounds(nranks)):
        bit = 1 << k
        if vr & bit:                       # pass the subtree's sum up and stop
            s.step(Send((rank - bit) % nranks, acc, 0, count))
            break
        if vr + bit < nranks:
            s.step(Recv((rank + bit) % nranks, acc, 0, count, reduce=True))
    return s


def _subtree(vr: int, n: int) -> int:
    """One past the last virtual rank in vr's binomial subtree."""
    low = vr & -vr if vr else 1 << max(0, (n - 1).bit_length())
    return min(vr + low, n)


#: the last few calls' blocks in virtual-rank order, by the identity of their counts list: building every
#: rank's schedule of one call (the tuner, the simulator) lays them out once, not once per rank (that was
#: O(ranks) per rank). A counts list is not changed once handed to a builder.
_VIRTUAL: dict = {}


def _virtual(counts: list[int], n: int, root: int) -> tuple[list[int], list[int]]:
    """(block sizes in virtual-rank order, their offsets): virtual rank v is rank (v + root) % n."""
    key = (id(counts), n, root)
    got = _VIRTUAL.get(key)
    if got is None or got[0] is not counts:
        vcounts = counts[root:] + counts[:root]
        got = (counts, vcounts, offsets(vcounts))
        if len(_VIRTUAL) >= 8:
            _VIRTUAL.pop(next(iter(_VIRTUAL)))
        _VIRTUAL[key] = got
    return got[1], got[2]


class _Tree:
    """The binomial tree of gather and scatter, rooted at ``root``, for rank ``rank``: its virtual
    rank, parent, children (nearest first) and the blocks of its subtree, laid out in "tmp" in
    virtual-rank order starting at ``base``."""

    def __init__(self, rank: int, n: int, counts: list[int], root: int):
        self.vr = vr = (rank - root) % n
        self.real = lambda v: (v + root) % n          # noqa: E731
        self.vcounts, self.voff = _virtual(counts, n, root)
        self.end = _subtree(vr, n)
        self.base = self.voff[vr]
        self.size = self.voff[self.end] - self.base
        self.parent = self.real(vr - (vr & -vr)) if vr else None
        self.children = []
        bit = 1
        while (vr + bit < self.end) if vr else bit < n:
            self.children.append(vr + bit)
            bit <<= 1

    def span(self, child: int) -> tuple[int, int]:
        """(offset in this rank's "tmp", elements) of ``child``'s subtree."""
        n = len(self.vcounts)
        return self.voff[child] - self.base, self.voff[_subtree(child, n)] - self.voff[child]


@register("gather", "binomial")
def gather(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    """Blocks climb the binomial tree: ceil(log2 n) steps; a rank gathers its subtree's blocks in
    "tmp" (in virtual-rank order), the root puts them in rank order at the end."""
    t = _Tree(rank, nranks, counts, root)
    s = Schedule(rank, nranks, scratch=t.size)
    s.step(Copy("in", 0, "tmp", 0, counts[rank]))
    for child in t.children:
        s.step(Recv(t.real(child), "tmp", *t.span(child)))
    if t.parent is not None:
        s.step(Send(t.parent, "tmp", 0, t.size))
    else:
        off = offsets(counts)
        s.step(*(Copy("tmp", t.voff[v], "out", off[t.real(v)], t.vcounts[v]) for v in range(nranks)))
    return s


@register("scatter", "binomial")
def scatter(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    """The gather tree run backwards: each rank receives its subtree's blocks, keeps its own."""
    t = _Tree(rank, nranks, counts, root)
    s = Schedule(rank, nranks, scratch=t.size)
    if t.parent is not None:
        s.step(Recv(t.parent, "tmp", 0, t.size))
    else:
        off = offsets(counts)
        s.step(*(Copy("in", off[t.real(v)], "tmp", t.voff[v], t.vcounts[v]) for v in range(nranks)))
    for child in reversed(t.children):          # farthest subtree first: it has the most to do
        s.step(Send(t.real(child), "tmp", *t.span(child)))
    s.step(Copy("tmp", 0, "out", 0, counts[rank]))
    return s
