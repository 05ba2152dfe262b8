"""Reduce operations: which dtypes each accepts and how it is applied in place."""
from __future__ import annotations

import enum

import numpy as np

from .dtypes import FLOATS, dtype_name


class ReduceOp(enum.Enum):
    """Reduction applied element-wise by reduce, allreduce and reduce_scatter.

    >>> comm.allreduce(x, op=pyxccl.ReduceOp.MAX)   # doctest: +SKIP
    """
    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"      # SUM, then divided by the number of ranks (float dtypes)
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    LAND = "land"
    LOR = "lor"

    __hash__ = object.__hash__      # members are singletons; Enum's own hash is Python code, on every call


_UFUNC = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
    ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or,
}
_NOT_ON_FLOATS = {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.LAND, ReduceOp.LOR}


def as_op(op) -> ReduceOp:
    """Accept a ReduceOp, its name ("sum", "MAX") or torch's ReduceOp."""
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", op)
    if isinstance(name, str):
        try:
            return ReduceOp[name.upper()]
        except KeyError:
            pass
    raise ValueError(f"unknown reduce op {op!r}; use one of " + ", ".join(o.name for o in ReduceOp))


def op_error(op: ReduceOp, dt: np.dtype) -> str | None:
    """Why ``op`` makes no sense for ``dt``, or None if it does."""
    if dt in FLOATS and op in _NOT_ON_FLOATS:
        return (f"{op.name} is a bitwise/logical op and the buffers are {dtype_name(dt)}; "
                f"use an integer or bool dtype, or SUM/PROD/MIN/MAX/AVG")
    if op is ReduceOp.AVG and dt not in FLOATS:
        return (f"AVG needs a floating dtype and the buffers are {dtype_name(dt)}; "
                f"use SUM and divide, or convert to float first")
    return None


def reducer(op: ReduceOp):
    """``f(dst, src)``: dst = dst (op) src, in place, for numpy arrays of one dtype.

    Overflow wraps (integers) or saturates to inf (floats), as in NCCL and MPI: callers run
    reductions with numpy's floating-point warnings off (np.errstate once per call, or np.seterr
    in threads of their own), not once per reduction: entering np.errstate costs more than adding
    a few numbers.
    """
    uf = _UFUNC[op]

    def reduce_into(dst, src):
        uf(dst, src, out=dst)
    return reduce_into

