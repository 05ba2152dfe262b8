"""What a communicator moved: per operation, calls, payload bytes, and bytes sent and received.

``bytes`` is the call's payload (its largest buffer, as the flight recorder says). ``sent`` and
``received`` are what this rank's schedule, the one that ran, put on links and took off them:
the sum of its ``Send`` and of its ``Recv`` ops, and of its ``Get`` reads of another rank's
window or buffer (on one host's shared segment data moves by reads, so a segment schedule's
ranks receive without sending; count ``received`` there). A ring allreduce of G bytes over N
ranks sends 2G(N-1)/N per rank: the counters show exactly that, because they sum what the
schedule does, not what a formula says it should.
"""
from __future__ import annotations

from ..schedule import Get, Recv, Send

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
        io = kept[codec and codec.spec] = (sent, recv)
    return io


class Traffic:
    """Per operation name: [calls, bytes, sent, received], since the communicator was made."""

    def __init__(self):
        self._ops: dict[str, list[int]] = {}
        self._wire: dict[str, dict[str, int]] = {}

    def add(self, op: str, nbytes: int, sent: int, received: int) -> None:
        c = self._ops.get(op)
        if c is None:
            c = self._ops[op] = [0, 0, 0, 0]
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
        return {op: dict(calls=c[0], bytes=c[1], sent=c[2], received=c[3], wire=dict(self._wire.get(op, {})))
                for op, c in sorted(self._ops.items())}
