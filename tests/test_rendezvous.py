"""Stores (TCP and file, one set of behaviour tests for both), prefixes, URL parsing."""
import socket
import threading
import time

import pytest

from pyxccl import InvalidArgumentError, RendezvousError
from pyxccl.rendezvous import FileStore, PrefixStore, TCPStore, create_store

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=("tcp", "file"))
def make_store(request, tmp_path):
    """A factory of clients of one store (the first TCP one also serves it)."""
    made = []

    def make(timeout=10.0):
        if request.param == "file":
            s = FileStore(str(tmp_path / "store"), timeout=timeout)
        elif not made:
            s = TCPStore("127.0.0.1", 0, is_server=True, timeout=timeout)
        else:
            s = TCPStore("127.0.0.1", made[0].port, is_server=False, timeout=timeout)
        made.append(s)
        return s
    yield make
    for s in reversed(made):
        s.close()


def test_set_get_check_delete(make_store):
    a, b = make_store(), make_store()
    a.set("k", b"\x00value")
    assert b.get("k") == b"\x00value"
    assert b.check("k") and not b.check("other")
    assert b.delete_key("k") and not a.check("k")
    assert not a.delete_key("k")


def test_get_blocks_until_another_client_sets(make_store):
    a, b = make_store(), make_store()
    threading.Timer(0.3, lambda: b.set("late", b"x")).start()
    t = time.monotonic()
    assert a.get("late", timeout=5) == b"x"
    assert time.monotonic() - t >= 0.25


def test_get_timeout_names_the_key(make_store):
    a = make_store()
    with pytest.raises(RendezvousError, match="never-set"):
        a.get("never-set", timeout=0.3)


def test_add_is_atomic_across_clients(make_store):
    clients = [make_store() for _ in range(8)]
    threads = [threading.Thread(target=lambda c=c: [c.add("n", 1) for _ in range(4)]) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clients[0].add("n", 0) == 32
    assert clients[0].get("n") == b"32"


def test_wait_for_several_keys(make_store):
    a, b = make_store(), make_store()
    threading.Timer(0.1, lambda: (b.set("x", b"1"), b.set("y", b"2"))).start()
    a.wait(["x", "y"], timeout=5)


def test_prefix_store_isolates_keys(make_store):
    base = make_store()
    p, q = PrefixStore("job1", base), PrefixStore("job2", base)
    p.set("k", b"1")
    assert not q.check("k") and p.get("k") == b"1" and base.get("job1/k") == b"1"
    assert p.add("c", 2) == 2 and q.add("c", 5) == 5


def test_tcp_server_survives_garbage_and_abrupt_clients():
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(b"\xff" * 64)              # unknown op: the server drops this client
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(b"\x01\x00\x00")           # truncated request, then gone
        server.set("still", b"ok")
        other = TCPStore("127.0.0.1", server.port, is_server=False, timeout=5)
        assert other.get("still") == b"ok"
        other.close()
    finally:
        server.close()


def test_client_without_server_gives_up_with_a_clear_error():
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    with pytest.raises(RendezvousError, match="MASTER_ADDR"):
        TCPStore("127.0.0.1", free, is_server=False, timeout=0.5)


def test_create_store_urls(tmp_path, monkeypatch):
    s = create_store(f"file://{tmp_path}/d", rank=0, world_size=2, timeout=5)
    assert isinstance(s, FileStore)
    server = create_store("tcp://127.0.0.1:0", rank=0, world_size=1, timeout=5)
    assert isinstance(server, TCPStore) and server.port > 0
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    client = create_store("env://", rank=1, world_size=2, timeout=5)
    client.set("a", b"b")
    assert server.get("a") == b"b"
    client.close()
    server.close()
    with pytest.raises(InvalidArgumentError, match="unknown init_method"):
        create_store("udp://x:1", rank=0, world_size=1, timeout=1)
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(InvalidArgumentError, match="MASTER_PORT"):
        create_store("env://", rank=0, world_size=1, timeout=1)
