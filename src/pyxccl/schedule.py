"""Schedules: what an algorithm is.

An algorithm builds, for one rank, an ordered list of steps. A step is a
tuple of operations that may run at the same time. Two kinds of schedule:

**Message schedules** (the default), run over any transport:

- ``Send(peer, buf, off, count)``: send ``count`` elements of ``buf`` from ``off``;
- ``Recv(peer, buf, off, count, reduce)``: receive into ``buf`` at ``off``, copying
  or, with ``reduce=True``, reducing the incoming elements into what is there;
- ``Copy(src, src_off, dst, dst_off, count, reduce)``: a local copy or reduce.

**Segment schedules** (``Schedule.segment``), run on the shared segment of the
ranks of one host. Every step is a *round*: each rank owns a window (its area
of the segment, ``window`` elements, named ``"win"`` as a buffer); in a round it
writes its window, publishes it, then reads the windows of others:

- ``Copy(..., dst="win", ...)``: write my window (before publishing);
- ``Get(peer, src_off, buf, off, count, reduce, prev)``: read ``count`` elements of
  ``peer``'s window of this round (``prev``: of the round before, read before
  publishing) into ``buf``, copying or reducing; ``peer`` may be this rank;
- ``Put(peer, dst_off, buf, off, count)``: write ``count`` elements of my ``buf`` from
  ``off`` into the buffer ``peer`` posted this round, at ``dst_off`` (a single copy,
  through process_vm_writev; ``peer`` may be this rank: a plain copy). It waits, as a
  ``Get`` does, until ``peer`` has published the round; the owner must not touch the
  region, nor return, before it has heard from the writer's next round (a ``Sync``);
- ``Post(buf, off, count, writes)``: in this round the others read ``buf[off:off+count]``
  of this rank in place (a single copy, through process_vm_readv) instead of its
  area; its ``Get``s then read that region; with ``writes``, the others ``Put`` into
  it instead (the region must be writable);
- ``Sync(peer)``: wait until ``peer`` has published this round (no data).

Buffers are named: ``"in"`` (the user's input), ``"out"`` (the user's output:
the same array as ``"in"`` for in-place calls), ``"tmp"`` (scratch of
``Schedule.scratch`` elements) and, in segment schedules, ``"win"``. Offsets and
counts are in elements. The order in which a step's operations run is defined
once, in ``walk.py``, for the engine, the checker and the cost model alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from typing import Callable, NamedTuple


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


class Get(NamedTuple):
    peer: int
    src_off: int
    buf: str
    off: int
    count: int
    reduce: bool = False
    prev: bool = False


class Put(NamedTuple):
    peer: int
    dst_off: int
    buf: str
    off: int
    count: int


class Post(NamedTuple):
    buf: str
    off: int
    count: int
    writes: bool = False    # the others Put into it (else they Get from it)


class Sync(NamedTuple):
    peer: int
    count: int = 1          # never empty: a step of Syncs is a round of its own


Op = Send | Recv | Copy | Get | Put | Post | Sync


@dataclass
class Schedule:
    """The steps one rank runs for one collective call."""
    rank: int
    nranks: int
    steps: list[tuple[Op, ...]] = field(default_factory=list)
    scratch: int = 0          # elements of "tmp" the schedule needs
    segment: bool = False     # a segment schedule: every step is a round on the host's shared segment
    window: int = 0           # elements of "win" it writes (segment schedules)
    # Segment schedules made by their algorithm record (registry.Algorithm.schedule): rank -> that
    # rank's schedule of the same call. What this rank sends is what the others' Gets read of it, which
    # only their schedules say (core/counters.py); built when first asked, not with every schedule.
    peers: Callable[[int], "Schedule"] | None = field(default=None, repr=False, compare=False)

    def step(self, *ops: Op) -> None:
        """Append a step made of ``ops``, leaving out empty transfers."""
        for o in ops:
            if o is None or o.count <= 0:       # (most steps have none: kept as given, without a copy)
                ops = tuple([o for o in ops if o is not None and o.count > 0])
                break
        if ops:
            self.steps.append(ops)


def many(op: type, *fields) -> list:
    """``op(*row)`` for each row of ``fields`` (a list or range is a column, zipped; a str, int or bool
    is the same in every row), leaving out the rows whose count is 0 (as ``Schedule.step`` does). Every field
    is given, defaults included. Made in C (``tuple.__new__`` over ``zip``), without a frame per
    operation: for builders that make thousands a rank (Bruck's alltoall, the hierarchical
    regroupings, a direct exchange's n-1 messages)."""
    k = 4 if op is Copy else 3
    cols = [f if isinstance(f, (list, range)) else repeat(f) for f in fields]
    rows = zip(*cols)
    if isinstance(fields[k], (list, range)):
        rows = compress(rows, fields[k])
    elif fields[k] <= 0:
        return []
    return list(map(tuple.__new__, repeat(op), rows))


def copies(src: str, srcs, dst: str, dsts, counts) -> list[Copy]:
    """``Copy(src, srcs[i], dst, dsts[i], counts[i])`` for each i with counts[i] > 0 (``many``)."""
    return many(Copy, src, srcs, dst, dsts, counts, False)


def split_counts(count: int, parts: int) -> list[int]:
    """``count`` elements cut into ``parts`` near-equal chunks (the first ones larger)."""
    q, r = divmod(count, parts)
    return [q + 1] * r + [q] * (parts - r)


def offsets(counts: list[int]) -> list[int]:
    """Start offset of each chunk: [0, c0, c0+c1, ...] (one more entry than counts)."""
    return [0, *accumulate(counts)]


def embed(into: Schedule, sub: Schedule, group: list[int], bufs: dict[str, tuple[str, int]],
          at: int | None = None) -> None:
    """Append ``sub`` (a message schedule among ``group``, in group ranks) to ``into`` (in communicator ranks).

    ``bufs`` maps each buffer name of ``sub`` to (buffer name, element offset) of ``into``:
    that is how a hierarchical algorithm runs an inner algorithm on part of its buffers.
    With ``at``, sub's step k joins ``into``'s step ``at + k`` instead (running alongside what
    is there: how a pipeline overlaps one chunk's phase with another's).
    """
    if sub.segment:
        raise ValueError("a segment schedule runs on its own rounds; it cannot be embedded")

    out, _new = into.steps, tuple.__new__
    padded = len(out)
    if at is not None and len(out) < at + len(sub.steps):     # the steps it joins, made at once
        out.extend([()] * (at + len(sub.steps) - len(out)))
    for step in sub.steps:
        ops = []
        add = ops.append
        for o in step:
            # tuple.__new__(Op, fields) is Op(*fields) without the generated __new__'s frame, and the fields
            # unpacked at once rather than read one by one (every rank of a large simulation is built);
            # a count <= 0 is what Schedule.step leaves out
            t = type(o)
            if t is Send:
                peer, buf, off, count = o
                if count > 0:
                    b, base = bufs[buf]
                    add(_new(Send, (group[peer], b, base + off, count)))
            elif t is Recv:
                peer, buf, off, count, red = o
                if count > 0:
                    b, base = bufs[buf]
                    add(_new(Recv, (group[peer], b, base + off, count, red)))
            elif t is Copy:
                src, src_off, dst, dst_off, count, red = o
                if count > 0:
                    (sb, so), (db, do) = bufs[src], bufs[dst]
                    add(_new(Copy, (sb, so + src_off, db, do + dst_off, count, red)))
            elif o.count > 0:
                b, base = bufs[o.buf]
                add(o._replace(peer=group[o.peer], buf=b, off=base + o.off))
        if at is None:
            if ops:
                out.append(tuple(ops))
            continue
        if ops:
            out[at] = out[at] + tuple(ops) if out[at] else tuple(ops)
        at += 1
    if at is not None and () in out[padded:]:       # (steps before those it added are never empty)
        out[:] = [st for st in out if st]
