"""The TCP store at scale, and MULTI_GET.

One event-loop thread serves 4,096 clients held open at once (each proves the job's secret, sets,
gets, and waits in a blocking get that one set answers) while strangers break the protocol in every
way the server knows: the good are served, each bad one is dropped and logged. MULTI_GET is answered
when its last key appears, names the keys still missing at its deadline, and is refused over the
limits (by the client before sending, and by the server from a client that lies).
"""
from __future__ import annotations

import datetime
import hashlib
import logging
import resource
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sockfns import dropped, eventually

import pyxccl
from pyxccl.rendezvous import Limits, PrefixStore, wire
from pyxccl.rendezvous.tcp import TCPStore
from pyxccl.rendezvous.torch_store import TorchStore
from pyxccl.transport import auth, fds

N = 4096                         # good clients held open at once
BAD = 16                         # strangers of each kind
THREADS = 8


def _request(op: int, key: bytes, value: bytes) -> bytes:
    return wire.REQ.pack(op, len(key)) + key + wire.LEN.pack(len(value)) + value


def _get(key: str, timeout: float) -> bytes:
    return _request(wire.GET, key.encode(), wire.TIMEOUT.pack(timeout))


def _reply(sock: socket.socket) -> tuple[int, bytes]:
    return wire.read_reply(sock, 1 << 20)


def _server(monkeypatch, secret: str | None = "scale", **limits) -> TCPStore:
    if secret is None:
        monkeypatch.delenv("PYXCCL_SECRET", raising=False)
        monkeypatch.setattr(auth, "_warned", True)
    else:
        monkeypatch.setenv("PYXCCL_SECRET", secret)
    return TCPStore("127.0.0.1", 0, is_server=True, timeout=60, limits=Limits(**limits))


# --- 4,096 clients -----------------------------------------------------------------------------------------

def _strangers(port: int, secret: bytes) -> dict[str, tuple[str, callable]]:
    """Each kind of bad client: what it does (on a fresh connection), and what the server's log says."""
    wrong = hashlib.sha256(b"a guess").digest()

    def opened(s):
        wire.open_client(s, secret, "test")

    def garbage(s):
        opened(s)
        s.sendall(b"\xff" * 16)

    def wrong_secret(s):
        try:
            wire.open_client(s, wrong, "test")
        except pyxccl.RendezvousError:
            pass

    def stall(s):
        opened(s)
        s.sendall(struct.pack("<BI", wire.SET, 3) + b"key" + struct.pack("<Q", 100) + b"only part")

    def more_while_waiting(s):
        opened(s)
        s.sendall(_get("never", 60.0))
        s.sendall(b"x")

    def hang_up(s):
        wire.read_reply(s, 1 << 12)            # the greeting, then gone: the caller shuts the socket
        s.shutdown(socket.SHUT_WR)

    def huge_multi_get(s):
        opened(s)
        value = wire.TIMEOUT.pack(1.0) + wire.COUNT.pack(wire.MAX_KEYS + 1)
        s.sendall(_request(wire.MULTI_GET, b"", value))
    return {"garbage": ("not the store protocol", garbage), "wrong secret": ("wrong secret", wrong_secret),
            "stall": ("silent for 2 s during its request", stall),
            "more": ("sent more while its get waited", more_while_waiting),
            "hang up": ("hung up before opening", hang_up),
            "multi_get": (f"multi-get of {wire.MAX_KEYS + 1} keys", huge_multi_get)}


@pytest.mark.timeout(600)
def test_4096_clients_at_once_with_strangers_among_them(monkeypatch, caplog):
    """4,096 clients, connections held open at once, each proves the secret, sets its key and gets a
    neighbour's; then all wait in a get of one key that one set answers. Meanwhile six kinds of bad
    client (16 each) are dropped and logged, one line each, and everyone else is served."""
    fds.ensure_fds(2 * N + 7 * BAD + 64, "this test")
    caplog.set_level(logging.WARNING, logger="pyxccl")
    store = _server(monkeypatch, opening_timeout=60, request_timeout=2)
    server, port, secret = store._server, store.port, auth.env_secret()
    socks: list[socket.socket | None] = [None] * N
    errors: list[BaseException] = []
    phase = threading.Barrier(THREADS + 1, timeout=300)

    def client(t: int) -> None:
        mine = range(t, N, THREADS)
        try:
            for i in mine:
                s = socket.create_connection(("127.0.0.1", port), timeout=120)
                wire.open_client(s, secret, "test")
                socks[i] = s
            phase.wait()                                  # all N open at once
            for i in mine:
                socks[i].sendall(_request(wire.SET, f"k/{i}".encode(), b"v%d" % i))
                assert _reply(socks[i]) == (wire.OK, b"")
            phase.wait()
            for i in mine:
                j = (i + 7) % N
                socks[i].sendall(_get(f"k/{j}", 60.0))
                assert _reply(socks[i]) == (wire.OK, b"v%d" % j)
                socks[i].sendall(_get("go", 120.0))       # waits for the one set below
            phase.wait()
            for i in mine:
                assert _reply(socks[i]) == (wire.OK, b"go!")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            phase.abort()

    kinds = _strangers(port, secret)
    bad: list[tuple[str, socket.socket]] = []

    def strangers() -> None:
        for name, (_, act) in kinds.items():
            for _ in range(BAD):
                s = socket.create_connection(("127.0.0.1", port), timeout=120)
                act(s)
                bad.append((name, s))
    threads = [threading.Thread(target=client, args=(t,)) for t in range(THREADS)]
    try:
        for t in threads:
            t.start()
        phase.wait()
        assert len(server._clients) >= N + 1, "the clients were not all held open at once"   # + the server's own
        with ThreadPoolExecutor(1) as ex:
            rude = ex.submit(strangers)
            phase.wait()                                  # sets and gets done, all N wait for "go"
            rude.result(timeout=300)
        assert eventually(lambda: len(server._waiting.get("go", ())) == N, 120), "not all N wait for 'go'"
        store.set("go", b"go!")
        phase.wait()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        gone = [name for name, s in bad if dropped(s, None)]
        assert gone == [name for name, _ in bad], "a bad client was kept"
        assert store.get("k/4095") == b"v4095" and store.multi_get(["k/0", "k/1"]) == [b"v0", b"v1"]
        held = sum(len(k.encode()) + len(v) for k, v in server.data.items())
        assert server.used == held, (server.used, held)
    finally:
        for s in socks:
            if s is not None:
                s.close()
        for _, s in bad:
            s.close()
        store.close()
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    for name, (says, _) in kinds.items():
        assert sum(says in m for m in refusals) == BAD, (name, [m for m in refusals if says in m][:3])
    assert len(refusals) == BAD * len(kinds), refusals[:10]


def test_a_store_for_a_big_world_makes_room_for_its_clients(monkeypatch):
    """Started for a world size, the server raises the soft descriptor limit (to the hard one) when it is
    too low for that many clients, and says how many descriptors are missing when even the hard one is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    monkeypatch.setenv("PYXCCL_SECRET", "fds")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fds.open_fds() + 64, hard))
        TCPStore("127.0.0.1", 0, is_server=True, timeout=5, world_size=4096).close()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= fds.open_fds() + 4096
        if hard != resource.RLIM_INFINITY:
            with pytest.raises(pyxccl.RendezvousError, match=r"rank 0: the store at .* short\); raise it") as e:
                TCPStore("127.0.0.1", 0, is_server=True, timeout=5, world_size=hard + 1,
                         limits=Limits(max_connections=hard + 1))
            assert "ulimit -Hn" in str(e.value)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- MULTI_GET ----------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_multi_get_is_answered_when_its_last_key_appears(monkeypatch):
    """In the order asked (a key twice too); a key deleted while the request waits is waited for again."""
    store = _server(monkeypatch)
    other = TCPStore("127.0.0.1", store.port, is_server=False, timeout=60)
    keys = [f"addr/{r}" for r in range(64)] + ["addr/5"]
    try:
        with ThreadPoolExecutor(1) as ex:
            got = ex.submit(other.multi_get, keys, 30)
            for r in range(63):
                store.set(f"addr/{r}", b"rank %d" % r)
            assert eventually(lambda: "addr/63" in store._server._waiting, 30)
            store.delete_key("addr/0")                    # counted as there: the request must notice
            store.set("addr/63", b"rank 63")
            assert eventually(lambda: "addr/0" in store._server._waiting, 30) and not got.done()
            store.set("addr/0", b"again")
            assert got.result(timeout=30) == [b"again"] + [b"rank %d" % r for r in range(1, 64)] + [b"rank 5"]
        assert store._server.used == sum(len(k) + len(v) for k, v in store._server.data.items())
        assert store.multi_get([]) == [] and PrefixStore("addr", other).multi_get(["1", "2"]) == [b"rank 1",
                                                                                               b"rank 2"]
    finally:
        other.close()
        store.close()


def test_multi_get_timeout_names_the_missing_keys(monkeypatch):
    store = _server(monkeypatch)
    try:
        for r in range(20):
            if r not in (3, 17):
                store.set(f"k{r}", b"x")
        with pytest.raises(pyxccl.RendezvousError, match=r"2 of 20 keys did not appear within 0\.2 s: 'k3', 'k17'"):
            store.multi_get([f"k{r}" for r in range(20)], timeout=0.2)
        with pytest.raises(pyxccl.RendezvousError, match=r"12 of 12 keys .*'m7' and 4 more; a rank") as e:
            store.multi_get([f"m{r}" for r in range(12)], timeout=0)
        assert "'m8'" not in str(e.value)
        assert store.multi_get(["k0"], timeout=0) == [b"x"] and not store._server._waiting
    finally:
        store.close()


def test_multi_get_over_the_limits_is_refused(monkeypatch, caplog):
    """The client refuses a request over the key count or the value limit, and a reply whose values are
    over it; a client that lies about either is dropped and logged; a waiting request's bytes count
    against max_bytes (FULL when there is no room) and are given back."""
    caplog.set_level(logging.WARNING, logger="pyxccl")
    store = _server(monkeypatch, secret=None, max_value=1000, max_bytes=3000)
    try:
        with pytest.raises(pyxccl.InvalidArgumentError, match=f"over the store's limit of {wire.MAX_KEYS} keys"):
            store.multi_get(["k"] * (wire.MAX_KEYS + 1))
        with pytest.raises(pyxccl.InvalidArgumentError, match="PYXCCL_STORE_MAX_VALUE"):
            store.multi_get([f"key/{i:04d}" for i in range(100)])          # 1,212 bytes of request
        with pytest.raises(pyxccl.InvalidArgumentError, match="has 4097 bytes"):
            store.multi_get(["a", "k" * 4097])
        store.set("a", b"x" * 600)
        store.set("b", b"y" * 600)
        with pytest.raises(pyxccl.InvalidArgumentError, match="total 1200 bytes.*get fewer keys"):
            store.multi_get(["a", "b"])
        assert store.multi_get(["b"]) == [b"y" * 600]
        store.set("c", b"z" * 1000)                       # 2,203 held
        keys = [f"wait/{i:03d}" for i in range(80)]
        request = len(wire.pack_keys(5.0, [k.encode() for k in keys]))      # 972 bytes: no room while it waits
        with pytest.raises(pyxccl.RendezvousError, match=f"no room for {request} more"):
            store.multi_get(keys, timeout=5)
        store.delete_key("c")
        with ThreadPoolExecutor(1) as ex:
            got = ex.submit(store.multi_get, keys, 30)
            assert eventually(lambda: store._server.used == 1202 + request, 30)   # held while it waits
            for k in keys:
                store.set(k, b"")
            assert got.result(timeout=30) == [b""] * 80
        assert store._server.used == 1202 + sum(len(k) for k in keys)
        lies = {"count": wire.TIMEOUT.pack(1) + wire.COUNT.pack(wire.MAX_KEYS + 1),
                "short": wire.TIMEOUT.pack(1) + wire.COUNT.pack(3) + wire.COUNT.pack(1) + b"a",
                "big": None}
        for name, value in lies.items():
            with socket.create_connection(("127.0.0.1", store.port), timeout=10) as raw:
                wire.open_client(raw, None, "test")
                if value is None:
                    raw.sendall(wire.REQ.pack(wire.MULTI_GET, 0) + wire.LEN.pack(1001))
                else:
                    raw.sendall(_request(wire.MULTI_GET, b"", value))
                assert dropped(raw, None), name
        assert store._server.used == 1202 + sum(len(k) for k in keys)
    finally:
        store.close()
    why = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(why) == 3 and f"{wire.MAX_KEYS + 1} keys" in why[0] and "announcing 3 keys" in why[1], why
    assert "over the store's limit of 1000" in why[2], why


def test_multi_get_of_64_keys_for_64_ranks(monkeypatch):
    """The init pattern: every rank reads every rank's address, one request each, all answered at once
    when the last rank has set its own."""
    store = _server(monkeypatch)
    ranks = [TCPStore("127.0.0.1", store.port, is_server=False, timeout=60, rank=r) for r in range(64)]
    keys = [f"addr/{r}" for r in range(64)]
    try:
        with ThreadPoolExecutor(64) as ex:
            gets = [ex.submit(c.multi_get, keys, 60) for c in ranks[1:]]
            for r, c in enumerate(ranks):
                c.set(keys[r], b"host:%d" % r)
            want = [b"host:%d" % r for r in range(64)]
            assert all(g.result(timeout=60) == want for g in gets)
        assert ranks[0].multi_get(keys) == want
    finally:
        for c in ranks:
            c.close()
        store.close()


# --- torch's store --------------------------------------------------------------------------------------

class _NoMulti:
    """A torch-like store without multi_get (older torch): TorchStore falls back to a get per key."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        if name == "multi_get":
            raise AttributeError(name)
        self.calls.append(name)
        return getattr(self.inner, name)


def test_torch_store_multi_get():
    dist = pytest.importorskip("torch.distributed")
    if not hasattr(dist.Store, "multi_get"):
        pytest.skip("this torch has no Store.multi_get (the fallback is tested below)")
    wait = datetime.timedelta(seconds=30)
    inner = dist.TCPStore("127.0.0.1", 0, None, True, timeout=wait, wait_for_workers=False)
    store = TorchStore(inner, timeout=30)
    setter = TorchStore(dist.TCPStore("127.0.0.1", inner.port, None, False, timeout=wait), timeout=30)
    with ThreadPoolExecutor(1) as ex:              # (a torch store client serves one call at a time)
        got = ex.submit(store.multi_get, ["a", "b", "a"], 30)
        setter.set("a", b"1")
        setter.set("b", b"2")
        assert got.result(timeout=30) == [b"1", b"2", b"1"]
    with pytest.raises(pyxccl.RendezvousError, match="'c'"):
        store.multi_get(["a", "c"], timeout=0.2)
    fallback = _NoMulti(inner)
    assert TorchStore(fallback, timeout=30).multi_get(["b", "a"]) == [b"2", b"1"]
    assert "get" in fallback.calls and "multi_get" not in fallback.calls
