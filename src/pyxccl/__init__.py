"""pyxccl: collective communication for CPU processes on one or many hosts.

>>> import numpy as np, pyxccl                      # doctest: +SKIP
>>> comm = pyxccl.init()                           # under `pyxccl run -n 4`, torchrun, mpirun, srun
>>> x = np.arange(4, dtype=np.float32) * comm.rank
>>> comm.allreduce(x)                              # in place, every rank gets the sum
>>> comm.close()
"""
from __future__ import annotations

import atexit
import os
import weakref

from . import _env
from ._errors import (CollectiveMismatchError, CommAbortedError, CommClosedError, CommError, CommTimeoutError,
                      InvalidArgumentError, NotSupportedError, PeerLostError, ProtocolError, PyxcclError,
                      RendezvousError, TensorArgumentError, UnsupportedOpError)
from ._version import __version__
from .comm import Communicator, default_timeout
from .comm import world as _world
from .core.engine import Work
from .core.persistent import PersistentRequest
from .ops import ReduceOp
from .trace import compute

__all__ = [
    "init", "Communicator", "Work", "PersistentRequest", "ReduceOp", "compute",
    "PyxcclError", "InvalidArgumentError", "UnsupportedOpError", "TensorArgumentError", "NotSupportedError",
    "CommClosedError", "RendezvousError",
    "CommError", "CommTimeoutError", "PeerLostError", "ProtocolError", "CollectiveMismatchError",
    "CommAbortedError",
]

_open: "weakref.WeakSet[Communicator]" = weakref.WeakSet()
# Stores init() made, by rendezvous, kept for the process's life: a later init() with the same
# rendezvous (close() then init(), or a new world of survivors) uses the same server, where a
# store closed with its world would vanish under the ranks still connecting to it.
_stores: dict[tuple, object] = {}


def init(rank: int | None = None, size: int | None = None, store=None, *, init_method: str | None = None,
         timeout: float | None = None, transport: str | None = None) -> Communicator:
    """Join the job and return its world communicator.

    With no arguments, rank and size come from the launcher's environment
    (``pyxccl run``, torchrun, mpirun/mpiexec, srun) and the rendezvous from
    ``MASTER_ADDR``/``MASTER_PORT``. Otherwise pass ``rank`` and ``size`` and
    either a ``store`` (a :class:`pyxccl.rendezvous.Store`) or an
    ``init_method``: ``"env://"``, ``"tcp://host:port"`` (rank 0 hosts the
    store) or ``"file:///shared/dir"``. A process started without any of these
    is a world of one.

    ``timeout`` (s, default ``PYXCCL_TIMEOUT`` or 300) is the deadline of
    set-up and of every later call; ``transport`` (default
    ``PYXCCL_TRANSPORT`` or ``"auto"``) forces ``"tcp"`` or ``"shm"``. The
    first init on a host measures its links (well under a second) and keeps
    the figures the tuner chooses algorithms with in
    ``~/.cache/pyxccl/links.json`` (``PYXCCL_LINKS``); later inits check them
    with a quick re-measurement and measure again when the file was recorded
    on a busy machine, belongs to another machine or software version, is
    older than ``PYXCCL_LINKS_MAX_AGE`` seconds (a week) or is malformed.

    >>> comm = pyxccl.init(rank=0, size=2, init_method="tcp://127.0.0.1:29500")   # doctest: +SKIP
    """
    from ._checks import init_arguments, world_rank
    from .launch_env import read_launch_env
    from .rendezvous import PrefixStore, create_store
    from .transport.mesh import Mesh, build_mesh

    init_arguments(rank, size, store, init_method, timeout, transport)     # before anything is made
    _setup_logging()
    timeout = default_timeout() if timeout is None else float(timeout)
    transport = transport or _env.get("PYXCCL_TRANSPORT")
    master = os.environ.get("MASTER_ADDR")
    if rank is None or size is None:
        info = read_launch_env()
        if info is None:
            if rank not in (None, 0) or size not in (None, 1):
                raise InvalidArgumentError("pyxccl.init: pass both rank= and size=, or start the processes "
                                           "with a launcher (pyxccl run, torchrun, mpirun, srun)", op="init")
            rank, size = 0, 1
        else:
            rank = info.rank if rank is None else rank
            size = info.world_size if size is None else size
            master = info.master_addr or master
    rank, size = world_rank(rank, size)
    if size == 1 and store is None and init_method is None:
        mesh = Mesh(0, 1)
        from .transport.topology import host_id
        mesh.hosts, mesh.transport = [host_id()], transport     # (tcp: no shared memory, not even a segment)
    else:
        if store is None:
            url = init_method or "env://"
            where = (url, os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"), rank)
            store = _stores.get(where)
            if store is None:
                store = _stores[where] = create_store(url, rank=rank, world_size=size, timeout=timeout)
            if init_method and init_method.startswith("tcp://"):
                master = init_method[6:].rsplit(":", 1)[0]
        # Every init() on one store gets its own key space, the same on every rank.
        gen = store.add(f"pyxccl/init-count/{rank}", 1)
        mine = PrefixStore(f"pyxccl/{gen}", store)
        mesh = build_mesh(mine, rank, size, transport=transport, master_addr=master, timeout=timeout)
        mesh.store, mesh.how = mine, (transport, master)
    comm = _world(mesh, timeout, tune=_env.get("PYXCCL_TUNE"))
    if store is not None:
        store.release()         # started: rank 0's store holds no connection per rank while idle
    _open.add(comm)
    return comm


def _setup_logging() -> None:
    """PYXCCL_DEBUG=INFO (or WARN, DEBUG) logs set-up and algorithm choices to stderr, like NCCL_DEBUG."""
    import logging
    import socket
    level = _env.get("PYXCCL_DEBUG")
    log = logging.getLogger("pyxccl")
    if not level or log.handlers:
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter(f"{socket.gethostname()}:{os.getpid()} [pyxccl] %(levelname)s %(message)s"))
    log.addHandler(h)
    log.setLevel({"WARN": "WARNING", "TRACE": "DEBUG"}.get(level, level))


@atexit.register
def _close_all() -> None:
    for c in [*_open, *_stores.values()]:
        try:
            c.close()
        except Exception:  # noqa: BLE001  (best effort at exit)
            pass
    _stores.clear()
