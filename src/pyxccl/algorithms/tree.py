"""Binomial trees rooted anywhere (ranks renumbered so the root is 0).

Broadcast: in step k, the ranks that already hold the data (virtual rank
< 2^k) send it to virtual rank + 2^k: ceil(log2 n) steps for any n.
Reduce runs the same tree backwards, each rank reducing what its children
send into its accumulator before passing it to its parent.
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send
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
