"""What each collective primitive is, described once.

The argument checks of the Communicator, the symbolic checker, the tuner's
representative calls and the benchmark all read these descriptions, so a
primitive's buffers and count rule live in one place. A call's size is given
by the arguments of its schedule builder (registry.py):

=================  ====================================  =========================================
primitive          builder arguments                     elements of "in" / "out" on rank r
=================  ====================================  =========================================
allreduce          count                                 count / count
broadcast          count, root                           0 / count (the root's holds the data)
reduce             count, root                           count / count (meaningful at the root)
allgather          counts (each rank's block)            counts[r] / sum(counts)
reduce_scatter     counts (each rank's result)           sum(counts) / counts[r]
gather             counts, root                          counts[r] / sum(counts) at the root, else 0
scatter            counts, root                          sum(counts) at the root, else 0 / counts[r]
alltoall           send_counts, recv_counts (rank r's)   sum(send_counts) / sum(recv_counts)
barrier            (none)                                0 / 0
=================  ====================================  =========================================

The module also defines a call's *fingerprint* (``Call``): what every rank
must agree on before data moves. It travels in every message header and is
published with every round of the one-host fast path, so ranks that disagree
get a ``CollectiveMismatchError`` naming both calls instead of wrong data.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .dtypes import CODE_DTYPE, DTYPE_CODE, dtype_name
from .ops import ReduceOp


@dataclass(frozen=True)
class Primitive:
    name: str
    rooted: bool            # has a root rank
    reduces: bool           # applies a ReduceOp
    shape: str              # builder arguments: "count", "blocks" (counts), "pairs" (send/recv counts), "none"
    split: bool = False     # its nccl-tests size is the whole buffer split over the ranks
    gathers: bool = False   # blocks flow towards every rank / the root (allgather, gather), not from it

    def args(self, n: int, per: int, root: int = 0) -> dict:
        """Builder arguments of a call where every rank's block (or the count) is ``per`` elements."""
        a = {"count": dict(count=per), "blocks": dict(counts=[per] * n),
             "pairs": dict(send_counts=[per] * n, recv_counts=[per] * n), "none": {}}[self.shape]
        return dict(a, root=root) if self.rooted else a

    def sized(self, n: int, nbytes: int, itemsize: int, root: int = 0) -> dict:
        """Builder arguments of a call of ``nbytes`` by nccl-tests' convention (the whole buffer, split
        over the ranks for split primitives; every rank gets at least one element)."""
        total = max(1, nbytes // itemsize) if nbytes else 0
        return self.args(n, max(1, total // n) if self.split and total else total, root)

    def buffers(self, rank: int, args: dict) -> tuple[int, int]:
        """Elements of "in" and "out" on ``rank`` for builder arguments ``args``."""
        if self.shape == "none":
            return 0, 0
        if self.shape == "pairs":
            return sum(args["send_counts"]), sum(args["recv_counts"])
        if self.shape == "count":
            c = args["count"]
            return (0 if self.name == "broadcast" else c), c
        counts = args["counts"]
        whole = 0 if self.rooted and rank != args["root"] else sum(counts)
        return (counts[rank], whole) if self.gathers else (whole, counts[rank])

    def in_place_at(self, rank: int, args: dict, itemsize: int) -> int | None:
        """Where the call's in-place form (MPI_IN_PLACE, NCCL's in place) puts the smaller buffer in
        the larger, in bytes: 0 for one buffer (allreduce, reduce), this rank's block of the output
        (allgather, gather) or of the input (reduce_scatter, scatter); None: no in-place form."""
        if self.shape == "count":
            return 0
        if self.shape == "blocks":
            return sum(args["counts"][:rank]) * itemsize
        return None

    def busbw_factor(self, n: int) -> float:
        """nccl-tests' bus bandwidth factor."""
        if self.name == "allreduce":
            return 2.0 * (n - 1) / n
        return (n - 1) / n if self.split else 1.0


def apart(prim: Primitive, inp: np.ndarray, out: np.ndarray, at: int | None) -> bool:
    """May a call of ``prim`` run on contiguous arrays ``inp`` and ``out``? They share no memory, or
    only in the in-place form (``at``: :meth:`Primitive.in_place_at`). Any other overlap would have
    the call overwrite what it has yet to read. The full path and prepared calls ask this one rule."""
    if inp is out or not (inp.size and out.size) or not np.may_share_memory(inp, out):
        return True
    inner, outer = (inp, out) if prim.gathers else (out, inp)
    return at is not None and inner.ctypes.data == outer.ctypes.data + at


PRIMITIVES: dict[str, Primitive] = {p.name: p for p in (
    Primitive("allreduce", rooted=False, reduces=True, shape="count"),
    Primitive("broadcast", rooted=True, reduces=False, shape="count"),
    Primitive("reduce", rooted=True, reduces=True, shape="count"),
    Primitive("allgather", rooted=False, reduces=False, shape="blocks", split=True, gathers=True),
    Primitive("reduce_scatter", rooted=False, reduces=True, shape="blocks", split=True),
    Primitive("gather", rooted=True, reduces=False, shape="blocks", split=True, gathers=True),
    Primitive("scatter", rooted=True, reduces=False, shape="blocks", split=True),
    Primitive("alltoall", rooted=False, reduces=False, shape="pairs", split=True),
    Primitive("barrier", rooted=False, reduces=False, shape="none"),
)}

#: The calls of the API, each with the primitive it runs (its code travels in fingerprints).
CALLS = ("allreduce", "broadcast", "reduce", "allgather", "allgatherv", "reduce_scatter", "reduce_scatterv",
         "gather", "gatherv", "scatter", "scatterv", "alltoall", "alltoallv", "barrier")
_CALL_CODE = {c: i + 1 for i, c in enumerate(CALLS)}
_OP_CODE = {op: i + 1 for i, op in enumerate(ReduceOp)}
_OP_OF = {v: k for k, v in _OP_CODE.items()}

_SIZE_BITS = 48
_UNCHECKED = (1 << _SIZE_BITS) - 1     # sizes only this rank knows (gatherv away from the root, alltoallv)
_DIGEST = 1 << (_SIZE_BITS - 1)        # the size is a digest of a list of counts


def call_word(name: str, op, dtype: np.dtype, algorithm_id: int, root: int | None, codec: str | None = None) -> int:
    """The first fingerprint word: which call, op, dtype, algorithm, root and compression (a compressor's
    spec, as a digest in the top byte)."""
    return (_CALL_CODE[name] | _OP_CODE.get(op, 0) << 8 | DTYPE_CODE[dtype] << 16 | (algorithm_id & 0xFF) << 24
            | ((0 if root is None else root + 1) & 0xFFFFFF) << 32 | _codec_code(codec) << 56)


def _codec_code(spec: str | None) -> int:
    return 0 if spec is None else 0x80 | zlib.crc32(spec.encode()) & 0x7F


def size_word(size, thread: int) -> int:
    """The second fingerprint word: the call's counts and the issuing thread (a digest of its name)."""
    return _size_code(size) | (thread & 0xFFFF) << _SIZE_BITS


class Call(NamedTuple):
    """A collective call as the ranks must agree on it."""
    name: str                   # the API call ("gatherv")
    dtype: np.dtype
    size: int | list | None     # count, or the counts every rank passes, or None (only this rank knows them)
    root: int | None
    op: ReduceOp | None
    algorithm: str
    thread: str                 # the issuing thread's name ("" when not checked)


    def describe(self, seq: int) -> str:
        parts = [dtype_name(self.dtype), _size_text(self.size)] if self.name != "barrier" else []
        if self.root is not None:
            parts.append(f"root {self.root}")
        if self.op is not None:
            parts.append(self.op.name)
        parts += [f"algorithm {self.algorithm}"] + ([f"thread {self.thread}"] if self.thread else [])
        return f"{self.name} #{seq} ({', '.join(parts)})"


def _size_code(size) -> int:
    if size is None:
        return _UNCHECKED
    if isinstance(size, int):
        return size & (_DIGEST - 1)
    if len(set(size)) == 1:             # equal blocks: say how large
        return size[0] & (_DIGEST - 1)
    return _DIGEST | zlib.crc32(np.asarray(size, np.int64).tobytes())


def _size_text(size) -> str:
    if size is None:
        return "counts known to this rank only"
    if isinstance(size, int):
        return f"{size} elements"
    if len(set(size)) == 1:
        return f"{size[0]} elements per rank"
    return f"counts {list(size)}" if len(size) <= 8 else f"counts {list(size[:8])}..."


def describe_words(seq: int, w0: int, w1: int, algorithm_name) -> str:
    """A peer's call, from the words it published: what can be read back of it."""
    name = CALLS[(w0 & 0xFF) - 1] if 0 < (w0 & 0xFF) <= len(CALLS) else f"call code {w0 & 0xFF}"
    parts = []
    dt = CODE_DTYPE.get((w0 >> 16) & 0xFF)
    parts.append(dtype_name(dt) if dt is not None else "unknown dtype")
    size = w1 & ((1 << _SIZE_BITS) - 1)
    parts.append("counts known to that rank only" if size == _UNCHECKED else
                 f"counts with digest {size & (_DIGEST - 1):08x}" if size & _DIGEST else f"{size} elements")
    if w0 >> 32 & 0xFFFFFF:
        parts.append(f"root {(w0 >> 32 & 0xFFFFFF) - 1}")
    op = _OP_OF.get((w0 >> 8) & 0xFF)
    if op is not None:
        parts.append(op.name)
    parts.append(f"algorithm {algorithm_name((w0 >> 24) & 0xFF)}")
    if w0 >> 56:
        parts.append(f"compressed (code {w0 >> 56 & 0x7F})")
    return f"{name} #{seq} ({', '.join(parts)})"


def differences(mine: tuple[int, int, int], theirs: tuple[int, int, int]) -> list[str]:
    """What differs between two fingerprints (seq, w0, w1), in words."""
    (s0, a0, b0), (s1, a1, b1) = mine, theirs
    fields = [("sequence number", s0 != s1), ("call", (a0 ^ a1) & 0xFF), ("op", (a0 ^ a1) >> 8 & 0xFF),
              ("dtype", (a0 ^ a1) >> 16 & 0xFF), ("algorithm", (a0 ^ a1) >> 24 & 0xFF), ("root", (a0 ^ a1) >> 32 & 0xFFFFFF), ("compression", (a0 ^ a1) >> 56),
              ("count", (b0 ^ b1) & ((1 << _SIZE_BITS) - 1)), ("thread", (b0 ^ b1) >> _SIZE_BITS)]
    return [what for what, differs in fields if differs]
