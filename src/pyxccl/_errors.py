"""The one exception tree of pyxccl.

Every error pyxccl raises is a :class:`PyxcclError`; the subclasses say what
went wrong and also derive from the matching built-in exception, so code that
catches ``ValueError`` or ``TimeoutError`` keeps working::

    PyxcclError
    ├── InvalidArgumentError (ValueError)    bad input, refused before any byte moves;
    │   ├── UnsupportedOpError (TypeError)   a reduce op that makes no sense for the dtype
    │   └── TensorArgumentError (RuntimeError)  tensors that don't fit a torch.distributed call
    │       └── NotSupportedError (NotImplementedError)  a layout, device or op the torch backend lacks
    ├── CommClosedError                      the communicator was closed
    ├── RendezvousError (ConnectionError)    the store or the connection set-up failed
    └── CommError (RuntimeError)             a collective or point-to-point call failed
        ├── CommTimeoutError (TimeoutError)  a deadline expired: names the rank that never entered the call
        ├── PeerLostError (ConnectionError)  a peer process exited, died or dropped its link
        ├── ProtocolError                    a peer sent a frame that does not fit the protocol
        │   └── CollectiveMismatchError      the ranks made different calls (primitive, dtype, count, ...)
        └── CommAbortedError                 comm.abort(), or an earlier failure left the communicator unusable

Messages name the rank, the peer (where there is one), the operation and
what to do. The structured fields are attributes too (``err.rank``,
``err.peer``, ``err.op``, ``err.seq``), so programs need not parse text.
"""
from __future__ import annotations

__all__ = [
    "PyxcclError", "InvalidArgumentError", "UnsupportedOpError", "TensorArgumentError", "NotSupportedError",
    "CommClosedError",
    "RendezvousError", "CommError", "CommTimeoutError", "PeerLostError",
    "ProtocolError", "CollectiveMismatchError", "CommAbortedError",
]


class PyxcclError(Exception):
    """Base of every pyxccl error.

    ``rank``: the rank that raised it; ``peer``: the other rank involved (or
    None); ``op``: the operation (``"allreduce"``, ``"recv"``, ...); ``seq``:
    its sequence number on the communicator (or None).
    """

    def __init__(self, msg: str, *, rank=None, peer=None, op=None, seq=None):
        super().__init__(msg)
        self.rank, self.peer, self.op, self.seq = rank, peer, op, seq


class InvalidArgumentError(PyxcclError, ValueError):
    """The call's arguments are wrong; nothing was sent and the communicator is unchanged."""


class UnsupportedOpError(InvalidArgumentError, TypeError):
    """The reduce op makes no sense for the buffer's dtype (BXOR on float, ...)."""


class TensorArgumentError(InvalidArgumentError, RuntimeError):
    """The tensors don't fit a torch.distributed call (list lengths, shapes); raised by the torch
    backend before anything is sent. A RuntimeError too, as torch's own checks (and Gloo's) are."""


class NotSupportedError(TensorArgumentError, NotImplementedError):
    """The torch backend does not do this: a sparse tensor outside allreduce with SUM, a device
    other than the CPU. A NotImplementedError, as torch raises for an operator a layout lacks."""


class CommClosedError(PyxcclError):
    """The communicator was closed with ``close()``; make a new one with ``pyxccl.init()``."""


class RendezvousError(PyxcclError, ConnectionError):
    """Finding the other ranks failed: store unreachable, key never set, connection refused."""


class CommError(PyxcclError, RuntimeError):
    """A communication call failed after it started."""


class CommTimeoutError(CommError, TimeoutError):
    """A deadline expired; ``peer`` is the rank that never entered the call (a collective asks every
    peer how far it got), else the rank that did not answer."""


class PeerLostError(CommError, ConnectionError):
    """A peer exited, was killed or its link went down; ``peer`` names it."""


class ProtocolError(CommError):
    """A peer sent a frame that does not fit the protocol (wrong size, unknown kind, mismatched collective)."""


class CollectiveMismatchError(ProtocolError):
    """The ranks disagree about a collective call: a different primitive, dtype, count, root, op
    or algorithm, an extra call on one rank, or calls issued in a different order by several
    threads. Raised on every rank, naming the ranks and both calls; the communicator is aborted."""


class CommAbortedError(CommError):
    """The communicator was aborted: by ``comm.abort()`` (``cause`` is None), or by an earlier failure
    (``cause`` holds that error); it cannot be used: make a new one (``comm.shrink()`` after a lost rank)."""

    def __init__(self, msg: str, *, cause: BaseException | None = None, **kw):
        super().__init__(msg, **kw)
        self.cause = cause
