"""A TCP key-value store: one process (rank 0) serves it, every rank is a client.

The wire format and the opening of a connection are in ``wire.py``, the server
(its limits on connections, sizes, memory and silence) in ``server.py``. With
``PYXCCL_SECRET`` set, every connection proves the job's secret both ways
before it carries a request; without it the store serves any process that
can reach its port (see "Trust" in docs/design.md). A blocking ``get`` (and
``multi_get``, many keys in one request) waits on the server, so clients never
poll.
"""
from __future__ import annotations

import math
import socket
import struct
import threading
import time

from .._errors import InvalidArgumentError, RendezvousError
from ..transport import auth
from . import wire
from .base import Store
from .server import StoreServer
from .wire import ADD, CHECK, DELETE, ERR, FULL, GET, MISSING, MULTI_GET, SET

_NAMES = {SET: "set", GET: "get", ADD: "add", CHECK: "check", DELETE: "delete_key", MULTI_GET: "multi_get"}
_NAMED = 8                       # missing keys a multi_get's error names (then how many more)


class TCPStore(Store):
    """A store served over TCP.

    ``is_server=True`` starts the server in this process (one daemon thread, a
    socket bound to ``host:port``; ``port=0`` picks a free one, see
    ``.port``), and the object is also a client of it. Clients retry
    connecting, with backoff, for up to ``timeout`` s, since the server may
    start later. One object may be used from several threads: each concurrent
    call gets its own connection, so a blocked ``get`` never holds up a
    ``set`` from another thread. ``world_size`` (when known, with
    ``is_server``) makes room for that many clients' descriptors in this
    process (RendezvousError, saying how many are missing, when the hard
    limit is too low); ``rank`` (when known) is named in errors.
    The server's limits are ``limits`` (default :meth:`wire.Limits.from_env`).
    Both ends take the job's secret from ``PYXCCL_SECRET`` when the object
    is made.

    >>> s = TCPStore("127.0.0.1", 0, is_server=True)       # doctest: +SKIP
    >>> TCPStore("127.0.0.1", s.port, is_server=False).set("k", b"v")
    """

    def __init__(self, host: str, port: int, *, is_server: bool, timeout: float = 300.0,
                 world_size: int | None = None, rank: int | None = None, limits: wire.Limits | None = None):
        super().__init__(timeout)
        self._secret = auth.env_secret()
        self._server = StoreServer(host, port, limits, self._secret, clients=world_size) if is_server else None
        self.host, self.port = host, (self._server.port if self._server else int(port))
        self.world_size, self.rank = world_size, rank
        self._where = f"{'' if rank is None else f'rank {rank}: '}the store at {self.address}"
        self._max_value = wire.MAX_MESSAGE        # until the server's greeting says
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._idle.append(self._connect())   # fail here, at construction, when the server is unreachable
        except BaseException:
            if self._server is not None:
                self._server.close()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _connect(self) -> socket.socket:
        deadline, delay = time.monotonic() + self.timeout, 0.01
        while True:
            try:
                s = socket.create_connection((self.host, self.port),
                                             timeout=max(0.1, min(10.0, deadline - time.monotonic())))
                break
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(
                        f"{self._where}: could not reach it within {self.timeout:g} s ({e}); check "
                        f"MASTER_ADDR/MASTER_PORT (or the tcp:// address) and that rank 0 is running",
                        rank=self.rank, op="store") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._max_value = wire.open_client(s, self._secret, self._where)
        except BaseException as e:
            s.close()
            if isinstance(e, RendezvousError):
                e.rank = self.rank
            raise
        return s

    def _call(self, op: int, key: str, value: bytes = b"", wait: float = 0.0) -> bytes:
        """One request/response on a connection of our own; raise on an error reply."""
        what = f"{_NAMES[op]} of key {key[:64]!r}"
        k = key.encode()
        if len(k) > wire.MAX_KEY:
            raise InvalidArgumentError(f"{self._where}: {_NAMES[op]} of a key of {len(k)} bytes, over the store's "
                                       f"limit of {wire.MAX_KEY}; use a shorter key", rank=self.rank, op="store")
        status, payload = self._exchange(op, k, value, wait, what, max(self._max_value, wire.MAX_MESSAGE))
        if status == MISSING:
            raise RendezvousError(f"{self._where}: key {key!r} did not appear within {wait:g} s; a rank did not "
                                  f"start, failed, or started with other settings", rank=self.rank, op="store")
        return payload

    def _exchange(self, op: int, k: bytes, value: bytes, wait: float, what: str, limit: int) -> tuple[int, bytes]:
        """Send one request, read its reply (at most ``limit`` bytes); raise on ERR and FULL."""
        if self._closed:
            raise RendezvousError(f"{self._where}: this client was closed; {what} refused", rank=self.rank,
                                  op="store")
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        try:
            sock = sock or self._connect()
            if len(value) > self._max_value:
                raise InvalidArgumentError(
                    f"{self._where}: {what}: a value of {len(value)} bytes is over the store's limit of "
                    f"{self._max_value} (PYXCCL_STORE_MAX_VALUE on rank 0); store less, or raise the limit",
                    rank=self.rank, op="store")
            sock.settimeout(self.timeout + wait + 5.0)   # a dead server host must not hang us forever
            sock.sendall(wire.REQ.pack(op, len(k)) + k + wire.LEN.pack(len(value)) + value)
            status, payload = wire.read_reply(sock, limit)
        except (RendezvousError, InvalidArgumentError):
            if sock is not None:
                self._keep(sock)
            raise
        except OSError as e:
            if sock is not None:
                sock.close()
            raise RendezvousError(f"{self._where} went away or stopped answering ({e!r}) during a {what}; is "
                                  f"rank 0 still running?", rank=self.rank, op="store") from None
        self._keep(sock)
        if status == ERR:
            raise InvalidArgumentError(f"{self._where}: {what}: {payload.decode(errors='replace')}",
                                       rank=self.rank, op="store")
        if status == FULL:
            raise RendezvousError(f"{self._where}: {what}: {payload.decode(errors='replace')}", rank=self.rank,
                                  op="store")
        return status, payload

    def _keep(self, sock: socket.socket) -> None:
        """Back to the idle connections, for the next call (or closed, if this client is)."""
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)

    def release(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()

    def set(self, key: str, value: bytes) -> None:
        self._call(SET, key, bytes(value))

    def _timeout(self, timeout: float | None, what: str) -> float:
        timeout = self.timeout if timeout is None else float(timeout)
        if math.isnan(timeout) or timeout < 0:
            raise InvalidArgumentError(f"{self._where}: {what}: timeout must be >= 0, not {timeout}",
                                       rank=self.rank, op="store")
        return timeout

    def get(self, key: str, timeout: float | None = None) -> bytes:
        timeout = self._timeout(timeout, f"get of key {key!r}")
        return self._call(GET, key, wire.TIMEOUT.pack(timeout), wait=timeout)

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        """The values of ``keys``, in one request answered when the last of them is set (RendezvousError
        naming those still missing after ``timeout`` s). At most ``wire.MAX_KEYS`` keys, whose request and
        whose values each fit the store's largest value (InvalidArgumentError otherwise)."""
        keys = list(keys)
        what = f"multi_get of {len(keys)} keys"
        timeout = self._timeout(timeout, what)
        if not keys:
            return []
        if len(keys) > wire.MAX_KEYS:
            raise InvalidArgumentError(f"{self._where}: {what}: over the store's limit of {wire.MAX_KEYS} keys "
                                       f"in one request; ask in several", rank=self.rank, op="store")
        encoded = [k.encode() for k in keys]
        longest = max(encoded, key=len)
        if len(longest) > wire.MAX_KEY:
            raise InvalidArgumentError(f"{self._where}: {what}: key {keys[encoded.index(longest)][:64]!r}... has "
                                       f"{len(longest)} bytes, over the store's limit of {wire.MAX_KEY}; use "
                                       f"shorter keys", rank=self.rank, op="store")
        status, payload = self._exchange(MULTI_GET, b"", wire.pack_keys(timeout, encoded), timeout, what,
                                         self._max_value + 8 * len(keys) + wire.MAX_MESSAGE)
        try:
            if status == MISSING:
                absent = [keys[i] for i in struct.unpack(f"<{len(payload) // 4}I", payload)]
                named = ", ".join(repr(k) for k in absent[:_NAMED])
                more = f" and {len(absent) - _NAMED} more" if len(absent) > _NAMED else ""
                raise RendezvousError(f"{self._where}: {len(absent)} of {len(keys)} keys did not appear within "
                                      f"{timeout:g} s: {named}{more}; a rank did not start, failed, or started "
                                      f"with other settings", rank=self.rank, op="store")
            return wire.split_values(payload, len(keys))
        except (struct.error, IndexError, ConnectionError) as e:
            if isinstance(e, RendezvousError):
                raise
            raise RendezvousError(f"{self._where}: {what}: a reply that does not fit the request ({e}); is that "
                                  f"port rank 0's store?", rank=self.rank, op="store") from None

    def add(self, key: str, amount: int) -> int:
        value = str(int(amount)).encode()
        if len(value) > wire.MAX_ADD:
            raise InvalidArgumentError(f"{self._where}: add of {amount} to key {key[:64]!r}: over {wire.MAX_ADD} "
                                       f"digits; add less at a time", rank=self.rank, op="store")
        return int(self._call(ADD, key, value))

    def check(self, key: str) -> bool:
        return self._call(CHECK, key) == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call(DELETE, key) == b"1"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()
        if self._server is not None:
            self._server.close()
