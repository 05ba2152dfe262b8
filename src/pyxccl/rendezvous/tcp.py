"""A TCP key-value store: one process (rank 0) serves it, every rank is a client.

Protocol (little-endian, no pickle):

* request: ``op (u8) | key length (u32) | key (UTF-8) | value length (u64) | value``
* reply:   ``status (u8) | length (u64) | payload``

A blocking ``get`` waits on the server (a condition variable), so clients
never poll. The server runs one daemon thread per connection; a client that
sends something outside the protocol, or vanishes, is dropped alone (and
logged). With ``PYXCCL_SECRET`` set, every connection first passes the job's
HMAC handshake (``pyxccl.transport.auth``), so only the job's ranks can read or write.
"""
from __future__ import annotations

import math
import select
import socket
import struct
import threading
import time

from ..transport import auth
from .._errors import InvalidArgumentError, RendezvousError
from .base import Store

_SET, _GET, _ADD, _CHECK, _DEL = range(1, 6)
_OK, _MISSING, _ERR = 0, 1, 2
_REQ = struct.Struct("<BI")
_LEN = struct.Struct("<Q")
_REP = struct.Struct("<BQ")
_TIMEOUT = struct.Struct("<d")
_MAX_KEY, _MAX_VALUE = 1 << 16, 1 << 30
_CHUNK = 1 << 20


def _recv(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes. Read in chunks: a garbage length must not allocate a huge buffer up front."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), _CHUNK))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def _gone(conn: socket.socket) -> bool:
    """Whether the client closed its end (readable with nothing to read), without blocking."""
    try:
        if not select.select([conn], [], [], 0)[0]:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class _Server:
    """The store's data and its listening socket; lives in the process that serves (rank 0)."""

    def __init__(self, host: str, port: int):
        self.secret = auth.env_secret()
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()
        try:
            self.sock = socket.create_server((host, port), backlog=256)
        except OSError as e:
            raise RendezvousError(f"could not serve the store on {host}:{port} ({e}); choose another MASTER_PORT "
                                  f"(or port) or stop the process that holds it", op="init") from None
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="pyxccl-store-accept").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return                    # listening socket closed
            with self._lock:
                if self.closed:
                    conn.close()
                    return
                self._clients.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="pyxccl-store-client").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.secret is not None:
                conn.settimeout(10.0)
                auth.accept(conn, self.secret)
                conn.settimeout(None)
            while not self.closed:
                op, klen = _REQ.unpack(_recv(conn, _REQ.size))
                if klen > _MAX_KEY or op not in (_SET, _GET, _ADD, _CHECK, _DEL):
                    raise auth.AuthError(f"not the store protocol (op {op}, key length {klen})")
                key = _recv(conn, klen).decode()
                (vlen,) = _LEN.unpack(_recv(conn, _LEN.size))
                if vlen > _MAX_VALUE:
                    raise auth.AuthError(f"a {vlen}-byte value, over the store's limit of {_MAX_VALUE}")
                status, payload = self._handle(conn, op, key, _recv(conn, vlen))
                conn.sendall(_REP.pack(status, len(payload)) + payload)
        except auth.AuthError as e:       # drop this client, keep serving the others
            auth.refused("store", conn, e)
        except (OSError, UnicodeDecodeError, struct.error):
            pass                          # the client vanished mid-request
        finally:
            with self._lock:
                self._clients.discard(conn)
            conn.close()

    def _handle(self, conn: socket.socket, op: int, key: str, value: bytes) -> tuple[int, bytes]:
        with self.cv:
            if op == _SET:
                self.data[key] = value
                self.cv.notify_all()
                return _OK, b""
            if op == _GET:
                (timeout,) = _TIMEOUT.unpack(value)
                deadline = time.monotonic() + (min(timeout, 1e7) if timeout > 0 else 0.0)   # NaN -> 0
                while key not in self.data and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return _MISSING, b""
                    # Wake now and then to notice a client that gave up, so its thread does not linger.
                    self.cv.wait(min(left, 1.0))
                    if key not in self.data and _gone(conn):
                        raise ConnectionError("client left during get")
                return (_OK, self.data[key]) if key in self.data else (_MISSING, b"")
            if op == _ADD:
                try:
                    new = int(self.data.get(key, b"0")) + int(value)
                except ValueError:
                    return _ERR, f"key {key!r} holds {self.data.get(key, b'')[:32]!r}, not a counter".encode()
                self.data[key] = str(new).encode()
                self.cv.notify_all()
                return _OK, self.data[key]
            if op == _CHECK:
                return _OK, b"1" if key in self.data else b"0"
            return _OK, b"1" if self.data.pop(key, None) is not None else b"0"

    def close(self) -> None:
        with self._lock:
            self.closed = True
            clients = list(self._clients)
        with self.cv:
            self.cv.notify_all()          # blocked gets return "missing"
        try:
            self.sock.shutdown(socket.SHUT_RDWR)   # on Linux, close() alone does not wake accept()
        except OSError:
            pass
        self.sock.close()
        for c in clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TCPStore(Store):
    """A store served over TCP.

    ``is_server=True`` starts the server in this process (daemon threads, a
    socket bound to ``host:port``; ``port=0`` picks a free one, see
    ``.port``), and the object is also a client of it. Clients retry
    connecting, with backoff, for up to ``timeout`` s, since the server may
    start later. One object may be used from several threads: each concurrent
    call gets its own connection, so a blocked ``get`` never holds up a
    ``set`` from another thread. ``world_size`` is accepted for torch's
    signature and not needed.

    >>> s = TCPStore("127.0.0.1", 0, is_server=True)       # doctest: +SKIP
    >>> TCPStore("127.0.0.1", s.port, is_server=False).set("k", b"v")
    """

    def __init__(self, host: str, port: int, *, is_server: bool, timeout: float = 300.0,
                 world_size: int | None = None):
        super().__init__(timeout)
        self._server = _Server(host, port) if is_server else None
        self.host, self.port = host, (self._server.port if self._server else int(port))
        self.world_size = world_size
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
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                secret = auth.env_secret()
                if secret is not None:
                    try:
                        auth.dial(s, secret, 0)
                    except auth.AuthError as e:
                        s.close()
                        raise RendezvousError(f"the store at {self.address} refused this process or failed "
                                              f"its proof ({e}); every rank needs the same PYXCCL_SECRET",
                                              op="store") from None
                return s
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(
                        f"could not reach the store at {self.address} within {self.timeout:g} s ({e}); check "
                        f"MASTER_ADDR/MASTER_PORT (or the tcp:// address) and that rank 0 is running",
                        op="store") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _call(self, op: int, key: str, value: bytes = b"", wait: float = 0.0) -> bytes:
        """One request/response on a connection of our own; raise on an error reply."""
        if self._closed:
            raise RendezvousError(f"the store client of {self.address} was closed; operation on key {key!r} "
                                  f"refused", op="store")
        k = key.encode()
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        try:
            sock = sock or self._connect()
            sock.settimeout(self.timeout + wait + 5.0)   # a dead server host must not hang us forever
            sock.sendall(_REQ.pack(op, len(k)) + k + _LEN.pack(len(value)) + value)
            status, n = _REP.unpack(_recv(sock, _REP.size))
            payload = _recv(sock, n)
        except RendezvousError:
            raise
        except OSError as e:
            if sock is not None:
                sock.close()
            raise RendezvousError(f"the store at {self.address} went away or stopped answering ({e!r}) during "
                                  f"an operation on key {key!r}; is rank 0 still running?", op="store") from None
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)
        if status == _ERR:
            raise InvalidArgumentError(f"store at {self.address}: {payload.decode(errors='replace')}", op="store")
        if status == _MISSING:
            raise RendezvousError(f"key {key!r} did not appear in the store at {self.address} within {wait:g} s; "
                                  f"a rank did not start, failed, or started with other settings", op="store")
        return payload

    def set(self, key: str, value: bytes) -> None:
        self._call(_SET, key, bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        timeout = self.timeout if timeout is None else float(timeout)
        if math.isnan(timeout) or timeout < 0:
            raise InvalidArgumentError(f"store get of {key!r}: timeout must be >= 0, not {timeout}", op="store")
        return self._call(_GET, key, _TIMEOUT.pack(timeout), wait=timeout)

    def add(self, key: str, amount: int) -> int:
        return int(self._call(_ADD, key, str(int(amount)).encode()))

    def check(self, key: str) -> bool:
        return self._call(_CHECK, key) == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call(_DEL, key) == b"1"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()
        if self._server is not None:
            self._server.close()
