"""One client of the store's server: the state of its connection, as the server's event loop drives it.

The loop hands in bytes as they arrive (``inbuf``); ``next_request`` turns them into whole requests,
each checked against the limits as soon as its header is in (before a byte of what it announces
is kept), and runs the opening first (``wire.opening_reply``: the hello, or the proof of the job's
secret). Replies wait in ``out`` as pieces until the socket takes them (``flush``). No threads and
no blocking: the loop decides what to read and when a deadline has passed.

Stages: OPENING (greeted, waiting for the hello or proof), READY (between requests, or in the
middle of one), WAITING (a GET or MULTI_GET waits for keys; the server answers it).
"""
from __future__ import annotations

import itertools
from collections import deque

from . import wire
from .wire import MULTI_GET, SET, BadClient, Limits

OPENING, READY, WAITING = range(3)
_IOV = 512                     # pieces per sendmsg (Linux allows 1024)
_HEAD = wire.REQ.size + wire.LEN.size


class Session:
    """A connected client: what it sent that is not served yet, what it is owed, its deadline.

    ``held``: bytes of the store's memory budget this client holds (a SET's value or a MULTI_GET's
    keys being received, the keys of a MULTI_GET that waits); the server gives them back.
    """

    __slots__ = ("sock", "secret", "limits", "nonce", "stage", "inbuf", "out", "head", "skip", "held",
                 "want", "single", "missing", "wait_until", "open_by", "deadline", "late", "queued", "events",
                 "closed", "handoff")

    def __init__(self, sock, secret: bytes | None, limits: Limits, now: float):
        self.sock, self.secret, self.limits = sock, secret, limits
        greeting, self.nonce = wire.greeting(secret, limits)
        self.stage = OPENING
        self.inbuf = bytearray()
        self.out: deque[memoryview] = deque([memoryview(greeting)])
        self.head = None               # (op, key, value length, room held) of the request coming in
        self.skip = 0                  # bytes of a refused value still to drop
        self.held = 0
        self.want: list[str] | None = None     # the keys a GET (single) or MULTI_GET asked for
        self.single = False
        self.missing = 0               # of them, how many the server still waits for
        self.wait_until = 0.0
        self.open_by = now + limits.opening_timeout
        self.deadline: float | None = None
        self.late = ""                 # what the client failed to do by its deadline
        self.queued: float | None = None       # the earliest time this client has on the server's timer heap
        self.events = 0
        self.closed = False
        self.handoff = None

    def busy(self) -> bool:
        """Whether part of a request is in (the client must keep sending)."""
        return self.head is not None or bool(self.inbuf)

    def next_request(self, reserve) -> tuple[int, str, bytes | None, int] | None:
        """The next whole request received, as (op, key, value, room held), or None until one is whole.

        ``reserve(n)`` takes ``n`` bytes of the store's budget, or says there is none: a SET's key and
        value, a MULTI_GET's request. A request refused room comes out with value None, its bytes
        dropped as they arrived. BadClient for bytes that break the protocol or the limits.
        """
        buf = self.inbuf
        if self.stage == OPENING:
            n = wire.opening_size(self.secret)
            if len(buf) < n:
                return None
            answer = wire.opening_reply(self.secret, self.nonce, bytes(buf[:n]))
            del buf[:n]
            self.stage = READY
            self.send(answer)
        if self.head is None:
            if len(buf) < wire.REQ.size:
                return None
            op, klen = wire.REQ.unpack_from(buf)
            wire.check_key(op, klen)
            if len(buf) < _HEAD + klen:
                return None
            try:
                key = bytes(buf[wire.REQ.size:wire.REQ.size + klen]).decode()
            except UnicodeDecodeError:
                raise BadClient("a key that is not UTF-8") from None
            (vlen,) = wire.LEN.unpack_from(buf, wire.REQ.size + klen)
            wire.check_value(op, vlen, self.limits.max_value)
            del buf[:_HEAD + klen]
            need = klen + vlen if op == SET else vlen if op == MULTI_GET else 0
            # Room is taken before the value is read, so clients sending at once cannot overshoot the limit.
            if need and not reserve(need):
                self.skip, need = vlen, -need
            self.held = max(need, 0)
            self.head = (op, key, vlen, need)
        op, key, vlen, need = self.head
        if need < 0:                   # refused: drop the value as it comes, keep the connection
            drop = min(len(buf), self.skip)
            del buf[:drop]
            self.skip -= drop
            if self.skip:
                return None
            self.head = None
            return op, key, None, -need
        if len(buf) < vlen:
            return None
        value = bytes(buf[:vlen])
        del buf[:vlen]
        self.head = None
        return op, key, value, need

    def send(self, *pieces: bytes) -> None:
        """Queue reply pieces (sent in order by ``flush``; not copied)."""
        self.out.extend(memoryview(p) for p in pieces if p)

    def flush(self) -> None:
        """Send what the socket takes now; OSError if the client is gone."""
        out = self.out
        while out:
            try:
                n = self.sock.sendmsg(list(itertools.islice(out, _IOV)))
            except (BlockingIOError, InterruptedError):
                return
            while n:
                first = out[0]
                if n >= len(first):
                    n -= len(first)
                    out.popleft()
                else:
                    out[0] = first[n:]
                    n = 0
