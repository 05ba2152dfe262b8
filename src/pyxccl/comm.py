"""The Communicator: the operator interface of the adaptation layer.

Every call checks its arguments on the calling rank before any byte moves
(raising InvalidArgumentError and leaving the communicator usable), describes
itself (primitive, buffers, counts, root, op; the rules are those of
``pyxccl.primitives``) and hands the call to the communicator's context
(``core/context.py``), which chooses a plan and runs it.
"""
from __future__ import annotations

import numpy as np

from . import compressed
from ._checks import Check, env_timeout
from ._errors import CommAbortedError
from ._describe import Description
from ._objects import ObjectCollectives
from .core.context import Context
from .core.onehost import attach_segment
from .ops import ReduceOp
from .primitives import PRIMITIVES


def default_timeout() -> float:
    return env_timeout("PYXCCL_TIMEOUT", 300.0)


class Communicator(Description, ObjectCollectives):
    """A group of ranks that run collectives together (made by :func:`pyxccl.init` or :meth:`split`).

    >>> comm = pyxccl.init()                      # doctest: +SKIP
    >>> x = np.full(4, comm.rank, np.float32)
    >>> comm.allreduce(x)                         # in place: every rank now holds the sum
    >>> w = comm.allgather(x, async_op=True); w.wait()
    """

    def __init__(self, ctx: Context):
        self._ctx = ctx
        self.rank, self.size, self.timeout = ctx.rank, ctx.size, ctx.timeout

    def __repr__(self) -> str:
        state = "closed" if self._ctx.closed else ("failed" if self._ctx.error else "open")
        return f"<pyxccl.Communicator rank {self.rank} of {self.size}, id {self._ctx.id:08x}, {state}>"


    # --- collectives --------------------------------------------------------------
    def _run(self, c: Check, prim: str, bufs: dict, args: dict, size, nbytes: int, *, op=None,
             root=None, result=None, quick=None, writes=True, codec=None, after=None):
        """Run a checked call: ``args`` for the builders, ``size`` for its fingerprint, ``nbytes`` for the
        choice of algorithm; ``c.how``: its (algorithm, async_op, timeout); ``quick``: the key its next
        calls run prepared under (core/quick.py), ``writes``: it writes its output; ``codec``, ``after``: see
        compressed.py."""
        algorithm, async_op, timeout = c.how
        n_in, n_out = PRIMITIVES[prim].buffers(self.rank, args)
        for b, want in (("in", n_in), ("out", n_out)):
            if b in bufs and bufs[b].size != want:
                c.size(bufs[b], want, "the output" if b == "out" else "the input")
        c.apart(bufs, PRIMITIVES[prim], args)
        plan = self._ctx.plans.plan(prim, next(iter(bufs.values())).dtype, nbytes, op, root, algorithm, c.error,
                                    codec)
        key = tuple(args.values())          # hashable: counts lists become tuples
        if "count" not in args:
            key = tuple(v if type(v) is int else tuple(v) for v in key)
        return self._ctx.collective(c.op, plan, key, args, size, bufs, result=result, async_op=async_op,
                                    timeout=timeout, quick=quick, writes=writes, after=after, codec=codec)

    def allreduce(self, tensor, op=ReduceOp.SUM, *, out=None, async_op=False, algorithm=None, timeout=None,
                  compression=None, key=None):
        """Reduce ``tensor`` over all ranks; every rank gets the result (in place, or in ``out``).
        ``compression=``, ``key=`` (here, in reduce_scatter and in allgather): see compressed.py.

        >>> comm.allreduce(grad, compression="int8")       # doctest: +SKIP
        """
        if compression is not None:
            return compressed.allreduce(self, tensor, op, out, async_op, algorithm, timeout, compression, key)
        dst = tensor if out is None else out
        sh = _shape(tensor)
        q = sh and (out is None or _shape(out)) and ("allreduce", sh, out is None or _shape(out), op, algorithm,
                                                     timeout)
        if q and async_op is False and self._ctx.quick(q, tensor, dst):
            return dst
        c = Check(self, "allreduce", (algorithm, async_op, timeout))
        buf = c.array(tensor, "tensor", writable=out is None)
        dst = buf if out is None else c.same_dtype(buf, c.array(out, "out", writable=True), "out")
        return self._run(c, "allreduce", {"in": buf, "out": dst}, dict(count=buf.size), buf.size, buf.nbytes,
                         op=c.op_for(op, buf.dtype),
                         result=tensor if out is None else out, quick=q)

    def broadcast(self, tensor, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Copy ``tensor`` of rank ``root`` into ``tensor`` of every rank."""
        sh = _shape(tensor)
        q = sh and type(root) is int and ("broadcast", sh, root, algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, None, tensor):
            return tensor
        c = Check(self, "broadcast", (algorithm, async_op, timeout))
        root = c.rank(root, "root")
        buf = c.array(tensor, "tensor", writable=self.rank != root)
        return self._run(c, "broadcast", {"out": buf}, dict(count=buf.size, root=root), buf.size, buf.nbytes,
                         root=root, result=tensor, quick=q, writes=self.rank != root)

    def reduce(self, tensor, root: int = 0, op=ReduceOp.SUM, *, out=None, async_op=False, algorithm=None,
               timeout=None):
        """Reduce ``tensor`` over all ranks into rank ``root`` (in place there, or into ``out``).

        The other ranks' buffers are left unchanged.
        """
        dst = out if out is not None and self.rank == root else tensor
        sh = _shape(tensor)
        q = sh and type(root) is int and (dst is tensor or _shape(dst)) and (
            "reduce", sh, dst is tensor or _shape(dst), root, op, algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, tensor, dst):
            return dst
        c = Check(self, "reduce", (algorithm, async_op, timeout))
        root = c.rank(root, "root")
        is_root = self.rank == root
        buf = c.array(tensor, "tensor", writable=is_root and out is None)
        dst = c.same_dtype(buf, c.array(out, "out", writable=True), "out") if is_root and out is not None else buf
        return self._run(c, "reduce", {"in": buf, "out": dst}, dict(count=buf.size, root=root), buf.size,
                         buf.nbytes, op=c.op_for(op, buf.dtype), root=root,
                         result=out if out is not None and is_root else tensor, quick=q, writes=is_root)

    def allgather(self, sendbuf, recvbuf=None, *, async_op=False, algorithm=None, timeout=None, compression=None,
                  key=None):
        """Concatenate every rank's ``sendbuf`` (in rank order) into ``recvbuf`` on every rank.

        ``recvbuf`` needs ``size * len(sendbuf)`` elements; None allocates and returns a numpy array.
        """
        if compression is not None:
            return compressed.allgather(self, sendbuf, recvbuf, async_op, algorithm, timeout, compression, key)
        q = _shape(sendbuf) and _shape(recvbuf) and ("allgather", _shape(sendbuf), _shape(recvbuf), algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, sendbuf, recvbuf):
            return recvbuf
        c = Check(self, "allgather", (algorithm, async_op, timeout))
        send = c.array(sendbuf, "sendbuf", writable=False)
        return self._allgatherv(c, send, recvbuf, [send.size] * self.size, q)

    def allgatherv(self, sendbuf, recvbuf, counts, *, async_op=False, algorithm=None, timeout=None):
        """Like allgather, rank i contributing ``counts[i]`` elements."""
        c = Check(self, "allgatherv", (algorithm, async_op, timeout))
        return self._allgatherv(c, c.array(sendbuf, "sendbuf", writable=False), recvbuf, counts)

    def _allgatherv(self, c, send, recvbuf, counts, quick=None):
        counts = c.counts(counts, "counts", own=(send.size, "sendbuf"))
        recvbuf = c.allocate(recvbuf, sum(counts), send.dtype)
        recv = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
        return self._run(c, "allgather", {"in": send, "out": recv}, dict(counts=counts), counts, recv.nbytes,
                         result=recvbuf, quick=quick)

    def gather(self, sendbuf, recvbuf=None, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Concatenate every rank's ``sendbuf`` into ``recvbuf`` of rank ``root``.

        Only the root needs ``recvbuf`` (None there allocates one); the others get None back.
        """
        out = recvbuf if self.rank == root else None
        q = type(root) is int and _shape(sendbuf) and (out is None or _shape(out)) and (
            "gather", _shape(sendbuf), out is not None and _shape(out), root, algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, sendbuf, out):
            return out
        c = Check(self, "gather", (algorithm, async_op, timeout))
        send = c.array(sendbuf, "sendbuf", writable=False)
        return self._gatherv(c, send, recvbuf, root, [send.size] * self.size, q)

    def gatherv(self, sendbuf, recvbuf=None, counts=None, root: int = 0, *, async_op=False, algorithm=None,
                timeout=None):
        """Like gather, rank i contributing ``counts[i]`` elements (``counts`` needed at the root)."""
        c = Check(self, "gatherv", (algorithm, async_op, timeout))
        send = c.array(sendbuf, "sendbuf", writable=False)
        return self._gatherv(c, send, recvbuf, root, c.root_counts(counts, c.rank(root, "root"), send.size))

    def _gatherv(self, c, send, recvbuf, root, counts, quick=None):
        root = c.rank(root, "root")
        counts = c.counts(counts, "counts", own=(send.size, "sendbuf"))
        bufs, recvbuf = {"in": send}, None if self.rank != root else c.allocate(recvbuf, sum(counts), send.dtype)
        if self.rank == root:
            bufs["out"] = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
        return self._run(c, "gather", bufs, dict(counts=counts, root=root), c.agreed(counts),
                         send.nbytes * self.size, root=root, result=recvbuf, quick=quick)

    def scatter(self, sendbuf, recvbuf, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Rank ``root`` cuts ``sendbuf`` into ``size`` equal parts; rank i receives part i in ``recvbuf``.

        ``sendbuf`` is only read on the root (pass None elsewhere).
        """
        inp = sendbuf if self.rank == root else None
        q = type(root) is int and _shape(recvbuf) and (inp is None or _shape(inp)) and (
            "scatter", inp is not None and _shape(inp), _shape(recvbuf), root, algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, inp, recvbuf):
            return recvbuf
        c = Check(self, "scatter", (algorithm, async_op, timeout))
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._scatterv(c, sendbuf, recv, recvbuf, root, [recv.size] * self.size, q)

    def scatterv(self, sendbuf, recvbuf, counts=None, root: int = 0, *, async_op=False, algorithm=None,
                 timeout=None):
        """Like scatter, rank i receiving ``counts[i]`` elements (``counts`` needed at the root)."""
        c = Check(self, "scatterv", (algorithm, async_op, timeout))
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._scatterv(c, sendbuf, recv, recvbuf, root, c.root_counts(counts, c.rank(root, "root"), recv.size))

    def _scatterv(self, c, sendbuf, recv, recvbuf, root, counts, quick=None):
        root = c.rank(root, "root")
        counts = c.counts(counts, "counts", own=(recv.size, "recvbuf"))
        bufs = {"out": recv}
        if self.rank == root:
            if sendbuf is None:
                raise c.error("the root must pass sendbuf")
            bufs = {"in": c.same_dtype(recv, c.array(sendbuf, "sendbuf", writable=False), "sendbuf"), "out": recv}
        return self._run(c, "scatter", bufs, dict(counts=counts, root=root), c.agreed(counts),
                         recv.nbytes * self.size, root=root, result=recvbuf, quick=quick)

    def reduce_scatter(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, async_op=False, algorithm=None,
                       timeout=None, compression=None, key=None):
        """Reduce ``sendbuf`` (``size`` equal parts) over all ranks; rank i gets part i in ``recvbuf``."""
        if compression is not None:
            return compressed.reduce_scatter(self, sendbuf, recvbuf, op, async_op, algorithm, timeout, compression,
                                             key)
        q = _shape(sendbuf) and _shape(recvbuf) and ("reduce_scatter", _shape(sendbuf), _shape(recvbuf), op,
                                                     algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, sendbuf, recvbuf):
            return recvbuf
        c = Check(self, "reduce_scatter", (algorithm, async_op, timeout))
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._reduce_scatterv(c, sendbuf, recv, recvbuf, [recv.size] * self.size, op, q)

    def reduce_scatterv(self, sendbuf, recvbuf, counts, op=ReduceOp.SUM, *, async_op=False, algorithm=None,
                        timeout=None):
        """Like reduce_scatter, rank i getting ``counts[i]`` elements."""
        c = Check(self, "reduce_scatterv", (algorithm, async_op, timeout))
        recv = c.array(recvbuf, "recvbuf", writable=True)
        return self._reduce_scatterv(c, sendbuf, recv, recvbuf, counts, op)

    def _reduce_scatterv(self, c, sendbuf, recv, recvbuf, counts, op, quick=None):
        send = c.same_dtype(recv, c.array(sendbuf, "sendbuf", writable=False), "sendbuf")
        counts = c.counts(counts, "counts", total=(send.size, "sendbuf"), own=(recv.size, "recvbuf"))
        return self._run(c, "reduce_scatter", {"in": send, "out": recv}, dict(counts=counts), counts, send.nbytes,
                         op=c.op_for(op, send.dtype), result=recvbuf, quick=quick)

    def alltoall(self, sendbuf, recvbuf, *, async_op=False, algorithm=None, timeout=None):
        """Rank i sends part j of ``sendbuf`` (``size`` equal parts) to rank j, which stores it as part i."""
        q = _shape(sendbuf) and _shape(recvbuf) and ("alltoall", _shape(sendbuf), _shape(recvbuf), algorithm, timeout)
        if q and async_op is False and self._ctx.quick(q, sendbuf, recvbuf):
            return recvbuf
        c = Check(self, "alltoall", (algorithm, async_op, timeout))
        send = c.array(sendbuf, "sendbuf", writable=False)
        if send.size % self.size:
            raise c.error(f"sendbuf has {send.size} elements, not a multiple of the {self.size} ranks")
        counts = [send.size // self.size] * self.size
        return self._alltoallv(c, send, recvbuf, counts, counts, q)

    def alltoallv(self, sendbuf, recvbuf, send_counts, recv_counts, *, async_op=False, algorithm=None,
                  timeout=None):
        """Rank i sends ``send_counts[j]`` elements to rank j and receives ``recv_counts[j]`` from it."""
        c = Check(self, "alltoallv", (algorithm, async_op, timeout))
        return self._alltoallv(c, c.array(sendbuf, "sendbuf", writable=False), recvbuf, send_counts, recv_counts)

    def _alltoallv(self, c, send, recvbuf, send_counts, recv_counts, quick=None):
        recv = c.same_dtype(send, c.array(recvbuf, "recvbuf", writable=True), "recvbuf")
        sc = c.counts(send_counts, "send_counts", total=(send.size, "sendbuf"))
        rc = c.counts(recv_counts, "recv_counts", total=(recv.size, "recvbuf"))
        if sc[self.rank] != rc[self.rank]:
            raise c.error(f"this rank sends itself {sc[self.rank]} elements but expects {rc[self.rank]}")
        return self._run(c, "alltoall", {"in": send, "out": recv}, dict(send_counts=sc, recv_counts=rc),
                         sc if c.op == "alltoall" else None, send.nbytes, result=recvbuf, quick=quick)

    def barrier(self, *, async_op=False, algorithm=None, timeout=None):
        """Return once every rank has entered the barrier."""
        q = ("barrier", algorithm, timeout)
        if async_op is False and self._ctx.quick(q, None, None):
            return None
        return self._run(Check(self, "barrier", (algorithm, async_op, timeout)), "barrier",
                         {"in": np.empty(0, np.uint8)}, {}, 0, 0, quick=q)

    # --- point to point -----------------------------------------------------------
    def isend(self, tensor, dst: int, tag: int = 0, *, timeout=None):
        """Start sending ``tensor`` to rank ``dst``; don't modify it until the Work is done."""
        return self._send("isend", tensor, dst, tag, timeout, async_op=True)

    def send(self, tensor, dst: int, tag: int = 0, *, timeout=None) -> None:
        """Send ``tensor`` to rank ``dst`` (matched by a recv with the same tag)."""
        self._send("send", tensor, dst, tag, timeout, async_op=False)

    def _send(self, name, tensor, dst, tag, timeout, async_op):
        c = Check(self, name)
        return self._ctx.send(name, c.array(tensor, "tensor", writable=False), c.rank(dst, "dst"), c.tag(tag),
                              async_op=async_op, timeout=c.timeout(timeout))

    def irecv(self, tensor, src: int | None, tag: int = 0, *, timeout=None):
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
        c = Check(self, name)
        return self._ctx.recv(name, c.array(tensor, "tensor", writable=True), None if src is None else
                              c.rank(src, "src"), c.tag(tag), tensor, async_op=async_op, timeout=c.timeout(timeout))

    # --- sub-communicators ------------------------------------------------------------
    def split(self, color, key: int = 0, *, timeout=None) -> "Communicator | None":
        """Partition the ranks by ``color``; order each part by (``key``, rank). Collective.

        A rank passing ``color=None`` takes part but gets None back (MPI_UNDEFINED).

        >>> tp = comm.split(color=comm.rank // 2)        # doctest: +SKIP
        """
        c = Check(self, "split")
        color, key, _ = c.color(color), c.integer(key, "key"), c.timeout(timeout)
        infos = self.allgather_object((color, key), timeout=timeout)
        child = self._ctx.split(color, sorted((k, r) for r, (col, k) in enumerate(infos) if col == color))
        return None if child is None else _ready(Communicator(child))

    def dup(self) -> "Communicator":
        """A new communicator with the same ranks (collective), whose calls never mix with this one's."""
        return self.split(0, self.rank)

    # --- teardown ---------------------------------------------------------------------
    def abort(self) -> None:
        """Give up on this communicator, from any thread: every pending and later operation raises
        ``CommAbortedError``; the other ranks' fail at once with ``PeerLostError`` naming this rank.

        >>> threading.Timer(60, comm.abort).start()    # a watchdog   # doctest: +SKIP
        """
        self._ctx.abort(CommAbortedError(f"rank {self.rank}: comm.abort() was called; make a new communicator",
                                         rank=self.rank, op="abort"))

    def shrink(self, *, timeout=None) -> "Communicator":
        """After a lost rank, the survivors' new world communicator (MPI ULFM's MPIX_Comm_shrink; every
        survivor calls it; core/shrink.py). ``examples/elastic.py`` finishes a job that lost a rank.

        >>> comm = comm.shrink()   # in `except pyxccl.PeerLostError:`   # doctest: +SKIP
        """
        from .core.shrink import shrink
        return world(shrink(self._ctx, Check(self, "shrink").timeout(timeout) or self.timeout), self.timeout, False)

    def close(self) -> None:
        """Release the communicator. Closing the world communicator also closes every
        communicator split from it and releases sockets, threads and shared memory."""
        compressed.forget(self)             # the compressors its spec strings named (their residuals)
        self._ctx.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shape(a):
    """A numpy array's (dtype, size) in the key of a prepared call; None for anything else."""
    return (a.dtype, a.size) if type(a) is np.ndarray else None


def _ready(comm: Communicator, tune: bool = False) -> Communicator:
    """Give a new communicator its one-host segment, link figures (``tune``) and tuner (collective).
    The set-up's own calls come from whichever thread makes the communicator: not checked."""
    ctx = comm._ctx
    ctx.thread_check = False
    try:
        attach_segment(ctx, comm.broadcast_object, comm.allgather_object)
        if tune and comm.size > 1:
            from .tuning.probe import measure
            ctx.mesh.machine = measure(comm)
    except BaseException:
        comm.close()
        raise
    ctx.make_tuner()
    ctx.thread_check = True
    return comm


def world(mesh, timeout: float, tune: bool = True) -> Communicator:
    """The world communicator of ``mesh`` (collective): its segment, its link figures, its tuner."""
    return _ready(Communicator(Context(mesh, list(range(mesh.size)), 0, timeout)), tune)
