"""Persistent calls (MPI-4's ``MPI_Allreduce_init`` and the rest): the ``*_init`` methods of a
:class:`~pyxccl.Communicator`. Each takes the plain call's arguments (but ``async_op``), checks and
prepares the call once, through the full path of the plain call (calls.py, then the context's
planner), and returns a :class:`~pyxccl.core.persistent.PersistentRequest` whose starts run that
prepared call on the same buffers. Nothing moves at init."""
from __future__ import annotations

from .ops import ReduceOp


class PersistentCollectives:
    """The ``*_init`` calls of a :class:`~pyxccl.Communicator`; comm.py makes the requests (``_persistent``,
    ``_point_request``)."""

    def allreduce_init(self, tensor, op=ReduceOp.SUM, *, out=None, algorithm=None, timeout=None):
        """A persistent :meth:`allreduce` of ``tensor`` (into ``out``, or in place): every start
        reduces what ``tensor`` holds then.

        >>> req = comm.allreduce_init(grad)                     # doctest: +SKIP
        >>> grad[:] = g; req.start(); req.wait()                # grad holds the sum
        """
        return self._persistent("allreduce", algorithm, timeout, tensor, op, out)

    def broadcast_init(self, tensor, root: int = 0, *, algorithm=None, timeout=None):
        """A persistent :meth:`broadcast` of rank ``root``'s ``tensor``.

        >>> req = comm.broadcast_init(params, root=0); req()    # doctest: +SKIP
        """
        return self._persistent("broadcast", algorithm, timeout, tensor, root)

    def reduce_init(self, tensor, root: int = 0, op=ReduceOp.SUM, *, out=None, algorithm=None, timeout=None):
        """A persistent :meth:`reduce` into rank ``root``."""
        return self._persistent("reduce", algorithm, timeout, tensor, root, op, out)

    def allgather_init(self, sendbuf, recvbuf=None, *, algorithm=None, timeout=None):
        """A persistent :meth:`allgather` (``recvbuf`` None: allocated once, ``req.result``).

        >>> req = comm.allgather_init(mine); everything = req()  # doctest: +SKIP
        """
        return self._persistent("allgather", algorithm, timeout, sendbuf, recvbuf)

    def allgatherv_init(self, sendbuf, recvbuf, counts, *, algorithm=None, timeout=None):
        """A persistent :meth:`allgatherv`."""
        return self._persistent("allgatherv", algorithm, timeout, sendbuf, recvbuf, counts)

    def gather_init(self, sendbuf, recvbuf=None, root: int = 0, *, algorithm=None, timeout=None):
        """A persistent :meth:`gather` (``recvbuf`` None at the root: allocated once, ``req.result``)."""
        return self._persistent("gather", algorithm, timeout, sendbuf, recvbuf, root)

    def gatherv_init(self, sendbuf, recvbuf=None, counts=None, root: int = 0, *, algorithm=None, timeout=None):
        """A persistent :meth:`gatherv`."""
        return self._persistent("gatherv", algorithm, timeout, sendbuf, recvbuf, counts, root)

    def scatter_init(self, sendbuf, recvbuf, root: int = 0, *, algorithm=None, timeout=None):
        """A persistent :meth:`scatter` from rank ``root``."""
        return self._persistent("scatter", algorithm, timeout, sendbuf, recvbuf, root)

    def scatterv_init(self, sendbuf, recvbuf, counts=None, root: int = 0, *, algorithm=None, timeout=None):
        """A persistent :meth:`scatterv`."""
        return self._persistent("scatterv", algorithm, timeout, sendbuf, recvbuf, counts, root)

    def reduce_scatter_init(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, algorithm=None, timeout=None):
        """A persistent :meth:`reduce_scatter`."""
        return self._persistent("reduce_scatter", algorithm, timeout, sendbuf, recvbuf, op)

    def reduce_scatterv_init(self, sendbuf, recvbuf, counts, op=ReduceOp.SUM, *, algorithm=None, timeout=None):
        """A persistent :meth:`reduce_scatterv`."""
        return self._persistent("reduce_scatterv", algorithm, timeout, sendbuf, recvbuf, counts, op)

    def alltoall_init(self, sendbuf, recvbuf, *, algorithm=None, timeout=None):
        """A persistent :meth:`alltoall`."""
        return self._persistent("alltoall", algorithm, timeout, sendbuf, recvbuf)

    def alltoallv_init(self, sendbuf, recvbuf, send_counts, recv_counts, *, algorithm=None, timeout=None):
        """A persistent :meth:`alltoallv`."""
        return self._persistent("alltoallv", algorithm, timeout, sendbuf, recvbuf, send_counts, recv_counts)

    def barrier_init(self, *, algorithm=None, timeout=None):
        """A persistent :meth:`barrier` (MPI_Barrier_init)."""
        return self._persistent("barrier", algorithm, timeout)

    # --- point to point: MPI_Send_init / MPI_Recv_init ----------------------------------------------------
    def send_init(self, tensor, dst: int, tag: int = 0, *, timeout=None):
        """A persistent send of ``tensor`` to ``dst``: each ``start()`` is an :meth:`isend`, ``run()`` a
        :meth:`send` (don't write ``tensor`` while a start is active).

        >>> req = comm.send_init(buf, dst=1, tag=5)             # doctest: +SKIP
        >>> buf[:] = chunk; req.start(); req.wait()
        """
        return self._point_request("send", tensor, dst, tag, timeout)

    def recv_init(self, tensor, src: int | None, tag: int = 0, *, timeout=None):
        """A persistent receive into ``tensor`` from ``src`` (None: any rank): each ``start()`` is an
        :meth:`irecv`, ``run()`` a :meth:`recv` (returns ``tensor``)."""
        return self._point_request("recv", tensor, src, tag, timeout)
