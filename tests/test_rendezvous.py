"""Stores: one set of behaviour tests run against TCPStore and FileStore; TCP server
robustness; PrefixStore; create_store URL parsing."""
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pyxccl import InvalidArgumentError, RendezvousError
from pyxccl.rendezvous import FileStore, PrefixStore, Store, TCPStore, create_store

pytestmark = pytest.mark.timeout(60)
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


class Stores:
    """Clients of one store of a kind; the first TCP client also serves it. ``spec`` lets a subprocess join."""

    def __init__(self, kind, tmp_path):
        self.kind, self.path, self.made = kind, str(tmp_path / "store"), []

    def client(self, timeout=10.0) -> Store:
        if self.kind == "file":
            s = FileStore(self.path, timeout=timeout)
        elif not self.made:
            s = TCPStore("127.0.0.1", 0, is_server=True, timeout=timeout)
        else:
            s = TCPStore("127.0.0.1", self.made[0].port, is_server=False, timeout=timeout)
        self.made.append(s)
        return s

    @property
    def spec(self) -> str:
        return self.path if self.kind == "file" else str(self.made[0].port)

    def close(self):
        for s in reversed(self.made):
            s.close()


@pytest.fixture(params=("tcp", "file"))
def stores(request, tmp_path):
    s = Stores(request.param, tmp_path)
    s.client()                       # the server (TCP) or the directory (file) exists from the start
    yield s
    s.close()


# --- behaviour, both kinds --------------------------------------------------------------------------------

def test_set_get_check_delete(stores):
    a, b = stores.client(), stores.client()
    a.set("k", b"\x00value")
    assert b.get("k", timeout=5) == b"\x00value"
    assert b.check("k") and not b.check("other")
    a.set("k", b"")                  # overwrite, with an empty value
    assert b.get("k", timeout=5) == b""
    assert b.delete_key("k") and not a.check("k")
    assert not a.delete_key("k")
    odd = "a/b c/é/" + "x" * 300     # slashes, spaces, non-ASCII and a long name are all fine keys
    a.set(odd, b"1")
    assert b.get(odd, timeout=5) == b"1"


def test_get_blocks_until_another_client_sets(stores):
    a, b = stores.client(), stores.client()
    timer = threading.Timer(0.3, lambda: b.set("late", b"x"))
    timer.start()
    t = time.monotonic()
    assert a.get("late", timeout=5) == b"x"
    assert time.monotonic() - t >= 0.25
    timer.join(5)


def test_get_timeout_names_the_key_and_the_store(stores):
    a = stores.client()
    t = time.monotonic()
    with pytest.raises(RendezvousError, match="never-set") as e:
        a.get("never-set", timeout=0.3)
    assert 0.25 <= time.monotonic() - t < 5
    assert stores.spec in str(e.value)            # the port or the directory
    with pytest.raises(ConnectionError):            # RendezvousError is a ConnectionError too
        a.get("never-set", timeout=0)


def test_default_timeout_comes_from_the_constructor(stores):
    a = stores.client(timeout=0.2)
    with pytest.raises(RendezvousError, match="missing"):
        a.get("missing")


def test_add_counts_and_reads_back_as_decimal(stores):
    a, b = stores.client(), stores.client()
    assert a.add("n", 5) == 5 and b.add("n", -2) == 3 and a.add("n", 0) == 3
    assert b.get("n", timeout=5) == b"3"
    a.set("text", b"abc")
    with pytest.raises(InvalidArgumentError, match="text"):
        a.add("text", 1)
    assert a.add("n", 1) == 4                     # the store still works after the refused add


def test_32_concurrent_clients_add_to_one_counter(stores):
    clients = [stores.client() for _ in range(32)]
    barrier = threading.Barrier(32, timeout=10)

    def one(c):
        barrier.wait()
        return c.add("n", 1)

    with ThreadPoolExecutor(32) as ex:
        results = list(ex.map(one, clients, timeout=30))
    assert sorted(results) == list(range(1, 33))   # every add saw a distinct value
    assert clients[0].get("n", timeout=5) == b"32"


def test_wait_for_several_keys(stores):
    a, b = stores.client(), stores.client()
    timer = threading.Timer(0.1, lambda: (b.set("x", b"1"), b.set("y", b"2")))
    timer.start()
    a.wait(["x", "y"], timeout=5)
    timer.join(5)
    with pytest.raises(RendezvousError, match="z"):
        a.wait(["x", "z"], timeout=0.2)


def test_multi_get_waits_for_its_last_key(stores):
    """Every kind of store: values in the order asked, the wait covers the late key, a timeout names a
    missing key (the TCP store answers in one request, the file store by a get per key)."""
    a, b = stores.client(), stores.client()
    a.set("x", b"1")
    with ThreadPoolExecutor(1) as ex:
        got = ex.submit(b.multi_get, ["x", "y", "x"], 20)
        a.set("y", b"2")
        assert got.result(timeout=20) == [b"1", b"2", b"1"]
    with pytest.raises(RendezvousError, match="'z'"):
        b.multi_get(["x", "z"], timeout=0.2)
    assert b.multi_get([]) == []


def test_one_client_shared_by_threads(stores):
    """A get blocked in one thread must not hold up a set from another thread on the same object."""
    c = stores.client()
    with ThreadPoolExecutor(8) as ex:
        getters = [ex.submit(c.get, f"k{i}", 10) for i in range(4)]
        time.sleep(0.1)
        setters = [ex.submit(c.set, f"k{i}", str(i).encode()) for i in range(4)]
        assert [f.result(timeout=15) for f in getters] == [b"0", b"1", b"2", b"3"]
        for f in setters:
            f.result(timeout=5)


_CHILD = """
import sys
from pyxccl.rendezvous import FileStore, TCPStore
kind, spec, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = FileStore(spec, timeout=20) if kind == "file" else TCPStore("127.0.0.1", int(spec), is_server=False, timeout=20)
s.add("count", 1)
s.set(f"tmp/{rank}", b"")
s.set(f"hello/{rank}", str(rank).encode())
s.wait(["go"], timeout=20)
print(s.get(f"hello/{(rank + 1) % 4}", timeout=20).decode(), s.check("go"), s.delete_key(f"tmp/{rank}"))
s.close()
"""


def test_clients_in_other_processes(stores):
    main = stores.client()
    env = dict(os.environ, PYTHONPATH=SRC)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, stores.kind, stores.spec, str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(4)]
    try:
        main.wait([f"hello/{r}" for r in range(4)], timeout=30)
        assert main.get("count", timeout=5) == b"4"     # each child counted before it said hello
        main.set("go", b"")
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * 4, [e for _, e in outs]
    assert sorted(o.split()[0] for o, _ in outs) == ["0", "1", "2", "3"]
    assert all(o.split()[1:] == ["True", "True"] for o, _ in outs)
    assert not any(main.check(f"tmp/{r}") for r in range(4))


# --- TCP server robustness -----------------------------------------------------------------------------

def test_tcp_64_concurrent_clients():
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=10)
    try:
        def one(i):
            with TCPStore("127.0.0.1", server.port, is_server=False, timeout=10) as c:
                c.set(f"k{i}", b"v")
                c.add("n", 1)
                return c.get(f"k{(i + 1) % 64}", timeout=10)
        with ThreadPoolExecutor(64) as ex:
            assert list(ex.map(one, range(64), timeout=30)) == [b"v"] * 64
        assert server.get("n", timeout=5) == b"64"
    finally:
        server.close()


def _opened(port: int) -> socket.socket:
    """A raw connection to the store, past its opening (greeting read, hello sent): ready for requests."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    status, n = struct.unpack("<BQ", raw.recv(9, socket.MSG_WAITALL))
    assert status == 0 and len(raw.recv(n, socket.MSG_WAITALL)) == n
    raw.sendall(b"PXS1open")
    return raw


def test_tcp_server_survives_garbage_and_abrupt_clients():
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    try:
        with _opened(server.port) as raw:
            raw.sendall(b"\xff" * 64)              # unknown op: the server drops this client
            try:
                assert raw.recv(1) == b""          # ... and closes the connection
            except ConnectionResetError:           # (a reset, since our unread bytes were left behind)
                pass
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(b"\x01\x00\x00")           # no hello: junk, then gone
        with _opened(server.port) as raw:
            raw.sendall(b"\x01\x00\x00")           # truncated request, then gone
        with _opened(server.port) as raw:
            # a SET announcing a 1 GiB value, then gone: must not make the server allocate it
            raw.sendall(struct.pack("<BI", 1, 1) + b"k" + struct.pack("<Q", (1 << 30) - 1) + b"abc")
        with _opened(server.port) as raw:
            raw.sendall(struct.pack("<BI", 2, 3) + b"key" + struct.pack("<Q", 3) + b"bad")   # GET, bad timeout
        with _opened(server.port) as raw:
            # a blocking GET whose client disappears while it waits
            raw.sendall(struct.pack("<BI", 2, 4) + b"nope" + struct.pack("<Q", 8) + struct.pack("<d", 30.0))
        server.set("still", b"ok")
        with TCPStore("127.0.0.1", server.port, is_server=False, timeout=5) as other:
            assert other.get("still", timeout=5) == b"ok"
            assert other.add("n", 2) == 2
    finally:
        server.close()


def test_tcp_close_stops_the_server():
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    client = TCPStore("127.0.0.1", server.port, is_server=False, timeout=5)
    port = server.port
    blocked = ThreadPoolExecutor(1).submit(client.get, "never", 30)
    time.sleep(0.1)
    server.close()
    with pytest.raises(RendezvousError):
        blocked.result(timeout=10)                  # a waiting client learns at once
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with pytest.raises(RendezvousError, match="closed"):
        server.set("k", b"v")
    client.close()


def test_tcp_client_waits_for_a_late_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    servers = []
    timer = threading.Timer(0.5, lambda: servers.append(TCPStore("127.0.0.1", port, is_server=True, timeout=5)))
    timer.start()
    try:
        with TCPStore("127.0.0.1", port, is_server=False, timeout=10) as c:
            c.set("k", b"v")
        timer.join(5)
        assert servers[0].get("k", timeout=5) == b"v"
    finally:
        timer.join(5)
        for s in servers:
            s.close()


def test_client_without_server_gives_up_with_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(RendezvousError, match="MASTER_ADDR") as e:
        TCPStore("127.0.0.1", free, is_server=False, timeout=0.5)
    assert str(free) in str(e.value) and time.monotonic() - t < 5


def test_server_port_in_use_is_a_rendezvous_error():
    with TCPStore("127.0.0.1", 0, is_server=True, timeout=5) as first:
        with pytest.raises(RendezvousError, match="MASTER_PORT"):
            TCPStore("127.0.0.1", first.port, is_server=True, timeout=5)


# --- PrefixStore ---------------------------------------------------------------------------------------

def test_prefix_store_isolates_keys(stores):
    base = stores.client()
    p, q = PrefixStore("job1", base), PrefixStore("job2", base)
    p.set("k", b"1")
    assert not q.check("k") and p.get("k", timeout=5) == b"1" and base.get("job1/k", timeout=5) == b"1"
    assert p.add("c", 2) == 2 and q.add("c", 5) == 5
    q.set("k", b"2")
    p.wait(["k", "c"], timeout=5)
    assert p.get("k", timeout=5) == b"1" and q.get("k", timeout=5) == b"2"
    assert p.delete_key("k") and q.check("k")
    with pytest.raises(RendezvousError, match="job1/k"):
        p.get("k", timeout=0.1)
    nested = PrefixStore("inner", p)
    nested.set("x", b"y")
    assert base.get("job1/inner/x", timeout=5) == b"y"
    p.close()                                       # the shared store stays usable
    assert base.check("job1/inner/x")


# --- create_store ----------------------------------------------------------------------------------------

def test_create_store_urls(tmp_path, monkeypatch):
    s = create_store(f"file://{tmp_path}/d", rank=0, world_size=2, timeout=5)
    assert isinstance(s, FileStore) and s.path == f"{tmp_path}/d"
    server = create_store("tcp://127.0.0.1:0", rank=0, world_size=1, timeout=5)
    assert isinstance(server, TCPStore) and server.port > 0
    try:
        client = create_store(f"tcp://127.0.0.1:{server.port}", rank=1, world_size=2, timeout=5)
        client.set("a", b"b")
        client.close()
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(server.port))
        for url in ("env://", None):
            client = create_store(url, rank=1, world_size=2, timeout=5)
            assert client.get("a", timeout=5) == b"b"
            client.close()
    finally:
        server.close()


@pytest.mark.parametrize("url, match", [
    ("udp://x:1", "unknown init_method"),
    ("tcp://hostonly", "tcp://host:port"),
    ("tcp://h:notaport", "tcp://host:port"),
    ("file://relative/dir", "three"),
    ("tcp://127.0.0.1:0", "port 0"),                  # other ranks could not find a random port
])
def test_create_store_bad_urls(url, match):
    with pytest.raises(InvalidArgumentError, match=match) as e:
        create_store(url, rank=1, world_size=2, timeout=1)
    assert e.value.rank == 1 and "rank 1" in str(e.value)


def test_create_store_env_needs_master(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(InvalidArgumentError, match="MASTER_PORT"):
        create_store("env://", rank=0, world_size=1, timeout=1)
    monkeypatch.setenv("MASTER_PORT", "http")
    with pytest.raises(InvalidArgumentError, match="MASTER_PORT"):
        create_store("env://", rank=0, world_size=1, timeout=1)
    with pytest.raises(InvalidArgumentError, match="rank"):
        create_store("env://", rank=2, world_size=2, timeout=1)


def test_create_store_unreachable_names_the_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(RendezvousError, match="rank 3") as e:
        create_store(f"tcp://127.0.0.1:{free}", rank=3, world_size=4, timeout=0.3)
    assert e.value.rank == 3


def test_release_closes_idle_connections_and_the_next_call_reopens():
    """A started job releases its store connections (pyxccl.init): the server then holds none of this
    client's, and a later call (shrink's, a new init's) connects again."""
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=10)
    client = TCPStore("127.0.0.1", server.port, is_server=False, timeout=10)
    try:
        client.set("k", b"v")
        assert server.get("k") == b"v"
        deadline = time.monotonic() + 10
        held = lambda: len(server._server._clients)      # noqa: SLF001  (what the server holds)
        assert held() == 2
        client.release()
        server.release()
        while held() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held() == 0
        assert client.get("k") == b"v" and held() == 1
    finally:
        client.close()
        server.close()
