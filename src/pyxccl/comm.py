"""The Communicator: the operator interface of the adaptation layer.

Every call checks its arguments on the calling rank before any byte moves
(raising InvalidArgumentError and leaving the communicator usable), describes
itself (primitive, buffers, counts, root, op; the rules are those of
``pyxccl.primitives``) and hands the call to the communicator's context
(``core/context.py``), which chooses a plan and runs it.
"""
from __future__ import annotations

from ._checks import Check, env_timeout
from ._errors import CommAbortedError
from ._describe import Description
from ._objects import ObjectCollectives
from ._persistent import PersistentCollectives
from .calls import DESCRIBE, Described
from .compression import collectives as compressed
from .core.context import Context
from .core.onehost import _native, attach_segment
from .core.persistent import CollectiveRequest, PointToPointRequest
from .core.prepared import FULL_PATH, key
from .ops import ReduceOp
from .primitives import PRIMITIVES


def default_timeout() -> float:
    return env_timeout("PYXCCL_TIMEOUT", 300.0)


def _repeat(comm, name: str, inp, out, root, op, async_op, algorithm, timeout, *args):
    """Run call ``name`` (each collective's way in): the prepared call of this output's last blocking repeat
    if it takes these buffers and objects, else ``_full``. ``_native.repeat`` is this in C where the C
    executor is built (``_call``); tests/test_floor.py holds the two to the same books."""
    kept = comm._ctx.prepared
    # this array's last blocking repeat: its C call checks the arrays, objects and thread (no key)
    # (a form of it remembered in ``forms`` has an entry here too: PreparedCalls.remember)
    p = kept.last.get((name, id(out))) if async_op is False else None
    if p is not None:
        done = p.fast.again(inp, out, root, op, algorithm, timeout)
        if done is None:        # another form of the call on this output: the one remembered for this one?
            q = kept.forms.get((name, id(out), id(root), id(op), id(algorithm), id(timeout)))
            if q is not None:
                p, done = q, q.fast.again(inp, out, root, op, algorithm, timeout)
                kept.last[name, id(out)] = q
        if done is True:
            return out
        done = p.settle(inp, out, FULL_PATH, done)
        if done is not FULL_PATH:
            return done
    return _full(comm, name, inp, out, root, op, async_op, algorithm, timeout, *args)


def _full(comm, name: str, inp, out, root, op, async_op, algorithm, timeout, *args):
    """Call ``name`` by its key: the prepared call kept under it if it takes these buffers, else the full
    path (``calls.DESCRIBE[name](check, rank, size, *args)``), which keeps what it prepared under the key
    for the next call."""
    ctx = comm._ctx
    kept = ctx.prepared
    thread = ctx.thread_word()
    k = key(name, inp, out, root, op, algorithm, timeout, thread)
    try:
        p = kept.get(k)
    except TypeError:       # an unhashable op object: never kept
        p = k = None
    if p is not None:
        kept.used.add(k)
        done = p.again(inp, out, async_op)
        if done is not FULL_PATH:
            if async_op is False and p.fast is not None:
                kept.remember(name, inp, out, root, op, algorithm, timeout, p)
            return done
    c = Check(comm, name, (algorithm, async_op, timeout))
    return comm._start(c, DESCRIBE[name](c, comm.rank, comm.size, *args), k)


if _native is not None:
    _native.set_repeat(_full, FULL_PATH)
_call = _repeat if _native is None else _native.repeat


class Communicator(Description, ObjectCollectives, PersistentCollectives):
    """A group of ranks that run collectives together (made by :func:`pyxccl.init` or :meth:`split`).

    >>> comm = pyxccl.init()                      # doctest: +SKIP
    >>> x = np.full(4, comm.rank, np.float32)
    >>> comm.allreduce(x)                         # in place: every rank now holds the sum
    >>> w = comm.allgather(x, async_op=True); w.wait()
    >>> req = comm.allreduce_init(x)              # persistent: checked once, started many times
    >>> req.start(); req.wait()
    """

    def __init__(self, ctx: Context):
        self._ctx = ctx
        self.rank, self.size, self.timeout = ctx.rank, ctx.size, ctx.timeout

    def __repr__(self) -> str:
        state = "closed" if self._ctx.closed else ("failed" if self._ctx.error else "open")
        return f"<pyxccl.Communicator rank {self.rank} of {self.size}, id {self._ctx.id:08x}, {state}>"


    # --- collectives --------------------------------------------------------------
    # Each call names what this rank reads and writes (``inp``, ``out``: the user's objects, None for
    # none or an output to allocate) for its key, then its arguments for the full path (calls.py).
    def _start(self, c: Check, d: Described, k=None):
        """Run the described call ``d`` (checked by ``c``, whose ``how`` is its algorithm, async_op and
        timeout), kept under key ``k`` for its repeats (None: not kept)."""
        return self._prepare(c, d, k).start(d.inp, d.out, d.result, c.how[1], d.codec, d.after)

    def _prepare(self, c: Check, d: Described, k=None):
        """The described call ``d`` checked (its buffers' sizes and overlap), planned and prepared, not
        run: ``_start`` runs it once, a persistent request (_persistent.py) at every start."""
        algorithm, _, timeout = c.how
        prim = PRIMITIVES[d.primitive]
        n_in, n_out = prim.buffers(self.rank, d.args)
        for arr, want, what in ((d.inp, n_in, "the input"), (d.out, n_out, "the output")):
            if arr is not None and arr.size != want:
                c.size(arr, want, what)
        c.apart({"in": d.inp, "out": d.out}, prim, d.args)
        dtype = (d.inp if d.inp is not None else d.out).dtype
        ctx = self._ctx
        plan = ctx.plans.plan(d.primitive, dtype, d.nbytes, d.op, d.root, algorithm, c.error, d.codec)
        keep = k if d.codec is None and d.after is None else None
        return ctx.prepare(c.op, plan, d.args, d.size, d.inp, d.out, timeout=timeout, writes=d.writes,
                           allocates=d.allocates, keep=keep)

    def _persistent(self, name: str, algorithm, timeout, *args) -> CollectiveRequest:
        """A persistent request of call ``name`` (the ``*_init`` calls, _persistent.py): the plain call's
        full path up to its ``Prepared``, which every start runs on the arrays described here."""
        ctx = self._ctx
        ctx.usable(name)        # closed or failed: refused at init, as the plain call would be
        c = Check(self, name, (algorithm, False, timeout))
        d = DESCRIBE[name](c, self.rank, self.size, *args)
        return CollectiveRequest(ctx, name, self._prepare(c, d), lambda: self._prepare(c, d), d.inp, d.out, d.result)

    def _point_request(self, name: str, tensor, peer, tag, timeout) -> PointToPointRequest:
        """A persistent "send" to or "recv" from ``peer`` (None: any rank), its arguments checked once."""
        c = Check(self, name)
        self._ctx.usable(name)
        buf = c.array(tensor, "tensor", writable=name == "recv")
        peer = None if peer is None and name == "recv" else c.rank(peer, "dst" if name == "send" else "src")
        return PointToPointRequest(self._ctx, name, buf, peer, c.tag(tag), c.timeout(timeout),
                                   tensor if name == "recv" else None)

    def allreduce(self, tensor, op=ReduceOp.SUM, *, out=None, async_op=False, algorithm=None, timeout=None,
                  compression=None, key=None):
        """Reduce ``tensor`` over all ranks; every rank gets the result (in place, or in ``out``).
        ``compression=``, ``key=`` (here, in reduce_scatter and in allgather): see pyxccl.compression.

        >>> comm.allreduce(grad, compression="int8")       # doctest: +SKIP
        """
        if compression is not None:
            return compressed.allreduce(self, self._start, tensor, op, out, async_op, algorithm, timeout,
                                        compression, key)
        return _call(self, "allreduce", tensor, tensor if out is None else out, None, op, async_op, algorithm,
                          timeout, tensor, op, out)

    def broadcast(self, tensor, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Copy ``tensor`` of rank ``root`` into ``tensor`` of every rank."""
        return _call(self, "broadcast", None, tensor, root, None, async_op, algorithm, timeout, tensor, root)

    def reduce(self, tensor, root: int = 0, op=ReduceOp.SUM, *, out=None, async_op=False, algorithm=None,
               timeout=None):
        """Reduce ``tensor`` over all ranks into rank ``root`` (in place there, or into ``out``).

        The other ranks' buffers are left unchanged.
        """
        dst = out if out is not None and self.rank == root else tensor
        return _call(self, "reduce", tensor, dst, root, op, async_op, algorithm, timeout, tensor, root, op, out)

    def allgather(self, sendbuf, recvbuf=None, *, async_op=False, algorithm=None, timeout=None, compression=None,
                  key=None):
        """Concatenate every rank's ``sendbuf`` (in rank order) into ``recvbuf`` on every rank.

        ``recvbuf`` needs ``size * len(sendbuf)`` elements; None allocates and returns a numpy array.
        """
        if compression is not None:
            return compressed.allgather(self, self._start, sendbuf, recvbuf, async_op, algorithm, timeout,
                                        compression, key)
        return _call(self, "allgather", sendbuf, recvbuf, None, None, async_op, algorithm, timeout, sendbuf, recvbuf)

    def allgatherv(self, sendbuf, recvbuf, counts, *, async_op=False, algorithm=None, timeout=None):
        """Like allgather, rank i contributing ``counts[i]`` elements (``recvbuf`` None allocates)."""
        c = Check(self, "allgatherv", (algorithm, async_op, timeout))
        return self._start(c, DESCRIBE["allgatherv"](c, self.rank, self.size, sendbuf, recvbuf, counts))

    def gather(self, sendbuf, recvbuf=None, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Concatenate every rank's ``sendbuf`` into ``recvbuf`` of rank ``root``.

        Only the root needs ``recvbuf`` (None there allocates one); the others get None back.
        """
        out = recvbuf if self.rank == root else None
        return _call(self, "gather", sendbuf, out, root, None, async_op, algorithm, timeout, sendbuf, recvbuf, root)

    def gatherv(self, sendbuf, recvbuf=None, counts=None, root: int = 0, *, async_op=False, algorithm=None,
                timeout=None):
        """Like gather, rank i contributing ``counts[i]`` elements (``counts`` needed at the root)."""
        c = Check(self, "gatherv", (algorithm, async_op, timeout))
        return self._start(c, DESCRIBE["gatherv"](c, self.rank, self.size, sendbuf, recvbuf, counts, root))

    def scatter(self, sendbuf, recvbuf, root: int = 0, *, async_op=False, algorithm=None, timeout=None):
        """Rank ``root`` cuts ``sendbuf`` into ``size`` equal parts; rank i receives part i in ``recvbuf``.

        ``sendbuf`` is only read on the root (pass None elsewhere).
        """
        inp = sendbuf if self.rank == root else None
        return _call(self, "scatter", inp, recvbuf, root, None, async_op, algorithm, timeout, sendbuf, recvbuf, root)

    def scatterv(self, sendbuf, recvbuf, counts=None, root: int = 0, *, async_op=False, algorithm=None,
                 timeout=None):
        """Like scatter, rank i receiving ``counts[i]`` elements (``counts`` needed at the root)."""
        c = Check(self, "scatterv", (algorithm, async_op, timeout))
        return self._start(c, DESCRIBE["scatterv"](c, self.rank, self.size, sendbuf, recvbuf, counts, root))

    def reduce_scatter(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, async_op=False, algorithm=None,
                       timeout=None, compression=None, key=None):
        """Reduce ``sendbuf`` (``size`` equal parts) over all ranks; rank i gets part i in ``recvbuf``."""
        if compression is not None:
            return compressed.reduce_scatter(self, self._start, sendbuf, recvbuf, op, async_op, algorithm, timeout,
                                             compression, key)
        return _call(self, "reduce_scatter", sendbuf, recvbuf, None, op, async_op, algorithm, timeout, sendbuf,
                          recvbuf, op)

    def reduce_scatterv(self, sendbuf, recvbuf, counts, op=ReduceOp.SUM, *, async_op=False, algorithm=None,
                        timeout=None):
        """Like reduce_scatter, rank i getting ``counts[i]`` elements."""
        c = Check(self, "reduce_scatterv", (algorithm, async_op, timeout))
        return self._start(c, DESCRIBE["reduce_scatterv"](c, self.rank, self.size, sendbuf, recvbuf, counts, op))

    def alltoall(self, sendbuf, recvbuf, *, async_op=False, algorithm=None, timeout=None):
        """Rank i sends part j of ``sendbuf`` (``size`` equal parts) to rank j, which stores it as part i."""
        return _call(self, "alltoall", sendbuf, recvbuf, None, None, async_op, algorithm, timeout, sendbuf, recvbuf)

    def alltoallv(self, sendbuf, recvbuf, send_counts, recv_counts, *, async_op=False, algorithm=None,
                  timeout=None):
        """Rank i sends ``send_counts[j]`` elements to rank j and receives ``recv_counts[j]`` from it."""
        c = Check(self, "alltoallv", (algorithm, async_op, timeout))
        return self._start(c, DESCRIBE["alltoallv"](c, self.rank, self.size, sendbuf, recvbuf, send_counts,
                                                    recv_counts))

    def barrier(self, *, async_op=False, algorithm=None, timeout=None):
        """Return once every rank has entered the barrier."""
        return _call(self, "barrier", None, None, None, None, async_op, algorithm, timeout)

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
        self._ctx.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ready(comm: Communicator, tune: bool = False) -> Communicator:
    """Give a new communicator its one-host segment, link figures (``tune``) and tuner (collective).
    The set-up's own calls come from whichever thread makes the communicator: not checked."""
    ctx = comm._ctx
    ctx.thread_check, ctx.setting_up = False, True
    try:
        attach_segment(ctx, comm.broadcast_object, comm.allgather_object)
        if tune and comm.size > 1:
            from .probe import measure
            ctx.mesh.machine = measure(comm)
    except BaseException:
        comm.close()
        raise
    ctx.thread_check, ctx.setting_up = True, False
    ctx.make_tuner()        # and drops the set-up's plans: they are not the user's
    return comm


def world(mesh, timeout: float, tune: bool = True) -> Communicator:
    """The world communicator of ``mesh`` (collective): its segment, its link figures, its tuner."""
    return _ready(Communicator(Context(mesh, list(range(mesh.size)), 0, timeout)), tune)
