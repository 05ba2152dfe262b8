"""Proving membership of a job when a connection is made: HMAC-SHA256 challenge-response.

Every connection between ranks starts with a handshake in which each side
proves it knows the job's secret without sending it (the store's own, with
the same MACs on channel ``STORE_CHANNEL``, is in ``pyxccl.rendezvous.wire``)::

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

The secret is ``PYXCCL_SECRET`` (every rank must have the same one; ``pyxccl
run`` makes one per one-node job and hands it to its ranks in their
environment). Without it nothing can be proven: rank 0 then puts a random
*job key* in the rendezvous store, which keeps other jobs' ranks apart but is
no secret (whoever can read the store reads it), and warns once
(:class:`NoSecretWarning`). See "Trust" in docs/design.md.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import warnings

log = logging.getLogger("pyxccl")

_HELLO = struct.Struct("<8sIB16s")
_MAGIC = b"pyxccl02"
NONCE, MAC_BYTES = 16, 32
STORE_CHANNEL = 255      # proofs made for the store: a channel no rank-to-rank connection uses


class AuthError(ConnectionError):
    """The other end did not prove it belongs to this job (internal: callers log it and drop the connection)."""


class NoSecretWarning(UserWarning):
    """The job runs without ``PYXCCL_SECRET``: its store and its ranks cannot authenticate anyone."""


_warned = False


def warn_no_secret(where: str) -> None:
    """Say once per process what a job without a secret trusts (``where``: the store or rank that runs so)."""
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"pyxccl: {where} runs without PYXCCL_SECRET, so nothing is authenticated: any process that can "
        f"reach the rendezvous store (its TCP port, or its directory) can read the ranks' addresses and the "
        f"job key, set and delete keys, and connect to the ranks as one of them. Set PYXCCL_SECRET to the same "
        f"value on every rank (pyxccl run does this for one-node jobs; with --nnodes export it on every node)",
        NoSecretWarning, stacklevel=3)


def env_secret() -> bytes | None:
    """``PYXCCL_SECRET`` as a key, or None."""
    s = os.environ.get("PYXCCL_SECRET")
    return hashlib.sha256(s.encode()).digest() if s else None


def job_secret(store, rank: int, timeout: float) -> bytes:
    """The key the ranks' handshakes prove: ``PYXCCL_SECRET``, else rank 0's random job key from the store.

    The job key is no secret (anyone who can read the store reads it); rank 0 warns once that the job
    is not authenticated.
    """
    s = env_secret()
    if s is not None:
        return s
    if rank == 0:
        warn_no_secret("rank 0")
        s = secrets.token_bytes(32)
        store.set("pyxccl/job-key", s)
        return s
    return store.get("pyxccl/job-key", timeout=timeout)


def mac(secret: bytes, side: bytes, first: bytes, second: bytes, rank: int, channel: int) -> bytes:
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
    nd = secrets.token_bytes(NONCE)
    sock.sendall(_HELLO.pack(_MAGIC, rank, channel, nd))
    reply = _read(sock, NONCE + MAC_BYTES)
    na, theirs = reply[:NONCE], reply[NONCE:]
    if not hmac.compare_digest(theirs, mac(secret, b"A", nd, na, rank, channel)):
        raise AuthError("the other end does not know this job's secret (another job on this port, "
                        "or PYXCCL_SECRET differs)")
    sock.sendall(mac(secret, b"D", na, nd, rank, channel))


def accept(sock: socket.socket, secret: bytes) -> tuple[int, int]:
    """Check the dialer's proof; return the rank and channel it claims. AuthError if it is not one of ours."""
    magic, rank, channel, nd = _HELLO.unpack(_read(sock, _HELLO.size))
    if magic != _MAGIC:
        raise AuthError(f"not a pyxccl handshake (first bytes {magic[:8]!r})")
    if channel == STORE_CHANNEL:
        raise AuthError("a store's handshake sent to a rank")   # never an oracle for the store's proofs
    na = secrets.token_bytes(NONCE)
    sock.sendall(na + mac(secret, b"A", nd, na, rank, channel))
    why = f"claimed rank {rank} but {{}} (a different PYXCCL_SECRET, or not a rank of this job)"
    try:
        theirs = _read(sock, MAC_BYTES)
    except AuthError:
        raise AuthError(why.format("hung up instead of proving it knows the job's secret")) from None
    if not hmac.compare_digest(theirs, mac(secret, b"D", na, nd, rank, channel)):
        raise AuthError(why.format("proved a wrong secret"))
    return rank, channel


def refused(what: str, sock: socket.socket, err: BaseException) -> None:
    """Log a refused connection: who, where, why."""
    try:
        addr = sock.getpeername() or "a local process"
    except OSError:
        addr = "an unknown address"
    log.warning("pyxccl %s: refused a connection from %s: %s", what, addr, err)
