"""Schedules: what an algorithm is.

An algorithm builds, for one rank, an ordered list of steps. A step is a
tuple of operations that may run at the same time:

- ``Send(peer, buf, off, count)``: send ``count`` elements of ``buf`` from ``off``;
- ``Recv(peer, buf, off, count, reduce)``: receive into ``buf`` at ``off``, copying
  or, with ``reduce=True``, reducing the incoming elements into what is there;
- ``Copy(src, src_off, dst, dst_off, count, reduce)``: a local copy or reduce.

Buffers are named: ``"in"`` (the user's input), ``"out"`` (the user's output:
the same array as ``"in"`` for in-place calls) and ``"tmp"`` (scratch of
``Schedule.scratch`` elements). Offsets and counts are in elements.

Within a step, local ``Copy`` operations run first, then the transfers; a step
ends when all its transfers are done. The engine runs a schedule on real
transports; nothing in a schedule depends on how bytes move.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Send(NamedTuple):
    peer: int
    buf: str
    off: int
    count: int


class Recv(NamedTuple):
    peer: int
    buf: str
    off: int
    count: int
    reduce: bool = False


class Copy(NamedTuple):
    src: str
    src_off: int
    dst: str
    dst_off: int
    count: int
    reduce: bool = False


Op = Send | Recv | Copy


@dataclass
class Schedule:
    """The steps one rank runs for one collective call."""
    rank: int
    nranks: int
    steps: list[tuple[Op, ...]] = field(default_factory=list)
    scratch: int = 0          # elements of "tmp" the schedule needs

    def step(self, *ops: Op) -> None:
        """Append a step made of ``ops``, leaving out empty transfers."""
        ops = tuple(o for o in ops if o is not None and o.count > 0)
        if ops:
            self.steps.append(ops)


def split_counts(count: int, parts: int) -> list[int]:
    """``count`` elements cut into ``parts`` near-equal chunks (the first ones larger)."""
    q, r = divmod(count, parts)
    return [q + (i < r) for i in range(parts)]


def offsets(counts: list[int]) -> list[int]:
    """Start offset of each chunk: [0, c0, c0+c1, ...] (one more entry than counts)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def embed(into: Schedule, sub: Schedule, group: list[int], bufs: dict[str, tuple[str, int]],
          at: int | None = None) -> None:
    """Append ``sub`` (a schedule among ``group``, in group ranks) to ``into`` (in communicator ranks).

    ``bufs`` maps each buffer name of ``sub`` to (buffer name, element offset) of ``into``:
    that is how a hierarchical algorithm runs an inner algorithm on part of its buffers.
    With ``at``, sub's step k joins ``into``'s step ``at + k`` instead (running alongside what
    is there: how a pipeline overlaps one chunk's phase with another's).
    """
    def mv(name: str, off: int) -> tuple[str, int]:
        b, base = bufs[name]
        return b, base + off
    for step in sub.steps:
        ops = []
        for o in step:
            if type(o) is Copy:
                (sb, so), (db, do) = mv(o.src, o.src_off), mv(o.dst, o.dst_off)
                ops.append(Copy(sb, so, db, do, o.count, o.reduce))
            else:
                b, off = mv(o.buf, o.off)
                ops.append(o._replace(peer=group[o.peer], buf=b, off=off))
        if at is None:
            into.step(*ops)
            continue
        ops = [o for o in ops if o.count > 0]
        while len(into.steps) <= at:
            into.steps.append(())
        into.steps[at] += tuple(ops)
        at += 1
    if at is not None:
        into.steps[:] = [st for st in into.steps if st]
