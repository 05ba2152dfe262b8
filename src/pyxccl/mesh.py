"""The mesh: this process's connections to every other rank of a job.

Made once per ``pyxccl.init()``: each rank listens (TCP, and an abstract Unix
socket for shared memory), publishes its addresses in the store, then every
pair connects (the higher rank dials the lower). The transport of a pair is
shared memory when both ranks report the same host identity, TCP otherwise
(``PYXCCL_TRANSPORT=tcp|shm|auto`` forces one). All communicators split from
the world share the mesh; messages carry the communicator id.
"""
from __future__ import annotations

import json
import os
import secrets
import select
import socket
import struct
import threading
import time

from ._errors import InvalidArgumentError, RendezvousError
from .mailbox import Mailbox
from .topology import host_id, local_address, numa_node
from .transport.base import recv_bytes
from .transport.shm import ShmPeer
from .transport.tcp import TcpPeer

_HELLO = struct.Struct("<8s16sI")
_HELLO_MAGIC = b"pyxccl01"


class SelfPeer:
    """Messages a rank sends to itself go straight to its mailbox."""
    kind = "self"

    def __init__(self, rank: int, mailbox: Mailbox):
        self.rank, self.mailbox = rank, mailbox

    def send(self, key, dtype_code, payload, deadline) -> None:
        self.mailbox.deliver(self.rank, key, dtype_code, payload.nbytes, 0, payload)

    def close(self) -> None:
        pass


class Mesh:
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.mailbox = Mailbox(rank)
        self.peers: dict[int, object] = {rank: SelfPeer(rank, self.mailbox)}
        self.hosts: list[str] = []
        self.cores: list[int] = [len(os.sched_getaffinity(0))]
        self.numa: list[int] = [numa_node()]
        self.kinds: list[list[str]] = []    # transport kind between every pair of world ranks
        self.machine = None                 # link figures, once measured (tuning.probe)
        self.comms: set = set()
        self._graceful: set[int] = set()
        self._closed = False

    def peer(self, world_rank: int):
        return self.peers[world_rank]

    def kind_between(self, a: int, b: int) -> str:
        """The transport two other ranks use between them (same rule as for this rank's peers)."""
        return self.kinds[a][b] if self.kinds else "tcp"

    def graceful(self, peer) -> bool:
        return peer in self._graceful

    def on_lost(self, peer: int, err: BaseException, graceful: bool = False) -> None:
        if graceful:
            self._graceful.add(peer)
        self.mailbox.peer_lost(peer, err)
        if not graceful:
            for c in list(self.comms):
                if peer in c._world_ranks:
                    c._abort(err)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self.peers.values():
            p.close()


def build_mesh(store, rank: int, size: int, *, transport: str, master_addr: str | None,
               timeout: float) -> Mesh:
    """Connect this rank to every other rank through ``store`` (see the module docstring)."""
    if transport not in ("auto", "tcp", "shm"):
        raise InvalidArgumentError(f"rank {rank}: PYXCCL_TRANSPORT={transport!r}; use tcp, shm or auto",
                                   rank=rank, op="init")
    mesh = Mesh(rank, size)
    deadline = time.monotonic() + timeout
    if rank == 0:
        token = secrets.token_bytes(16)
        store.set("token", token)
    else:
        token = store.get("token", timeout=timeout)
    me = host_id()
    addr = local_address(master_addr)
    tcp_l = socket.create_server((addr, 0), backlog=max(16, size))
    unix_name = f"\0pyxccl-{token.hex()}-{rank}"
    unix_l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_l.bind(unix_name)
    unix_l.listen(max(16, size))
    store.set(f"addr/{rank}", json.dumps({"host": me, "tcp": [addr, tcp_l.getsockname()[1]],
                                          "unix": unix_name[1:], "pid": os.getpid(),
                                          "cores": len(os.sched_getaffinity(0)), "numa": numa_node()}).encode())
    infos = [json.loads(store.get(f"addr/{r}", timeout=max(0.1, deadline - time.monotonic())))
             for r in range(size)]
    mesh.hosts = [i["host"] for i in infos]
    mesh.cores = [i["cores"] for i in infos]
    mesh.numa = [i["numa"] for i in infos]

    def kind(a: int, b: int) -> str:
        if a == b:
            return "self"
        return "shm" if mesh.hosts[a] == mesh.hosts[b] and transport != "tcp" else "tcp"
    mesh.kinds = [[kind(a, b) for b in range(size)] for a in range(size)]

    def kind_for(p: int) -> str:
        if transport == "shm" and mesh.hosts[p] != me:
            raise RendezvousError(
                f"rank {rank}: PYXCCL_TRANSPORT=shm but rank {p} is on host {mesh.hosts[p]!r} and this rank "
                f"on {me!r}; use PYXCCL_TRANSPORT=auto or tcp across hosts", rank=rank, peer=p, op="init")
        return mesh.kinds[rank][p]

    peer_cls = {"shm": ShmPeer, "tcp": TcpPeer}
    errors: list[BaseException] = []

    def accept_all():
        # One loop over both listeners, each connection finished at once: waiting on one
        # kind of connection while a dialer blocks in the other's handshake could deadlock.
        want = {p: kind_for(p) for p in range(rank + 1, size)}
        kind_of = {tcp_l: "tcp", unix_l: "shm"}
        try:
            while want:
                ready, _, _ = select.select([tcp_l, unix_l], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise TimeoutError("timed out")
                for lst in ready:
                    conn, _ = lst.accept()
                    conn.settimeout(min(10.0, max(0.1, deadline - time.monotonic())))
                    try:
                        magic, tok, peer = _HELLO.unpack(recv_bytes(conn, _HELLO.size))
                    except (OSError, ConnectionError):
                        conn.close()
                        continue
                    if magic != _HELLO_MAGIC or tok != token or want.get(peer) != kind_of[lst]:
                        conn.close()     # not a rank of this job, or a duplicate: drop it
                        continue
                    del want[peer]
                    mesh.peers[peer] = peer_cls[kind_of[lst]](rank, peer, mesh.mailbox, mesh.on_lost, conn)
                    conn.settimeout(None)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    acceptor = threading.Thread(target=accept_all, daemon=True, name=f"pyxccl-accept-{rank}")
    acceptor.start()
    try:
        for p in range(rank):
            kind = kind_for(p)
            conn = _dial(kind, infos[p], deadline)
            conn.sendall(_HELLO.pack(_HELLO_MAGIC, token, rank))
            mesh.peers[p] = peer_cls[kind](rank, p, mesh.mailbox, mesh.on_lost, conn)
            conn.settimeout(None)
        acceptor.join(max(0.1, deadline - time.monotonic()))
        if errors or acceptor.is_alive():
            missing = [p for p in range(rank + 1, size) if p not in mesh.peers]
            raise RendezvousError(
                f"rank {rank}: ranks {missing} did not connect before the deadline "
                f"({errors[0] if errors else 'timeout'}); check that every rank was started with the same "
                f"world size and store", rank=rank, peer=missing[0] if missing else None, op="init")
    except BaseException:
        mesh.close()
        raise
    finally:
        tcp_l.close()
        unix_l.close()
    for p, peer in mesh.peers.items():
        if p != rank:
            peer.start()
    return mesh


def _dial(kind: str, info: dict, deadline: float) -> socket.socket:
    while True:
        try:
            if kind == "shm":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect("\0" + info["unix"])
                return s
            s = socket.create_connection(tuple(info["tcp"]), timeout=max(0.1, deadline - time.monotonic()))
            return s
        except OSError as e:
            if time.monotonic() > deadline:
                raise RendezvousError(f"could not connect to {info}: {e}") from None
            time.sleep(0.05)
