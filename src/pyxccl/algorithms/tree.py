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


@register("gather", "binomial")
def gather(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    """Blocks climb the binomial tree: ceil(log2 n) steps; a rank gathers its subtree's blocks in
    "tmp" (in virtual-rank order), the root puts them in rank order at the end."""
    n = nranks
    vr = (rank - root) % n
    vcounts = [counts[(v + root) % n] for v in range(n)]
    voff = offsets(vcounts)
    end = _subtree(vr, n)
    base = voff[vr]
    s = Schedule(rank, n, scratch=voff[end] - base)
    s.step(Copy("in", 0, "tmp", 0, counts[rank]))
    bit = 1
    while vr + bit < end if vr else bit < n:
        child = vr + bit
        cend = _subtree(child, n)
        s.step(Recv((child + root) % n, "tmp", voff[child] - base, voff[cend] - voff[child]))
        bit <<= 1
    if vr:
        s.step(Send((vr - (vr & -vr) + root) % n, "tmp", 0, voff[end] - base))
    else:
        off = offsets(counts)
        s.step(*(Copy("tmp", voff[v], "out", off[(v + root) % n], vcounts[v]) for v in range(n)))
    return s


@register("scatter", "binomial")
def scatter(rank: int, nranks: int, counts: list[int], root: int) -> Schedule:
    """The gather tree run backwards: each rank receives its subtree's blocks, keeps its own."""
    n = nranks
    vr = (rank - root) % n
    vcounts = [counts[(v + root) % n] for v in range(n)]
    voff = offsets(vcounts)
    end = _subtree(vr, n)
    base = voff[vr]
    s = Schedule(rank, n, scratch=voff[end] - base)
    if vr:
        s.step(Recv((vr - (vr & -vr) + root) % n, "tmp", 0, voff[end] - base))
    else:
        off = offsets(counts)
        s.step(*(Copy("in", off[(v + root) % n], "tmp", voff[v], vcounts[v]) for v in range(n)))
    bits = []
    bit = 1
    while (vr + bit < end) if vr else bit < n:
        bits.append(bit)
        bit <<= 1
    for bit in reversed(bits):                          # farthest subtree first: it has the most to do
        child = vr + bit
        s.step(Send((child + root) % n, "tmp", voff[child] - base, voff[_subtree(child, n)] - voff[child]))
    s.step(Copy("tmp", 0, "out", 0, counts[rank]))
    return s
