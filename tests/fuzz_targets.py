"""Fuzz targets for every parser of bytes from outside, run by atheris (tests/test_fuzz.py runs them).

    python tests/fuzz_targets.py frames|handshake|store [CORPUS_DIR] [libFuzzer flags: -max_total_time=5 ...]

- ``frames``: a connected peer's frames, read by a transport's receive loop
  (``StreamPeer._recv_loop``, ``parse``, ``TcpPeer._on_frame`` or
  ``ShmPeer._on_frame``, the mailbox behind them);
- ``handshake``: the HMAC handshake between ranks (``auth.accept``: the acceptor's state machine
  that the mesh's progress loop runs, here driven blocking; ``auth.dial`` as a dialing rank reads
  the reply);
- ``store``: the TCP store, both ends: the server serving a connection
  (``StoreServer.serve``: its event loop serving one connection, with and without a secret) and a client opening one and
  reading a reply (``wire.open_client``, ``wire.read_reply``).

Each input runs through the real code over a socketpair, synchronously, and is a
failure (atheris stops and saves the input) when the code raises anything but its
documented error, when it allocates more than the bytes it received allow (the
tracemalloc peak, against ``_budget``: a size a header claims must never be
allocated), or when server bookkeeping is off afterwards. A hang is libFuzzer's
``-timeout``.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import threading
import tracemalloc
from contextlib import contextmanager

import atheris

with atheris.instrument_imports(include=["pyxccl"]):
    import numpy as np

    from pyxccl._errors import PeerLostError, ProtocolError
    from pyxccl.rendezvous import wire
    from pyxccl.rendezvous.server import StoreServer
    from pyxccl.transport import auth
    from pyxccl.transport.base import CREDIT, DATA, GOODBYE, HEADER, MAGIC, SHM_DATA, STRIPE
    from pyxccl.transport.mailbox import COLL, Mailbox, RecvRequest
    from pyxccl.transport.shm import SLOT_BYTES, SLOTS, ShmPeer
    from pyxccl.transport.tcp import TcpPeer

SECRET = auth.mac(b"fuzz", b"", b"", b"", 0, 0)
# Constant memory a receive may take whatever it was sent: a piece of up to 1 MiB that the TCP
# transport reads an unexpected message's bytes into (transport/mailbox.py), socket reads of up to
# 64 KiB, exceptions and log records. What must never happen is memory in proportion to a claim.
_SLACK = (1 << 20) + (256 << 10)


@contextmanager
def _budget(received: int):
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    yield
    peak = tracemalloc.get_traced_memory()[1] - base
    if peak > 2 * received + _SLACK:
        raise AssertionError(f"{peak} bytes allocated for {received} bytes received")


def _pair(data: bytes) -> tuple[socket.socket, socket.socket]:
    """(ours, theirs): ``data`` waits on ours, theirs sends no more."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    theirs.sendall(data)
    theirs.shutdown(socket.SHUT_WR)
    return ours, theirs


# --- frames ------------------------------------------------------------------------------------------

def _add(dst: np.ndarray, src: np.ndarray) -> None:
    np.add(dst, src, out=dst)


def _shm_peer(box: Mailbox, on_lost, ours: socket.socket, theirs: socket.socket) -> ShmPeer:
    """A shared-memory peer whose other end is this harness: its ring is handed over first."""
    fd = os.memfd_create("pyxccl-fuzz")
    try:
        os.ftruncate(fd, SLOT_BYTES * SLOTS)
        socket.send_fds(theirs, [(SLOT_BYTES * SLOTS).to_bytes(8, "little")], [fd])
    finally:
        os.close(fd)
    return ShmPeer(0, 1, box, on_lost, ours)


def frames(data: bytes) -> None:
    """First byte: 0 the TCP transport, 1 shared memory (frames name slots of a ring); then the frames."""
    shm, data = bool(data[:1]) and data[0] & 1, data[1:]
    ours, theirs = socket.socketpair()
    box = Mailbox(0)
    box.on_comm_error = lambda comm_id, err, remote: None
    box.post(RecvRequest(1, (0, 0, 0), np.zeros(16, np.float32)))           # a posted receive of 64 bytes
    box.post(RecvRequest(1, (0, 0, 1), np.zeros(16, np.float32), _add))   # one that reduces
    lost = []

    def on_lost(p, err, graceful=False):
        lost.append(err)
    peer = _shm_peer(box, on_lost, ours, theirs) if shm else TcpPeer(0, 1, box, on_lost, ours)
    drain = threading.Thread(target=_drain, args=(theirs,), daemon=True)      # credits sent back
    drain.start()
    theirs.sendall(data)
    theirs.shutdown(socket.SHUT_WR)
    # Over shared memory a frame's bytes are in the ring, up to a slot each: received, not claimed.
    in_ring = (len(data) // HEADER.size) * SLOT_BYTES if shm else 0
    try:
        with _budget(len(data) + in_ring):
            peer._recv_loop()                  # the receiver thread's loop, here on this thread
    finally:
        peer.close()
        drain.join()
        theirs.close()
    (err,) = lost
    if shm and not (set(peer._free) <= set(range(SLOTS)) and len(set(peer._free)) == len(peer._free)):
        raise AssertionError(f"credits for slots that are not ours, or twice: {list(peer._free)}")
    if isinstance(err, ProtocolError):
        return
    if not isinstance(err, PeerLostError) or not (err.__cause__ is None or isinstance(err.__cause__, OSError)):
        raise AssertionError(f"not a documented error: {err!r} (cause {err.__cause__!r})") from err.__cause__


def _frame(kind, key=(0, 0, 0), dcode=0, total=0, off=0, n=0, aux=0, call=(0, 0), payload=b"") -> bytes:
    return HEADER.pack(MAGIC, kind, dcode, *key, total, off, n, aux, *call) + payload


def _frame_seeds() -> list[bytes]:
    tcp = [_frame(DATA, total=64, n=64, payload=bytes(64)),
           _frame(DATA, (0, 0, 1), total=64, n=32, payload=bytes(32)) + _frame(DATA, (0, 0, 1), total=64, off=32,
                                                                          n=32, payload=bytes(32)),
           _frame(DATA, (0, 5, 1), total=8, n=4, payload=b"abcd") + _frame(DATA, (0, 5, 1), total=8, off=4, n=4,
                                                                          payload=b"efgh"),
           _frame(DATA, (3, COLL, 1), total=16, n=16, call=(7, 9), payload=bytes(16)),
           _frame(DATA, (0, -2, 0), dcode=1, total=5, n=5, payload=b"abort"),
           _frame(STRIPE, total=8, n=8, aux=1, payload=bytes(8)),
           _frame(DATA, total=1 << 40, n=1 << 40) + bytes(100),
           _frame(GOODBYE)]
    shm = [_frame(SHM_DATA, total=64, n=64, aux=1) + _frame(CREDIT, aux=0),
           _frame(SHM_DATA, (0, 5, 1), total=1 << 21, n=1 << 20) + _frame(SHM_DATA, (0, 5, 1), total=1 << 21,
                                                                          off=1 << 20, n=1 << 20, aux=3),
           _frame(CREDIT, aux=7) + _frame(GOODBYE)]
    return [b"\0" + f for f in tcp] + [b"\1" + f for f in shm]


# --- handshake ---------------------------------------------------------------------------------------

def handshake(data: bytes) -> None:
    dialing, data = bool(data[:1]) and data[0] & 1, data[1:]
    ours, theirs = _pair(data)
    try:
        with _budget(len(data)):
            if dialing:
                auth.dial(ours, SECRET, 1)
            else:
                auth.accept(ours, SECRET)
    except auth.AuthError:
        return                                 # the documented refusal
    finally:
        ours.close()
        theirs.close()
    raise AssertionError("random bytes passed the handshake")


def _handshake_seeds() -> list[bytes]:
    hello = struct.pack("<8sIB16s", b"pyxccl03", 1, 0, bytes(16))
    return [b"\0" + hello + bytes(32), b"\0" + hello[:10], b"\1" + bytes(48), b"\1"]


# --- store -------------------------------------------------------------------------------------------

class _Servers:
    """One server without a secret and one with, made once; their data is emptied between inputs."""

    def __init__(self):
        auth._warned = True                    # that the open one trusts anyone is the point here
        limits = wire.Limits(max_connections=4, max_value=1024, max_bytes=4096, opening_timeout=2,
                             request_timeout=2)
        self.open = StoreServer("127.0.0.1", 0, limits, secret=None)
        self.proof = StoreServer("127.0.0.1", 0, limits, secret=SECRET)


_servers: _Servers | None = None


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


def store(data: bytes) -> None:
    global _servers
    mode, data = (data[0] & 3 if data else 0), data[1:]
    if mode >= 2:                              # the client's side: `data` is what a server says
        ours, theirs = _pair(data)
        try:
            with _budget(len(data)):
                wire.open_client(ours, SECRET if mode == 3 else None, "the store at fuzz")
                wire.read_reply(ours, 1024)
        except ConnectionError:
            pass                               # RendezvousError (documented), or a reply cut short
        finally:
            ours.close()
            theirs.close()
        return
    _servers = _servers or _Servers()
    server = _servers.proof if mode else _servers.open
    server.data.clear()
    server.used = 0
    ours, theirs = socket.socketpair()
    drain = threading.Thread(target=_drain, args=(theirs,), daemon=True)   # replies must not fill the socket
    drain.start()
    theirs.sendall(data)
    theirs.shutdown(socket.SHUT_WR)
    try:
        with _budget(len(data)):
            server.serve(ours)                 # returns when the client leaves, misbehaves or stalls
    finally:
        drain.join()
        theirs.close()
    held = sum(len(k.encode()) + len(v) for k, v in server.data.items())
    if server.used != held:
        raise AssertionError(f"the server counts {server.used} bytes held but holds {held}")


def _request(op: int, key: bytes, value: bytes) -> bytes:
    return wire.REQ.pack(op, len(key)) + key + wire.LEN.pack(len(value)) + value


def _store_seeds() -> list[bytes]:
    session = (b"PXS1open" + _request(wire.SET, b"k", b"v" * 10) + _request(wire.GET, b"k", wire.TIMEOUT.pack(0.01))
               + _request(wire.ADD, b"n", b"5") + _request(wire.ADD, b"k", b"1") + _request(wire.CHECK, b"k", b"")
               + _request(wire.DELETE, b"k", b"") + _request(wire.SET, b"big", b"x" * 1000)
               + _request(wire.SET, b"more", b"y" * 1000) + _request(wire.GET, b"none", wire.TIMEOUT.pack(0.0))
               + _request(wire.MULTI_GET, b"", wire.pack_keys(0.01, [b"n", b"more", b"n"]))
               + _request(wire.MULTI_GET, b"", wire.pack_keys(0.0, [b"n", b"none"])))
    greeting = wire.reply(wire.OK, struct.pack("<4sBQ16s", b"PXS1", 0, 1024, bytes(16)))
    return [b"\0" + session, b"\1" + bytes(48), b"\2" + greeting + wire.reply(wire.OK, b"1"),
            b"\2" + wire.reply(wire.REFUSED, b"full"), b"\3" + greeting.replace(b"PXS1\0", b"PXS1\1")]


TARGETS = {"frames": (frames, _frame_seeds), "handshake": (handshake, _handshake_seeds),
           "store": (store, _store_seeds)}


def write_seeds(target: str, corpus: str) -> None:
    """Valid (and nearly valid) inputs to start from, one file each in ``corpus``."""
    os.makedirs(corpus, exist_ok=True)
    for i, seed in enumerate(TARGETS[target][1]()):
        with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
            f.write(seed)


def main(argv: list[str]) -> None:
    fn, _ = TARGETS[argv[1]]
    logging.getLogger("pyxccl").disabled = True   # a refusal per input is expected, not news
    tracemalloc.start()
    atheris.Setup([argv[0], *argv[2:]], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
