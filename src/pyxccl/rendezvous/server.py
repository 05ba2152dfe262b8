"""The TCP store's server: rank 0 holds the data and serves it to the clients.

One daemon thread per client, at most ``Limits.max_connections`` of them
(beyond that a connection is told why and closed). A new connection must open
(``wire.open_server``: a hello, or the proof of the job's secret) within
``opening_timeout`` and a started request must keep coming (``request_timeout``
between two bytes), else it is dropped and logged; a proven client may wait
between requests as long as it likes. The data, counting values still being
received, never holds more than ``max_bytes``. A client that breaks the
protocol is logged (logger "pyxccl", warning) and dropped alone.
"""
from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time

from .._errors import RendezvousError
from ..transport import auth
from . import wire
from .wire import ADD, CHECK, ERR, FULL, GET, MISSING, OK, SET, BadClient, Limits

log = logging.getLogger("pyxccl")
# accept() failures that pass (a client gone before we took it, out of file descriptors for a moment)
_TRANSIENT = {errno.ECONNABORTED, errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EPROTO}


_GONE_CHECK = 1.0     # seconds between checks that a client waiting in a get is still there


def _still_waiting(conn: socket.socket) -> None:
    """Raise if a client waiting for its get's reply left (ConnectionResetError) or sent more (BadClient)."""
    try:
        if not select.select([conn], [], [], 0)[0]:
            return
        more = conn.recv(1, socket.MSG_PEEK)
    except OSError:
        more = b""
    if not more:
        raise ConnectionResetError("client left during get")
    raise BadClient("sent more while its get waited")


class StoreServer:
    """The store's data and its listening socket on ``host:port`` (``port=0``: a free one, see ``.port``).

    ``secret``: the key every client must prove (``TCPStore`` passes ``PYXCCL_SECRET``'s);
    None: the store serves anyone who reaches the port, and says so once (NoSecretWarning).
    """

    def __init__(self, host: str, port: int, limits: Limits | None = None, secret: bytes | None = None):
        self.limits = limits or Limits.from_env()
        self.secret = secret
        self.data: dict[str, bytes] = {}
        self.used = 0                    # bytes of keys and values held, and of values being received
        self.cv = threading.Condition()
        try:
            self.sock = socket.create_server((host, port), backlog=256)
        except OSError as e:
            raise RendezvousError(f"rank 0: could not serve the store on {host}:{port} ({e}); choose another "
                                  f"MASTER_PORT (or port) or stop the process that holds it", rank=0,
                                  op="init") from None
        self.port = self.sock.getsockname()[1]
        self.where = f"the store at {host}:{self.port}"
        if self.secret is None:
            auth.warn_no_secret(self.where)
        self.closed = False
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="pyxccl-store-accept").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError as e:
                if self.closed or e.errno not in _TRANSIENT:
                    return               # listening socket closed
                log.warning("pyxccl %s: cannot accept a connection (%s); retrying", self.where, e)
                time.sleep(0.1)
                continue
            with self._lock:
                full = len(self._clients) >= self.limits.max_connections
                if not (full or self.closed):
                    self._clients.add(conn)
            if full or self.closed:
                self._refuse(conn, full)
                continue
            threading.Thread(target=self.serve, args=(conn,), daemon=True, name=f"pyxccl-store-{self.port}").start()

    def _refuse(self, conn: socket.socket, full: bool) -> None:
        why = (f"it serves its limit of {self.limits.max_connections} connections (PYXCCL_STORE_MAX_CONNECTIONS "
               f"on rank 0); a process may be leaking store clients, else raise the limit" if full
               else "it is closing")
        try:
            conn.settimeout(1.0)
            wire.refuse(conn, why)
        except OSError:
            pass
        if full:
            auth.refused(self.where, conn, BadClient(why))
        conn.close()

    def serve(self, conn: socket.socket) -> None:
        """Serve one client until it leaves, breaks the protocol or stalls (then drop it)."""
        lim = self.limits
        stage = "opening"
        try:
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(lim.opening_timeout)
            wire.open_server(conn, self.secret, lim)
            while not self.closed:
                stage = "idle"
                conn.settimeout(None)    # between requests: a rank's connection idles for the whole job
                first = conn.recv(1)
                if not first:
                    break
                stage = "request"
                conn.settimeout(lim.request_timeout)
                op, klen = wire.REQ.unpack(first + wire.recv_exactly(conn, wire.REQ.size - 1))
                wire.check_key(op, klen)
                key = wire.recv_exactly(conn, klen).decode()
                (vlen,) = wire.LEN.unpack(wire.recv_exactly(conn, wire.LEN.size))
                wire.check_value(op, vlen, lim.max_value)
                status, payload = self._request(conn, op, key, klen, vlen)
                conn.sendall(wire.reply(status, payload))
        except (BadClient, UnicodeDecodeError) as e:
            auth.refused(self.where, conn, e if isinstance(e, BadClient) else BadClient("a key that is not UTF-8"))
        except TimeoutError:
            seconds = lim.opening_timeout if stage == "opening" else lim.request_timeout
            auth.refused(self.where, conn, BadClient(f"silent for {seconds:g} s during its {stage}"))
        except OSError:
            pass                         # the client vanished
        finally:
            with self._lock:
                self._clients.discard(conn)
            conn.close()

    def _request(self, conn: socket.socket, op: int, key: str, klen: int, vlen: int) -> tuple[int, bytes]:
        if op == SET:
            return self._set(conn, key, klen, vlen)
        value = wire.recv_exactly(conn, vlen)
        with self.cv:
            if op == GET:
                return self._get(conn, key, wire.TIMEOUT.unpack(value)[0])
            if op == ADD:
                return self._add(key, klen, value)
            if op == CHECK:
                return OK, b"1" if key in self.data else b"0"
            old = self.data.pop(key, None)
            if old is not None:
                self.used -= klen + len(old)
            return OK, b"1" if old is not None else b"0"

    def _full(self, nbytes: int) -> tuple[int, bytes]:
        return FULL, (f"it holds {self.used} bytes, its limit is {self.limits.max_bytes} (PYXCCL_STORE_MAX_BYTES "
                      f"on rank 0): no room for {nbytes} more; delete keys no longer needed, or raise the "
                      f"limit").encode()

    def _set(self, conn: socket.socket, key: str, klen: int, vlen: int) -> tuple[int, bytes]:
        # Room is taken before the value is read, so clients sending at once cannot overshoot the
        # limit; a value it replaces stays until the new one has arrived, and counts until then.
        need = klen + vlen
        with self.cv:
            fits = self.used + need <= self.limits.max_bytes
            if fits:
                self.used += need
            else:
                refusal = self._full(need)
        if not fits:
            wire.discard(conn, vlen)     # keep the connection usable: the client gets the refusal
            return refusal
        try:
            value = wire.recv_exactly(conn, vlen)
        except BaseException:
            with self.cv:
                self.used -= need
            raise
        with self.cv:
            old = self.data.get(key)
            if old is not None:
                self.used -= klen + len(old)
            self.data[key] = value
            self.cv.notify_all()
        return OK, b""

    def _get(self, conn: socket.socket, key: str, timeout: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + (min(timeout, 1e7) if timeout > 0 else 0.0)   # NaN -> 0
        while key not in self.data and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return MISSING, b""
            # Wake now and then to notice a client that gave up, so its thread does not linger.
            self.cv.wait(min(left, _GONE_CHECK))
            if key not in self.data:
                _still_waiting(conn)
        return (OK, self.data[key]) if key in self.data else (MISSING, b"")

    def _add(self, key: str, klen: int, amount: bytes) -> tuple[int, bytes]:
        old = self.data.get(key)
        try:
            new = str(int(old if old is not None else b"0") + int(amount)).encode()
        except ValueError:
            return ERR, f"key {key[:64]!r} holds {(old or b'')[:32]!r}, not a counter; add {amount[:32]!r}".encode()
        grow = len(new) - (len(old) if old is not None else -klen)
        if self.used + grow > self.limits.max_bytes:
            return self._full(grow)
        self.used += grow
        self.data[key] = new
        self.cv.notify_all()
        return OK, new

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

