"""The Communicator: the operator interface of the adaptation layer.

Every call checks its arguments on the calling rank before any byte moves
(raising InvalidArgumentError and leaving the communicator usable), then
hands the work to the communicator's ordered engine.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import threading
import time

import numpy as np

from . import algorithms
from .algorithms import registry
from ._errors import (CommAbortedError, CommClosedError, CommError, InvalidArgumentError, PeerLostError,
                      ProtocolError, UnsupportedOpError)
from .dtypes import DTYPE_CODE, as_array, dtype_name
from . import fastpath
from .engine import _QUEUED, Engine, Work, _Call, annotate, run_schedule
from .mailbox import RecvRequest
from .ops import ReduceOp, as_op, op_error, reducer

#: Collective codes carried (negated) in the tag of collective messages.
_CODES = {name: i + 1 for i, name in enumerate((
    "allreduce", "broadcast", "reduce", "allgather", "gather", "scatter", "reduce_scatter",
    "alltoall", "barrier"))}
_MAX_TAG = (1 << 31) - 1


def default_timeout() -> float:
    return float(os.environ.get("PYXCCL_TIMEOUT", 300))


class _Check:
    """Argument checks of one call, raising errors that name the rank and the operation."""

    def __init__(self, comm: "Communicator", op: str):
        self.comm, self.op = comm, op

    def error(self, msg: str, cls=InvalidArgumentError) -> InvalidArgumentError:
        return cls(f"rank {self.comm.rank}: {self.op}: {msg}", rank=self.comm.rank, op=self.op)

    def array(self, obj, what: str, *, writable: bool) -> np.ndarray:
        return as_array(obj, what=what, writable=writable, ctx=self.error)

    def same_dtype(self, a: np.ndarray, b: np.ndarray, what: str) -> None:
        if a.dtype != b.dtype:
            raise self.error(f"{what} has dtype {dtype_name(b.dtype)} but the input is "
                             f"{dtype_name(a.dtype)}; pass buffers of one dtype")

    def size(self, arr: np.ndarray, expected: int, what: str) -> None:
        if arr.size != expected:
            raise self.error(f"{what} has {arr.size} elements but this call needs {expected}")

    def rank(self, r, what: str) -> int:
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < self.comm.size:
            raise self.error(f"{what}={r!r} is not a rank of this communicator (0..{self.comm.size - 1})")
        return int(r)

    def tag(self, tag) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= _MAX_TAG:
            raise self.error(f"tag={tag!r} must be an integer in 0..{_MAX_TAG}")
        return int(tag)

    def op_for(self, op, dt: np.dtype) -> ReduceOp:
        try:
            op = as_op(op)
        except ValueError as e:
            raise self.error(str(e)) from None
        why = op_error(op, dt)
        if why:
            raise self.error(why, UnsupportedOpError)
        return op

    def counts(self, counts, what: str, total: int | None = None,
               own: tuple[int, str] | None = None) -> list[int]:
        """Checked per-rank counts; ``total``: what they must add up to; ``own``: (elements, buffer name)
        that this rank's count must match."""
        try:
            counts = [int(c) for c in counts]
        except (TypeError, ValueError):
            raise self.error(f"{what} must be a sequence of {self.comm.size} integers") from None
        if len(counts) != self.comm.size:
            raise self.error(f"{what} has {len(counts)} entries; it needs one per rank ({self.comm.size})")
        if any(c < 0 for c in counts):
            raise self.error(f"{what} has a negative count: {counts}")
        if total is not None and sum(counts) != total:
            raise self.error(f"{what} adds up to {sum(counts)} elements but the buffer has {total}")
        me = self.comm.rank
        if own is not None and counts[me] != own[0]:
            raise self.error(f"{what}[{me}]={counts[me]} but {own[1]} has {own[0]} elements")
        return counts

    def root_counts(self, counts, root: int, own: int) -> list[int]:
        """gatherv/scatterv counts: the root must pass them all; elsewhere None means just this rank's."""
        if counts is not None:
            return counts
        if self.comm.rank == root:
            raise self.error("the root needs counts (one per rank)")
        counts = [0] * self.comm.size
        counts[self.comm.rank] = own
        return counts

    def only_direct(self, name) -> str:
        """gatherv/scatterv: a rank knows only its own count (all of them at the root), and every
        algorithm but "direct" routes other ranks' blocks: refuse those, or ranks would hang."""
        if name not in (None, "direct"):
            raise self.error(f"algorithm={name!r} routes other ranks' blocks, whose sizes only the root "
                             f"knows; use 'direct', or gather/scatter for equal blocks")
        return "direct"

    def algorithm(self, primitive: str, name, nbytes: int = 0, itemsize: int = 4):
        """The builder to use, as ``f(**args) -> Schedule`` for this rank: the one named by the
        call or PYXCCL_ALGO, else the tuner's choice for this size."""
        comm = self.comm
        name = name or comm._algo_env.get(primitive)
        if name is None and comm._tuner is not None:
            name = comm._tuner.choose(primitive, nbytes, itemsize)
        try:
            name, builder = algorithms.lookup(primitive, name)
        except KeyError:
            raise self.error(f"no algorithm {name!r} for {primitive}; known: "
                             + ", ".join(algorithms.algorithms(primitive))) from None
        comm.last_algorithm = name
        return lambda **args: registry.build(builder, comm.rank, comm.size, hosts=comm._hosts, **args)


class Communicator:
    """A group of ranks that run collectives together (made by :func:`pyxccl.init` or :meth:`split`).

    >>> comm = pyxccl.init()                      # doctest: +SKIP
    >>> x = np.full(4, comm.rank, np.float32)
    >>> comm.allreduce(x)                         # in place: every rank now holds the sum
    >>> w = comm.allgather(x, async_op=True); w.wait()
    """

    def __init__(self, mesh, world_ranks: list[int], comm_id: int, *, timeout: float | None = None,
                 parent: "Communicator | None" = None):
        self._mesh = mesh
        self._world_ranks = list(world_ranks)
        self._world_to_comm = {w: i for i, w in enumerate(self._world_ranks)}
        self._id = comm_id
        self.rank = self._world_to_comm[mesh.rank]
        self.size = len(self._world_ranks)
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self._seq = 0
        self._coll_seq = 0
        self._splits = 0
        self._closed = False
        self._failed: BaseException | None = None
        self._scratch = np.empty(0, np.uint8)
        self._inflight: set[RecvRequest] = set()
        self._lock = threading.Lock()
        self._children: list[Communicator] = []
        self._parent = parent
        self._store = None      # the rendezvous store init() made, closed with the world
        self._algo_env = _parse_algo_env(os.environ.get("PYXCCL_ALGO", ""))
        host_index = {h: i for i, h in enumerate(dict.fromkeys(mesh.hosts[w] for w in self._world_ranks))}
        self._hosts = [host_index[mesh.hosts[w]] for w in self._world_ranks]
        self._tuner = None
        self._seg = None        # shared segment of the one-host fast path (_setup_segment)
        self.last_algorithm: str | None = None
        self._engine = Engine(f"pyxccl-comm{comm_id:08x}-r{self.rank}")
        mesh.comms.add(self)
        if mesh.machine is not None:
            self._make_tuner()

    def link_class(self, a: int, b: int) -> str:
        """Link class between ranks ``a`` and ``b``: "self", "shm", "tcp_local" (one host) or "tcp"."""
        if a == b:
            return "self"
        wa, wb = self._world_ranks[a], self._world_ranks[b]
        kind = self._mesh.peer(wb).kind if wa == self._mesh.rank else (
            self._mesh.peer(wa).kind if wb == self._mesh.rank else self._mesh.kind_between(wa, wb))
        if kind == "shm":
            return "shm"
        return "tcp_local" if self._hosts[a] == self._hosts[b] else "tcp"

    def _make_tuner(self) -> None:
        from .tuning import Tuner
        cls = [[self.link_class(a, b) for b in range(self.size)] for a in range(self.size)]
        self._tuner = Tuner(self.size, self._hosts, lambda a, b: cls[a][b], self._mesh.machine,
                            [self._mesh.cores[w] for w in self._world_ranks],
                            fast_area=self._seg.area if self._seg is not None else 0)

    def _setup_segment(self) -> None:
        """Collective: give a one-host communicator its shared segment (the fast path)."""
        if self.size < 2 or len(set(self._hosts)) > 1 or any(
                self.link_class(0, p) != "shm" for p in range(1, self.size)):
            return
        from .transport.segment import HostSegment
        area = int(os.environ.get("PYXCCL_SHM_AREA_BYTES", 2 << 20))
        seg = HostSegment(0, self.size, area) if self.rank == 0 else None
        where = self.broadcast_object((os.getpid(), seg.fd) if seg else None)
        try:
            if seg is None:
                seg = HostSegment.open(self.rank, self.size, area, *where)
            ok = True
        except OSError:     # /proc/<pid>/fd not openable here (ptrace rules): no fast path
            ok = False
        cma = False
        if ok:
            from .transport.cma import works
            cma = self.rank == 0 or works(int(seg.posts[0, 0]), int(seg.posts[0, 1]))
        oks = self.allgather_object((ok, cma))
        if all(o for o, _ in oks):
            seg.cma = all(c for _, c in oks) and os.environ.get("PYXCCL_CMA", "1") != "0"
            def check_alive(p, comm=self):
                if comm._failed is not None:
                    raise comm._failed
                lost = comm._mesh.mailbox.lost(comm._world_ranks[p])
                if lost is not None:
                    raise lost
            seg.check_alive = check_alive
            self._seg = seg
            if self._tuner is not None:
                self._make_tuner()      # now with the fast path among the candidates
        elif seg is not None:
            seg.close()

    def _tune(self) -> None:
        """Measure (or load) the link figures and start choosing algorithms by cost. Collective."""
        from .tuning.probe import measure
        first = {}
        for p in range(self.size):
            k = self.link_class(0, p)
            if k != "self":
                first.setdefault(k, p)
        self._mesh.machine = measure(self, first)
        self._make_tuner()

    # --- description -----------------------------------------------------------
    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._failed else "open")
        return f"<pyxccl.Communicator rank {self.rank} of {self.size}, id {self._id:08x}, {state}>"

    @property
    def world_ranks(self) -> list[int]:
        """The world rank of each rank of this communicator."""
        return list(self._world_ranks)

    def transport(self, peer: int) -> str:
        """How data moves to ``peer``: "shm", "tcp" or "self"."""
        return self._peer(peer).kind

    @property
    def host_ranks(self) -> list[int]:
        """Ranks of this communicator on the same host as this rank (by host identity)."""
        me = self._mesh.hosts[self._mesh.rank]
        return [i for i, w in enumerate(self._world_ranks) if self._mesh.hosts[w] == me]

    # --- plumbing ----------------------------------------------------------------
    def _peer(self, r: int):
        return self._mesh.peer(self._world_ranks[r])

    def _from_world(self, w: int) -> int:
        return self._world_to_comm.get(w, w)

    def _track(self, req: RecvRequest) -> None:
        with self._lock:
            self._inflight.add(req)
            failed = self._failed
        if failed is not None:
            req.fail(failed)

    def _untrack(self, req: RecvRequest) -> None:
        with self._lock:
            self._inflight.discard(req)

    def _abort(self, err: BaseException) -> None:
        """Fail what is in flight and refuse later calls: after a lost peer or a broken collective."""
        with self._lock:
            if self._failed is None:
                self._failed = err
            reqs = list(self._inflight)
        for r in reqs:
            r.fail(err)
        for c in list(self._children):
            c._abort(err)

    def _usable(self, op: str) -> None:
        if self._closed:
            raise CommClosedError(f"rank {self.rank}: {op} called on a closed communicator; "
                                  f"make a new one with pyxccl.init()", rank=self.rank, op=op)
        cause = self._failed
        if cause is not None:
            msg = (f"rank {self.rank}: {op} refused: this communicator failed earlier ({cause}); "
                   f"close it and make a new one")
            if isinstance(cause, PeerLostError):   # keep the root cause's type: callers catch that
                raise PeerLostError(msg, rank=self.rank, peer=cause.peer, op=op)
            raise CommAbortedError(msg, cause=cause, rank=self.rank, peer=cause.peer, op=op)

    def _submit(self, op: str, fn, *, async_op: bool, timeout, collective: bool) -> Work | object:
        self._usable(op)
        self._seq += 1
        seq = self._seq
        deadline = time.monotonic() + (self.timeout if timeout is None else float(timeout))

        def guarded(w: Work):
            self._usable(op)
            try:
                return fn(w, deadline)
            except CommError as e:
                e = annotate(e, op, seq, self.rank)
                if collective or isinstance(e, (ProtocolError, CommAbortedError)) \
                        or (isinstance(e, PeerLostError) and not self._mesh.graceful(e.peer)):
                    self._abort(e)   # a half-done collective leaves the ranks out of step
                raise e from None
        if not async_op:
            call = _Call(seq)
            out = self._engine.try_inline(guarded, call)
            if out is not _QUEUED:
                if call._recvs:             # a recv posted its request: wait for it like a Work would
                    work = Work(op, seq, self.rank, deadline)
                    work._recvs, work._cancel, work._from_world = call._recvs, call._cancel, self._from_world
                    work._ran.set()
                    work.wait()
                return out
        work = Work(op, seq, self.rank, deadline)
        work._from_world = self._from_world
        self._engine.submit(guarded, work, async_op=async_op)
        if async_op:
            return work
        return work.result()

    def _collective(self, op: str, build, bufs_fn, *, reduce_op=None, after=None, result=None,
                    async_op=False, timeout=None, fast=None):
        """Queue one collective: ``build()`` gives the Schedule, ``bufs_fn()`` the buffers.

        ``fast(reduce_fn)`` runs the call on the host segment instead, when the chosen algorithm
        is "shm" and this communicator has a segment (all its ranks on one host)."""
        self._coll_seq += 1
        key = (self._id, -_CODES[op], self._coll_seq & 0xFFFFFFFF)
        # last_algorithm: what _Check.algorithm just chose for this very call
        seg = self._seg if fast is not None and self.last_algorithm == "shm" else None

        def fn(work: Work, deadline: float):
            if seg is not None:
                seg.deadline, seg.who = deadline, f"{op} (#{work.seq} on this communicator)"
                fast(reducer(reduce_op) if reduce_op is not None else None)
                if after is not None:
                    after()
                return result
            s = build()
            bufs = bufs_fn()
            if s.scratch:
                bufs["tmp"] = self._tmp(s.scratch, next(iter(bufs.values())).dtype)
            run_schedule(self, s, bufs, op=reduce_op, key=key, opname=op, seq=work.seq, deadline=deadline)
            if after is not None:
                after()
            return result
        return self._submit(op, fn, async_op=async_op, timeout=timeout, collective=True)

    def _tmp(self, count: int, dt: np.dtype) -> np.ndarray:
        nbytes = count * dt.itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes].view(dt)

    # --- collectives --------------------------------------------------------------
    def allreduce(self, tensor, op=ReduceOp.SUM, *, out=None, async_op=False, algorithm=None, timeout=None):
        """Reduce ``tensor`` over all ranks; every rank gets the result (in place, or in ``out``).

        >>> comm.allreduce(grad, op=pyxccl.ReduceOp.AVG)   # doctest: +SKIP
        """
        c = _Check(self, "allreduce")
        buf = c.array(tensor, "tensor", writable=out is None)
        dst = buf if out is None else c.array(out, "out", writable=True)
        c.same_dtype(buf, dst, "out")
        c.size(dst, buf.size, "out")
        rop = c.op_for(op, buf.dtype)
        build = c.algorithm("allreduce", algorithm, buf.nbytes, buf.itemsize)
        after = (lambda: np.divide(dst, self.size, out=dst)) if rop is ReduceOp.AVG else None
        return self._collective("allreduce", lambda: build(count=buf.size),
                                lambda: {"in": buf, "out": dst}, reduce_op=rop, after=after,
                                fast=lambda red: fastpath.allreduce(self._seg, buf, dst, red),
                                result=tensor if out is None else out, async_op=async_op, timeout=timeout)

    def broadcast(self, tensor, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Copy ``tensor`` of rank ``root`` into ``tensor`` of every rank."""
        c = _Check(self, "broadcast")
        root = c.rank(root, "root")
        buf = c.array(tensor, "tensor", writable=self.rank != root)
        build = c.algorithm("broadcast", algorithm, buf.nbytes, buf.itemsize)
        return self._collective("broadcast", lambda: build(count=buf.size, root=root),
                                lambda: {"out": buf}, fast=lambda _: fastpath.broadcast(self._seg, buf, root),
                                result=tensor, async_op=async_op, timeout=timeout)

    def reduce(self, tensor, root: int = 0, op=ReduceOp.SUM, *, out=None, async_op=False, algorithm=None,
               timeout=None):
        """Reduce ``tensor`` over all ranks into rank ``root`` (in place there, or into ``out``).

        The other ranks' buffers are left unchanged.
        """
        c = _Check(self, "reduce")
        root = c.rank(root, "root")
        is_root = self.rank == root
        buf = c.array(tensor, "tensor", writable=is_root and out is None)
        dst = buf
        if is_root and out is not None:
            dst = c.array(out, "out", writable=True)
            c.same_dtype(buf, dst, "out")
            c.size(dst, buf.size, "out")
        rop = c.op_for(op, buf.dtype)
        build = c.algorithm("reduce", algorithm, buf.nbytes, buf.itemsize)
        after = (lambda: np.divide(dst, self.size, out=dst)) if rop is ReduceOp.AVG and is_root else None
        return self._collective("reduce", lambda: build(count=buf.size, root=root),
                                lambda: {"in": buf, "out": dst}, reduce_op=rop, after=after,
                                fast=lambda red: fastpath.allreduce(self._seg, buf, dst, red, root=root),
                                result=(out if out is not None and is_root else tensor),
                                async_op=async_op, timeout=timeout)

    def allgather(self, sendbuf, recvbuf=None, *, async_op=False, algorithm=None, timeout=None):
        """Concatenate every rank's ``sendbuf`` (in rank order) into ``recvbuf`` on every rank.

        ``recvbuf`` needs ``size * len(sendbuf)`` elements; None allocates and returns a numpy array.
        """
        c = _Check(self, "allgather")
        send = c.array(sendbuf, "sendbuf", writable=False)
        return self._gatherv("allgather", c, sendbuf, recvbuf, [send.size] * self.size, algorithm, async_op,
                             timeout)

    def allgatherv(self, sendbuf, recvbuf, counts, *, async_op=False, algorithm=None, timeout=None):
        """Like allgather, rank i contributing ``counts[i]`` elements."""
        c = _Check(self, "allgatherv")
        return self._gatherv("allgatherv", c, sendbuf, recvbuf, counts, algorithm, async_op, timeout)

    def _gatherv(self, name, c, sendbuf, recvbuf, counts, algorithm, async_op, timeout):
        send = c.array(sendbuf, "sendbuf", writable=False)
        counts = c.counts(counts, "counts", own=(send.size, "sendbuf"))
        recvbuf = np.empty(sum(counts), send.dtype) if recvbuf is None else recvbuf
        recv = c.array(recvbuf, "recvbuf", writable=True)
        c.same_dtype(send, recv, "recvbuf")
        c.size(recv, sum(counts), "recvbuf")
        build = c.algorithm("allgather", algorithm, recv.nbytes, recv.itemsize)
        return self._collective("allgather", lambda: build(counts=counts),
                                lambda: {"in": send, "out": recv}, result=recvbuf, async_op=async_op,
                                fast=lambda _: fastpath.allgather(self._seg, send, recv, counts),
                                timeout=timeout)

    def gather(self, sendbuf, recvbuf=None, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Concatenate every rank's ``sendbuf`` into ``recvbuf`` of rank ``root``.

        Only the root needs ``recvbuf`` (None there allocates one); the others get None back.
        """
        c = _Check(self, "gather")
        send = c.array(sendbuf, "sendbuf", writable=False)
        return self._gatherv_root("gather", c, send, recvbuf, root, [send.size] * self.size, algorithm,
                                  async_op, timeout)

    def gatherv(self, sendbuf, recvbuf=None, counts=None, root: int = 0, *, async_op=False, algorithm=None,
                timeout=None):
        """Like gather, rank i contributing ``counts[i]`` elements (``counts`` needed at the root)."""
        c = _Check(self, "gatherv")
        send = c.array(sendbuf, "sendbuf", writable=False)
        root = c.rank(root, "root")
        counts = c.root_counts(counts, root, send.size)
        return self._gatherv_root("gatherv", c, send, recvbuf, root, counts, algorithm, async_op, timeout)

    def _gatherv_root(self, name, c, send, recvbuf, root, counts, algorithm, async_op, timeout):
        if name == "gatherv":     # only the root knows every count: the tree algorithms need them all
            algorithm = c.only_direct(algorithm)
        root = c.rank(root, "root")
        counts = c.counts(counts, "counts", own=(send.size, "sendbuf"))
        bufs = {"in": send}
        if self.rank == root:
            recvbuf = np.empty(sum(counts), send.dtype) if recvbuf is None else recvbuf
            recv = c.array(recvbuf, "recvbuf", writable=True)
            c.same_dtype(send, recv, "recvbuf")
            c.size(recv, sum(counts), "recvbuf")
            bufs["out"] = recv
        else:
            recvbuf = None
        build = c.algorithm("gather", algorithm, send.nbytes * self.size, send.itemsize)
        fast = None
        if name == "gather":       # gatherv: only the root knows every count, and the fast path needs them all
            fast = lambda _: fastpath.allgather(self._seg, send, bufs.get("out"), counts, root=root)  # noqa: E731
        return self._collective("gather", lambda: build(counts=counts, root=root),
                                lambda: bufs, result=recvbuf, async_op=async_op, timeout=timeout, fast=fast)

    def scatter(self, sendbuf, recvbuf, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Rank ``root`` cuts ``sendbuf`` into ``size`` equal parts; rank i receives part i in ``recvbuf``.

        ``sendbuf`` is only read on the root (pass None elsewhere).
        """
        c = _Check(self, "scatter")
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._scatterv("scatter", c, sendbuf, recv, recvbuf, root, [recv.size] * self.size, algorithm,
                              async_op, timeout)

    def scatterv(self, sendbuf, recvbuf, counts=None, root: int = 0, *, async_op=False, algorithm=None,
                 timeout=None):
        """Like scatter, rank i receiving ``counts[i]`` elements (``counts`` needed at the root)."""
        c = _Check(self, "scatterv")
        recv = c.array(recvbuf, "recvbuf", writable=True)
        root = c.rank(root, "root")
        counts = c.root_counts(counts, root, recv.size)
        return self._scatterv("scatterv", c, sendbuf, recv, recvbuf, root, counts, algorithm, async_op, timeout)

    def _scatterv(self, name, c, sendbuf, recv, recvbuf, root, counts, algorithm, async_op, timeout):
        if name == "scatterv":    # only the root knows every count
            algorithm = c.only_direct(algorithm)
        root = c.rank(root, "root")
        counts = c.counts(counts, "counts", own=(recv.size, "recvbuf"))
        bufs = {"out": recv}
        if self.rank == root:
            if sendbuf is None:
                raise c.error("the root must pass sendbuf")
            send = c.array(sendbuf, "sendbuf", writable=False)
            c.same_dtype(send, recv, "recvbuf")
            c.size(send, sum(counts), "sendbuf")
            bufs = {"in": send, "out": recv}
        build = c.algorithm("scatter", algorithm, recv.nbytes * self.size, recv.itemsize)
        fast = None
        if name == "scatter":      # scatterv: only the root knows every count
            rc = [0] * self.size
            rc[root] = counts[self.rank]
            fast = lambda _: fastpath.alltoall(self._seg, bufs.get("in"), recv, counts, rc,  # noqa: E731
                                               most=counts[root], root=root)
        return self._collective("scatter", lambda: build(counts=counts, root=root),
                                lambda: bufs, result=recvbuf, async_op=async_op, timeout=timeout, fast=fast)

    def reduce_scatter(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, async_op=False, algorithm=None,
                       timeout=None):
        """Reduce ``sendbuf`` (``size`` equal parts) over all ranks; rank i gets part i in ``recvbuf``."""
        c = _Check(self, "reduce_scatter")
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._reduce_scatterv("reduce_scatter", c, sendbuf, recv, recvbuf, [recv.size] * self.size, op,
                                     algorithm, async_op, timeout)

    def reduce_scatterv(self, sendbuf, recvbuf, counts, op=ReduceOp.SUM, *, async_op=False, algorithm=None,
                        timeout=None):
        """Like reduce_scatter, rank i getting ``counts[i]`` elements."""
        c = _Check(self, "reduce_scatterv")
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._reduce_scatterv("reduce_scatterv", c, sendbuf, recv, recvbuf, counts, op, algorithm,
                                     async_op, timeout)

    def _reduce_scatterv(self, name, c, sendbuf, recv, recvbuf, counts, op, algorithm, async_op, timeout):
        send = c.array(sendbuf, "sendbuf", writable=False)
        c.same_dtype(send, recv, "recvbuf")
        counts = c.counts(counts, "counts", total=send.size, own=(recv.size, "recvbuf"))
        rop = c.op_for(op, send.dtype)
        build = c.algorithm("reduce_scatter", algorithm, send.nbytes, send.itemsize)
        after = (lambda: np.divide(recv, self.size, out=recv)) if rop is ReduceOp.AVG else None
        return self._collective("reduce_scatter", lambda: build(counts=counts),
                                lambda: {"in": send, "out": recv}, reduce_op=rop, after=after, result=recvbuf,
                                fast=lambda red: fastpath.reduce_scatter(self._seg, send, recv, red, counts),
                                async_op=async_op, timeout=timeout)

    def alltoall(self, sendbuf, recvbuf, *, async_op=False, algorithm=None, timeout=None):
        """Rank i sends part j of ``sendbuf`` (``size`` equal parts) to rank j, which stores it as part i."""
        c = _Check(self, "alltoall")
        send = c.array(sendbuf, "sendbuf", writable=False)
        if send.size % self.size:
            raise c.error(f"sendbuf has {send.size} elements, not a multiple of the {self.size} ranks")
        counts = [send.size // self.size] * self.size
        return self._alltoallv("alltoall", c, send, recvbuf, counts, counts, algorithm, async_op, timeout)

    def alltoallv(self, sendbuf, recvbuf, send_counts, recv_counts, *, async_op=False, algorithm=None,
                  timeout=None):
        """Rank i sends ``send_counts[j]`` elements to rank j and receives ``recv_counts[j]`` from it."""
        c = _Check(self, "alltoallv")
        send = c.array(sendbuf, "sendbuf", writable=False)
        return self._alltoallv("alltoallv", c, send, recvbuf, send_counts, recv_counts, algorithm, async_op,
                               timeout)

    def _alltoallv(self, name, c, send, recvbuf, send_counts, recv_counts, algorithm, async_op, timeout):
        if name == "alltoallv":   # a rank knows only its own blocks: no algorithm that forwards others'
            if algorithm in ("bruck", "hierarchical"):   # ranks with equal blocks would go ahead and hang
                raise c.error(f"algorithm={algorithm!r} forwards other ranks' blocks, so it needs equal blocks "
                              f"on every rank; use alltoall, or 'pairwise' or 'direct' for alltoallv")
            algorithm = algorithm or "pairwise"
        recv = c.array(recvbuf, "recvbuf", writable=True)
        c.same_dtype(send, recv, "recvbuf")
        sc = c.counts(send_counts, "send_counts", total=send.size)
        rc = c.counts(recv_counts, "recv_counts", total=recv.size)
        if sc[self.rank] != rc[self.rank]:
            raise c.error(f"this rank sends itself {sc[self.rank]} elements but expects {rc[self.rank]}")
        if np.shares_memory(send, recv):
            raise c.error("sendbuf and recvbuf overlap; alltoall needs separate buffers")
        build = c.algorithm("alltoall", algorithm, send.nbytes, send.itemsize)
        fast = None
        if name == "alltoall":     # alltoallv: a rank does not know the others' block sizes
            fast = lambda _: fastpath.alltoall(self._seg, send, recv, sc, rc, most=sc[0])  # noqa: E731
        return self._collective("alltoall", lambda: build(send_counts=sc, recv_counts=rc),
                                lambda: {"in": send, "out": recv}, result=recvbuf, async_op=async_op,
                                timeout=timeout, fast=fast)

    def barrier(self, *, async_op=False, timeout=None):
        """Return once every rank has entered the barrier."""
        c = _Check(self, "barrier")
        build = c.algorithm("barrier", None)
        return self._collective("barrier", lambda: build(),
                                lambda: {"in": np.empty(0, np.uint8)}, async_op=async_op, timeout=timeout,
                                fast=lambda _: fastpath.barrier(self._seg))

    # --- point to point -----------------------------------------------------------
    def isend(self, tensor, dst: int, tag: int = 0, *, timeout=None) -> Work:
        """Start sending ``tensor`` to rank ``dst``; don't modify it until the Work is done."""
        return self._send("isend", tensor, dst, tag, timeout, async_op=True)

    def send(self, tensor, dst: int, tag: int = 0, *, timeout=None) -> None:
        """Send ``tensor`` to rank ``dst`` (matched by a recv with the same tag)."""
        self._send("send", tensor, dst, tag, timeout, async_op=False)

    def _send(self, name, tensor, dst, tag, timeout, async_op):
        c = _Check(self, name)
        buf = c.array(tensor, "tensor", writable=False)
        dst, tag = c.rank(dst, "dst"), c.tag(tag)
        key, dcode = (self._id, tag, 0), DTYPE_CODE[buf.dtype]

        def fn(work, deadline):
            self._peer(dst).send(key, dcode, buf.view(np.uint8), deadline)
        return self._submit(name, fn, async_op=async_op, timeout=timeout, collective=False)

    def irecv(self, tensor, src: int | None, tag: int = 0, *, timeout=None) -> Work:
        """Start receiving into ``tensor`` from rank ``src`` (None: from any rank).

        >>> w = comm.irecv(buf, None, tag=3)     # doctest: +SKIP
        >>> sender = w.source_rank()              # waits, then names the sender
        """
        return self._recv("irecv", tensor, src, tag, timeout, async_op=True)

    def recv(self, tensor, src: int | None, tag: int = 0, *, timeout=None):
        """Receive into ``tensor`` from rank ``src`` (None: any rank; ``irecv(...).source_rank()``
        names it) a message sent with the same tag; returns ``tensor``."""
        return self._recv("recv", tensor, src, tag, timeout, async_op=False)

    def _recv(self, name, tensor, src, tag, timeout, async_op):
        c = _Check(self, name)
        buf = c.array(tensor, "tensor", writable=True)
        src, tag = None if src is None else c.rank(src, "src"), c.tag(tag)

        def fn(work, deadline):
            peer = None if src is None else self._world_ranks[src]
            req = RecvRequest(peer, (self._id, tag, 0), buf, None, name)
            work._recvs.append(req)
            work._cancel = self._mesh.mailbox.cancel
            self._mesh.mailbox.post(req)
            return tensor
        return self._submit(name, fn, async_op=async_op, timeout=timeout, collective=False)

    # --- Python objects ------------------------------------------------------------
    def broadcast_object(self, obj=None, root: int = 0, *, timeout=None):
        """Return rank ``root``'s ``obj`` (pickled) on every rank.

        Unpickling runs code chosen by the sender: use it within one trusted job only.
        """
        data = pickle.dumps(obj) if self.rank == root else b""
        n = np.array([len(data)], np.int64)
        self.broadcast(n, root, timeout=timeout)
        buf = np.frombuffer(bytearray(data), np.uint8) if self.rank == root else np.empty(int(n[0]), np.uint8)
        self.broadcast(buf, root, timeout=timeout)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def allgather_object(self, obj, *, timeout=None) -> list:
        """Return the list of every rank's ``obj`` (pickled), in rank order."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = self.allgather(np.array([data.size], np.int64), timeout=timeout)
        out = self.allgatherv(data, None, [int(s) for s in sizes], timeout=timeout)
        off = np.concatenate([[0], np.cumsum(sizes)])
        return [pickle.loads(out[off[i]:off[i + 1]].tobytes()) for i in range(self.size)]

    # --- sub-communicators ------------------------------------------------------------
    def split(self, color, key: int = 0, *, timeout=None) -> "Communicator | None":
        """Partition the ranks by ``color``; order each part by (``key``, rank). Collective.

        A rank passing ``color=None`` takes part but gets None back (MPI_UNDEFINED).

        >>> tp = comm.split(color=comm.rank // 2)        # doctest: +SKIP
        """
        c = _Check(self, "split")
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise c.error(f"color={color!r} must be a non-negative integer or None")
        if not isinstance(key, (int, np.integer)):
            raise c.error(f"key={key!r} must be an integer")
        infos = self.allgather_object((None if color is None else int(color), int(key)), timeout=timeout)
        self._splits += 1
        if color is None:
            return None
        members = sorted((k, r) for r, (col, k) in enumerate(infos) if col == color)
        digest = hashlib.blake2b(f"{self._id}/{self._splits}/{color}".encode(), digest_size=4).digest()
        child = Communicator(self._mesh, [self._world_ranks[r] for _, r in members],
                             int.from_bytes(digest, "little"), timeout=self.timeout, parent=self)
        self._children.append(child)
        child._setup_segment()
        return child

    def dup(self) -> "Communicator":
        """A new communicator with the same ranks (collective), whose calls never mix with this one's."""
        return self.split(0, self.rank)

    # --- teardown ---------------------------------------------------------------------
    def close(self) -> None:
        """Release the communicator. Closing the world communicator also closes every
        communicator split from it and releases sockets, threads and shared memory."""
        if self._closed:
            return
        for c in list(self._children):
            c.close()
        self._closed = True
        self._engine.stop()
        if self._seg is not None:
            self._seg.close()
        self._mesh.comms.discard(self)
        if self._parent is None:
            self._mesh.close()
            if self._store is not None:
                self._store.close()
        else:
            self._parent._children.remove(self)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _parse_algo_env(spec: str) -> dict[str, str]:
    """PYXCCL_ALGO="allreduce=ring,allgather=ring" -> {"allreduce": "ring", ...}."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        prim, _, name = part.partition("=")
        if name:
            out[prim.strip()] = name.strip()
    return out
