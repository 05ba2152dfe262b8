"""Bruck et al.'s algorithms: ceil(log2 n) steps for any n, for small messages.

Allgather: rank r keeps the blocks in rotated order (slot j holds rank r+j's
block); in step k it sends its first min(2^k, n-2^k) slots to rank r-2^k and
receives as many from rank r+2^k behind them; a final local rotation puts the
blocks in rank order. Alltoall: the blocks are rotated so that slot j is meant
for rank r+j; in step k every slot whose index has bit k set goes to rank
r+2^k; at the end slot j holds what rank r-j sent to r. Each block crosses
about log2(n)/2 links instead of one: fewer, larger messages.
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, offsets
from .registry import SHIFT, register


@register("allgather", "bruck", symmetry=SHIFT)
def allgather(rank: int, nranks: int, counts: list[int]) -> Schedule:
    n = nranks
    who = [(rank + j) % n for j in range(n)]          # rank whose block sits in slot j
    slot_off = offsets([counts[w] for w in who])
    s = Schedule(rank, n, scratch=slot_off[-1])
    s.step(Copy("in", 0, "tmp", 0, counts[rank]))
    d = 1
    while d < n:
        m = min(d, n - d)
        s.step(Send((rank - d) % n, "tmp", 0, slot_off[m]),
               Recv((rank + d) % n, "tmp", slot_off[d], slot_off[d + m] - slot_off[d]))
        d <<= 1
    off = offsets(counts)
    s.step(*(Copy("tmp", slot_off[j], "out", off[who[j]], counts[who[j]]) for j in range(n)))
    return s


@register("alltoall", "bruck", equal_blocks=True, symmetry=SHIFT)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    """Equal block sizes only (a block's size must be known to the ranks it passes through)."""
    n = nranks
    if len(set(send_counts)) > 1 or send_counts != recv_counts:
        raise ValueError("bruck alltoall needs equal block sizes")
    c = send_counts[0] if n else 0
    s = Schedule(rank, n, scratch=2 * n * c)           # tmp = [slots | incoming]
    if c <= 0:
        return s            # every operation would move nothing (Schedule.step leaves them out)
    # n log n operations a rank: the steps are made as Schedule.step makes them (every count is c > 0),
    # the operations with tuple.__new__ (what Op(...) does, without its frame)
    new, steps = tuple.__new__, s.steps
    steps.append(tuple([new(Copy, ("in", ((rank + j) % n) * c, "tmp", j * c, c, False)) for j in range(n)]))
    d = 1
    while d < n:
        moving = [j for j in range(n) if j & d]
        to, frm = (rank + d) % n, (rank - d) % n
        steps.append(tuple([new(Send, (to, "tmp", j * c, c)) for j in moving]
                           + [new(Recv, (frm, "tmp", (n + j) * c, c, False)) for j in moving]))
        steps.append(tuple([new(Copy, ("tmp", (n + j) * c, "tmp", j * c, c, False)) for j in moving]))
        d <<= 1
    steps.append(tuple([new(Copy, ("tmp", j * c, "out", ((rank - j) % n) * c, c, False)) for j in range(n)]))
    return s
