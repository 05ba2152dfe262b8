"""Bruck et al.'s algorithms: ceil(log2 n) steps for any n, for small messages.

Allgather: rank r keeps the blocks in rotated order (slot j holds rank r+j's
block); in step k it sends its first min(2^k, n-2^k) slots to rank r-2^k and
receives as many from rank r+2^k behind them; a final local rotation puts the
blocks in rank order. Alltoall: the blocks are rotated so that slot j is meant
for rank r+j; in step k every slot whose index has bit k set goes to rank
r+2^k, packed into one message; at the end slot j holds what rank r-j sent to
r. Each block crosses about log2(n)/2 links instead of one: fewer, larger
messages.

Both builders give every rank operations of the same kinds and sizes, only at
other offsets (the shift symmetry they declare, which lets the tuner price one
host's ranks for all: ``tuning/symmetric.py``). That is why their rotations copy
whole doubled areas instead of the two pieces either side of the rank's wrap
point, whose sizes depend on the rank.
"""
from __future__ import annotations

from ..schedule import Copy, Recv, Schedule, Send, offsets
from .registry import SHIFT, register


@register("allgather", "bruck", symmetry=SHIFT)
def allgather(rank: int, nranks: int, counts: list[int]) -> Schedule:
    n = nranks
    who = [(rank + j) % n for j in range(n)]          # rank whose block sits in slot j
    slot_off = offsets([counts[w] for w in who])
    total = slot_off[-1]
    # tmp = [slots | the slots again]: slots n-r.. of the two hold ranks 0..n-1 in order, one copy to out
    s = Schedule(rank, n, scratch=2 * total)
    s.step(Copy("in", 0, "tmp", 0, counts[rank]))
    d = 1
    while d < n:
        m = min(d, n - d)
        s.step(Send((rank - d) % n, "tmp", 0, slot_off[m]),
               Recv((rank + d) % n, "tmp", slot_off[d], slot_off[d + m] - slot_off[d]))
        d <<= 1
    s.step(Copy("tmp", 0, "tmp", total, total))
    s.step(Copy("tmp", slot_off[n - rank], "out", 0, total))
    return s


def _runs(n: int, d: int) -> list[tuple[int, int]]:
    """The slots [a, b) below n whose index has bit d set: runs of d, every 2d."""
    return [(a, min(a + d, n)) for a in range(d, n, 2 * d)]


@register("alltoall", "bruck", equal_blocks=True, symmetry=SHIFT)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    """Equal block sizes only (a block's size must be known to the ranks it passes through).

    tmp holds, in blocks: ``in`` twice (blocks 1..n-1, then 0..n-2), so that slots 1..n-1 (slot j
    meant for rank r+j) are blocks r+1..r+n-1 of it; a pack area (what a step sends) and an
    incoming area (what it receives), each as large as the largest step. Slot 0 (this rank's own
    block) goes straight from in to out. Step d (d = 1, 2, 4, ...) packs its runs into the pack
    area (a copy per run), sends them to rank r+d in one message and receives the same slots of
    rank r-d in one; the next step first unpacks them (a copy per run) into the slots. The last
    step's slots are copied from the incoming area to out directly. About 3n operations a rank.
    """
    n = nranks
    if len(set(send_counts)) > 1 or send_counts != recv_counts:
        raise ValueError("bruck alltoall needs equal block sizes")
    c = send_counts[0] if n else 0
    if c <= 0:
        return Schedule(rank, n)    # every operation would move nothing (Schedule.step leaves them out)
    ds, d = [], 1
    while d < n:
        ds.append(d)
        d <<= 1
    runs = [_runs(n, d) for d in ds]
    most = max((sum(b - a for a, b in rs) for rs in runs), default=0)   # the largest step, in blocks
    pack, inc = (2 * n - 1) * c, (2 * n - 1 + most) * c
    s = Schedule(rank, n, scratch=(2 * n - 1 + 2 * most) * c)

    # ~3n operations a rank, every count > 0 (c > 0, runs never empty): the steps are made as Schedule.step
    # makes them, the operations with tuple.__new__ (what Op(...) does, without its frame: the tuner builds
    # a host's ranks at thousands of ranks; tests/test_tuner_builders.py compares the plain build)
    new, steps = tuple.__new__, s.steps

    def packed(rs) -> list[tuple[int, int, int]]:
        """(slot offset, offset in the pack or incoming area, count) of each run, packed in order."""
        out, p = [], 0
        for a, b in rs:
            out.append(((rank + a) * c, p, (b - a) * c))
            p += (b - a) * c
        return out

    ops = [new(Copy, ("in", c, "tmp", c, (n - 1) * c, False)), new(Copy, ("in", 0, "tmp", n * c, (n - 1) * c, False))]
    ops = (ops if n > 1 else []) + [new(Copy, ("in", rank * c, "out", rank * c, c, False))]
    for i, d in enumerate(ds):
        if i:       # the step before's arrivals into their slots, before this step packs from them
            ops += [new(Copy, ("tmp", inc + p, "tmp", at, k, False)) for at, p, k in packed(runs[i - 1])]
        now = packed(runs[i])
        size = sum(k for _, _, k in now)
        ops += [new(Copy, ("tmp", at, "tmp", pack + p, k, False)) for at, p, k in now]
        ops += [new(Send, ((rank + d) % n, "tmp", pack, size)), new(Recv, ((rank - d) % n, "tmp", inc, size, False))]
        steps.append(tuple(ops))
        ops = []
    last = ds[-1] if ds else n      # its slots [last, n) are the incoming area, in order
    ops += [new(Copy, ("tmp", (rank + j) * c, "out", ((rank - j) % n) * c, c, False)) for j in range(1, last)]
    ops += [new(Copy, ("tmp", inc + (j - last) * c, "out", ((rank - j) % n) * c, c, False)) for j in range(last, n)]
    steps.append(tuple(ops))
    return s
