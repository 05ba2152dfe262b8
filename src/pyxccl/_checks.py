"""Argument checks of the Communicator's calls: each raises InvalidArgumentError (or
UnsupportedOpError) naming the rank, the operation and the argument, before any byte moves."""
from __future__ import annotations

import math

import numpy as np

from ._errors import InvalidArgumentError, UnsupportedOpError
from .dtypes import as_array, dtype_name
from .ops import ReduceOp, as_op, op_error

_MAX_TAG = (1 << 31) - 1


class Check:
    """The checks of one call (``op``: its name) on ``comm``."""

    def __init__(self, comm, op: str):
        self.me, self.n, self.op = comm.rank, comm.size, op
        self._names: dict[int, str] = {}

    def error(self, msg: str, cls=InvalidArgumentError) -> InvalidArgumentError:
        return cls(f"rank {self.me}: {self.op}: {msg}", rank=self.me, op=self.op)

    def array(self, obj, what: str, *, writable: bool) -> np.ndarray:
        arr = as_array(obj, what=what, writable=writable, ctx=self.error)
        self._names[id(arr)] = what
        return arr

    def allocate(self, buf, count: int, dt: np.dtype):
        """``buf``, or a new array of ``count`` elements when it is None."""
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
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < self.n:
            raise self.error(f"{what}={r!r} is not a rank of this communicator (0..{self.n - 1})")
        return int(r)

    def integer(self, v, what: str) -> int:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise self.error(f"{what}={v!r} must be an integer")
        return int(v)

    def color(self, color) -> int | None:
        """split()'s color: a non-negative integer, or None (this rank joins no part)."""
        if color is not None and (self.integer(color, "color") < 0):
            raise self.error(f"color={color!r} must be a non-negative integer or None")
        return None if color is None else int(color)

    def tag(self, tag) -> int:
        if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool) or not 0 <= tag <= _MAX_TAG:
            raise self.error(f"tag={tag!r} must be an integer in 0..{_MAX_TAG}")
        return int(tag)

    def timeout(self, t):
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating))
                              or not math.isfinite(t) or t <= 0):
            raise self.error(f"timeout={t!r} must be a positive number of seconds (or None for the default)")
        return t

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
            ok = all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in counts)
            counts = [int(c) for c in counts] if ok else None
        except TypeError:
            counts = None
        if counts is None:
            raise self.error(f"{what} must be a sequence of {self.n} integers")
        if len(counts) != self.n:
            raise self.error(f"{what} has {len(counts)} entries; it needs one per rank ({self.n})")
        if any(c < 0 for c in counts):
            raise self.error(f"{what} has a negative count: {counts}")
        if total is not None and sum(counts) != total:
            raise self.error(f"{what} adds up to {sum(counts)} elements but the buffer has {total}")
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

    def only_direct(self, name) -> str:
        """gatherv/scatterv: a rank knows only its own count (all of them at the root), and every
        algorithm but "direct" routes other ranks' blocks: refuse those, or ranks would hang."""
        if name not in (None, "direct"):
            raise self.error(f"algorithm={name!r} routes other ranks' blocks, whose sizes only the root "
                             f"knows; use 'direct', or gather/scatter for equal blocks")
        return "direct"
