"""Gloo's BCube allreduce.

The n = b^k ranks are the points of a k-dimensional cube of side b. For each
dimension in turn, the b ranks that differ only in that coordinate form a
group and do a direct reduce-scatter of the region they share, so the region
shrinks b times per dimension; then the dimensions are walked back with
allgathers. 2k steps and 2(n-1)/n of the data per rank, like ring, with only b-1
messages per step. The base b is the smallest one with n = b^k (so 8 ranks:
b = 2, k = 3; 9 ranks: b = 3; a prime n: b = n, one group, the direct algorithm).
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, offsets, split_counts
from .registry import SHIFT_XOR, register


def base_of(n: int) -> tuple[int, int]:
    for b in range(2, n + 1):
        k, m = 0, 1
        while m < n:
            m *= b
            k += 1
        if m == n:
            return b, k
    return max(n, 1), 1 if n > 1 else 0


@register("allreduce", "bcube", symmetry=SHIFT_XOR)
def allreduce(rank: int, nranks: int, count: int) -> Schedule:
    b, k = base_of(nranks)
    s = Schedule(rank, nranks, scratch=count + b)       # b slots of the largest part
    s.step(Copy("in", 0, "out", 0, count))
    lo, hi = 0, count
    history = []
    for dim in range(k):
        stride = b ** dim
        digit = rank // stride % b
        group = [rank + (j - digit) * stride for j in range(b)]
        parts = split_counts(hi - lo, b)
        off = [lo + o for o in offsets(parts)]
        mine = parts[digit]
        # everyone sends me its copy of my part (into tmp, slot j), I reduce them in group order
        s.step(*(Send(p, "out", off[j], parts[j]) for j, p in enumerate(group) if p != rank),
               *(Recv(p, "tmp", j * mine, mine) for j, p in enumerate(group) if p != rank))
        s.step(Copy("out", off[digit], "tmp", digit * mine, mine))
        s.step(Copy("tmp", 0, "out", off[digit], mine),
               *(Copy("tmp", j * mine, "out", off[digit], mine, reduce=True) for j in range(1, b)))
        history.append((group, off, parts, digit))
        lo, hi = off[digit], off[digit + 1]
    for group, off, parts, digit in reversed(history):
        s.step(*(Send(p, "out", off[digit], parts[digit]) for p in group if p != rank),
               *(Recv(p, "out", off[j], parts[j]) for j, p in enumerate(group) if p != rank))
    return s
