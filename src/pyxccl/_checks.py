"""Argument checks of the Communicator's calls and of ``pyxccl.init``: each raises
InvalidArgumentError (or UnsupportedOpError) naming the rank, the operation, the argument, its value
and what is expected, before anything is allocated and before any byte moves."""
from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Set

import numpy as np

from ._errors import InvalidArgumentError, UnsupportedOpError
from .algorithms import registry
from .dtypes import as_array, dtype_name
from .ops import ReduceOp, as_op, op_error
from .primitives import apart

_MAX_TAG = (1 << 31) - 1            # the wire's tag field is a signed 32-bit integer
_INT32 = (-(1 << 31), (1 << 31) - 1)  # split's color and key, as MPI_Comm_split's ints
_MAX_COUNT = (1 << 47) - 1          # a fingerprint carries 47 bits of a count (primitives.size_word)
_TRANSPORTS = ("auto", "tcp", "shm")   # as transport/mesh.py
_MAX_TIMEOUT = 1e9                  # s (31 years): waits and socket timeouts overflow past threading.TIMEOUT_MAX


def timeout_error(t) -> str | None:
    """Why ``t`` is no timeout (None, or a positive number of seconds up to ``_MAX_TIMEOUT``), or None if
    it is one. 0 is refused: torch's kNoTimeout (0 ms) means "the default", which here is None; a
    deadline of 0 s would fail every call at once."""
    if t is None or (not isinstance(t, (bool, np.bool_)) and isinstance(t, (int, float, np.integer, np.floating))
                     and 0 < t <= _MAX_TIMEOUT):
        return None
    return (f"timeout={t!r} must be a positive number of seconds up to {_MAX_TIMEOUT:.0e}, or None for the "
            f"default" + (" (0 does not mean 'no timeout')" if type(t) in (int, float) and t == 0 else ""))


def env_timeout(name: str, default: float) -> float:
    """A timeout from the environment variable ``name`` (seconds), else ``default``."""
    text = os.environ.get(name)
    try:
        t = default if text is None else float(text)
    except ValueError:
        t = None
    if t is None or timeout_error(t):
        raise InvalidArgumentError(f"{name}={text!r} must be a positive number of seconds up to {_MAX_TIMEOUT:.0e}")
    return t


def _known(prim: str, name: str) -> bool:
    try:
        return registry.lookup(prim, name).name == registry.canonical(name)     # aliases: registry.ALIASES
    except KeyError:
        return False


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _show(values: list) -> str:
    return str(values) if len(values) <= 8 else f"[{', '.join(map(str, values[:8]))}, ...] ({len(values)} entries)"


def _memory() -> int:
    """This host's memory in bytes: no buffer pyxccl allocates can be larger."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def init_arguments(rank, size, store, init_method, timeout, transport) -> None:
    """``pyxccl.init``'s arguments as passed (None: from the environment), before anything is made."""
    def refuse(msg):
        return InvalidArgumentError(f"pyxccl.init: {msg}", rank=rank if _is_int(rank) else None, op="init")
    for name, v in (("rank", rank), ("size", size)):
        if v is not None and not _is_int(v):
            raise refuse(f"{name}={v!r} must be an integer")
    why = timeout_error(timeout)
    if why:
        raise refuse(why)
    if transport is not None and transport not in _TRANSPORTS:
        raise refuse(f"transport={transport!r} must be one of {', '.join(_TRANSPORTS)} (or None)")
    if init_method is not None and not isinstance(init_method, str):
        raise refuse(f"init_method={init_method!r} must be a URL string (env://, tcp://host:port, file:///dir)")
    if store is not None and init_method is not None:
        raise refuse("pass store= or init_method=, not both")
    if store is not None and not all(callable(getattr(store, m, None)) for m in ("set", "get", "add")):
        raise refuse(f"store={store!r} is not a store (pyxccl.rendezvous.Store: set, get, add)")


def world_rank(rank, size) -> tuple[int, int]:
    """``init``'s rank and size once the launcher's environment filled them in."""
    if not (_is_int(rank) and _is_int(size) and 0 <= rank < size):
        raise InvalidArgumentError(f"pyxccl.init: rank={rank!r} and size={size!r} must be integers with "
                                   f"0 <= rank < size", rank=rank if _is_int(rank) else None, op="init")
    return int(rank), int(size)


class Check:
    """The checks of one call (``op``: its name) on ``comm``; ``how``: the call's (algorithm, async_op,
    timeout), checked at once, before any buffer: ``self.how`` holds what the call runs with."""

    def __init__(self, comm, op: str, how=None):
        self.me, self.n, self.op = comm.rank, comm.size, op
        self._names: dict[int, str] = {}
        if how is not None:
            self.how = (self.algorithm(how[0]), self.flag(how[1], "async_op"), self.timeout(how[2]))

    def error(self, msg: str, cls=InvalidArgumentError) -> InvalidArgumentError:
        return cls(f"rank {self.me}: {self.op}: {msg}", rank=self.me, op=self.op)

    def array(self, obj, what: str, *, writable: bool) -> np.ndarray:
        arr = as_array(obj, what=what, writable=writable, ctx=self.error)
        self._names[id(arr)] = what
        return arr

    def allocate(self, buf, count: int, dt: np.dtype):
        """``buf``, or a new array of ``count`` elements when it is None (counts that no host could hold
        are refused here, not by numpy)."""
        if buf is None and count * dt.itemsize > _memory():
            raise self.error(f"counts add up to {count} elements of {dtype_name(dt)} ({count * dt.itemsize} "
                             f"bytes), more than this host's memory ({_memory()} bytes); check counts")
        return np.empty(count, dt) if buf is None else buf

    def same_dtype(self, a: np.ndarray, b: np.ndarray, what: str) -> np.ndarray:
        if a.dtype != b.dtype:
            raise self.error(f"{what} has dtype {dtype_name(b.dtype)} but {self._names.get(id(a), 'the input')} is "
                             f"{dtype_name(a.dtype)}; pass buffers of one dtype")
        return b

    def size(self, arr: np.ndarray, expected: int, what: str) -> None:
        if arr.size != expected:
            raise self.error(f"{self._names.get(id(arr), what)} has {arr.size} elements but this call needs "
                             f"{expected}")

    def rank(self, r, what: str) -> int:
        if not _is_int(r) or not 0 <= r < self.n:
            raise self.error(f"{what}={r!r} is not a rank of this communicator (an integer in 0..{self.n - 1})")
        return int(r)

    def integer(self, v, what: str, lo: int = _INT32[0], hi: int = _INT32[1], also: str = "") -> int:
        if not _is_int(v) or not lo <= v <= hi:
            raise self.error(f"{what}={v!r} must be an integer in {lo}..{hi}{also}")
        return int(v)

    def color(self, color) -> int | None:
        """split()'s color: a non-negative integer, or None (this rank joins no part)."""
        return None if color is None else self.integer(color, "color", 0, also=", or None (this rank joins no part)")

    def tag(self, tag) -> int:
        return self.integer(tag, "tag", 0, _MAX_TAG)

    def timeout(self, t):
        why = timeout_error(t)
        if why:
            raise self.error(why)
        return t

    def flag(self, v, what: str) -> bool:
        if not isinstance(v, (bool, np.bool_)):
            raise self.error(f"{what}={v!r} must be True or False")
        return bool(v)

    def algorithm(self, name) -> str | None:
        """``algorithm=``: None or a registered name of the call's primitive. The v-variants run only
        what their counts allow (the algorithm's record says): gatherv and scatterv an algorithm that
        needs only each rank's own count (the root knows the rest), alltoallv none that needs equal
        blocks (ranks with equal blocks would go ahead and hang)."""
        prim = self.op[:-1] if self.op.endswith("v") else self.op
        if name is not None and (not isinstance(name, str) or not _known(prim, name)):
            raise self.error(f"algorithm={name!r}: no algorithm of that name for {prim}; known: "
                             + ", ".join(registry.algorithms(prim)))
        if self.op in ("gatherv", "scatterv"):
            fit = [a.name for a in registry.records(prim) if a.root_counts]
            if name is not None and name not in fit:
                raise self.error(f"algorithm={name!r} routes other ranks' blocks, whose sizes only the root "
                                 f"knows; use {' or '.join(map(repr, fit))}, or {prim} for equal blocks")
            return name or fit[0]
        if self.op == "alltoallv":
            if name is not None and registry.lookup(prim, name).equal_blocks:
                fit = [a.name for a in registry.records(prim) if not a.equal_blocks]
                raise self.error(f"algorithm={name!r} needs equal blocks on every rank; use alltoall, or "
                                 f"{' or '.join(map(repr, fit))} for alltoallv")
            return name or registry.default(prim)
        return name

    def op_for(self, op, dt: np.dtype) -> ReduceOp:
        try:
            op = as_op(op)
        except ValueError:
            raise self.error(f"op={op!r} is an unknown reduce op; use a pyxccl.ReduceOp or its name: "
                             + ", ".join(o.name for o in ReduceOp)) from None
        why = op_error(op, dt)
        if why:
            raise self.error(f"op={op.name}: {why}", UnsupportedOpError)
        return op

    def counts(self, counts, what: str, total: tuple[int, str] | None = None,
               own: tuple[int, str] | None = None) -> list[int]:
        """Checked per-rank counts; ``total``: (elements, buffer name) they must add up to; ``own``: the same
        for this rank's count."""
        try:    # a mapping or a set iterates, but in no rank order
            given = None if isinstance(counts, (str, bytes, Mapping, Set)) else list(counts)
        except TypeError:
            given = None
        if given is None:
            raise self.error(f"{what}={counts!r} must be a sequence of {self.n} integers, one per rank")
        if len(given) != self.n:
            raise self.error(f"{what} has {len(given)} entries; it needs one per rank ({self.n})")
        bad = [c for c in given if not _is_int(c)]
        if bad:     # float counts are refused, not truncated
            raise self.error(f"{what} has {bad[0]!r} ({type(bad[0]).__name__}); counts are integers (numpy "
                             f"integers too), not floats or bools")
        counts = [int(c) for c in given]
        if any(c < 0 for c in counts):
            raise self.error(f"{what} has a negative count: {_show(counts)}")
        if max(counts) > _MAX_COUNT or sum(counts) > _MAX_COUNT:
            raise self.error(f"{what} adds up to {sum(counts)} elements: more than any buffer ({_MAX_COUNT}); "
                             f"{what}={_show(counts)}")
        if total is not None and sum(counts) != total[0]:
            raise self.error(f"{what} adds up to {sum(counts)} elements but {total[1]} has {total[0]}")
        me = self.me
        if own is not None and counts[me] != own[0]:
            raise self.error(f"{what}[{me}]={counts[me]} but {own[1]} has {own[0]} elements")
        return counts

    def root_counts(self, counts, root: int, own: int) -> list[int]:
        """gatherv/scatterv counts: the root must pass them all; elsewhere None means just this rank's."""
        if counts is not None:
            return counts
        if self.me == root:
            raise self.error("the root needs counts (one per rank)")
        counts = [0] * self.n
        counts[self.me] = own
        return counts

    def agreed(self, counts: list[int]):
        """What a call's fingerprint says of its counts: all of them, unless only the root knows them
        (gatherv, scatterv)."""
        return None if self.op.endswith("v") else counts

    def apart(self, bufs: dict, prim, args: dict) -> None:
        """The input and output share no memory, or only in the call's in-place form
        (``primitives.apart``, the rule prepared calls follow too)."""
        a, b = bufs.get("in"), bufs.get("out")
        if a is None or b is None or apart(prim, a, b, prim.in_place_at(self.me, args, a.itemsize)):
            return
        names = self._names.get(id(a), "the input"), self._names.get(id(b), "the output")
        form = {"count": "be one buffer", "blocks": f"hold {names[0 if prim.gathers else 1]} at this rank's "
                f"block of {names[1 if prim.gathers else 0]} (in place)"}.get(prim.shape)
        raise self.error(f"{names[0]} and {names[1]} overlap; they must be apart" + (f" or {form}" if form else ""))

    def pickled(self, obj) -> bytes:
        """``obj`` pickled (broadcast_object, allgather_object)."""
        try:
            return pickle.dumps(obj)
        except Exception as e:  # noqa: BLE001  (pickling raises whatever the object's reducer raises)
            raise self.error(f"obj={type(obj).__name__} object cannot be pickled: {e}") from None
