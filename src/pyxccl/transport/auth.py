"""Proving membership of a job when a connection is made: HMAC-SHA256 challenge-response.

Every connection between ranks starts with a handshake in which each side
proves it knows the job's secret without sending it (the store's own, with
the same MACs on channel ``STORE_CHANNEL``, is in ``pyxccl.rendezvous.wire``)::

    dialer   -> acceptor   HELLO: magic "pyxccl03", dialer's rank (u32), channel (u8), nonce_d (16 B)
    acceptor -> dialer     nonce_a (16 B), HMAC(secret, "A" | nonce_d | nonce_a | rank | channel)
    dialer   -> acceptor   HMAC(secret, "D" | nonce_a | nonce_d | rank | channel)   [shm: + its ring]
    acceptor -> dialer     status (1 B): ACCEPT [shm: + its ring], or DEFER

(``channel``: which of a peer pair's connections this is, see PYXCCL_NSOCKS. Over shared memory
each side's ring, a memfd, rides with its last message as SCM_RIGHTS.) Connections are made on
first use, so two ranks may dial each other at once: the acceptor answers DEFER when it dials the
dialer itself and its own connection wins (the one dialed by the lower rank), or when the pair is
connected already; the dialer then waits for that connection instead. Exactly one connection per
pair survives (``pyxccl.transport.mesh``).

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

import array
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
_MAGIC = b"pyxccl03"
ACCEPT, DEFER = 1, 2        # the acceptor's last word: this connection is the pair's, or wait for mine
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


def dial(sock: socket.socket, secret: bytes, rank: int, channel: int = 0,
         ring: int | None = None) -> tuple[int, int | None]:
    """Prove ``rank``'s membership to the acceptor at the other end of ``sock``, and check its proof.
    ``ring``: this side's shared-memory ring, handed over with the proof. Returns the acceptor's
    status (ACCEPT or DEFER) and, with ACCEPT over shared memory, its ring."""
    nd = secrets.token_bytes(NONCE)
    sock.sendall(_HELLO.pack(_MAGIC, rank, channel, nd))
    reply = _read(sock, NONCE + MAC_BYTES)
    na, theirs = reply[:NONCE], reply[NONCE:]
    if not hmac.compare_digest(theirs, mac(secret, b"A", nd, na, rank, channel)):
        raise AuthError("the other end does not know this job's secret (another job on this port, "
                        "or PYXCCL_SECRET differs)")
    proof = mac(secret, b"D", na, nd, rank, channel)
    if ring is None:
        sock.sendall(proof)
        status, fds = sock.recv(1), []
    else:
        socket.send_fds(sock, [proof], [ring])
        status, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if len(status) != 1 or status[0] not in (ACCEPT, DEFER) or len(fds) > (status[:1] == bytes([ACCEPT])):
        for fd in fds:
            os.close(fd)
        raise AuthError("the other end hung up instead of accepting the connection (it took another "
                        "connection from this rank, or is not a rank of this job)" if not status else
                        f"the other end answered {status!r} instead of accepting or deferring")
    return status[0], fds[0] if fds else None


def accept(sock: socket.socket, secret: bytes) -> tuple[int, int]:
    """Check the dialer's proof and accept it, blocking; return the rank and channel it claims.
    AuthError if it is not one of ours. (The mesh runs :class:`Acceptor` step by step instead.)"""
    a = Acceptor(sock, secret)
    while not a.step():
        pass
    a.finish(ACCEPT)
    return a.rank, a.channel


class Acceptor:
    """The acceptor's side of one handshake, a step per call: the mesh's progress loop calls
    :meth:`step` when the socket is readable (non-blocking sockets: a step never waits), then,
    once the dialer has proven itself, decides and calls :meth:`finish`."""

    def __init__(self, sock: socket.socket, secret: bytes, rings: bool = False):
        self.sock, self.secret, self.rings = sock, secret, rings
        self.rank = self.channel = None
        self.ring: int | None = None        # the dialer's ring (shared memory), once proven
        self._buf = bytearray()
        self._want = _HELLO.size
        self._proving = False
        self._nd = self._na = b""

    def step(self) -> bool:
        """Read what has come; True once the dialer has proven it knows the secret. AuthError if not."""
        n = self._want - len(self._buf)
        try:
            if self._proving and self.rings:
                data, anc, _, _ = self.sock.recvmsg(n, socket.CMSG_SPACE(4))
                for level, kind, fds in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        got = array.array("i")
                        got.frombytes(fds[:len(fds) - len(fds) % got.itemsize])
                        for fd in got:
                            if self.ring is None:
                                self.ring = fd
                            else:
                                os.close(fd)
            else:
                data = self.sock.recv(n)
        except (BlockingIOError, InterruptedError):
            return False
        if not data:
            if self._proving:
                raise AuthError(self._why("hung up instead of proving it knows the job's secret"))
            raise AuthError(f"closed after {len(self._buf)} of {self._want} handshake bytes")
        self._buf += data
        if len(self._buf) < self._want:
            return False
        if not self._proving:
            magic, rank, channel, nd = _HELLO.unpack(self._buf)
            if magic != _MAGIC:
                raise AuthError(f"not a pyxccl handshake (first bytes {magic[:8]!r})")
            if channel == STORE_CHANNEL:
                raise AuthError("a store's handshake sent to a rank")   # never an oracle for the store's proofs
            self.rank, self.channel, self._nd = rank, channel, nd
            self._na = secrets.token_bytes(NONCE)
            self._send(self._na + mac(self.secret, b"A", nd, self._na, rank, channel))
            self._buf, self._want, self._proving = bytearray(), MAC_BYTES, True
            return False
        if not hmac.compare_digest(bytes(self._buf), mac(self.secret, b"D", self._na, self._nd, self.rank,
                                                         self.channel)):
            raise AuthError(self._why("proved a wrong secret"))
        return True

    def finish(self, status: int, ring: int | None = None) -> None:
        """Answer the proven dialer: ACCEPT (with this side's ``ring`` over shared memory) or DEFER."""
        if ring is None:
            self._send(bytes([status]))
        elif self.sock.sendmsg([bytes([status])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                     array.array("i", [ring]))]) != 1:
            raise AuthError("could not answer the handshake")

    def drop(self) -> None:
        """Close what it holds (the dialer's ring) and the socket."""
        if self.ring is not None:
            os.close(self.ring)
            self.ring = None
        self.sock.close()

    def _send(self, data: bytes) -> None:
        # A few dozen bytes into an empty socket buffer: all or nothing, or the dialer is no rank.
        try:
            if self.sock.send(data) != len(data):
                raise AuthError("does not read its handshake")
        except (BlockingIOError, InterruptedError):
            raise AuthError("does not read its handshake") from None

    def _why(self, what: str) -> str:
        return f"claimed rank {self.rank} but {what} (a different PYXCCL_SECRET, or not a rank of this job)"


def refused(what: str, sock: socket.socket, err: BaseException) -> None:
    """Log a refused connection: who, where, why."""
    try:
        addr = sock.getpeername() or "a local process"
    except OSError:
        addr = "an unknown address"
    log.warning("pyxccl %s: refused a connection from %s: %s", what, addr, err)
