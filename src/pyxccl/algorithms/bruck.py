"""Bruck et al.'s algorithms: ceil(log2 n) steps for any n, for small messages.

Allgather: rank r keeps the blocks in rotated order (slot j holds rank r+j's
block); in step k it sends its first min(2^k, n-2^k) slots to rank r-2^k and
receives as many from rank r+2^k behind them; a final local rotation puts the
blocks in rank order. Alltoall: slot j holds the block meant for rank r+j; in
step k every slot whose index has bit k set goes to rank r+2^k, all in one
message; at the end slot j holds what rank r-j sent to r. Each block crosses
about log2(n)/2 links instead of one: fewer, larger messages.

Both builders give every rank operations of the same kinds and sizes, only at
other offsets: the shift symmetry they declare, which lets the tuner price one
host's ranks for all (``tuning/symmetric.py``). So a rotation is one copy out of
the slots followed by a mirror of them, not the two copies either side of the
rank's wrap point, whose sizes depend on the rank.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..schedule import Copy, Recv, Schedule, Send, copies, offsets
from .registry import SHIFT, register


@register("allgather", "bruck", symmetry=SHIFT)
def allgather(rank: int, nranks: int, counts: list[int]) -> Schedule:
    n = nranks
    slot_off = offsets(counts[rank:] + counts[:rank])      # slot j holds rank r+j's block
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
    s.step(Copy("tmp", 0, "tmp", total, total), Copy("tmp", slot_off[n - rank], "out", 0, total))
    return s


def _runs(n: int, d: int, c: int, area: int) -> tuple[list, list, list]:
    """Step d's runs (the slots j < n with bit d set: d of them every 2d, the last maybe shorter), as
    (their offsets in the slot area, in the pack or incoming area ``area``, counts), in elements. Slot j
    is block n-1-j of the slot area, so a run is contiguous there too; it is packed in that order."""
    full, rest = (n - d) // (2 * d), (n - d) % (2 * d)     # runs of d, and the last run's slots (if < d)
    if rest >= d:           # a last full run, then slots without bit d
        full, rest = full + 1, 0
    slots = list(range((n - 2 * d) * c, (n - 2 * d * (full + 1)) * c, -2 * d * c))
    packed = list(range(area, area + full * d * c, d * c))
    counts = [d * c] * full
    if rest:                # the last run ends at slot n-1: block 0 of the slot area
        slots.append(0)
        packed.append(area + full * d * c)
        counts.append(rest * c)
    return slots, packed, counts


@lru_cache(maxsize=8)
def _shared(n: int, c: int) -> tuple[int, int, int, list[tuple[int, tuple]]]:
    """What every rank's alltoall schedule of n ranks and blocks of c holds alike: (the pack and the
    incoming area's offsets, the scratch, [(message size, copies)] per step d = 1, 2, 4, ... and one
    more, the last). A step's copies: the unpacking of step d/2's message, then the packing of its own
    (but step 1's, from in: rank by rank); the last: the last message's unpacking and the mirror."""
    ds = [1 << k for k in range((n - 1).bit_length())]
    most = max((n - d) // (2 * d) * d + min(d, (n - d) % (2 * d)) for d in ds) if ds else 0
    pack, inc = (2 * n - 1) * c, (2 * n - 1 + most) * c
    steps, before = [], []
    for d in ds:
        slots, packed, counts = _runs(n, d, c, pack)
        ops = before + (copies("tmp", slots, "tmp", packed, counts) if d > 1 else [])
        steps.append((sum(counts), tuple(ops)))
        slots, packed, counts = _runs(n, d, c, inc)
        before = copies("tmp", packed, "tmp", slots, counts)
    if n > 1:
        before.append(Copy("tmp", 0, "tmp", n * c, (n - 1) * c))
    steps.append((0, tuple(before)))
    return pack, inc, (2 * n - 1 + 2 * most) * c, steps


@register("alltoall", "bruck", equal_blocks=True, symmetry=SHIFT, rotates=True)
def alltoall(rank: int, nranks: int, send_counts: list[int], recv_counts: list[int]) -> Schedule:
    """Equal block sizes only (a block's size must be known to the ranks it passes through).

    Slot j (j = 0..n-1) holds the block meant for rank r+j, then what rank r-j sent: a block moves
    on by 2^k in step k if bit k of its slot is set, and never changes slot. tmp holds, in blocks, the
    slot area (slot j at block n-1-j; then a mirror of blocks 0..n-2), a pack area (what a step
    sends) and an incoming area (what it receives), each as large as the largest step. Step d
    (d = 1, 2, 4, ...) copies its runs of slots into the pack area (a copy each), sends them to
    rank r+d in one message and receives the same slots of rank r-d in one, which the next step
    copies back into the slots first (a copy each). The even slots start as copies of in; the odd
    ones go from in to step 1's message directly. Slot j goes to out block r-j: after the mirror,
    out is blocks n-1-r.. of the slot area, one copy. About 2.5n operations a rank.

    Every rank's operations have the same sizes (the shift symmetry the tuner folds by), and all but
    the first step's and the last copy are the same operations on every rank: they are made once per
    (n, c) and shared, steps of their own before each message (the tuner converts a shared step once).
    """
    n = nranks
    if len(set(send_counts)) > 1 or send_counts != recv_counts:
        raise ValueError("bruck alltoall needs equal block sizes")
    c = send_counts[0] if n else 0
    if c <= 0:
        return Schedule(rank, n)    # every operation would move nothing (Schedule.step leaves them out)
    pack, inc, scratch, shared = _shared(n, c)
    s = Schedule(rank, n, scratch=scratch)
    first = copies("in", ((np.arange(rank, rank + n, 2) % n) * c).tolist(), "tmp", range((n - 1) * c, -1, -2 * c),
                   c)                                                       # the even slots
    first += copies("in", ((np.arange(rank + 1, rank + n, 2) % n) * c).tolist(), "tmp",
                    range(pack, pack + n // 2 * c, c), c)                   # the odd ones, packed for step 1
    d = 1
    for size, ops in shared[:-1]:
        if ops:             # the same tuple on every rank: the tuner converts it once (compact._STEPS)
            s.steps.append(ops)
        s.steps.append((*first, tuple.__new__(Send, ((rank + d) % n, "tmp", pack, size)),
                        tuple.__new__(Recv, ((rank - d) % n, "tmp", inc, size, False))))
        first, d = [], d << 1
    last, out = shared[-1][1], Copy("tmp", (n - 1 - rank) * c, "out", 0, n * c)
    if first or not last:           # one rank: no step before
        s.steps.append((*first, *last, out))
    else:
        s.steps += [last, (out,)]
    return s
