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

def schedule_io(s, itemsize: int) -> tuple[int, int]:
    """(sent, received) bytes of schedule ``s`` on its rank; kept on the schedule (schedules are
    made once per call shape)."""
    io = getattr(s, "_io", None)
    if io is None:
        sent = recv = 0
        for step in s.steps:
            for o in step:
                t = type(o)
                if t is Send:
                    sent += o.count
                elif t is Recv:
                    recv += o.count
                elif t is Get and o.peer != s.rank:
                    recv += o.count
        io = s._io = (sent * itemsize, recv * itemsize)
    return io


class Traffic:
    """Per operation name: [calls, bytes, sent, received], since the communicator was made."""

    def __init__(self):
        self._ops: dict[str, list[int]] = {}

    def add(self, op: str, nbytes: int, sent: int, received: int) -> None:
        c = self._ops.get(op)
        if c is None:
            c = self._ops[op] = [0, 0, 0, 0]
        c[0] += 1
        c[1] += nbytes
        c[2] += sent
        c[3] += received

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {op: dict(calls=c[0], bytes=c[1], sent=c[2], received=c[3]) for op, c in sorted(self._ops.items())}
