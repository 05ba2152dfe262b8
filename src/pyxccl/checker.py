"""Run schedules without processes and prove they compute the right thing.

Every element carries, instead of a value, *who contributed to it*: a vector of
multiplicities over ranks plus the index of the input element it came from.
Reducing adds the vectors (and insists on one index); copying copies them.
At the end each rank's output must hold exactly the contributions the
primitive promises, each input counted once. Messages move between ranks
FIFO per ordered pair, as on the real transports; a schedule that deadlocks,
leaves messages unreceived, sizes a receive wrongly or races (a receive into
memory that its own step also reads or writes) is reported.

>>> check("allreduce", "ring", nranks=5, count=7)      # raises CheckError if wrong
"""
from __future__ import annotations

from collections import deque

import numpy as np

from . import algorithms
from .algorithms import registry
from .schedule import Copy, Recv, Send

MIXED = -1      # an element combining different input indices: always wrong
UNSET = -2      # never written


class CheckError(AssertionError):
    pass


class _Buf:
    def __init__(self, count: int, nranks: int):
        self.c = np.zeros((count, nranks), np.int32)   # contribution multiplicity per source rank
        self.i = np.full(count, UNSET, np.int64)      # input element index

    def input(self, rank: int) -> "_Buf":
        self.c[:, rank] = 1
        self.i[:] = np.arange(len(self.i))
        return self


def _args(primitive: str, nranks: int, rank: int, count: int, root: int):
    """The builder arguments of one rank and the element counts of its buffers."""
    per = [count] * nranks                                 # the per-rank part for split primitives
    if primitive in ("allreduce",):
        return dict(count=count), count, count
    if primitive == "broadcast":
        return dict(count=count, root=root), 0, count
    if primitive == "reduce":
        return dict(count=count, root=root), count, count
    if primitive in ("allgather",):
        return dict(counts=per), count, count * nranks
    if primitive == "reduce_scatter":
        return dict(counts=per), count * nranks, count
    if primitive == "gather":
        return dict(counts=per, root=root), count, count * nranks if rank == root else 0
    if primitive == "scatter":
        return dict(counts=per, root=root), count * nranks if rank == root else 0, count
    if primitive == "alltoall":
        return dict(send_counts=per, recv_counts=per), count * nranks, count * nranks
    if primitive == "barrier":
        return {}, 0, 0
    raise ValueError(primitive)


def _expected(primitive: str, nranks: int, rank: int, count: int, root: int):
    """(contribution matrix, index vector) the output of ``rank`` must hold, or None if unconstrained."""
    ones = np.ones(nranks, np.int32)

    def hot(p):
        v = np.zeros(nranks, np.int32)
        v[p] = 1
        return v
    ar = np.arange(count)
    if primitive == "allreduce" or (primitive == "reduce" and rank == root):
        return np.tile(ones, (count, 1)), ar
    if primitive == "broadcast":
        return np.tile(hot(root), (count, 1)), ar
    if primitive == "reduce_scatter":
        return np.tile(ones, (count, 1)), ar + rank * count
    if primitive == "allgather" or (primitive == "gather" and rank == root):
        return np.repeat(np.eye(nranks, dtype=np.int32), count, axis=0), np.tile(ar, nranks)
    if primitive == "scatter":
        return np.tile(hot(root), (count, 1)), ar + rank * count
    if primitive == "alltoall":
        return np.repeat(np.eye(nranks, dtype=np.int32), count, axis=0), np.tile(ar + rank * count, nranks)
    return None


def _overlap(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _races(step) -> list[str]:
    recvs = [(o.buf, o.off, o.off + o.count) for o in step if type(o) is Recv]
    others = [(o.buf, o.off, o.off + o.count) for o in step if type(o) is Send]
    out = []
    for i, r in enumerate(recvs):
        for x in others + recvs[i + 1:]:
            if _overlap(r, x):
                out.append(f"receive into {r} overlaps {x} in the same step")
    return out


def simulate(primitive: str, name: str, nranks: int, count: int, root: int = 0, inplace: bool = False,
             hosts=None):
    """Run ``name``'s schedules for every rank; return the final buffers and causal knowledge.

    ``inplace``: "in" and "out" are one buffer, as in ``allreduce(x)`` and ``reduce(x)``."""
    _, build = algorithms.lookup(primitive, name)
    scheds, bufs = [], []
    for r in range(nranks):
        kw, n_in, n_out = _args(primitive, nranks, r, count, root)
        s = registry.build(build, r, nranks, hosts=hosts, **kw)
        if s.rank != r or s.nranks != nranks:
            raise CheckError(f"{name}: the schedule of rank {r} says rank {s.rank} of {s.nranks}")
        b = {"in": _Buf(n_in, nranks).input(r), "out": _Buf(n_out, nranks), "tmp": _Buf(s.scratch, nranks)}
        if primitive == "broadcast" and r == root:
            b["out"].input(r)
        if inplace:
            b["out"] = b["in"]
        scheds.append(s)
        bufs.append(b)
    chan = {(a, b): deque() for a in range(nranks) for b in range(nranks)}
    know = [{r} for r in range(nranks)]
    pc = [0] * nranks                 # next step of each rank
    entered = [False] * nranks        # the current step's copies and sends are done
    pending = [0] * nranks            # receives of the current step already matched

    def region(b, buf, off, cnt, who):
        if off < 0 or off + cnt > len(b[buf].i):
            raise CheckError(f"{name} n={nranks} count={count}: rank {who} touches {buf}[{off}:{off + cnt}] "
                             f"outside its {len(b[buf].i)} elements")
        return b[buf]

    progress = True
    while progress:
        progress = False
        for r in range(nranks):
            while pc[r] < len(scheds[r].steps):
                step, b = scheds[r].steps[pc[r]], bufs[r]
                if not entered[r]:
                    races = _races(step)
                    if races:
                        raise CheckError(f"{name} n={nranks}: rank {r} step {pc[r]}: {races[0]}")
                    for o in step:
                        if type(o) is Copy:
                            src = region(b, o.src, o.src_off, o.count, r)
                            dst = region(b, o.dst, o.dst_off, o.count, r)
                            sc, si = src.c[o.src_off:o.src_off + o.count].copy(), src.i[o.src_off:o.src_off + o.count].copy()
                            _apply(dst, o.dst_off, sc, si, o.reduce)
                    for o in step:
                        if type(o) is Send:
                            if not 0 <= o.peer < nranks or o.peer == r:
                                raise CheckError(f"{name} n={nranks}: rank {r} sends to {o.peer}")
                            src = region(b, o.buf, o.off, o.count, r)
                            chan[(r, o.peer)].append((src.c[o.off:o.off + o.count].copy(),
                                                      src.i[o.off:o.off + o.count].copy(), set(know[r])))
                    entered[r], pending[r] = True, 0
                    progress = True
                recvs = [o for o in step if type(o) is Recv]
                while pending[r] < len(recvs):
                    o = recvs[pending[r]]
                    q = chan.get((o.peer, r))
                    if q is None:
                        raise CheckError(f"{name} n={nranks}: rank {r} receives from {o.peer}")
                    if not q:
                        break
                    c, i, k = q.popleft()
                    if len(i) != o.count:
                        raise CheckError(f"{name} n={nranks} count={count}: rank {r} step {pc[r]} expects "
                                         f"{o.count} elements from rank {o.peer}, which sent {len(i)}")
                    region(b, o.buf, o.off, o.count, r)
                    _apply(b[o.buf], o.off, c, i, o.reduce)
                    know[r] |= k
                    pending[r] += 1
                    progress = True
                if pending[r] < len(recvs):
                    break
                pc[r] += 1
                entered[r] = False
    stuck = [r for r in range(nranks) if pc[r] < len(scheds[r].steps)]
    if stuck:
        raise CheckError(f"{name} n={nranks} count={count}: deadlock; ranks {stuck} wait at steps "
                         f"{[pc[r] for r in stuck]}")
    left = [k for k, q in chan.items() if q]
    if left:
        raise CheckError(f"{name} n={nranks} count={count}: messages never received on {left[:4]}")
    return bufs, know, scheds


def _apply(dst: _Buf, off: int, c, i, reduce: bool) -> None:
    sl = slice(off, off + len(i))
    if reduce:
        cur = dst.i[sl]
        dst.i[sl] = np.where((cur == i) | (cur == UNSET), i, MIXED)
        dst.c[sl] += c
    else:
        dst.c[sl] = c
        dst.i[sl] = i


def check(primitive: str, name: str, nranks: int, count: int, root: int = 0, hosts=None):
    """Raise CheckError unless every rank ends with exactly the promised contributions.

    Returns the schedules (for tests that also look at steps and bytes)."""
    if primitive in ("allreduce", "reduce"):
        _check(primitive, name, nranks, count, root, True, hosts)
    return _check(primitive, name, nranks, count, root, False, hosts)


def _check(primitive, name, nranks, count, root, inplace, hosts):
    bufs, know, scheds = simulate(primitive, name, nranks, count, root, inplace, hosts)
    if primitive == "barrier":
        for r in range(nranks):
            if len(know[r]) != nranks:
                raise CheckError(f"barrier {name} n={nranks}: rank {r} may leave before hearing from "
                                 f"{sorted(set(range(nranks)) - know[r])}")
        return scheds
    for r in range(nranks):
        exp = _expected(primitive, nranks, r, count, root)
        if exp is None:
            continue
        out = bufs[r]["out"]
        ec, ei = exp
        bad = np.flatnonzero((out.c != ec).any(axis=1) | (out.i != ei))
        if len(bad):
            e = bad[0]
            raise CheckError(f"{primitive} {name} n={nranks} count={count} root={root}: rank {r} out[{e}] holds "
                             f"contributions {out.c[e].tolist()} of input element {out.i[e]}; expected "
                             f"{ec[e].tolist()} of element {ei[e]} ({len(bad)} wrong elements)")
        if not inplace and primitive != "broadcast":
            inp = bufs[r]["in"]
            if (inp.c != np.eye(nranks, dtype=np.int32)[r]).any() and len(inp.i):
                raise CheckError(f"{primitive} {name} n={nranks}: rank {r}'s input was modified")
    return scheds


__all__ = ["check", "simulate", "CheckError"]
