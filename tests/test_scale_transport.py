"""The transport at scale (issue 26): one progress thread per mesh whatever the world size,
connections made on first use (a job holds the descriptors of the peers it used), two ranks
dialing each other at once keep one connection, and a dead or silent peer at first use is named
within the deadline."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

import pyxccl
import scalefns as sf
from pyxccl.launcher import free_port
from pyxccl.rendezvous import PrefixStore
from pyxccl.rendezvous.tcp import TCPStore
from pyxccl.testing import RankPool
from pyxccl.transport.mesh import build_mesh

pytestmark = pytest.mark.timeout(300)
_tags = iter(range(1 << 30))
_FIXED_FDS = 24         # a world's descriptors that do not grow with it: listeners, selector, store, segment...


def _tag(what: str) -> str:
    return f"scale-{what}-{next(_tags)}"


def _kind(thread_name: str) -> str:
    """A thread's job, from its name: the mesh's progress loop, a communicator's worker, or what it says."""
    return "progress" if "progress" in thread_name else "worker" if "comm" in thread_name else thread_name


def _threads_and_connections(pool, transport):
    """A fresh world on every rank of ``pool``: the threads it added per process (checked: the same on
    every rank), with its connections and descriptors bounded by the peers it used."""
    out = pool.run(sf.threads_and_connections, _tag("threads"), transport=transport, timeout=200)
    n = len(out)
    per = 3 if transport == "shm" else 1
    for r, res in enumerate(out):
        assert res["after_ring"] <= res["at_init"] + 2, (r, res)
        assert res["after_all"] == n - 1, f"rank {r}: an alltoall left {res['after_all']} peers connected"
        assert sum(res["conns"].values()) == n - 1 and set(res["conns"]) == {transport}, res["conns"]
        # The world's fixed descriptors (listeners, the loop's selector and wake-up pair, its store
        # connection, the segment) and one per connected peer (TCP) or three (shared memory: the
        # socket and the two rings' memfds, of which Python's mmap keeps a duplicate).
        fds0, _, _, fds3 = res["fds"]
        assert fds3 - fds0 <= per * (n - 1) + _FIXED_FDS, (r, res["fds"])
    return [res["threads"] for res in out]


@pytest.mark.parametrize("n", (2, 3, 5))
def test_connections_are_made_for_the_peers_used(pools, transport, n):
    """A ring's pattern connects each rank to its two neighbours only, and adds their descriptors;
    an all-to-all pattern then connects every pair."""
    out = pools(n).run(sf.ring_then_all, _tag("ring"), transport=transport, timeout=120)
    per = 3 if transport == "shm" else 1
    for r, res in enumerate(out):
        neighbours = sorted({(r - 1) % n, (r + 1) % n})
        assert res["ring"] == neighbours, (r, res)
        assert res["every"] == [p for p in range(n) if p != r], (r, res)
        fds0, fds1, fds2 = res["fds"]
        assert fds1 - fds0 == per * len(neighbours), (r, res)
        assert fds2 - fds1 == per * (n - 1 - len(neighbours)), (r, res)


@pytest.mark.parametrize("transport_", ("tcp", "shm"))
def test_threads_per_process_do_not_grow_with_the_world(transport_):
    """2, 4, 8 and 16 ranks: a world adds the same threads to each process (its progress loop and its
    communicator's worker), and connects only the peers its calls use."""
    seen = {}
    for n in (2, 4, 8, 16):
        with RankPool(n, transports=(transport_,)) as pool:
            threads = _threads_and_connections(pool, transport_)
        names = {tuple(sorted(_kind(t) for t in ts)) for ts in threads}
        assert len(names) == 1, f"{n} ranks: the ranks added different threads: {threads}"
        seen[n] = names.pop()
    assert len(set(seen.values())) == 1, f"threads per process changed with the world size: {seen}"
    assert seen[2] == ("progress", "worker"), seen[2]


@pytest.mark.parametrize("transport_", ("tcp", "shm"))
def test_64_ranks_hold_one_progress_thread_each(transport_):
    with RankPool(64, transports=(transport_,), timeout=120) as pool:
        threads = _threads_and_connections(pool, transport_)
    assert all(sorted(_kind(t) for t in ts) == ["progress", "worker"] for ts in threads), threads


@pytest.mark.parametrize("n", (2, 4))
def test_ranks_dialing_each_other_at_once_keep_one_connection(pools, transport, n):
    """Every rank asks for every peer at once from two threads, 25 times: each pair keeps exactly one
    connection (the same socket on both sides), and it carries the messages both ways."""
    fails = pools(n).run(sf.dial_each_other, 25, _tag("dial"), transport=transport, timeout=250)
    assert fails == [[]] * n, fails


def _one_rank_mesh(monkeypatch, other: dict):
    """Rank 0 of a 2-rank job whose rank 1 is ``other`` (its published address), over a TCP store."""
    monkeypatch.setenv("PYXCCL_SECRET", "scale")
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=10)
    st = PrefixStore("job", store)
    st.set("addr/1", json.dumps(dict({"host": "elsewhere", "unix": "pyxccl-nobody", "pid": 1, "cores": 1,
                                      "nsocks": 1, "numa": 0}, **other)).encode())
    mesh = build_mesh(st, 0, 2, transport="tcp", master_addr="127.0.0.1", timeout=3)
    return mesh, store


def test_a_dead_peer_at_first_use_is_named_at_once(monkeypatch):
    port = free_port()              # nothing listens there
    mesh, store = _one_rank_mesh(monkeypatch, {"tcp": ["127.0.0.1", port]})
    try:
        assert mesh.connections() == {}
        t0 = time.monotonic()
        with pytest.raises(pyxccl.PeerLostError) as e:
            mesh.peer(1)
        assert time.monotonic() - t0 < 3          # refused: no waiting for the deadline
        assert e.value.rank == 0 and e.value.peer == 1 and f"127.0.0.1:{port}" in str(e.value), e.value
        assert mesh.mailbox.lost(1) is not None   # receives from it fail now too
    finally:
        mesh.close()
        store.close()


def test_a_silent_peer_at_first_use_is_named_within_the_deadline(monkeypatch):
    silent = socket.create_server(("127.0.0.1", 0))    # accepts (the kernel does), never answers
    mesh, store = _one_rank_mesh(monkeypatch, {"tcp": list(silent.getsockname())})
    try:
        with pytest.raises(pyxccl.RendezvousError) as e:
            mesh.peer(1)
        assert e.value.peer == 1 and "rank 0" in str(e.value) and "rank 1" in str(e.value), e.value
        assert "{}:{}".format(*silent.getsockname()) in str(e.value), e.value
    finally:
        mesh.close()
        store.close()
        silent.close()


def test_a_silent_stranger_holds_up_no_connection(monkeypatch, caplog):
    """A stranger connects to rank 0 and says nothing; rank 1 connects and its messages flow at once,
    the stranger is dropped after the handshake deadline, and closing leaves no thread behind."""
    import logging
    import numpy as np
    from pyxccl.transport.mailbox import RecvRequest
    caplog.set_level(logging.WARNING, logger="pyxccl")
    monkeypatch.setenv("PYXCCL_SECRET", "scale")
    monkeypatch.setattr("pyxccl.transport.mesh._HANDSHAKE_SECONDS", 0.5)
    store = TCPStore("127.0.0.1", 0, is_server=True, timeout=10)
    meshes = [None, None]

    def make(r):
        meshes[r] = build_mesh(PrefixStore("job", store), r, 2, transport="tcp", master_addr="127.0.0.1",
                               timeout=10)
    ts = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    try:
        addr = tuple(json.loads(PrefixStore("job", store).get("addr/0"))["tcp"])
        stranger = socket.create_connection(addr)
        req = RecvRequest(1, (1, 2, 3), np.zeros(3, np.float64))
        meshes[0].mailbox.post(req)
        meshes[1].peer(0).send((1, 2, 3), 0, np.array([1.0, 2.0, 3.0]).view(np.uint8), time.monotonic() + 5)
        assert req.event.wait(5) and req.error is None and list(req.dst) == [1.0, 2.0, 3.0]
        assert stranger.recv(1) == b"", "the silent stranger was kept"
        stranger.close()
        assert any("silent for 0.5 s" in r.getMessage() for r in caplog.records)
        assert meshes[0].connections() == {"tcp": 1} and meshes[1].connections() == {"tcp": 1}
    finally:
        for m in meshes:
            if m is not None:
                m.close()
        store.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("pyxccl-progress")]
