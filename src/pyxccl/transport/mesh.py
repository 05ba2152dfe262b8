"""The mesh: this process's connections to the other ranks of a job, made on first use.

Made once per ``pyxccl.init()``: each rank listens (TCP, and an abstract Unix
socket for shared memory), publishes its address in the store and reads every
rank's with one request (``store.multi_get``). No pair connects at init: the
first thread of a rank that sends to a peer dials it (``Mesh.peer``), so a job
holds only the connections its calls use (a ring allreduce its neighbours, an
alltoall every pair). Receiving needs no connection: a receive waits in the
mailbox until the sender dials. The transport of a pair is shared memory when
both ranks report the same host identity, TCP otherwise
(``PYXCCL_TRANSPORT=tcp|shm|auto`` forces one); hosts, cores, NUMA nodes and
the transport of every pair are known at init. All communicators split from
the world share the mesh; messages carry the communicator id.

One progress thread per mesh (``progress.py``) serves every connection's
socket and the listening sockets: it reads frames, and runs the acceptor's
side of each handshake as a non-blocking state machine with a deadline, so a
silent stranger holds nothing up. Every connection starts with the job's HMAC
handshake (``pyxccl.transport.auth``): a connection that fails it is logged and
dropped, and never reaches a transport. Two ranks that dial each other at once
keep one connection, the one the lower rank dialed: the acceptor answers DEFER
when its own dial wins (or the pair is connected already), and the deferred
dialer waits for that connection. A peer lost without a goodbye is news for
every rank: this rank tells the others (a LOST notice), since they may hold no
connection to it. Listening sockets bind to this rank's chosen address only.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import socket
import threading
import time

import numpy as np

from . import auth
from .. import _env
from .._errors import InvalidArgumentError, PeerLostError, RendezvousError
from .fds import ensure_fds
from .mailbox import LOST, Mailbox, lost_error
from .progress import Progress
from .topology import host_id, job_cpus, local_address, numa_node
from .shm import ShmPeer, ring
from .tcp import TcpPeer

log = logging.getLogger("pyxccl")
_HANDSHAKE_SECONDS = 10.0     # a connection that has not proved itself by then is dropped
_NOTHING = np.empty(0, np.uint8)


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
    progress loop or by another rank (``failed(error, remote)``): the mesh never
    looks inside it.
    """

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.mailbox = Mailbox(rank)
        self.mailbox.on_comm_error = self._comm_error
        self.mailbox.on_progress = self._progress
        self.mailbox.on_lost_news = self._lost_news
        self.peers: dict[int, object] = {rank: SelfPeer(rank, self.mailbox)}     # the connections made so far
        self.hosts: list[str] = []
        self.cores: list[int] = [job_cpus()]
        self.numa: list[int] = [numa_node()]
        self.transport = "auto"             # asked for (PYXCCL_TRANSPORT): with hosts, decides every pair's kind
        self.machine = None                 # link figures, once measured (pyxccl/probe.py)
        self._contexts: dict[int, object] = {}     # communicator id -> its context
        self._graceful: set[int] = set()
        self._closed = False
        self.store = None                   # the store it was made through, for shrink()
        self.how = ("auto", None)           # (transport, master address) it was made with
        self.shrinks = 0
        self.timeout = 300.0                # how long a first use may take to connect
        self.progress: Progress | None = None
        self._cv = threading.Condition()    # guards peers, _dialing, _joining, _shaking
        self._dialing: set[int] = set()     # peers a thread of this process dials now
        self._joining: dict[int, dict] = {}     # peer -> {channel: socket}: accepted, not all channels in yet
        self._shaking: dict = {}            # socket -> (its Acceptor, kind, deadline): handshakes under way
        self._listeners: list = []
        self._parked: list | None = []     # proven connections waiting for the addresses (None: known)
        self._infos: list[dict] = []
        self._secret = b""
        self._channels = {"shm": 1, "tcp": 1}

    def peer(self, world_rank: int):
        """The connection to ``world_rank``, dialed now if this is its first use (RendezvousError or
        PeerLostError naming it if that fails within the mesh's deadline)."""
        p = self.peers.get(world_rank)
        if p is not None:
            return p
        if not 0 <= world_rank < self.size:
            raise KeyError(world_rank)
        return self._connect(world_rank)

    def kind_between(self, a: int, b: int) -> str:
        """The transport two ranks use between them (this rank's pairs too), without connecting."""
        if a == b:
            return "self"
        # A rule, not a table: n^2 entries would be 16.7 million at 4,096 ranks.
        h = self.hosts
        return "shm" if h and h[a] == h[b] and self.transport != "tcp" else "tcp"

    def kind_to(self, world_rank: int) -> str:
        """The transport to ``world_rank``, without connecting."""
        return self.kind_between(self.rank, world_rank)

    def connections(self) -> dict[str, int]:
        """How many peers this rank holds a connection to, per transport kind ("tcp", "shm")."""
        with self._cv:
            kinds = [p.kind for r, p in self.peers.items() if r != self.rank]
        return {k: kinds.count(k) for k in sorted(set(kinds))}

    def graceful(self, peer) -> bool:
        return peer in self._graceful

    def attach(self, comm_id: int, ctx) -> None:
        self._contexts[comm_id] = ctx

    def detach(self, comm_id: int) -> None:
        self._contexts.pop(comm_id, None)
        self.mailbox.calls(comm_id, None)

    def on_lost(self, peer: int, err: BaseException, graceful: bool = False) -> None:
        """A connection to ``peer`` ended (``graceful``: it said goodbye). A peer lost otherwise is news
        for every rank: connections are made on first use, so others may hold none to it and would
        otherwise learn only at their deadline. This rank tells them (LOST) from a thread of its own."""
        first = self.mailbox.lost(peer) is None
        self._mark_lost(peer, err, graceful)
        if first and not graceful and not self._closed and self.size > 2:
            threading.Thread(target=self._tell_lost, args=(peer,), daemon=True,
                             name=f"pyxccl-lost-{self.rank}").start()

    def _tell_lost(self, lost: int) -> None:
        end = time.monotonic() + 5.0
        for w in [*range(self.rank + 1, self.size), *range(self.rank)]:
            if w == lost or self.mailbox.lost(w) is not None or self._closed:
                continue
            try:
                p = self.peers.get(w) or self._connect(w, end)
                p.send((0, LOST, lost + 1), 0, _NOTHING, end)
            except Exception:  # noqa: BLE001  (that rank is gone or stuck too: it learns otherwise)
                pass

    def _lost_news(self, sender: int, lost: int) -> None:
        """Rank ``sender`` lost its connection to ``lost`` (from the progress thread)."""
        if 0 <= lost < self.size and lost != self.rank and self.mailbox.lost(lost) is None:
            self._mark_lost(lost, lost_error(self.rank, lost, f"rank {sender} lost its connection to it",
                                             self._host(lost)))

    def _host(self, p: int) -> str | None:
        if not self._infos:
            return None
        return "{} ({})".format(self._infos[p]["host"].split("/")[0], self._infos[p]["tcp"][0])

    def _mark_lost(self, peer: int, err: BaseException, graceful: bool = False) -> None:
        if graceful:
            self._graceful.add(peer)
        self.mailbox.peer_lost(peer, err)
        with self._cv:
            self._cv.notify_all()           # a thread waiting for its connection hears of it
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

    # --- connections on first use --------------------------------------------------------
    def listen(self, secret: bytes, tcp_l, unix_l) -> None:
        """Start serving the listeners on the progress loop (before the address is published: a
        stranger is refused at once even while this rank waits for the others' addresses)."""
        self._secret = secret
        self.progress = Progress(f"pyxccl-progress-{self.rank}")
        self._listeners = [(tcp_l, "tcp"), (unix_l, "shm")]
        for lst, kind in self._listeners:
            lst.setblocking(False)
            self.progress.add(lst, lambda lst=lst, kind=kind: self._incoming(lst, kind))
        self.progress.every(self._expire)

    def learn(self, infos: list[dict], channels: dict) -> None:
        """Every rank's address is known (``infos``): connections may be made, and those that proved
        themselves meanwhile are decided (on the loop)."""
        self._infos, self._channels = infos, channels
        self.progress.call(self._unpark)

    def _unpark(self) -> None:
        parked, self._parked = self._parked, None
        for acc, kind in parked or ():
            try:
                self._decide(acc, kind)
            except (OSError, auth.AuthError) as e:
                auth.refused(f"rank {self.rank}", acc.sock, e)
                acc.drop()

    def _where(self, p: int) -> str:
        info = self._infos[p]
        if self.kind_to(p) == "shm":
            return f"its unix socket @{info['unix']} on {info['host'].split('/')[0]}"
        return "{}:{}".format(*info["tcp"])

    def _connect(self, p: int, deadline: float | None = None):
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        with self._cv:
            while True:
                got = self.peers.get(p)
                if got is not None:
                    return got
                self._check(p, deadline)
                if p not in self._dialing and p not in self._joining:
                    self._dialing.add(p)
                    break
                self._cv.wait(min(0.5, max(0.01, deadline - time.monotonic())))
        try:
            made = self._dial(p, deadline)
        except PeerLostError as e:
            self._mark_lost(p, e)       # nothing listens there: receives from it fail now, not at their deadline
            raise
        finally:
            with self._cv:
                self._dialing.discard(p)
                self._cv.notify_all()
        if made is not None:
            return made
        with self._cv:                      # deferred: the peer's own connection is the pair's
            while (got := self.peers.get(p)) is None:
                self._check(p, deadline)
                self._cv.wait(min(0.5, max(0.01, deadline - time.monotonic())))
        return got

    def _check(self, p: int, deadline: float) -> None:
        """(Under the lock.) Raise if waiting for a connection to ``p`` is over."""
        if self._closed:
            raise lost_error(self.rank, p, "this rank's mesh is closed")
        lost = self.mailbox.lost(p)
        if lost is not None:
            raise lost
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"rank {self.rank}: no connection with rank {p} at {self._where(p)} within {self.timeout:g} s "
                f"(it deferred to its own connection, which never came); check that rank's output",
                rank=self.rank, peer=p, op="connect")

    def _dial(self, p: int, deadline: float):
        """Dial ``p``: its peer, registered, or None when ``p`` deferred (its own connection wins)."""
        kind = self.kind_to(p)
        info, where = self._infos[p], self._where(p)
        ensure_fds(self._channels[kind] + 1, f"rank {self.rank} connecting to rank {p}", op="connect")
        socks, rings = [], None
        try:
            for channel in range(self._channels[kind]):
                socks.append(_dial(kind, info, deadline, self.rank, p, where))
                mine = ring(self.rank, p) if kind == "shm" else None
                try:
                    status, theirs = auth.dial(socks[-1], self._secret, self.rank, channel, ring=mine)
                except (OSError, auth.AuthError) as e:
                    if mine is not None:
                        os.close(mine)
                    raise RendezvousError(
                        f"rank {self.rank}: the handshake with rank {p} at {where} failed ({e}); check that "
                        f"every rank has the same PYXCCL_SECRET (or none)", rank=self.rank, peer=p,
                        op="connect") from None
                if status == auth.DEFER:
                    if mine is not None:
                        os.close(mine)
                    for c in socks:
                        c.close()
                    log.debug("pyxccl rank %d: rank %d deferred: its own connection is the pair's", self.rank, p)
                    return None
                if mine is not None:
                    rings = (mine, theirs)
            for c in socks:
                c.settimeout(None)
            made = self._make(kind, p, socks, rings)
        except BaseException:
            for c in socks:
                c.close()
            raise
        self._register(p, made, "dialed")
        return made

    def _make(self, kind: str, p: int, socks: list, rings):
        if kind == "shm":
            made = ShmPeer(self.rank, p, self.mailbox, self.on_lost, socks[0], rings=rings)
        else:
            made = TcpPeer(self.rank, p, self.mailbox, self.on_lost, socks[0], lanes=socks[1:])
        made.host = self._host(p)
        return made

    def _register(self, p: int, made, how: str) -> None:
        with self._cv:              # one step: never neither in peers nor in _dialing/_joining
            closed = self._closed
            self._joining.pop(p, None)
            if not closed:
                self.peers[p] = made
            self._cv.notify_all()
        if closed:
            made.close()
            return
        made.start(self.progress)
        log.debug("pyxccl rank %d: %s rank %d over %s (%d connection(s))", self.rank, how, p, made.kind,
                  getattr(made, "connections", 1))

    # --- the acceptor's side, on the progress loop ----------------------------------------
    def _incoming(self, lst, kind: str) -> bool:
        try:
            conn, _ = lst.accept()
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            if self._closed:
                return False
            log.warning("pyxccl rank %d: could not accept a connection: %s", self.rank, e)
            if e.errno in (errno.EMFILE, errno.ENFILE):
                try:
                    ensure_fds(4, f"rank {self.rank} accepting a connection", op="connect")
                except RendezvousError as short:
                    log.warning("%s", short)
            return True
        conn.setblocking(False)
        acc = auth.Acceptor(conn, self._secret, rings=kind == "shm")
        self._shaking[conn] = (acc, kind, time.monotonic() + min(_HANDSHAKE_SECONDS, self.timeout))
        self.progress.add(conn, lambda: self._shake(conn))
        return True

    def _shake(self, conn) -> bool:
        acc, kind, _ = self._shaking[conn]
        try:
            if not acc.step():
                return True
            if self._parked is not None:        # proven before this rank knows the others: decided then
                self._parked.append((acc, kind))
                del self._shaking[conn]
                return False
            self._decide(acc, kind)
        except (OSError, auth.AuthError) as e:
            self._refuse(conn, e)
            return False
        del self._shaking[conn]
        return False            # the socket is the peer's now (or closed): this handler is done

    def _decide(self, acc, kind: str) -> None:
        """The dialer proved itself: accept its connection, defer to ours, or refuse it."""
        p, channel, rings = acc.rank, acc.channel, None
        if not (0 <= p < self.size and p != self.rank) or self.kind_to(p) != kind:
            raise auth.AuthError(f"rank {p} over {kind} was not expected (not another rank of this "
                                 f"{self.size}-rank job, or the wrong transport for it)")
        with self._cv:
            if channel == 0 and (p in self.peers or (p in self._dialing and self.rank < p)):
                status = auth.DEFER
            elif channel == 0 and p not in self._joining:
                status = auth.ACCEPT
                self._joining[p] = {}
            elif channel and p in self._joining and channel < self._channels[kind] \
                    and channel not in self._joining[p]:
                status = auth.ACCEPT
            else:
                raise auth.AuthError(f"rank {p} connection {channel} over {kind} was not expected (a duplicate)")
            if status == auth.ACCEPT:
                self._joining[p][channel] = acc.sock
                complete = len(self._joining[p]) == self._channels[kind]
        if status == auth.DEFER:
            acc.finish(auth.DEFER)
            acc.drop()
            return
        try:
            if kind == "shm":
                if acc.ring is None:
                    raise auth.AuthError(f"rank {p} sent no shared-memory ring")
                mine = ring(self.rank, p)
                rings = (mine, acc.ring)
                acc.ring = None
                try:
                    acc.finish(auth.ACCEPT, mine)
                except BaseException:
                    for fd in rings:
                        os.close(fd)
                    raise
            else:
                acc.finish(auth.ACCEPT)
            if not complete:
                return
            with self._cv:          # kept in _joining until registered: a thread asking meanwhile waits
                socks = dict(self._joining[p])
            socks = [socks[c] for c in sorted(socks)]
            for c in socks:
                c.setblocking(True)
            made = self._make(kind, p, socks, rings)
        except BaseException:
            with self._cv:
                for c in self._joining.pop(p, {}).values():
                    c.close()
                self._cv.notify_all()
            raise
        self._register(p, made, "accepted")

    def _refuse(self, conn, err: BaseException) -> None:
        acc, _, _ = self._shaking.pop(conn)
        self.progress.remove(conn)
        auth.refused(f"rank {self.rank}", conn, err)
        acc.drop()

    def _expire(self) -> bool:
        """(Every tick of the loop.) Drop handshakes past their deadline."""
        if self._closed:
            return False
        now = time.monotonic()
        for conn in [c for c, (_, _, end) in self._shaking.items() if now > end]:
            self._refuse(conn, auth.AuthError(f"silent for {min(_HANDSHAKE_SECONDS, self.timeout):g} s during "
                                              f"its handshake"))
        return True

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
            peers = [p for r, p in self.peers.items() if r != self.rank]
        for p in peers:             # goodbyes first, and every handler blocked on a socket returns
            p.shutdown()
        for lst, _ in self._listeners:
            try:
                lst.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.progress is not None:
            self.progress.close()   # no thread left behind; no handler runs after this
        for p in peers:
            p.close()
        for lst, _ in self._listeners:
            lst.close()
        for acc, _ in self._parked or ():
            acc.drop()
        for acc, _, _ in list(self._shaking.values()):
            acc.drop()
        self._shaking.clear()
        for socks in self._joining.values():
            for c in socks.values():
                c.close()
        self._joining.clear()
        self._contexts.clear()      # no cycles left through the mesh: closing frees it, not the GC


def build_mesh(store, rank: int, size: int, *, transport: str, master_addr: str | None,
               timeout: float) -> Mesh:
    """Listen, publish this rank's address and learn every rank's through ``store`` (see the module
    docstring): no connection is made here."""
    if transport not in ("auto", "tcp", "shm"):
        raise InvalidArgumentError(f"rank {rank}: PYXCCL_TRANSPORT={transport!r}; use tcp, shm or auto",
                                   rank=rank, op="init")
    mesh = Mesh(rank, size)
    mesh.timeout = timeout
    secret = auth.job_secret(store, rank, timeout)
    if rank == 0:
        job = secrets.token_hex(8)
        store.set("pyxccl/job", job.encode())
    else:
        job = store.get("pyxccl/job", timeout=timeout).decode()
    me = host_id()
    addr = local_address(master_addr, rank=rank)
    nsocks = _env.get("PYXCCL_NSOCKS")
    ensure_fds(6, f"rank {rank}")        # two listeners, the progress loop's selector and wake-up pair
    tcp_l = socket.create_server((addr, 0), backlog=max(16, min(size, 4096)))
    unix_name = f"\0pyxccl-{job}-{rank}"
    unix_l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        unix_l.bind(unix_name)
        unix_l.listen(max(16, min(size, 4096)))
    except BaseException:
        tcp_l.close()
        unix_l.close()
        raise
    mesh.listen(secret, tcp_l, unix_l)
    try:
        store.set(f"addr/{rank}", json.dumps({"host": me, "tcp": [addr, tcp_l.getsockname()[1]],
                                              "unix": unix_name[1:], "pid": os.getpid(),
                                              "cores": job_cpus(), "nsocks": nsocks,
                                              "numa": numa_node()}).encode())
        infos = [json.loads(v) for v in store.multi_get([f"addr/{r}" for r in range(size)], timeout)]
        mesh.hosts = [i["host"] for i in infos]
        mesh.cores = [i["cores"] for i in infos]
        mesh.numa = [i["numa"] for i in infos]
        mesh.transport = transport
        for p in range(size):
            if transport == "shm" and mesh.hosts[p] != me:
                raise RendezvousError(
                    f"rank {rank}: PYXCCL_TRANSPORT=shm but rank {p} is on host {mesh.hosts[p]!r} and this "
                    f"rank on {me!r}; use PYXCCL_TRANSPORT=auto or tcp across hosts", rank=rank, peer=p,
                    op="init")
    except BaseException:
        mesh.close()
        raise
    mesh.learn(infos, {"shm": 1, "tcp": infos[0].get("nsocks", 1)})
    return mesh


def _dial(kind: str, info: dict, deadline: float, rank: int, peer: int, where: str) -> socket.socket:
    """A socket connected to ``peer``'s listener. Nothing listening there (refused) means its process
    is gone: PeerLostError at once; anything else is retried until the deadline."""
    while True:
        try:
            if kind == "shm":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.settimeout(max(0.1, deadline - time.monotonic()))
                    s.connect("\0" + info["unix"])
                except BaseException:
                    s.close()
                    raise
                return s
            return socket.create_connection(tuple(info["tcp"]), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as e:
            if e.errno == errno.ECONNREFUSED:
                raise lost_error(rank, peer, f"nothing listens at {where} any more: its process exited or "
                                             f"closed its communicator") from None
            if time.monotonic() > deadline:
                raise RendezvousError(f"rank {rank}: could not connect to rank {peer} at {where} before the "
                                      f"deadline ({e}); check that rank's output and that this host can reach "
                                      f"it", rank=rank, peer=peer, op="connect") from None
            time.sleep(0.05)
