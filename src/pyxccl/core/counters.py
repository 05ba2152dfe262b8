"""What a communicator moved: per operation, calls, payload bytes, and bytes sent and received.

``bytes`` is the call's payload (its largest buffer, as the flight recorder says). ``sent`` and
``received`` are what the schedules that ran moved between this rank and the others, counted so
that every byte is sent once and received once: summed over the ranks of a call, sent equals
received, on every executor.

- Message schedules: ``sent`` is the sum of this rank's ``Send`` ops, ``received`` of its ``Recv``
  ops (each Send has its Recv of the same size on the peer).
- Segment schedules (one host's shared segment, where data moves by reads and writes): ``received``
  is the sum of this rank's ``Get`` reads of another rank's window or posted buffer and of the
  other ranks' ``Put`` writes into its posted buffer; ``sent`` is what this rank publishes (its
  window, a ``Post``ed buffer) counted once per read another rank makes of it (the sum of the other
  ranks' ``Get``s of this rank), and its own ``Put``s into other ranks' buffers. Reading one's own
  window or writing one's own buffer moves nothing. Only the peers' schedules say who reads and
  writes what, so a rank builds its peers' schedules of the call (``Schedule.peers``): n schedules
  at n ranks, so not on the call but when the counters are read (``Tally``; then kept with the
  schedule, which the plan keeps).

A prepared call (core/prepared.py) counts its calls in its ``Tally``, one increment per call; what
they add to the counters above is added when the counters are read.

A ring allreduce of G bytes over N ranks sends and receives 2G(N-1)/N per rank; the segment's
allreduce of G bytes on 2 ranks, G per rank (each reduces half, reading the other's half, then
reads the other's reduced half). The counters show exactly that, because they sum what the
schedules do, not what a formula says they should.
"""
from __future__ import annotations

from .._errors import PyxcclError
from ..schedule import Get, Post, Put, Recv, Send
from .onehost import _native


def schedule_io(s, itemsize: int, codec=None, compressed=()) -> tuple[int, int]:
    """(sent, received) bytes of schedule ``s`` on its rank (messages to and from the ranks in
    ``compressed`` encoded by ``codec``); kept on the schedule, per codec (builders may share schedules)."""
    kept = s.__dict__.setdefault("_io", {})
    io = kept.get(codec and codec.spec)
    if io is None:
        def size(o):
            return codec.nbytes(o.count) if codec is not None and o.peer in compressed else o.count * itemsize
        sent = recv = 0
        for step in s.steps:
            for o in step:
                t = type(o)
                if t is Send:
                    sent += size(o)
                elif t is Recv:
                    recv += size(o)
                elif t is Get and o.peer != s.rank:
                    recv += o.count * itemsize
        if s.segment and _puts(s):
            sent = recv = None  # the peers' reads of it and writes into it: counted when asked (Tally)
        elif s.segment:
            sent = None         # what the peers read of it: counted when asked (Tally)
        io = kept[codec and codec.spec] = (sent, recv)
    return io


class _Count:
    """``_native.Count`` where the module is not built: the count a prepared call's C part adds to."""
    __slots__ = ("calls",)


class Tally(_native.Count if _native is not None else _Count):
    """The calls one prepared call made since the counters were last read: each adds (1, ``nbytes``,
    ``sent``, ``received``) to its operation's counter, added when the counters are read (or when more
    than 256 tallies wait), so that a call costs one increment (``count``). A segment schedule's
    ``sent`` (None: its peers' reads of it) and ``received`` (None: with its peers' writes into it,
    where a rank of the call writes) are found at the first reading."""
    __slots__ = ("traffic", "counter", "nbytes", "sent", "received", "s", "itemsize")

    def __init__(self, traffic: "Traffic", counter: list[int], nbytes: int, sent: int | None, received: int, s,
                 itemsize: int):
        self.traffic, self.counter, self.nbytes, self.sent, self.received = traffic, counter, nbytes, sent, received
        self.s, self.itemsize, self.calls = s, itemsize, 0

    def count(self) -> None:
        """One call (Prepared.run writes this out: it is on every call)."""
        n = self.calls
        self.calls = n + 1
        if not n:       # the first since the last reading: listed to be added at the next
            self.traffic.waiting(self)

    def settle(self) -> None:
        n, self.calls = self.calls, 0
        if self.received is None:
            self.received = (written_into(self.s) + sum(o.count for step in self.s.steps for o in step
                                                        if type(o) is Get and o.peer != self.s.rank)) * self.itemsize
        if self.sent is None:
            self.sent = (read_of(self.s) + sum(o.count for step in self.s.steps for o in step
                                               if type(o) is Put and o.peer != self.s.rank)) * self.itemsize
        c = self.counter
        c[0] += n
        c[1] += n * self.nbytes
        c[2] += n * self.sent
        c[3] += n * self.received


def _peers(s):
    """The schedules of the other ranks of segment schedule ``s``'s call."""
    if s.peers is None:
        raise PyxcclError(f"rank {s.rank}: a segment schedule that does not say how to build its peers' (a bug: "
                          f"make it through its algorithm record, registry.Algorithm.schedule)", rank=s.rank)
    return [s.peers(q) for q in range(s.nranks) if q != s.rank]


def read_of(s) -> int:
    """Elements the other ranks' ``Get``s read of segment schedule ``s``'s rank in the same call."""
    return sum(o.count for t in _peers(s) for step in t.steps for o in step if type(o) is Get and o.peer == s.rank)


def _puts(s) -> bool:
    """Does any rank of segment schedule ``s``'s call write with ``Put``? (Only a posting rank is written
    into, and a rank that posts for writing says so in its own schedule; a writer has Puts of its own.)"""
    return any(type(o) is Put or (type(o) is Post and o.writes) for step in s.steps for o in step)


def written_into(s) -> int:
    """Elements the other ranks' ``Put``s write into segment schedule ``s``'s rank in the same call."""
    return sum(o.count for t in _peers(s) for step in t.steps for o in step if type(o) is Put and o.peer == s.rank)


class Traffic:
    """Per operation name: [calls, bytes, sent, received], since the communicator was made."""

    def __init__(self):
        self._ops: dict[str, list[int]] = {}
        self._wire: dict[str, dict[str, int]] = {}
        self._unsettled: list[Tally] = []

    def tally(self, op: str, nbytes: int, sent: int | None, received: int, s, itemsize: int) -> Tally:
        """The counts of one prepared call of ``op`` (schedule ``s``; ``sent`` None: a segment schedule's,
        found when the counters are read)."""
        return Tally(self, self.counter(op), nbytes, sent, received, s, itemsize)

    def waiting(self, t: Tally) -> None:
        """Tally ``t`` has calls to add at the next reading (when more than 256 wait, the oldest's are
        added now, so nothing grows without bound)."""
        self._unsettled.append(t)
        if len(self._unsettled) > 256:
            self._unsettled.pop(0).settle()

    def counter(self, op: str) -> list[int]:
        """The [calls, bytes, sent, received] of ``op``, for a caller that adds to it on every call."""
        c = self._ops.get(op)
        if c is None:
            c = self._ops.setdefault(op, [0, 0, 0, 0])
        return c

    def add(self, op: str, nbytes: int, sent: int, received: int) -> None:
        c = self.counter(op)
        c[0] += 1
        c[1] += nbytes
        c[2] += sent
        c[3] += received

    def wire(self, op: str, link: str, nbytes: int) -> None:
        """A send of ``op`` handed ``nbytes`` to a transport over a link of class ``link``."""
        w = self._wire.get(op)
        if w is None:
            w = self._wire[op] = {}
        w[link] = w.get(link, 0) + nbytes

    def snapshot(self) -> dict[str, dict]:
        while self._unsettled:
            self._unsettled.pop().settle()
        return {op: dict(calls=c[0], bytes=c[1], sent=c[2], received=c[3], wire=dict(self._wire.get(op, {})))
                for op, c in sorted(self._ops.items())}
