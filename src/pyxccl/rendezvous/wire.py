"""The TCP store's wire format and limits, and the opening of a connection on both sides.

Little-endian, no pickle. The server speaks first::

    server -> client   greeting = reply (below) with
                         OK:      "PXS1" | mode (u8: 0 open, 1 proof) | max value (u64) | nonce_s (16 B)
                         REFUSED: why, in UTF-8 (too many connections); then the server closes
    open mode          client -> server   "PXS1open"
    proof mode         client -> server   nonce_c (16 B) | HMAC(secret, "D" | nonce_s | nonce_c | 0 | 255)
                       server -> client   OK with HMAC(secret, "A" | nonce_c | nonce_s | 0 | 255),
                                          or ERR with why; then the server closes
    then, one at a time:
      request:  op (u8) | key length (u32) | key (UTF-8) | value length (u64) | value
      reply:    status (u8) | length (u64) | payload

    SET, ADD (value: decimal), CHECK, DELETE: one key. GET: the value is the wait (f64 seconds).
    MULTI_GET: no key; the value is the wait (f64) | count (u32) | count x (key length (u32) | key);
      reply OK:      count x value length (u64) | the values, in the order asked
            MISSING: the positions (u32 each) of the keys still missing when the wait ran out

The MACs are ``pyxccl.transport.auth``'s on channel ``STORE_CHANNEL``, which
no connection between ranks uses, so neither kind of proof passes for the
other. The server is in proof mode when it has a secret (``PYXCCL_SECRET``),
and a client with a secret accepts only a server in proof mode that proves it
too. Every length is checked against the limits before a byte of what it
announces is read (a MULTI_GET's at most ``MAX_KEYS`` keys and ``max_value``
bytes of request, and at most ``max_value`` bytes of values in its reply).
The server reads what a client sends as it arrives, in its event loop
(``session.py`` parses it); the client side here reads blocking sockets.
"""
from __future__ import annotations

import hmac
import secrets
import socket
import struct
from dataclasses import dataclass

from .. import _env
from .._errors import RendezvousError
from ..transport import auth

SET, GET, ADD, CHECK, DELETE, MULTI_GET = range(1, 7)
OK, MISSING, ERR, REFUSED, FULL = range(5)
REQ = struct.Struct("<BI")
LEN = struct.Struct("<Q")
REP = struct.Struct("<BQ")
TIMEOUT = struct.Struct("<d")
_GREETING = struct.Struct("<4sBQ16s")
_MAGIC, _OPEN_HELLO = b"PXS1", b"PXS1open"
MAX_KEY = 4096                   # bytes of UTF-8; pyxccl's keys are tens of bytes
MAX_MESSAGE = 4096               # a greeting's or an error's text
MAX_ADD = 32                     # bytes of a counter increment, in decimal
MAX_KEYS = 1 << 16               # keys of one MULTI_GET: every rank's address in jobs of up to 65,536 ranks
COUNT = struct.Struct("<I")
_CHUNK = 1 << 16


class BadClient(ConnectionError):
    """A client broke the protocol or failed its proof (internal: the server logs it and drops the client,
    after sending it ``reply`` if there is one)."""

    def __init__(self, why: str, reply: bytes = b""):
        super().__init__(why)
        self.reply = reply


@dataclass(frozen=True)
class Limits:
    """What one store server accepts.

    ``max_connections``: clients at once, a refusal beyond it
    (``PYXCCL_STORE_MAX_CONNECTIONS``, 65,536: one event loop serves them all,
    each costs a descriptor and a few KiB); ``max_value``: bytes of one
    value (``PYXCCL_STORE_MAX_VALUE``, 16 MiB); ``max_bytes``: keys and values
    held at once, counting values (and MULTI_GET requests) being received or
    waiting (``PYXCCL_STORE_MAX_BYTES``, 256 MiB); ``opening_timeout``: seconds
    a new connection has, from being accepted, to open (say hello, or prove
    the secret); ``request_timeout``: seconds a request may stall between two
    bytes, and a reply stay unread between two pieces. A client may stay idle between requests as long
    as it likes (each rank keeps one connection for the whole job).
    """
    max_connections: int = 65536
    max_value: int = 16 << 20
    max_bytes: int = 256 << 20
    opening_timeout: float = 10.0
    request_timeout: float = 30.0

    @classmethod
    def from_env(cls, **overrides) -> "Limits":
        values = {}
        for field, var in (("max_connections", "PYXCCL_STORE_MAX_CONNECTIONS"),
                           ("max_value", "PYXCCL_STORE_MAX_VALUE"), ("max_bytes", "PYXCCL_STORE_MAX_BYTES")):
            v = _env.get(var)
            if v is not None:
                values[field] = v
        values.update(overrides)
        return cls(**values)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, read in pieces: memory grows with the bytes received, never with ``n``."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), _CHUNK))
        if not chunk:
            raise ConnectionResetError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def reply(status: int, payload: bytes = b"") -> bytes:
    return REP.pack(status, len(payload)) + payload


def check_key(op: int, klen: int) -> None:
    """BadClient unless a request's op and key length fit the protocol."""
    if op not in (SET, GET, ADD, CHECK, DELETE, MULTI_GET) or klen > MAX_KEY or (op == MULTI_GET and klen):
        raise BadClient(f"not the store protocol (op {op}, key length {klen})")


def check_value(op: int, vlen: int, max_value: int) -> None:
    """BadClient unless a request's value length fits its op and the limits."""
    want = {SET: max_value, GET: TIMEOUT.size, ADD: MAX_ADD, MULTI_GET: max_value}.get(op, 0)
    if vlen > want or (op == GET and vlen != want) or (op == MULTI_GET and vlen < TIMEOUT.size + COUNT.size):
        raise BadClient(f"a {vlen}-byte value for op {op}, over the store's limit of {want} bytes")


# --- MULTI_GET -----------------------------------------------------------------------------------------

def pack_keys(timeout: float, keys: list[bytes]) -> bytes:
    """A MULTI_GET's value: the wait and the (UTF-8) keys."""
    return b"".join([TIMEOUT.pack(timeout), COUNT.pack(len(keys))] + [COUNT.pack(len(k)) + k for k in keys])


def unpack_keys(value: bytes) -> tuple[float, list[str]]:
    """The wait and keys of a MULTI_GET's value; BadClient if it does not parse or is over the limits."""
    (timeout,), (n,) = TIMEOUT.unpack_from(value), COUNT.unpack_from(value, TIMEOUT.size)
    if n > MAX_KEYS:
        raise BadClient(f"a multi-get of {n} keys, over the store's limit of {MAX_KEYS}")
    keys, at = [], TIMEOUT.size + COUNT.size
    try:
        for _ in range(n):
            (klen,) = COUNT.unpack_from(value, at)
            if klen > MAX_KEY or at + COUNT.size + klen > len(value):
                raise BadClient(f"a multi-get's key of {klen} bytes that its request does not hold or is over "
                                f"the limit of {MAX_KEY}")
            keys.append(value[at + COUNT.size:at + COUNT.size + klen].decode())
            at += COUNT.size + klen
    except struct.error:
        raise BadClient(f"a multi-get announcing {n} keys in a {len(value)}-byte request") from None
    except UnicodeDecodeError:
        raise BadClient("a key that is not UTF-8") from None
    if at != len(value):
        raise BadClient(f"a multi-get with {len(value) - at} bytes after its {n} keys")
    return timeout, keys


def values_reply(values: list[bytes]) -> list[bytes]:
    """A MULTI_GET's OK reply as pieces to send in order (the values themselves are not copied)."""
    lengths = struct.pack(f"<{len(values)}Q", *map(len, values))
    return [REP.pack(OK, len(lengths) + sum(map(len, values))), lengths, *values]


def split_values(payload: bytes, n: int) -> list[bytes]:
    """The ``n`` values in a MULTI_GET's OK reply; ConnectionError if they do not add up."""
    if len(payload) < 8 * n:
        raise ConnectionResetError(f"a multi-get reply of {len(payload)} bytes for {n} keys: not a pyxccl store")
    lengths = struct.unpack_from(f"<{n}Q", payload)
    if 8 * n + sum(lengths) != len(payload):
        raise ConnectionResetError("a multi-get reply whose lengths do not add up: not a pyxccl store")
    out, at = [], 8 * n
    for k in lengths:
        out.append(payload[at:at + k])
        at += k
    return out


# --- opening: server side (as steps: the server's event loop runs them as bytes arrive) ---------------

def refusal(why: str) -> bytes:
    """What a client that is not served reads instead of a greeting."""
    return reply(REFUSED, why.encode()[:MAX_MESSAGE])


def greeting(secret: bytes | None, limits: Limits) -> tuple[bytes, bytes]:
    """A new connection's greeting, and the server's nonce in it (for ``opening_reply``)."""
    ns = secrets.token_bytes(auth.NONCE)
    return reply(OK, _GREETING.pack(_MAGIC, secret is not None, limits.max_value, ns)), ns


def opening_size(secret: bytes | None) -> int:
    """Bytes a client sends to open, after the greeting: its hello, or its nonce and proof."""
    return len(_OPEN_HELLO) if secret is None else auth.NONCE + auth.MAC_BYTES


def opening_reply(secret: bytes | None, ns: bytes, answer: bytes) -> bytes:
    """What the server sends when the client's ``opening_size`` bytes are ``answer`` (nothing in open
    mode, its own proof with a secret); BadClient if they are not a hello or not a proof of the secret."""
    if secret is None:
        if answer != _OPEN_HELLO:
            raise BadClient("not a store client's hello")
        return b""
    nc, theirs = answer[:auth.NONCE], answer[auth.NONCE:]
    if not hmac.compare_digest(theirs, auth.mac(secret, b"D", ns, nc, 0, auth.STORE_CHANNEL)):
        raise BadClient("proved a wrong secret (a different PYXCCL_SECRET, or not a process of this job)",
                        reply(ERR, b"wrong secret: this process's PYXCCL_SECRET is not the store's"))
    return reply(OK, auth.mac(secret, b"A", nc, ns, 0, auth.STORE_CHANNEL))


# --- opening: client side ----------------------------------------------------------------------------

def read_reply(sock: socket.socket, limit: int) -> tuple[int, bytes]:
    """One reply; ConnectionError if it announces more than ``limit`` bytes (not a pyxccl store)."""
    status, n = REP.unpack(recv_exactly(sock, REP.size))
    if n > limit:
        raise ConnectionResetError(f"a reply announcing {n} bytes (over {limit}): not a pyxccl store")
    return status, recv_exactly(sock, n)


def open_client(sock: socket.socket, secret: bytes | None, where: str) -> int:
    """Open a connection to the store (``where`` names it in errors); return its max value size.

    RendezvousError, saying what to do, when the store refuses this client or
    cannot prove the job's secret, or when one side has a secret and the other not.
    """
    try:
        status, greeting = read_reply(sock, MAX_MESSAGE)
        if status == REFUSED:
            raise RendezvousError(f"{where} refused this connection: {greeting.decode(errors='replace')}",
                                  op="store")
        if status != OK or len(greeting) != _GREETING.size or greeting[:4] != _MAGIC:
            raise RendezvousError(f"{where} did not greet as a pyxccl store does (another program on that port?); "
                                  f"check MASTER_ADDR/MASTER_PORT", op="store")
        _, proof, max_value, ns = _GREETING.unpack(greeting)
        if not proof:
            if secret is not None:
                raise RendezvousError(
                    f"{where} serves without a secret but this process has PYXCCL_SECRET; rank 0 was started "
                    f"without it: give every rank the same PYXCCL_SECRET", op="store")
            sock.sendall(_OPEN_HELLO)
            return max_value
        if secret is None:
            raise RendezvousError(f"{where} requires the job's secret and this process has no PYXCCL_SECRET; "
                                  f"start it with the same PYXCCL_SECRET as rank 0 (pyxccl run passes it to "
                                  f"its ranks)", op="store")
        nc = secrets.token_bytes(auth.NONCE)
        sock.sendall(nc + auth.mac(secret, b"D", ns, nc, 0, auth.STORE_CHANNEL))
        status, theirs = read_reply(sock, MAX_MESSAGE)
        if status != OK:
            raise RendezvousError(f"{where} refused this process's proof: {theirs.decode(errors='replace')}; "
                                  f"every rank needs the same PYXCCL_SECRET as rank 0", op="store")
        if not hmac.compare_digest(theirs, auth.mac(secret, b"A", nc, ns, 0, auth.STORE_CHANNEL)):
            raise RendezvousError(f"{where} does not know this job's secret (another job's store on that port, or "
                                  f"PYXCCL_SECRET differs); check MASTER_ADDR/MASTER_PORT and PYXCCL_SECRET",
                                  op="store")
        return max_value
    except (OSError, struct.error) as e:
        if isinstance(e, RendezvousError):
            raise
        raise RendezvousError(f"{where} closed or stopped answering while this process connected ({e}); is rank "
                              f"0 still running, and is that port its store?", op="store") from None
