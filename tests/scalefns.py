"""Rank functions of test_scale_transport.py (run on every rank of a pool, rankfns style): a fresh
world or a bare mesh made beside the pool's, so what it connects is this test's alone."""
from __future__ import annotations

import os
import threading
import time

import numpy as np

def _fresh(comm, tag: str):
    """A new world over the pool's store (its own key space), without link measurements."""
    import pyxccl
    from pyxccl.rendezvous import PrefixStore, TCPStore
    store = TCPStore("127.0.0.1", int(os.environ["PYXCCL_POOL_STORE_PORT"]), is_server=False)
    old = os.environ.get("PYXCCL_TUNE")
    os.environ["PYXCCL_TUNE"] = "0"
    try:
        fresh = pyxccl.init(comm.rank, comm.size, store=PrefixStore(tag, store),
                            transport=comm.transport((comm.rank + 1) % comm.size), timeout=60)
    finally:
        if old is None:
            os.environ.pop("PYXCCL_TUNE", None)
        else:
            os.environ["PYXCCL_TUNE"] = old
    return fresh, store


def _ours() -> set:
    return {t for t in threading.enumerate() if t.name.startswith("pyxccl") or t.name.startswith("comm")}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1


def _connected(comm) -> int:
    return sum(comm.connections().values())


def threads_and_connections(comm, tag: str) -> dict:
    """A fresh world: the threads it added to this process (after an allreduce and a ring allreduce),
    how many peers it is connected to after init, after a ring allreduce over messages, after an
    alltoall, and the descriptors each step added."""
    before = _ours()
    fds0 = _fds()
    fresh, store = _fresh(comm, tag)
    try:
        n, r = fresh.size, fresh.rank
        x = np.ones(4096, np.float32)
        fresh.allreduce(x)
        assert x[0] == n, x[:4]
        fresh.barrier()
        at_init, fds1 = _connected(fresh), _fds()
        y = np.full(1 << 16, r, np.float32)
        fresh.allreduce(y, algorithm="ring")
        assert y[0] == n * (n - 1) / 2, y[:4]
        fresh.barrier()
        after_ring, fds2 = _connected(fresh), _fds()
        a = np.arange(n * 8, dtype=np.int64) + 1000 * r
        out = np.empty_like(a)
        fresh.alltoall(a, out)
        want = np.concatenate([np.arange(r * 8, r * 8 + 8) + 1000 * s for s in range(n)])
        assert np.array_equal(out, want), (out, want)
        fresh.barrier()
        after_all, fds3 = _connected(fresh), _fds()
        added = sorted(t.name for t in _ours() - before)
        conns = fresh.connections()
    finally:
        fresh.close()
        store.close()
    return dict(threads=added, at_init=at_init, after_ring=after_ring, after_all=after_all,
                fds=(fds0, fds1, fds2, fds3), conns=conns)


def dial_each_other(comm, rounds: int, tag: str) -> list[str]:
    """Bare meshes of the pool's ranks, ``rounds`` times: every rank's two threads ask for every peer at
    once (so pairs dial each other at the same moment), then each sends every peer a message and
    receives one from each. Exactly one connection per pair must survive, carrying the messages."""
    from pyxccl.rendezvous import PrefixStore, TCPStore
    from pyxccl.transport.mailbox import RecvRequest
    from pyxccl.transport.mesh import build_mesh
    fails = []
    store = TCPStore("127.0.0.1", int(os.environ["PYXCCL_POOL_STORE_PORT"]), is_server=False)
    transport = comm.transport((comm.rank + 1) % comm.size)
    n, r = comm.size, comm.rank
    try:
        for i in range(rounds):
            mesh = build_mesh(PrefixStore(f"{tag}/{i}", store), r, n, transport=transport, master_addr=None,
                              timeout=30)
            try:
                reqs = {p: RecvRequest(p, (7, 1, i), np.zeros(4, np.int64)) for p in range(n) if p != r}
                for req in reqs.values():
                    mesh.mailbox.post(req)
                comm.barrier()                  # every mesh is listening: now all at once
                got, errors = {}, []

                def ask():
                    try:
                        for p in [*range(r + 1, n), *range(r)]:
                            got.setdefault(p, set()).add(id(mesh.peer(p)))
                    except BaseException as e:  # noqa: BLE001
                        errors.append(e)
                ts = [threading.Thread(target=ask) for _ in range(2)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(60)
                if errors:
                    fails.append(f"round {i}: {errors[0]!r}")
                    break
                for p in got:
                    if len(got[p]) != 1:
                        fails.append(f"round {i}: two peers for rank {p}")
                    mesh.peer(p).send((7, 1, i), 0, np.array([r, p, i, 99], np.int64).view(np.uint8),
                                      time.monotonic() + 30)
                for p, req in reqs.items():
                    if not req.event.wait(30) or req.error is not None:
                        fails.append(f"round {i}: nothing (or {req.error!r}) from rank {p}")
                    elif list(req.dst) != [p, r, i, 99]:
                        fails.append(f"round {i}: wrong message from rank {p}: {list(req.dst)}")
                # One connection per pair on both sides: this side's socket is the other's.
                ends = {p: _ends(mesh.peer(p)) for p in range(n) if p != r}
                if sorted(mesh.connections().values()) != [n - 1]:
                    fails.append(f"round {i}: connections {mesh.connections()}")
                theirs = comm.allgather_object(ends)
                for p in ends:
                    if theirs[p][r] != ends[p][::-1]:
                        fails.append(f"round {i}: rank {p}'s connection {theirs[p][r]} is not ours {ends[p]}")
                comm.barrier()
            finally:
                mesh.close()
            if fails:
                break
    finally:
        store.close()
    return fails


def _ends(peer) -> tuple:
    """(this end, the other end) of a peer's first socket, comparable across ranks."""
    s = peer.sock
    if s.family == 1:           # AF_UNIX: the acceptor's end has the listener's name, the dialer's none
        return (str(s.getsockname()), str(s.getpeername()))
    return (tuple(s.getsockname()), tuple(s.getpeername()))


def ring_then_all(comm, tag: str) -> dict:
    """A bare mesh: every rank sends to its right neighbour and receives from its left (a ring's
    pattern), then sends to and receives from every rank. The peers connected and the descriptors
    added after each step."""
    from pyxccl.rendezvous import PrefixStore, TCPStore
    from pyxccl.transport.mailbox import RecvRequest
    from pyxccl.transport.mesh import build_mesh
    store = TCPStore("127.0.0.1", int(os.environ["PYXCCL_POOL_STORE_PORT"]), is_server=False)
    n, r = comm.size, comm.rank
    mesh = build_mesh(PrefixStore(tag, store), r, n, transport=comm.transport((r + 1) % n), master_addr=None,
                      timeout=30)

    def exchange(step: int, to: list[int], frm: list[int]) -> None:
        reqs = [RecvRequest(p, (9, step, 0), np.zeros(2, np.int64)) for p in frm]
        for req in reqs:
            mesh.mailbox.post(req)
        comm.barrier()
        for p in to:
            mesh.peer(p).send((9, step, 0), 0, np.array([r, step], np.int64).view(np.uint8), time.monotonic() + 30)
        for p, req in zip(frm, reqs):
            assert req.event.wait(30) and req.error is None and list(req.dst) == [p, step], (p, req.error)
        comm.barrier()
    try:
        fds0 = _fds()
        exchange(1, [(r + 1) % n], [(r - 1) % n])
        ring, fds1 = sorted(p for p in mesh.peers if p != r), _fds()
        others = [p for p in range(n) if p != r]
        exchange(2, others, others)
        every, fds2 = sorted(p for p in mesh.peers if p != r), _fds()
    finally:
        mesh.close()
        store.close()
    return dict(ring=ring, every=every, fds=(fds0, fds1, fds2))
