"""The TCP store's server: rank 0 holds the data and serves it to the clients.

One thread runs an event loop (``selectors``: epoll on Linux) over the listening socket and every
client, at most ``Limits.max_connections`` of them (beyond that a connection is told why and closed).
Each client is a :class:`~.session.Session`, a state machine fed the bytes as they arrive: a new
connection must open (the hello, or the proof of the job's secret, as ``wire.py`` says) within
``opening_timeout`` of being accepted, a started request must keep coming (``request_timeout``
between two bytes) and a reply must be read (as long again between two pieces); the loop keeps the
deadlines on a heap and drops, with a warning on logger "pyxccl", a client that misses one or breaks
the protocol. Everyone else goes on being served. A proven client may idle between requests as long
as it likes. A GET or MULTI_GET whose keys are missing waits without a thread: the client is noted
under each key it lacks and answered by the SET or ADD that makes the last one (or with MISSING at its
deadline); a waiting client that leaves is forgotten, one that sends more is dropped. The data,
counting values (and MULTI_GET requests) still being received or waiting, never holds more than
``max_bytes``.
"""
from __future__ import annotations

import errno
import heapq
import itertools
import logging
import selectors
import socket
import struct
import threading
import time

from .._errors import RendezvousError
from ..transport import auth, fds
from . import wire
from .session import OPENING, READY, WAITING, Session
from .wire import ADD, CHECK, DELETE, ERR, FULL, GET, MISSING, MULTI_GET, OK, SET, BadClient, Limits

log = logging.getLogger("pyxccl")
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
_LISTEN, _WAKE = object(), object()
_CHUNK = 1 << 16                # bytes read from one client per turn
_ACCEPTS = 64                   # connections accepted per turn (the backlog holds the rest)
_SPARE_FDS = 32                 # the loop's own descriptors, and a rank's extra connections
# accept() failures that pass at once (a client gone before we took it)
_GONE = {errno.ECONNABORTED, errno.EPROTO}


class _Handoff:
    """A connection given to the loop by ``serve``: set when it is dropped, with the bug if serving it raised one."""

    def __init__(self):
        self.done, self.bug = threading.Event(), None


class StoreServer:
    """The store's data and its listening socket on ``host:port`` (``port=0``: a free one, see ``.port``).

    ``secret``: the key every client must prove (``TCPStore`` passes ``PYXCCL_SECRET``'s);
    None: the store serves anyone who reaches the port, and says so once (NoSecretWarning).
    ``clients``: how many clients to expect (the world size), to make room for their descriptors
    (``transport.fds.ensure_fds``: RendezvousError, saying how many are missing, when there is none).
    """

    def __init__(self, host: str, port: int, limits: Limits | None = None, secret: bytes | None = None,
                 clients: int | None = None):
        self.limits = limits or Limits.from_env()
        self.secret = secret
        self.data: dict[str, bytes] = {}
        self.used = 0                    # bytes of keys and values held, and of requests being received
        if clients:
            fds.ensure_fds(min(clients, self.limits.max_connections) + _SPARE_FDS,
                           f"rank 0: the store at {host}:{port}")
        try:
            # A deep queue of connections not yet accepted (the kernel caps it at net.core.somaxconn): when
            # thousands of ranks dial at once, a full queue drops their SYNs and each retries after 1, 3, 7 s.
            self.sock = socket.create_server((host, port), backlog=65535)
        except OSError as e:
            raise RendezvousError(f"rank 0: could not serve the store on {host}:{port} ({e}); choose another "
                                  f"MASTER_PORT (or port) or stop the process that holds it", rank=0,
                                  op="init") from None
        self.port = self.sock.getsockname()[1]
        self.where = f"the store at {host}:{self.port}"
        if self.secret is None:
            auth.warn_no_secret(self.where)
        self.closed = False
        self._clients: set[Session] = set()
        self._waiting: dict[str, set[Session]] = {}     # key -> the clients whose GET/MULTI_GET lacks it
        self._timers: list[tuple[float, int, Session]] = []
        self._seq = itertools.count()
        self._paused_until: float | None = None          # accepting paused (out of descriptors) until then
        self._handoffs: list[tuple[socket.socket, _Handoff]] | None = []   # None: the loop has ended
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self.sock.setblocking(False)
        self._sel.register(self.sock, _READ, _LISTEN)
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._sel.register(self._wake_r, _READ, _WAKE)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pyxccl-store-{self.port}")
        self._thread.start()

    # --- the loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self.closed:
                try:
                    self._turn()
                except Exception:              # a bug outside one client's handling: keep serving the rest
                    log.error("pyxccl %s: the store's event loop failed; it goes on", self.where, exc_info=True)
        finally:
            self._shut()

    def _turn(self) -> None:
        for key, mask in self._sel.select(self._until_next()):
            now = time.monotonic()
            if key.data is _LISTEN:
                self._accept(now)
            elif key.data is _WAKE:
                self._woken(now)
            elif not key.data.closed:          # (dropped by an earlier event of this turn)
                self._event(key.data, mask, now)
        self._expire(time.monotonic())

    def _until_next(self) -> float | None:
        now = time.monotonic()
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self._sel.register(self.sock, _READ, _LISTEN)
        times = [t for t in (self._timers[0][0] if self._timers else None, self._paused_until) if t is not None]
        return max(0.0, min(times) - now) if times else None

    def _event(self, s: Session, mask: int, now: float) -> None:
        try:
            if mask & _WRITE:
                s.flush()
            if mask & _READ:
                data = s.sock.recv(_CHUNK)
                if not data:
                    if s.stage == OPENING:
                        raise BadClient("hung up before opening (saying hello, or proving the job's secret)")
                    self._drop(s)          # it left: between requests, in the middle of one, or while waiting
                    return
                if s.stage == WAITING:
                    raise BadClient("sent more while its get waited")
                s.inbuf += data
            self._serve(s, now)
        except BadClient as e:
            self._drop(s, e)
        except (BlockingIOError, InterruptedError):
            self._settle(s, now)
        except OSError:
            self._drop(s)                  # the client vanished
        except Exception as e:             # a bug: this client is dropped, the loop and the others go on
            log.error("pyxccl %s: serving a client failed; dropped it", self.where, exc_info=True)
            if s.handoff is not None:
                s.handoff.bug = e
            self._drop(s)

    def _serve(self, s: Session, now: float) -> None:
        """Serve the whole requests ``s`` sent, one at a time: the next once the last reply has gone out."""
        while s.stage != WAITING and not s.out and not s.closed:
            request = s.next_request(self._reserve)
            if request is None:
                break
            self._request(s, *request)
            s.flush()
        if s.stage == WAITING and s.inbuf:
            raise BadClient("sent more while its get waited")
        self._settle(s, now)

    def _settle(self, s: Session, now: float) -> None:
        """What to wait for from ``s`` next (to read, or to write its reply) and by when."""
        if s.closed:
            return
        events = _WRITE if s.out else _READ    # a reply pending: nothing more is read until it is out
        if events != s.events:
            self._sel.modify(s.sock, events, s)
            s.events = events
        lim = self.limits
        if s.stage == OPENING:
            s.deadline, s.late = s.open_by, f"silent for {lim.opening_timeout:g} s during its opening"
        elif s.out:
            s.deadline, s.late = now + lim.request_timeout, f"did not read its reply for {lim.request_timeout:g} s"
        elif s.stage == WAITING:
            s.deadline = s.wait_until
        elif s.busy():
            s.deadline, s.late = now + lim.request_timeout, f"silent for {lim.request_timeout:g} s during its request"
        else:
            s.deadline = None
        if s.deadline is not None and (s.queued is None or s.deadline < s.queued):
            heapq.heappush(self._timers, (s.deadline, next(self._seq), s))
            s.queued = s.deadline

    def _expire(self, now: float) -> None:
        """Act on the deadlines that passed: answer a wait with MISSING, drop a client that stalled."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            t, _, s = heapq.heappop(timers)
            if s.closed or t != s.queued:
                continue                   # a stale entry: an earlier one replaced it
            s.queued = None
            if s.deadline is None:
                continue
            if s.deadline > now:           # moved on since: wait again
                heapq.heappush(timers, (s.deadline, next(self._seq), s))
                s.queued = s.deadline
            elif s.stage == WAITING and not s.out:
                self._answer(s, now)
            else:
                self._drop(s, BadClient(s.late))

    def _accept(self, now: float) -> None:
        for _ in range(_ACCEPTS):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _GONE:
                    continue
                # Out of descriptors (or memory) for a moment: stop listening briefly rather than spin.
                log.warning("pyxccl %s: cannot accept a connection (%s); retrying in 0.1 s", self.where, e)
                self._sel.unregister(self.sock)
                self._paused_until = now + 0.1
                return
            self._admit(conn, now)

    def _admit(self, conn: socket.socket, now: float, handoff: _Handoff | None = None) -> None:
        if len(self._clients) >= self.limits.max_connections or self.closed:
            full = not self.closed
            why = (f"it serves its limit of {self.limits.max_connections} connections (PYXCCL_STORE_MAX_"
                   f"CONNECTIONS on rank 0); a process may be leaking store clients, else raise the limit"
                   if full else "it is closing")
            try:
                conn.setblocking(False)
                conn.send(wire.refusal(why))
            except OSError:
                pass
            if full:
                auth.refused(self.where, conn, BadClient(why))
            conn.close()
            if handoff is not None:
                handoff.done.set()
            return
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s = Session(conn, self.secret, self.limits, now)
        s.handoff = handoff
        self._clients.add(s)
        self._sel.register(conn, _READ, s)
        s.events = _READ
        try:
            s.flush()                      # the greeting
        except OSError:
            self._drop(s)
            return
        self._settle(s, now)

    def _woken(self, now: float) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        with self._lock:
            handoffs, self._handoffs = self._handoffs, []
        for conn, handoff in handoffs:
            self._admit(conn, now, handoff)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass                           # full (the loop is waking anyway) or closed

    def _drop(self, s: Session, why: BadClient | None = None) -> None:
        """Close ``s`` (logging ``why`` and telling the client ``why.reply``), give back what it held."""
        if s.closed:
            return
        if why is not None:
            auth.refused(self.where, s.sock, why)
            if why.reply:
                try:
                    s.sock.send(why.reply)
                except OSError:
                    pass
        s.closed = True
        self.used -= s.held
        s.held = 0
        self._unwait(s)
        self._clients.discard(s)
        if s.events:
            self._sel.unregister(s.sock)
        s.sock.close()
        if s.handoff is not None:
            s.handoff.done.set()

    def _shut(self) -> None:
        """The loop's end: waiting clients are told MISSING, every connection and the listener closed."""
        now = time.monotonic()
        for s in list(self._clients):
            if s.stage == WAITING and not s.out:
                try:
                    s.send(wire.reply(MISSING))
                    s.flush()
                except OSError:
                    pass
            try:
                s.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._drop(s)
        with self._lock:
            handoffs, self._handoffs = self._handoffs, None
        for conn, handoff in handoffs:
            self._admit(conn, now, handoff)    # refused: closing
        self._sel.close()
        self.sock.close()
        self._wake_r.close()

    # --- the requests --------------------------------------------------------------------------------------

    def _reserve(self, nbytes: int) -> bool:
        if self.used + nbytes > self.limits.max_bytes:
            return False
        self.used += nbytes
        return True

    def _full(self, nbytes: int) -> bytes:
        return wire.reply(FULL, (f"it holds {self.used} bytes, its limit is {self.limits.max_bytes} "
                                 f"(PYXCCL_STORE_MAX_BYTES on rank 0): no room for {nbytes} more; delete keys no "
                                 f"longer needed, or raise the limit").encode())

    def _request(self, s: Session, op: int, key: str, value: bytes | None, held: int) -> None:
        """Serve one whole request of ``s``: queue its reply, or make it wait."""
        if value is None:
            s.send(self._full(held))      # no room: its value was dropped as it came
        elif op == SET:
            s.send(self._set(s, key, value))
        elif op == GET:
            self._get(s, [key], wire.TIMEOUT.unpack(value)[0], single=True)
        elif op == MULTI_GET:
            timeout, keys = wire.unpack_keys(value)
            self._get(s, keys, timeout, single=False)
        elif op == ADD:
            s.send(self._add(key, value))
        elif op == CHECK:
            s.send(wire.reply(OK, b"1" if key in self.data else b"0"))
        elif op == DELETE:
            old = self.data.pop(key, None)
            if old is not None:
                self.used -= len(key.encode()) + len(old)
            s.send(wire.reply(OK, b"1" if old is not None else b"0"))

    def _set(self, s: Session, key: str, value: bytes) -> bytes:
        # The room was taken when the request's header came; a value it replaces stays until now.
        old = self.data.get(key)
        if old is not None:
            self.used -= s.held - len(value) + len(old)
        self.data[key] = value
        s.held = 0                         # now the data's
        if old is None:
            self._made(key)
        return wire.reply(OK)

    def _add(self, key: str, amount: bytes) -> bytes:
        old = self.data.get(key)
        try:
            new = str(int(old if old is not None else b"0") + int(amount)).encode()
        except ValueError:
            return wire.reply(ERR, f"key {key[:64]!r} holds {(old or b'')[:32]!r}, not a counter; add "
                                   f"{amount[:32]!r}".encode())
        grow = len(new) - (len(old) if old is not None else -len(key.encode()))
        if self.used + grow > self.limits.max_bytes:
            return self._full(grow)
        self.used += grow
        self.data[key] = new
        if old is None:
            self._made(key)
        return wire.reply(OK, new)

    def _get(self, s: Session, keys: list[str], timeout: float, single: bool) -> None:
        s.want, s.single = keys, single
        missing = {k for k in keys if k not in self.data}
        wait = min(timeout, 1e7) if timeout > 0 else 0.0      # NaN -> 0
        if not missing or wait == 0:
            self._answer(s, None)
            return
        s.stage, s.wait_until, s.missing = WAITING, time.monotonic() + wait, len(missing)
        for k in missing:
            self._waiting.setdefault(k, set()).add(s)

    def _made(self, key: str) -> None:
        """``key`` exists now: the clients waiting for it as their last missing key are answered."""
        for s in self._waiting.pop(key, ()):
            s.missing -= 1
            if s.missing:
                continue
            missing = {k for k in s.want if k not in self.data}    # one may have been deleted since
            if missing:
                s.missing = len(missing)
                for k in missing:
                    self._waiting.setdefault(k, set()).add(s)
            else:
                self._answer(s, time.monotonic())

    def _answer(self, s: Session, now: float | None) -> None:
        """Reply to ``s``'s GET or MULTI_GET with what the store holds now; flushed at once when ``now``
        is given (``s`` is not the client being served)."""
        data, keys = self.data, s.want
        if s.single:
            value = data.get(keys[0])
            s.send(*([wire.REP.pack(OK, len(value)), value] if value is not None else [wire.reply(MISSING)]))
        else:
            absent = [i for i, k in enumerate(keys) if k not in data]
            values = [data[k] for k in keys] if not absent else []
            total = sum(map(len, values))
            if absent:
                s.send(wire.reply(MISSING, struct.pack(f"<{len(absent)}I", *absent)))
            elif total > self.limits.max_value:
                s.send(wire.reply(ERR, (f"its {len(keys)} values total {total} bytes, over the store's limit of "
                                        f"{self.limits.max_value} for one reply (PYXCCL_STORE_MAX_VALUE on rank "
                                        f"0); get fewer keys at once").encode()))
            else:
                s.send(*wire.values_reply(values))
        self._unwait(s)
        self.used -= s.held
        s.held, s.want, s.stage = 0, None, READY
        if now is not None:
            try:
                s.flush()
            except OSError:
                self._drop(s)
                return
            self._settle(s, now)

    def _unwait(self, s: Session) -> None:
        if s.stage != WAITING:
            return
        for k in set(s.want):
            waiters = self._waiting.get(k)
            if waiters is not None:
                waiters.discard(s)
                if not waiters:
                    del self._waiting[k]

    # --- from other threads --------------------------------------------------------------------------------

    def serve(self, conn: socket.socket) -> None:
        """Serve ``conn`` (a connected socket) in the loop like an accepted client; return once it is
        dropped (it left, broke the protocol or stalled). Raises what serving it raised when that was a
        bug rather than the client's doing. (Tests and the fuzz harness hand it one end of a socketpair.)"""
        handoff = _Handoff()
        with self._lock:
            over = self._handoffs is None
            if not over:
                self._handoffs.append((conn, handoff))
        if over:
            conn.close()
            return
        self._wake()
        handoff.done.wait()
        if handoff.bug is not None:
            raise handoff.bug

    def close(self) -> None:
        """Stop serving: waiting clients are told MISSING, every connection and the port are closed."""
        self.closed = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(30)
        self._wake_w.close()
