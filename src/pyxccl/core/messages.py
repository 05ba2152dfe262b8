"""Running a message schedule: Send and Recv over the mesh's transports, through the walker."""
from __future__ import annotations

import time

import numpy as np

from .._errors import CommTimeoutError
from ..dtypes import DTYPE_CODE
from ..schedule import Schedule
from ..transport import copies
from ..transport.mailbox import COLL, RecvRequest
from ..walk import Semantics, walk


def copy(bufs: dict, o, reduce) -> None:
    """A local Copy (numpy copies nothing when source and destination are one memory: in place)."""
    src = bufs[o.src][o.src_off:o.src_off + o.count]
    dst = bufs[o.dst][o.dst_off:o.dst_off + o.count]
    if o.reduce:
        reduce(dst, src)
    else:
        copies.copy(dst, src)


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
        self._expect(o.peer, self.bufs[o.buf][o.off:o.off + o.count], self.reduce if o.reduce else None)

    def _expect(self, peer: int, dst: np.ndarray, reduce) -> None:
        req = RecvRequest(self.ctx.world_ranks[peer], self.key, dst, reduce, self.op, self.call)
        self.ctx.track(req)
        self.ctx.mailbox.post(req)
        self.reqs.append(req)

    def send(self, r, k, o):
        self._put(o.peer, self.dcode, self.bufs[o.buf][o.off:o.off + o.count].view(np.uint8))

    def _put(self, peer: int, code: int, data: np.ndarray) -> None:
        self.ctx.traffic.wire(self.op, self.ctx.link_to(peer), data.nbytes)
        self.ctx.peer(peer).send(self.key, code, data, self.deadline, self.call)

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


class _Compressed(_Messages):
    """Messages to the ranks in ``to`` travel encoded by ``codec`` (a pyxccl.compression Quantizer): the
    receiver decodes into its float32 buffer, copying or adding (the reduction in float32, higher
    precision than the code; the next hop encodes the partial sum again). A sender keeps what its peer
    will see (it writes the decoded values back where it sent from, unless that is the user's input):
    a rank that sends its part and keeps it then holds what the others got, so every rank ends with
    the same result."""
    __slots__ = ("codec", "to", "raws", "keep")
    BYTES = DTYPE_CODE[np.dtype(np.uint8)]

    def __init__(self, ctx, bufs, reduce, seq, call, op, deadline, dt, codec, to):
        super().__init__(ctx, bufs, reduce, seq, call, op, deadline, dt)
        self.codec, self.to, self.raws = codec, to, []
        self.keep = "in" not in bufs or bufs["in"] is bufs["out"]

    def post(self, r, k, o):
        if o.peer not in self.to:
            self.raws.append(None)
            return super().post(r, k, o)
        raw = np.empty(self.codec.nbytes(o.count), np.uint8)
        self._expect(o.peer, raw, None)
        self.raws.append(raw)

    def send(self, r, k, o):
        if o.peer not in self.to:
            return super().send(r, k, o)     # as is: what this rank holds, whatever it is
        src = self.bufs[o.buf][o.off:o.off + o.count]
        enc = np.empty(self.codec.nbytes(o.count), np.uint8)     # its own: the transport may still hold it
        self.codec.encode(src, enc)
        self._put(o.peer, self.BYTES, enc)
        if self.keep or o.buf != "in":
            self.codec.decode(enc, src, accumulate=False)

    def take(self, r, k, o):
        raw = self.raws[self.next]
        super().take(r, k, o)
        if raw is not None:
            self.codec.decode(raw, self.bufs[o.buf][o.off:o.off + o.count], accumulate=o.reduce)
        return True

    def end(self, r, k):
        super().end(r, k)
        self.raws.clear()


def run(ctx, s: Schedule, bufs: dict, reduce, seq: int, call, op: str, deadline: float, dt, codec=None,
        compressed=()) -> None:
    """Run this rank's message schedule ``s`` of collective ``seq``; ``call``: its fingerprint words;
    ``codec``: messages to the ranks in ``compressed`` are encoded (see :class:`_Compressed`)."""
    if codec is None:
        sem = _Messages(ctx, bufs, reduce, seq, call, op, deadline, dt)
    else:
        sem = _Compressed(ctx, bufs, reduce, seq, call, op, deadline, dt, codec, compressed)
    ctx.mailbox.begin(ctx.id, seq, call)
    try:
        walk([s], sem)
    except BaseException:
        sem.cancel()
        raise
    ctx.mailbox.finish(ctx.id, seq)       # a message for this call from now on is a disagreement
