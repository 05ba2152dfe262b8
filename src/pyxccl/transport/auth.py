"""Proving membership of a job when a connection is made: HMAC-SHA256 challenge-response.

Every connection between ranks (and, when ``PYXCCL_SECRET`` is set, every
connection to rank 0's TCP store) starts with a handshake in which each side
proves it knows the job's secret without sending it::

    dialer   -> acceptor   HELLO: magic "pyxccl02", dialer's rank (u32), channel (u8), nonce_d (16 B)
    acceptor -> dialer     nonce_a (16 B), HMAC(secret, "A" | nonce_d | nonce_a | rank | channel)
    dialer   -> acceptor   HMAC(secret, "D" | nonce_a | nonce_d | rank | channel)

(``channel``: which of a peer pair's connections this is, see PYXCCL_NSOCKS.)

Each side checks the other's MAC (constant-time compare) before the
connection carries anything else; fresh nonces on both sides make a recorded
handshake useless. Everything read is fixed-size, so a stranger's bytes can
neither allocate memory nor hold the acceptor for longer than its timeout. A
refused connection is logged (logger "pyxccl", warning) with the address and
the reason, and closed.

The secret is ``PYXCCL_SECRET`` when set (every rank must have the same one),
else 32 random bytes that rank 0 hands out through the rendezvous store: that
keeps ranks of other jobs out, and strangers who cannot reach the store; set
``PYXCCL_SECRET`` when the store's network is not trusted either.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct

log = logging.getLogger("pyxccl")

_HELLO = struct.Struct("<8sIB16s")
_MAGIC = b"pyxccl02"
_NONCE, _MAC = 16, 32


class AuthError(ConnectionError):
    """The other end did not prove it belongs to this job (internal: callers log it and drop the connection)."""


def env_secret() -> bytes | None:
    """``PYXCCL_SECRET`` as a key, or None."""
    s = os.environ.get("PYXCCL_SECRET")
    return hashlib.sha256(s.encode()).digest() if s else None


def job_secret(store, rank: int, timeout: float) -> bytes:
    """The job's secret: ``PYXCCL_SECRET``, else rank 0's random one from the store."""
    s = env_secret()
    if s is not None:
        return s
    if rank == 0:
        s = secrets.token_bytes(32)
        store.set("pyxccl/secret", s)
        return s
    return store.get("pyxccl/secret", timeout=timeout)


def _mac(secret: bytes, side: bytes, first: bytes, second: bytes, rank: int, channel: int) -> bytes:
    return hmac.new(secret, side + first + second + struct.pack("<IB", rank, channel), hashlib.sha256).digest()


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthError(f"closed after {len(buf)} of {n} handshake bytes")
        buf += chunk
    return bytes(buf)


def dial(sock: socket.socket, secret: bytes, rank: int, channel: int = 0) -> None:
    """Prove ``rank``'s membership to the acceptor at the other end of ``sock``, and check its proof."""
    nd = secrets.token_bytes(_NONCE)
    sock.sendall(_HELLO.pack(_MAGIC, rank, channel, nd))
    reply = _read(sock, _NONCE + _MAC)
    na, mac = reply[:_NONCE], reply[_NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"A", nd, na, rank, channel)):
        raise AuthError("the other end does not know this job's secret (another job on this port, "
                        "or PYXCCL_SECRET differs)")
    sock.sendall(_mac(secret, b"D", na, nd, rank, channel))


def accept(sock: socket.socket, secret: bytes) -> tuple[int, int]:
    """Check the dialer's proof; return the rank and channel it claims. AuthError if it is not one of ours."""
    magic, rank, channel, nd = _HELLO.unpack(_read(sock, _HELLO.size))
    if magic != _MAGIC:
        raise AuthError(f"not a pyxccl handshake (first bytes {magic[:8]!r})")
    na = secrets.token_bytes(_NONCE)
    sock.sendall(na + _mac(secret, b"A", nd, na, rank, channel))
    why = f"claimed rank {rank} but {{}} (a different PYXCCL_SECRET, or not a rank of this job)"
    try:
        theirs = _read(sock, _MAC)
    except AuthError:
        raise AuthError(why.format("hung up instead of proving it knows the job's secret")) from None
    if not hmac.compare_digest(theirs, _mac(secret, b"D", na, nd, rank, channel)):
        raise AuthError(why.format("proved a wrong secret"))
    return rank, channel


def refused(what: str, sock: socket.socket, err: BaseException) -> None:
    """Log a refused connection: who, where, why."""
    try:
        addr = sock.getpeername() or "a local process"
    except OSError:
        addr = "an unknown address"
    log.warning("pyxccl %s: refused a connection from %s: %s", what, addr, err)
