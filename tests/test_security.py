"""Strangers at the door: wrong secrets, random bytes, truncated and lying headers.

Each is refused with a logged reason, the job's ranks still connect and compute
correctly, and nothing is allocated at the size a header claims.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import resource
import socket
import struct
import threading

import numpy as np
import pytest

import pyxccl
from pyxccl.transport import auth
from pyxccl.launcher import free_port
from pyxccl.transport.mailbox import Mailbox
from pyxccl.rendezvous import wire
from pyxccl.rendezvous.tcp import TCPStore
from pyxccl.transport.base import DATA, HEADER, MAGIC
from pyxccl.transport.tcp import TcpPeer

import rankfns as rf

TB = 10 ** 12


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _knock(addr, send, got: list[bytes]) -> None:
    """Connect to ``addr``, run ``send(sock)``, then read until the other end drops us; keep what came."""
    with socket.create_connection(addr, timeout=5) as s:
        try:
            send(s)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(1 << 16):
                got.append(chunk)
        except (OSError, auth.AuthError, pyxccl.RendezvousError):
            pass


def _rank_strangers(addr, got: list[bytes]) -> list[str]:
    """Knock on a rank's listener in every bad way; return what was tried."""
    tried = {
        "wrong secret": lambda s: auth.dial(s, b"not the job's secret", 1),
        "random bytes": lambda s: s.sendall(np.random.default_rng(0).bytes(4096)),
        "truncated header": lambda s: s.sendall(b"pyxccl02\x01\x00"),
        "1 TB header": lambda s: s.sendall(HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, TB, 0, TB, 0, 0, 0)),
        "a store's proof": lambda s: auth.dial(s, b"not the job's secret", 0, auth.STORE_CHANNEL),
    }
    for send in tried.values():
        _knock(addr, send, got)
    return list(tried)


def _store_strangers(addr, got: list[bytes]) -> list[str]:
    """Knock on a store that requires the secret, without it; return what was tried."""
    wrong = hashlib.sha256(b"a guess").digest()
    request = struct.pack("<BI", 2, 15) + b"pyxccl/1/addr/0" + struct.pack("<Qd", 8, 5.0)
    tried = {
        "wrong secret": lambda s: wire.open_client(s, wrong, "test"),
        "no secret": lambda s: wire.open_client(s, None, "test"),
        "random bytes": lambda s: s.sendall(np.random.default_rng(0).bytes(4096)),
        "truncated proof": lambda s: s.sendall(b"\x00" * 10),
        "open hello, then a get": lambda s: s.sendall(b"PXS1open" + request * 8),
        "1 TB request": lambda s: s.sendall(struct.pack("<BI", 1, 1) + b"k" + struct.pack("<Q", TB)),
    }
    for send in tried.values():
        _knock(addr, send, got)
    return list(tried)


@pytest.mark.timeout(60)
def test_strangers_are_refused_and_the_job_goes_on(caplog, monkeypatch):
    """Two ranks (threads) of a job with a secret start; strangers knock on rank 0's listener and on the
    store; the ranks still connect and allreduce correctly, every stranger is logged, memory does not grow,
    and no stranger receives a byte of the secret or of the ranks' addresses: only greetings."""
    monkeypatch.setenv("PYXCCL_TRANSPORT", "tcp")
    monkeypatch.setenv("PYXCCL_SECRET", "the job's secret")
    caplog.set_level(logging.WARNING, logger="pyxccl")
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=30)
    comms, errors = [None, None], []

    def rank(r):
        try:
            comms[r] = pyxccl.init(r, 2, store=TCPStore("127.0.0.1", store.port, is_server=False, timeout=30),
                                   timeout=30)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    t0 = threading.Thread(target=rank, args=(0,), name="rank")     # ranks' calls come from threads of one name
    t0.start()
    info_raw = store.get("pyxccl/1/addr/0", timeout=20)            # rank 0 listens now; rank 1 has not dialed
    info = json.loads(info_raw)
    before = _rss_mb()
    got: list[bytes] = []
    tried = _rank_strangers(tuple(info["tcp"]), got) + _store_strangers(("127.0.0.1", store.port), got)
    t1 = threading.Thread(target=rank, args=(1,), name="rank")
    t1.start()
    for t in (t0, t1):
        t.join(30)
    assert not errors, errors
    try:
        outs = [np.arange(5, dtype=np.float32) * (r + 1) for r in range(2)]
        ws = [c.allreduce(x, async_op=True) for c, x in zip(comms, outs)]
        for w in ws:
            w.wait()
        for x in outs:
            np.testing.assert_array_equal(x, np.arange(5, dtype=np.float32) * 3)
        held = dict(store._server.data)
    finally:
        for c in comms:
            c.close()
        store.close()
    assert _rss_mb() - before < 64, "a stranger's claim made this process allocate memory"
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refusals) == len(tried), (tried, refusals)
    assert any("rank 0" in m and "job's secret" in m for m in refusals), refusals
    assert any("not a pyxccl handshake" in m for m in refusals), refusals
    assert any("store's handshake sent to a rank" in m for m in refusals), refusals
    assert sum("store" in m and "wrong secret" in m for m in refusals) == 3, refusals
    assert sum("store" in m and "hung up before opening" in m for m in refusals) == 3, refusals
    heard = b"".join(got)
    key = auth.env_secret()
    assert key is not None and key not in heard and b"the job's secret" not in heard
    assert info_raw not in heard and b'"tcp"' not in heard, "a stranger read a rank's address"
    assert not any(key in v for v in held.values()) and not any("job-key" in k for k in held), \
        "the secret (or a job key) was put in the store"


def test_handshake_with_a_wrong_secret_fails_on_both_sides():
    lst = socket.create_server(("127.0.0.1", 0))
    got = []

    def acceptor():
        conn, _ = lst.accept()
        with conn:
            try:
                auth.accept(conn, b"s" * 32)
            except auth.AuthError as e:
                got.append(e)
    t = threading.Thread(target=acceptor)
    t.start()
    with socket.create_connection(lst.getsockname()) as s, pytest.raises(auth.AuthError, match="secret"):
        auth.dial(s, b"x" * 32, 1)
    t.join(10)
    lst.close()
    assert len(got) == 1, got


def test_ranks_with_different_secrets_cannot_form_a_job(pools):
    """PYXCCL_SECRET differs between ranks: set-up fails on both with an error that names the fix."""
    out = pools(2).run(rf.init_with_secrets, free_port(), ["one", "two"], timeout=60)
    for r, msg in enumerate(out):
        assert msg.startswith("RendezvousError"), (r, msg)
    assert "PYXCCL_SECRET" in out[1], out[1]


class _Lost:
    def __init__(self):
        self.event, self.err = threading.Event(), None

    def __call__(self, peer, err, graceful=False):
        self.err = err
        self.event.set()


@pytest.mark.parametrize("frame, match", [
    (HEADER.pack(0x1234, DATA, 0, 0, 0, 0, 8, 0, 8, 0, 0, 0), "malformed frame"),
    (HEADER.pack(MAGIC, 99, 0, 0, 0, 0, 8, 0, 8, 0, 0, 0), "malformed frame"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 8, 4, 8, 0, 0, 0), "malformed frame"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 1 << 41, 0, 1 << 41, 0, 0, 0), "malformed frame"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 64, 32, 32, 0, 0, 0), "out of order|were due"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, TB, 0, TB, 0, 0, 0) + b"x" * 100, "middle of a frame"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 8, 0, 8, 0, 0, 0)[:20], "middle of a frame"),
], ids=["bad magic", "unknown kind", "chunk past the end", "over 1 TiB", "chunk out of order",
        "1 TB claimed, then closed", "truncated header"])
def test_a_bad_frame_from_a_connected_peer_is_a_clear_error(frame, match):
    """On an established connection, a frame that does not fit the protocol ends it with an error
    naming the peer: never a hang, never an allocation of the claimed size."""
    a, b = socket.socketpair()
    lost = _Lost()
    peer = TcpPeer(0, 3, Mailbox(0), lost, a)
    peer.host = "h1 (10.0.0.2)"
    peer.start()
    before = _rss_mb()
    b.sendall(frame)
    b.close()
    assert lost.event.wait(10), "the bad frame was not noticed"
    peer.close()
    assert lost.err.peer == 3 and "rank 3" in str(lost.err), lost.err
    assert re.search(match, str(lost.err)), lost.err
    assert _rss_mb() - before < 64
