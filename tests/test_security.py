"""Strangers at the door: wrong secrets, random bytes, truncated and lying headers; the store's limits.

Each stranger is refused with a logged reason, the job's ranks still connect and
compute correctly, and nothing is allocated at the size a header claims. The
store refuses connections beyond its cap, keys and values beyond their limits
and sets beyond its memory, drops silent connections, serves nobody who has not
proven the job's secret (when there is one), and warns once when there is none.
(The same parsers under a fuzzer: test_fuzz.py.)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from sockfns import dropped, eventually

import pyxccl
from pyxccl.transport import auth
from pyxccl.launcher import free_port
from pyxccl.transport.mailbox import Mailbox
from pyxccl.rendezvous import Limits, wire
from pyxccl.rendezvous.tcp import TCPStore
from pyxccl.transport.base import DATA, HEADER, MAGIC
from pyxccl.transport.tcp import TcpPeer

import rankfns as rf

pytestmark = pytest.mark.timeout(60)
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
        "truncated header": lambda s: s.sendall(b"pyxccl03\x01\x00"),
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


def test_strangers_are_refused_and_the_job_goes_on(caplog, monkeypatch):
    """Two ranks (threads) of a job with a secret start; strangers knock on rank 0's listener and on the
    store; the ranks still connect and allreduce correctly, every stranger is logged, memory does not grow,
    and no stranger receives a byte of the secret or of the ranks' addresses: only greetings."""
    monkeypatch.setenv("PYXCCL_TRANSPORT", "tcp")
    monkeypatch.setenv("PYXCCL_SECRET", "the job's secret")
    # No link probe: when the cached figures are stale it measures with buffers of tens of MiB, which
    # the memory check below would blame on the strangers.
    monkeypatch.setenv("PYXCCL_TUNE", "0")
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
    out = pools(2).run(rf.init_with_secrets, ["one", "two"], timeout=60)
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
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 256, 64, 64, 0, 0, 0), "out of order|were due"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 64, 0, 3, 0, 0, 0) + b"abc", "malformed frame"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, TB, 0, TB, 0, 0, 0) + b"x" * 100, "middle of a frame"),
    (HEADER.pack(MAGIC, DATA, 0, 0, 0, 0, 8, 0, 8, 0, 0, 0)[:20], "middle of a frame"),
], ids=["bad magic", "unknown kind", "chunk past the end", "over 1 TiB", "chunk out of order", "chunk misaligned",
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


# --- the store's limits ----------------------------------------------------------------------------------

def _server(monkeypatch, secret: str | None = None, rank: int | None = None, **limits) -> TCPStore:
    if secret is None:
        monkeypatch.delenv("PYXCCL_SECRET", raising=False)
    else:
        monkeypatch.setenv("PYXCCL_SECRET", secret)
    monkeypatch.setattr(auth, "_warned", True)          # the warning has a test of its own
    return TCPStore("127.0.0.1", 0, is_server=True, timeout=5, rank=rank, limits=Limits(**limits))


def _opened(port: int) -> socket.socket:
    """A raw connection past the open store's opening (greeting read, hello sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    wire.open_client(s, None, "test")
    return s


def test_connections_over_the_cap_are_refused_with_a_clear_error(monkeypatch, caplog):
    """Cap 4: the server's own client and 3 more fill it; the next is refused naming the limit; 200 silent
    connections are refused too and add no thread (one event loop serves the store); a freed slot is
    usable again."""
    caplog.set_level(logging.WARNING, logger="pyxccl")
    server = _server(monkeypatch, max_connections=4, opening_timeout=30)
    clients = [TCPStore("127.0.0.1", server.port, is_server=False, timeout=5) for _ in range(3)]
    try:
        with pytest.raises(pyxccl.RendezvousError, match="limit of 4 connections") as e:
            TCPStore("127.0.0.1", server.port, is_server=False, timeout=5, rank=7)
        assert "PYXCCL_STORE_MAX_CONNECTIONS" in str(e.value) and "rank 7" in str(e.value)
        most, flooding, name = [0], threading.Event(), f"pyxccl-store-{server.port}"

        def count():                                      # the server's threads while the flood lasts
            while flooding.is_set():
                most[0] = max(most[0], sum(t.name == name for t in threading.enumerate()))
                time.sleep(0.001)
        flooding.set()
        sampler = threading.Thread(target=count)
        sampler.start()
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(200)]
        assert all(dropped(s) for s in silent), "a connection over the cap was kept"
        flooding.clear()
        sampler.join(10)
        assert most[0] == 1, f"{most[0]} threads serve the store; one event loop should"
        for s in silent:
            s.close()
        assert sum("limit of 4 connections" in r.getMessage() for r in caplog.records) == 201
        clients.pop().close()
        assert eventually(lambda: len(server._server._clients) < 4)
        with TCPStore("127.0.0.1", server.port, is_server=False, timeout=5) as again:
            again.set("k", b"v")
            assert server.get("k") == b"v"
    finally:
        for c in clients:
            c.close()
        server.close()


def test_limits_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYXCCL_STORE_MAX_CONNECTIONS", "7")
    monkeypatch.setenv("PYXCCL_STORE_MAX_BYTES", "1000")
    assert Limits.from_env(max_value=10) == Limits(max_connections=7, max_value=10, max_bytes=1000)
    monkeypatch.setenv("PYXCCL_STORE_MAX_VALUE", "16M")
    with pytest.raises(pyxccl.InvalidArgumentError, match="PYXCCL_STORE_MAX_VALUE='16M'"):
        Limits.from_env()


def test_keys_and_values_over_the_limits_are_refused(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="pyxccl")
    server = _server(monkeypatch, max_value=1000)
    try:
        with pytest.raises(pyxccl.InvalidArgumentError, match="PYXCCL_STORE_MAX_VALUE"):
            server.set("big", b"x" * 1001)
        with pytest.raises(pyxccl.InvalidArgumentError, match="set of a key of 5000 bytes"):
            server.set("k" * 5000, b"")
        server.set("fits", b"x" * 1000)
        # A client that lies about sizes is dropped before a byte of the value is read.
        for claim in (struct.pack("<BI", 1, 1) + b"k" + struct.pack("<Q", TB),        # 1 TB value
                      struct.pack("<BI", 1, 1 << 31),                                 # 2 GiB key
                      struct.pack("<BI", 2, 1) + b"k" + struct.pack("<Q", 9) + b"x" * 9):   # get: 9-byte timeout
            with _opened(server.port) as raw:
                raw.sendall(claim)
                assert dropped(raw)
        assert server.get("fits") == b"x" * 1000 and server._server.used == len("fits") + 1000
    finally:
        server.close()
    why = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(why) == 3 and "over the store's limit of 1000" in why[0] and "key length" in why[1], why


def test_memory_cap_refuses_a_set_and_keeps_the_connection(monkeypatch):
    """The store holds at most max_bytes of keys and values, values still arriving included (a value being
    replaced counts until its successor is in): a set that does not fit is refused (the connection stays
    usable); replacing and deleting give the room back; counters count too."""
    server = _server(monkeypatch, max_value=8000, max_bytes=13_000, rank=0)
    try:
        for _ in range(10):
            server.set("a", b"x" * 6000)                  # replaced, not accumulated: 6001 held
        assert server._server.used == 6001
        server.set("b", b"y" * 6000)                      # 12002 held
        with pytest.raises(pyxccl.RendezvousError, match="PYXCCL_STORE_MAX_BYTES") as e:
            server.set("c", b"z" * 1000)
        assert all(w in str(e.value) for w in ("rank 0: the store at", "set of key 'c'", "delete keys")), e.value
        with pytest.raises(pyxccl.RendezvousError, match="no room"):
            server.set("a", b"x" * 6000)                  # while it arrives, the old "a" is still held
        assert server.get("a") == b"x" * 6000 and not server.check("c")   # the same connection, still good
        assert server.delete_key("a") and server._server.used == 6001
        assert server.add("n", 5) == 5 and server._server.used == 6001 + 2
        server.set("c", b"z" * (13_000 - 6003 - 1))       # exactly full
        with pytest.raises(pyxccl.RendezvousError, match="no room"):
            server.add("n", 10)                          # one digit more
        with pytest.raises(pyxccl.RendezvousError, match="no room"):
            server.add("m", 1)
        assert server.delete_key("c") and server.add("n", 10) == 15
    finally:
        server.close()


def test_two_100_mib_sets_do_not_stay_in_memory(monkeypatch):
    """The issue's case, with the default limits: a 100 MiB value is refused before it is sent."""
    server = _server(monkeypatch)
    try:
        for key in ("one", "two"):
            with pytest.raises(pyxccl.InvalidArgumentError, match="over the store's limit"):
                server.set(key, bytes(100 << 20))
        assert server._server.used == 0
    finally:
        server.close()


def test_silent_connections_are_dropped(monkeypatch, caplog):
    """A connection that sends nothing, or stops mid-request, is dropped after its deadline and logged;
    a client that opened and is idle between requests is kept."""
    caplog.set_level(logging.WARNING, logger="pyxccl")
    server = _server(monkeypatch, opening_timeout=0.5, request_timeout=0.5)
    try:
        mute = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        half_hello = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        half_hello.sendall(b"PXS1")
        mid_request = _opened(server.port)
        mid_request.sendall(struct.pack("<BI", 1, 3) + b"key" + struct.pack("<Q", 100) + b"only part")
        for s in (mute, half_hello, mid_request):
            assert dropped(s), "a silent connection was kept"
            s.close()
        time.sleep(1.0)                                   # the server's own client idled past both deadlines
        server.set("k", b"v")
        assert server.get("k") == b"v" and server._server.used == 2
    finally:
        server.close()
    why = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert sum("silent for 0.5 s during its opening" in m for m in why) == 2, why
    assert sum("silent for 0.5 s during its request" in m for m in why) == 1, why


# --- the secret ------------------------------------------------------------------------------------------

def test_store_with_a_secret_serves_only_proven_clients(monkeypatch):
    server = _server(monkeypatch, secret="right")
    try:
        server.set("pyxccl/1/addr/0", b'{"tcp": ["10.0.0.1", 1234]}')
        monkeypatch.setenv("PYXCCL_SECRET", "wrong")
        with pytest.raises(pyxccl.RendezvousError, match="PYXCCL_SECRET") as e:
            TCPStore("127.0.0.1", server.port, is_server=False, timeout=5, rank=1)
        assert "rank 1" in str(e.value) and f"127.0.0.1:{server.port}" in str(e.value)
        monkeypatch.delenv("PYXCCL_SECRET")
        with pytest.raises(pyxccl.RendezvousError, match="requires the job's secret"):
            TCPStore("127.0.0.1", server.port, is_server=False, timeout=5)
        monkeypatch.setenv("PYXCCL_SECRET", "right")
        with TCPStore("127.0.0.1", server.port, is_server=False, timeout=5) as ok:
            assert ok.get("pyxccl/1/addr/0").startswith(b'{"tcp"')
    finally:
        server.close()


def test_a_client_with_a_secret_refuses_a_store_without_one(monkeypatch):
    """Another program (or rank 0 started without the secret) on the port cannot pass for the job's store."""
    server = _server(monkeypatch)
    try:
        monkeypatch.setenv("PYXCCL_SECRET", "s")
        with pytest.raises(pyxccl.RendezvousError, match="serves without a secret"):
            TCPStore("127.0.0.1", server.port, is_server=False, timeout=5)
    finally:
        server.close()


class _DictStore(dict):
    """A dict as a store, to see what goes in."""

    def set(self, key, value):
        self[key] = value

    def get(self, key, timeout=None):
        return self[key]


def test_what_the_ranks_put_in_the_store_for_their_handshakes(monkeypatch):
    """With a secret: nothing. Without: rank 0's random job key, which the other ranks read."""
    monkeypatch.setattr(auth, "_warned", True)
    monkeypatch.setenv("PYXCCL_SECRET", "s")
    store = _DictStore()
    assert auth.job_secret(store, 0, 1.0) == auth.env_secret() and store == {}
    monkeypatch.delenv("PYXCCL_SECRET")
    key = auth.job_secret(store, 0, 1.0)
    assert store == {"pyxccl/job-key": key} and auth.job_secret(store, 1, 1.0) == key and len(key) == 32


def test_without_a_secret_one_warning_says_what_is_trusted(monkeypatch):
    monkeypatch.delenv("PYXCCL_SECRET", raising=False)
    monkeypatch.setattr(auth, "_warned", False)
    with pytest.warns(auth.NoSecretWarning) as record:
        server = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
        key = auth.job_secret(server, 0, 1.0)             # rank 0 of a job on it: no second warning
    server.close()
    assert len(record) == 1, [str(w.message) for w in record]
    text = str(record[0].message)
    assert f"the store at 127.0.0.1:{server.port}" in text and "any process that can reach" in text
    assert "set and delete keys" in text and "Set PYXCCL_SECRET" in text
    assert len(key) == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TCPStore("127.0.0.1", 0, is_server=True, timeout=5).close()   # once per process
        monkeypatch.setattr(auth, "_warned", False)
        monkeypatch.setenv("PYXCCL_SECRET", "s")
        TCPStore("127.0.0.1", 0, is_server=True, timeout=5).close()   # a secret: nothing to warn about


_SHOW_SECRET = """
import hashlib, os, warnings, numpy as np, pyxccl
from pyxccl.transport.auth import NoSecretWarning
warnings.simplefilter("error", NoSecretWarning)
comm = pyxccl.init()
x = np.ones(2, np.float32)
comm.allreduce(x)
secret = os.environ.get("PYXCCL_SECRET", "")
print(len(secret), hashlib.sha256(secret.encode()).hexdigest()[:12], int(x[0]))
comm.close()
"""


@pytest.mark.timeout(90)
def test_pyxccl_run_gives_a_one_node_job_its_own_secret(tmp_path, monkeypatch):
    """Every rank gets the same fresh secret, each job another; the job runs without NoSecretWarning
    (an error in the script); a secret in the environment is kept."""
    script = tmp_path / "job.py"
    script.write_text(_SHOW_SECRET)
    monkeypatch.delenv("PYXCCL_SECRET", raising=False)

    def job(env=None):
        p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "2", str(script)], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stderr
        lines = {line.split(" ", 1)[1] for line in p.stdout.splitlines()}
        assert len(lines) == 1, lines                    # the same on both ranks
        return lines.pop()
    first, second = job(), job()
    assert first.startswith("64 ") and first.endswith(" 2") and first != second
    given = job(dict(os.environ, PYXCCL_SECRET="mine"))
    assert given == f"4 {hashlib.sha256(b'mine').hexdigest()[:12]} 2"


_NODE = """
import numpy as np, pyxccl
comm = pyxccl.init()
x = np.ones(2, np.float32)
comm.allreduce(x)
print(comm.size, int(x[0]))
comm.close()
"""


@pytest.mark.parametrize("secrets", [("shared", "shared"), ("one", "two"), (None, None)],
                         ids=["same", "different", "none"])
def test_nodes_of_a_multi_node_job_share_the_secret_they_are_given(tmp_path, secrets):
    """Two `pyxccl run --nnodes 2` (emulated hosts): each keeps the PYXCCL_SECRET its environment gives;
    the same on both makes one job, different ones fail set-up with an error that names the fix; none
    makes a job that rank 0 warns about (nodes cannot agree on a fresh secret)."""
    base = {k: v for k, v in os.environ.items() if k != "PYXCCL_SECRET"}
    script = tmp_path / "node.py"
    script.write_text(_NODE)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "pyxccl", "run", "--nnodes", "2", "--node-rank", str(i), "-n",
                               "1", "--master-port", str(port), str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(base, PYXCCL_HOST_ID=f"node{i}", PYXCCL_TUNE="0", PYXCCL_TIMEOUT="10",
                                       **({"PYXCCL_SECRET": secrets[i]} if secrets[i] else {})))
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=50) for p in procs]
    finally:
        for p in procs:
            p.kill()
    if secrets[0] == secrets[1]:
        assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
        assert outs[0][0] + outs[1][0] == "[0] 2 2\n[1] 2 2\n"
        assert ("NoSecretWarning" in outs[0][1]) == (secrets[0] is None), outs[0][1]
    else:
        assert procs[1].returncode != 0
        assert "RendezvousError" in outs[1][1] and "PYXCCL_SECRET" in outs[1][1], outs[1][1]
