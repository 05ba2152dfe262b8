"""A TCP key-value store: one process (rank 0) serves it, every rank is a client.

Protocol: a request is ``op (1 byte) | key length (u32) | key | value length (u64) | value``;
a reply is ``status (1 byte) | length (u64) | payload``. A blocking ``get`` waits on
the server (a condition variable), so clients never poll.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

from .._errors import RendezvousError
from ..transport.base import recv_bytes
from .base import Store

_SET, _GET, _ADD, _CHECK, _DEL = range(1, 6)
_OK, _MISSING, _ERR = 0, 1, 2
_REQ = struct.Struct("<BI")
_LEN = struct.Struct("<Q")
_REP = struct.Struct("<BQ")
_MAX_KEY, _MAX_VALUE = 1 << 16, 1 << 30


class _Server:
    def __init__(self, host: str, port: int):
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()
        self.sock = socket.create_server((host, port), backlog=128, reuse_port=False)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self.clients: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name="pyxccl-store-accept").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.clients.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="pyxccl-store-client").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                op, klen = _REQ.unpack(recv_bytes(conn, _REQ.size))
                if klen > _MAX_KEY or op not in (_SET, _GET, _ADD, _CHECK, _DEL):
                    return        # not our protocol: drop this client, keep serving the others
                key = recv_bytes(conn, klen).decode()
                (vlen,) = _LEN.unpack(recv_bytes(conn, _LEN.size))
                if vlen > _MAX_VALUE:
                    return
                value = recv_bytes(conn, vlen)
                status, payload = self._handle(op, key, value)
                conn.sendall(_REP.pack(status, len(payload)) + payload)
        except (OSError, ConnectionError, UnicodeDecodeError, struct.error):
            pass
        finally:
            self.clients.discard(conn)
            conn.close()

    def _handle(self, op: int, key: str, value: bytes) -> tuple[int, bytes]:
        with self.cv:
            if op == _SET:
                self.data[key] = value
                self.cv.notify_all()
                return _OK, b""
            if op == _GET:
                (timeout,) = struct.unpack("<d", value)
                if not self.cv.wait_for(lambda: key in self.data or self.closed, timeout):
                    return _MISSING, b""
                return (_OK, self.data[key]) if key in self.data else (_MISSING, b"")
            if op == _ADD:
                new = int(self.data.get(key, b"0")) + int(value)
                self.data[key] = str(new).encode()
                self.cv.notify_all()
                return _OK, self.data[key]
            if op == _CHECK:
                return _OK, b"1" if key in self.data else b"0"
            existed = self.data.pop(key, None) is not None
            return _OK, b"1" if existed else b"0"

    def close(self) -> None:
        self.closed = True
        with self.cv:
            self.cv.notify_all()
        self.sock.close()
        for c in list(self.clients):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TCPStore(Store):
    """Store served over TCP. ``is_server=True`` also starts the server in this
    process (``port=0`` picks a free port, see ``.port``); clients retry until it is up.

    >>> s = TCPStore("127.0.0.1", 0, is_server=True)       # doctest: +SKIP
    >>> TCPStore("127.0.0.1", s.port, is_server=False).set("k", b"v")
    """

    def __init__(self, host: str, port: int, *, is_server: bool, timeout: float = 300.0, world_size=None):
        super().__init__(timeout)
        self._server = _Server(host, port) if is_server else None
        self.host, self.port = host, (self._server.port if self._server else port)
        self._lock = threading.Lock()
        self._sock = self._connect()

    def _connect(self) -> socket.socket:
        deadline, delay = time.monotonic() + self.timeout, 0.01
        while True:
            try:
                s = socket.create_connection((self.host, self.port), timeout=10)
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(
                        f"could not reach the store at {self.host}:{self.port} within {self.timeout:.0f} s "
                        f"({e}); check MASTER_ADDR/MASTER_PORT and that rank 0 is running", op="init") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _call(self, op: int, key: str, value: bytes = b"") -> tuple[int, bytes]:
        k = key.encode()
        with self._lock:
            try:
                self._sock.sendall(_REQ.pack(op, len(k)) + k + _LEN.pack(len(value)) + value)
                status, n = _REP.unpack(recv_bytes(self._sock, _REP.size))
                return status, recv_bytes(self._sock, n)
            except (OSError, ConnectionError) as e:
                raise RendezvousError(f"the store at {self.host}:{self.port} went away ({e}) during an "
                                      f"operation on key {key!r}; is rank 0 still running?", op="store") from None

    def set(self, key: str, value: bytes) -> None:
        self._call(_SET, key, bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        timeout = self.timeout if timeout is None else timeout
        status, payload = self._call(_GET, key, struct.pack("<d", timeout))
        if status != _OK:
            raise RendezvousError(f"key {key!r} did not appear in the store at {self.host}:{self.port} within "
                                  f"{timeout:.1f} s; a rank did not start or started with other settings",
                                  op="store")
        return payload

    def add(self, key: str, amount: int) -> int:
        return int(self._call(_ADD, key, str(int(amount)).encode())[1])

    def check(self, key: str) -> bool:
        return self._call(_CHECK, key)[1] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call(_DEL, key)[1] == b"1"

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            if self._server is not None:
                self._server.close()
