"""Running a message schedule: Send and Recv over the mesh's transports, through the walker."""
from __future__ import annotations

import time

import numpy as np

from .._errors import CommTimeoutError
from ..dtypes import DTYPE_CODE
from ..schedule import Schedule
from ..transport.mailbox import COLL, RecvRequest
from ..walk import Semantics, walk


def copy(bufs: dict, o, reduce) -> None:
    """A local Copy (numpy copies nothing when source and destination are one memory: in place)."""
    src = bufs[o.src][o.src_off:o.src_off + o.count]
    dst = bufs[o.dst][o.dst_off:o.dst_off + o.count]
    if o.reduce:
        reduce(dst, src)
    else:
        np.copyto(dst, src)


class _Messages(Semantics):
    blocking = True
    __slots__ = ("ctx", "bufs", "reduce", "key", "call", "dcode", "op", "seq", "deadline", "reqs", "next")

    def __init__(self, ctx, bufs, reduce, seq, call, op, deadline, dt):
        self.ctx, self.bufs, self.reduce, self.call, self.op, self.seq = ctx, bufs, reduce, call, op, seq
        self.key, self.deadline, self.dcode = (ctx.id, COLL, seq), deadline, DTYPE_CODE[dt]
        self.reqs: list[RecvRequest] = []
        self.next = 0

    def local(self, r, k, o):
        copy(self.bufs, o, self.reduce)

    def post(self, r, k, o):
        req = RecvRequest(self.ctx.world_ranks[o.peer], self.key, self.bufs[o.buf][o.off:o.off + o.count],
                          self.reduce if o.reduce else None, self.op, self.call)
        self.ctx.track(req)
        self.ctx.mailbox.post(req)
        self.reqs.append(req)

    def send(self, r, k, o):
        self.ctx.peer(o.peer).send(self.key, self.dcode, self.bufs[o.buf][o.off:o.off + o.count].view(np.uint8),
                                   self.deadline, self.call)

    def take(self, r, k, o):
        req = self.reqs[self.next]
        self.next += 1
        if not req.event.wait(max(0.0, self.deadline - time.monotonic())):
            peer = self.ctx.to_comm(req.peer)
            raise CommTimeoutError(
                f"rank {r}: {self.op} (#{self.seq} on this communicator) timed out waiting for rank {peer}; "
                f"that rank is slow, stuck or did not call {self.op}: check its output, or raise the deadline "
                f"with timeout= or PYXCCL_TIMEOUT", rank=r, peer=peer, op=self.op, seq=self.seq)
        if req.error is not None:
            raise req.error
        self.ctx.untrack(req)
        return True

    def end(self, r, k):
        self.reqs.clear()
        self.next = 0

    def cancel(self) -> None:
        for req in self.reqs[self.next:]:
            self.ctx.mailbox.cancel(req)
            self.ctx.untrack(req)


def run(ctx, s: Schedule, bufs: dict, reduce, seq: int, call, op: str, deadline: float, dt) -> None:
    """Run this rank's message schedule ``s`` of collective ``seq``; ``call``: its fingerprint words."""
    sem = _Messages(ctx, bufs, reduce, seq, call, op, deadline, dt)
    ctx.mailbox.begin(ctx.id, seq, call)
    try:
        walk([s], sem)
    except BaseException:
        sem.cancel()
        raise
    ctx.mailbox.finish(ctx.id, seq)       # a message for this call from now on is a disagreement
