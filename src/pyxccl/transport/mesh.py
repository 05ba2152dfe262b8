"""The mesh: this process's connections to every other rank of a job.

Made once per ``pyxccl.init()``: each rank listens (TCP, and an abstract Unix
socket for shared memory), publishes its addresses in the store, then every
pair connects (the higher rank dials the lower). The transport of a pair is
shared memory when both ranks report the same host identity, TCP otherwise
(``PYXCCL_TRANSPORT=tcp|shm|auto`` forces one). All communicators split from
the world share the mesh; messages carry the communicator id.

Every connection starts with the job's HMAC handshake (``pyxccl.transport.auth``): a
connection that fails it is logged and dropped, and never reaches a
transport. Listening sockets bind to this rank's chosen address only.
"""
from __future__ import annotations

import json
import os
import secrets
import select
import socket
import threading
import time

from . import auth
from .._errors import InvalidArgumentError, RendezvousError
from .mailbox import Mailbox
from .topology import host_id, job_cpus, local_address, numa_node
from .shm import ShmPeer
from .tcp import TcpPeer

_HANDSHAKE_SECONDS = 10.0     # a connection that has not proved itself by then is dropped


class SelfPeer:
    """Messages a rank sends to itself go straight to its mailbox."""
    kind = "self"

    def __init__(self, rank: int, mailbox: Mailbox):
        self.rank, self.mailbox = rank, mailbox

    def send(self, key, dtype_code, payload, deadline, call=None) -> None:
        self.mailbox.deliver(self.rank, key, dtype_code, payload.nbytes, 0, payload, call)

    def close(self) -> None:
        pass


class Mesh:
    """This process's connections, and the communicators that use them.

    A communicator's context registers with ``attach`` and is told of a lost peer
    (``peer_lost(world_rank, error)``) and of errors found in its calls by this rank's
    receiver threads or by another rank (``failed(error, remote)``): the mesh never
    looks inside it.
    """

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.mailbox = Mailbox(rank)
        self.mailbox.on_comm_error = self._comm_error
        self.mailbox.on_progress = self._progress
        self.peers: dict[int, object] = {rank: SelfPeer(rank, self.mailbox)}
        self.hosts: list[str] = []
        self.cores: list[int] = [job_cpus()]
        self.numa: list[int] = [numa_node()]
        self.kinds: list[list[str]] = []    # transport kind between every pair of world ranks
        self.machine = None                 # link figures, once measured (pyxccl/probe.py)
        self._contexts: dict[int, object] = {}     # communicator id -> its context
        self._graceful: set[int] = set()
        self._closed = False
        self.store = None                   # the store it was made through, for shrink()
        self.how = ("auto", None)           # (transport, master address) it was made with
        self.shrinks = 0

    def peer(self, world_rank: int):
        return self.peers[world_rank]

    def kind_between(self, a: int, b: int) -> str:
        """The transport two other ranks use between them (same rule as for this rank's peers)."""
        return self.kinds[a][b] if self.kinds else "tcp"

    def graceful(self, peer) -> bool:
        return peer in self._graceful

    def attach(self, comm_id: int, ctx) -> None:
        self._contexts[comm_id] = ctx

    def detach(self, comm_id: int) -> None:
        self._contexts.pop(comm_id, None)
        self.mailbox.calls(comm_id, None)

    def on_lost(self, peer: int, err: BaseException, graceful: bool = False) -> None:
        if graceful:
            self._graceful.add(peer)
        self.mailbox.peer_lost(peer, err)
        if not graceful:
            for ctx in list(self._contexts.values()):
                ctx.peer_lost(peer, err)

    def _progress(self, comm_id: int, peer: int, seq: int) -> None:
        ctx = self._contexts.get(comm_id)
        if ctx is not None:
            ctx.progress_asked(peer, seq)

    def _comm_error(self, comm_id: int, err: BaseException, remote: bool) -> None:
        ctx = self._contexts.get(comm_id)
        if ctx is not None:
            ctx.failed(err, remote)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self.peers.values():
            p.close()
        self._contexts.clear()      # no cycles left through the mesh: closing frees it, not the GC


def build_mesh(store, rank: int, size: int, *, transport: str, master_addr: str | None,
               timeout: float) -> Mesh:
    """Connect this rank to every other rank through ``store`` (see the module docstring)."""
    if transport not in ("auto", "tcp", "shm"):
        raise InvalidArgumentError(f"rank {rank}: PYXCCL_TRANSPORT={transport!r}; use tcp, shm or auto",
                                   rank=rank, op="init")
    mesh = Mesh(rank, size)
    deadline = time.monotonic() + timeout
    secret = auth.job_secret(store, rank, timeout)
    if rank == 0:
        job = secrets.token_hex(8)
        store.set("pyxccl/job", job.encode())
    else:
        job = store.get("pyxccl/job", timeout=timeout).decode()
    me = host_id()
    addr = local_address(master_addr, rank=rank)
    tcp_l = socket.create_server((addr, 0), backlog=max(16, size))
    unix_name = f"\0pyxccl-{job}-{rank}"
    unix_l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_l.bind(unix_name)
    unix_l.listen(max(16, size))
    nsocks = _nsocks(rank)
    errors: list[BaseException] = []
    lock = threading.Lock()
    want: dict[tuple, str] = {}      # (rank, channel) that dial us, and over what (once addresses are known)
    arrived: dict[int, dict] = {}    # rank -> {channel: connection}, until all its channels are in
    channels = {"shm": 1, "tcp": 1}  # connections per peer pair; TCP: rank 0's PYXCCL_NSOCKS

    def make(kind: str, peer: int, socks: list):
        if kind == "shm":
            return ShmPeer(rank, peer, mesh.mailbox, mesh.on_lost, socks[0])
        return TcpPeer(rank, peer, mesh.mailbox, mesh.on_lost, socks[0], lanes=socks[1:])
    known = threading.Event()
    all_in = threading.Event()       # every peer's transport is made (or one failed)
    if size == 1:
        all_in.set()

    def admit(conn: socket.socket, kind: str) -> None:
        # Each connection proves itself on its own thread: a stranger who connects and stays
        # silent must not hold up the ranks behind it.
        conn.settimeout(min(_HANDSHAKE_SECONDS, max(0.1, deadline - time.monotonic())))
        try:
            peer, channel = auth.accept(conn, secret)
            known.wait(max(0.1, deadline - time.monotonic()))
            with lock:
                if want.get((peer, channel)) != kind:
                    raise auth.AuthError(f"rank {peer} over {kind} (connection {channel}) was not expected (a "
                                         f"duplicate, or not a rank above {rank} of this {size}-rank job)")
                del want[(peer, channel)]
                got = arrived.setdefault(peer, {})
                got[channel] = conn
                if any((peer, c) in want for c in range(channels[kind])):
                    return           # the peer's last connection makes the transport
        except (OSError, auth.AuthError) as e:
            auth.refused(f"rank {rank}", conn, e)
            conn.close()
            return
        socks = [got[c] for c in sorted(got)]
        try:
            made = make(kind, peer, socks)
            for c in socks:
                c.settimeout(None)
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)
            for c in socks:
                c.close()
            all_in.set()             # wake the main thread: this job cannot start
            return
        with lock:
            mesh.peers[peer] = made
            if len(mesh.peers) == size:
                all_in.set()

    def accept_all():
        kind_of = {tcp_l: "tcp", unix_l: "shm"}
        try:
            while not all_in.is_set():
                ready, _, _ = select.select([tcp_l, unix_l], [], [], 0.1)
                for lst in ready:
                    conn, _ = lst.accept()
                    threading.Thread(target=admit, args=(conn, kind_of[lst]), daemon=True,
                                     name=f"pyxccl-admit-{rank}").start()
        except (OSError, ValueError) as e:     # the listeners were closed under us: we are giving up
            errors.append(e)

    acceptor = threading.Thread(target=accept_all, daemon=True, name=f"pyxccl-accept-{rank}")
    acceptor.start()
    try:
        store.set(f"addr/{rank}", json.dumps({"host": me, "tcp": [addr, tcp_l.getsockname()[1]],
                                              "unix": unix_name[1:], "pid": os.getpid(),
                                              "cores": job_cpus(), "nsocks": nsocks,
                                              "numa": numa_node()}).encode())
        infos = [json.loads(store.get(f"addr/{r}", timeout=max(0.1, deadline - time.monotonic())))
                 for r in range(size)]
        mesh.hosts = [i["host"] for i in infos]
        mesh.cores = [i["cores"] for i in infos]
        mesh.numa = [i["numa"] for i in infos]
        mesh.kinds = [["self" if a == b else "shm" if mesh.hosts[a] == mesh.hosts[b] and transport != "tcp"
                       else "tcp" for b in range(size)] for a in range(size)]
        for p in range(size):
            if transport == "shm" and mesh.hosts[p] != me:
                raise RendezvousError(
                    f"rank {rank}: PYXCCL_TRANSPORT=shm but rank {p} is on host {mesh.hosts[p]!r} and this "
                    f"rank on {me!r}; use PYXCCL_TRANSPORT=auto or tcp across hosts", rank=rank, peer=p, op="init")
        channels["tcp"] = infos[0].get("nsocks", 1)
        with lock:
            want.update({(p, c): mesh.kinds[rank][p] for p in range(rank + 1, size)
                         for c in range(channels[mesh.kinds[rank][p]])})
        known.set()
        for p in range(rank):
            kind = mesh.kinds[rank][p]
            socks = []
            for channel in range(channels[kind]):
                socks.append(_dial(kind, infos[p], deadline))
                try:
                    auth.dial(socks[-1], secret, rank, channel)
                except (OSError, auth.AuthError) as e:
                    for c in socks:
                        c.close()
                    where = "{}:{}".format(*infos[p]["tcp"]) if kind == "tcp" else "its unix socket"
                    raise RendezvousError(
                        f"rank {rank}: the handshake with rank {p} at {where} failed ({e}); check that every "
                        f"rank has the same PYXCCL_SECRET (or none)", rank=rank, peer=p, op="init") from None
            made = make(kind, p, socks)
            for c in socks:
                c.settimeout(None)
            with lock:
                mesh.peers[p] = made
                if len(mesh.peers) == size:
                    all_in.set()
        all_in.wait(max(0.1, deadline - time.monotonic()))
        if errors or len(mesh.peers) != size:
            with lock:
                missing = [p for p in range(size) if p not in mesh.peers]
            raise RendezvousError(
                f"rank {rank}: ranks {missing} did not connect before the deadline "
                f"({errors[0] if errors else 'timeout'}); check that every rank was started with the same "
                f"world size and store", rank=rank, peer=missing[0] if missing else None, op="init")
    except BaseException:
        mesh.close()
        raise
    finally:
        all_in.set()            # stops the acceptor; shutting a listener down wakes its select at once
        for lst in (tcp_l, unix_l):
            try:
                lst.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        acceptor.join(timeout=1)    # it holds the mesh: a close() must leave no thread behind
        tcp_l.close()
        unix_l.close()
    for p, peer in mesh.peers.items():
        if p != rank:
            peer.host = "{} ({})".format(infos[p]["host"].split("/")[0], infos[p]["tcp"][0])
            peer.start()
    return mesh


def _nsocks(rank: int) -> int:
    v = os.environ.get("PYXCCL_NSOCKS", "1")
    if not v.isdigit() or not 1 <= int(v) <= 16:
        raise InvalidArgumentError(f"rank {rank}: PYXCCL_NSOCKS={v!r}; use a number of connections per peer "
                                   f"pair from 1 to 16", rank=rank, op="init")
    return int(v)


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
