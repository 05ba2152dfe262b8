"""Rank functions of tests/test_call_forms.py: every documented call form of every array collective,
made several times in a row with new data (from the second call on a form may run prepared, core/quick.py),
checked against numpy on every rank; wrong buffers refused on the first and on a repeated call.

Each function returns a list of failure descriptions (empty when all is well). A form that raises is
recorded and does not hide the others: the communicator the forms run on is a dup of the pool's, which a
rank that saw an error aborts (so its peers, perhaps waiting for it, fail at once instead of hanging);
after each form the ranks agree on the pool's communicator whether to replace that dup.
"""
from __future__ import annotations

import threading
import traceback
import zlib

import numpy as np

import pyxccl
from pyxccl.algorithms import registry
from rankfns import _cmp

REPS = 4                      # calls per form in a row: the 2nd to 4th may run prepared
# A message algorithm forced per primitive (v-variants: their primitive's); gatherv/scatterv run "direct" only.
MESSAGE_ALGO = {"allreduce": "ring", "broadcast": "chain", "reduce": "binomial", "allgather": "bruck",
                "gather": "binomial", "scatter": "binomial", "reduce_scatter": "recursive_halving",
                "alltoall": "pairwise", "barrier": "dissemination"}
# (dtype, per-rank block of the equal-block calls, per-rank counts of the v-calls as a function of (n, rank))
CONFIGS = ((np.float32, 3, lambda n, p: 2 + p),
           (np.int64, 700, lambda n, p: 0 if p == n - 1 else 600 + 50 * p))


def values(tag: str, who: int, count: int, dt, k: int) -> np.ndarray:
    """Exact small integers (1..5, sums exact in float32 for 5 ranks) that differ per form ``tag``, per rank
    (or block) ``who`` and per repetition ``k``: every rank can compute every other rank's input."""
    salt = zlib.crc32(tag.encode()) % 997
    i = np.arange(count, dtype=np.int64)
    return ((i * 7 + who * 3 + salt + k * 11) % 5 + 1).astype(dt)


def sentinel(count: int, dt) -> np.ndarray:
    return np.full(count, -7, dt)


def _wrap(kind):
    """Buffers as the call gets them: numpy arrays, or torch CPU tensors sharing their memory."""
    if kind == "numpy":
        return lambda a: a
    import torch
    return lambda a: a if a is None else torch.from_numpy(a)


def _same(fails, what, got, want):
    if got is not want:
        fails.append(f"{what}: returned {type(got).__name__} {_desc(got)}, want the object passed "
                     f"({type(want).__name__})")


def _desc(x):
    return "" if x is None else f"{getattr(x, 'dtype', '')}{tuple(getattr(x, 'shape', ()))}"


def _algos(comm, prim: str) -> list:
    """None (the default), a forced message algorithm, and the segment algorithm where all ranks share one."""
    out = [None, MESSAGE_ALGO[prim]]
    if "shm" in registry.algorithms(prim) and all(comm.transport(p) in ("shm", "self") for p in range(comm.size)):
        out.append("shm")
    return out


# --- the forms -----------------------------------------------------------------------------------------------

def forms(comm, wrap) -> list:
    """(name, fn(c, k, fails)) for every call form on a communicator like ``comm``: fn makes the call once on
    communicator ``c`` with the data of repetition ``k`` and appends what is wrong to ``fails``."""
    n, r = comm.size, comm.rank
    W = wrap
    out = []

    def add(name, fn):
        out.append((name, fn))

    for dt, c, vc in CONFIGS:
        counts = [vc(n, p) for p in range(n)]
        offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        dn = np.dtype(dt).name
        for algo in _algos(comm, "allreduce"):
            t = f"allreduce {dn} c={c} algo={algo}"

            def ar(cc, k, fails, form, t=t, algo=algo):
                x = values(t, r, c, dt, k)
                exp = sum(values(t, p, c, dt, k) for p in range(n)).astype(dt)
                if form == "in place":
                    wx = W(x)
                    _same(fails, t + " in place", cc.allreduce(wx, algorithm=algo), wx)
                    _cmp(fails, t + " in place", x, exp)
                elif form == "out":
                    o = sentinel(c, dt)
                    wo = W(o)
                    _same(fails, t + " out=", cc.allreduce(W(x), out=wo, algorithm=algo), wo)
                    _cmp(fails, t + " out=", o, exp)
                    _cmp(fails, t + " out=: input untouched", x, values(t, r, c, dt, k))
                elif form == "out=the input":
                    wx = W(x)
                    _same(fails, t + " out=x", cc.allreduce(wx, out=wx, algorithm=algo), wx)
                    _cmp(fails, t + " out=x", x, exp)
                else:       # out= a view of the whole input: NCCL's in place
                    wv = W(x[:])
                    _same(fails, t + " out=x[:]", cc.allreduce(W(x), out=wv, algorithm=algo), wv)
                    _cmp(fails, t + " out=x[:]", x, exp)
            for form in ("in place", "out", "out=the input", "out=a view of the input"):
                add(f"{t} {form}", lambda cc, k, f, ar=ar, form=form: ar(cc, k, f, form))

        for algo in _algos(comm, "broadcast"):
            for root in range(n):
                t = f"broadcast {dn} c={c} algo={algo} root={root}"

                def bc(cc, k, fails, t=t, algo=algo, root=root):
                    x = values(t, r, c, dt, k) if r == root else sentinel(c, dt)
                    wx = W(x)
                    _same(fails, t, cc.broadcast(wx, root, algorithm=algo), wx)
                    _cmp(fails, t, x, values(t, root, c, dt, k))
                add(t, bc)

        for algo in _algos(comm, "reduce"):
            for root in range(n):
                t = f"reduce {dn} c={c} algo={algo} root={root}"

                def rd(cc, k, fails, form, t=t, algo=algo, root=root):
                    mine = values(t, r, c, dt, k)
                    x = mine.copy()
                    exp = sum(values(t, p, c, dt, k) for p in range(n)).astype(dt)
                    wx = W(x)
                    if form == "in place":
                        _same(fails, f"{t} {form}", cc.reduce(wx, root, algorithm=algo), wx)
                        _cmp(fails, f"{t} {form}", x, exp if r == root else mine)
                        return
                    if form == "out=a view of the input at the root":
                        o = x[:] if r == root else None
                    elif form == "out at the root, None elsewhere":
                        o = sentinel(c, dt) if r == root else None
                    else:                           # out everywhere: ignored off the root
                        o = sentinel(c, dt)
                    wo = W(o)
                    got = cc.reduce(wx, root, out=wo, algorithm=algo)
                    _same(fails, f"{t} {form}", got, wo if r == root else wx)
                    if r == root:
                        _cmp(fails, f"{t} {form}", o, exp)
                        if o is not None and not np.shares_memory(o, x):
                            _cmp(fails, f"{t} {form}: input untouched", x, mine)
                    else:
                        _cmp(fails, f"{t} {form}: non-root input untouched", x, mine)
                        if o is not None:
                            _cmp(fails, f"{t} {form}: non-root out untouched", o, sentinel(c, dt))
                for form in ("in place", "out at the root, None elsewhere", "out everywhere",
                             "out=a view of the input at the root"):
                    add(f"{t} {form}", lambda cc, k, f, rd=rd, form=form: rd(cc, k, f, form))

        for algo in _algos(comm, "allgather"):
            t = f"allgather {dn} c={c} algo={algo}"

            def ag(cc, k, fails, form, t=t, algo=algo):
                exp = np.concatenate([values(t, p, c, dt, k) for p in range(n)])
                mine = values(t, r, c, dt, k)
                if form == "provided":
                    o = sentinel(c * n, dt)
                    wo = W(o)
                    _same(fails, f"{t} {form}", cc.allgather(W(mine), wo, algorithm=algo), wo)
                elif form == "recvbuf=None":
                    o = cc.allgather(W(mine), None, algorithm=algo)
                    if type(o) is not np.ndarray:
                        fails.append(f"{t} {form}: returned {type(o).__name__}, want a new numpy array")
                        return
                else:                               # in place: sendbuf is this rank's block of recvbuf
                    o = sentinel(c * n, dt)
                    o[r * c:(r + 1) * c] = mine
                    wo = W(o)
                    _same(fails, f"{t} {form}", cc.allgather(W(o[r * c:(r + 1) * c]), wo, algorithm=algo), wo)
                _cmp(fails, f"{t} {form}", o, exp)
                _cmp(fails, f"{t} {form}: input untouched", mine, values(t, r, c, dt, k))
            for form in ("provided", "recvbuf=None", "in place"):
                add(f"{t} {form}", lambda cc, k, f, ag=ag, form=form: ag(cc, k, f, form))

        for algo in (None, MESSAGE_ALGO["allgather"]):
            t = f"allgatherv {dn} counts={counts} algo={algo}"

            def agv(cc, k, fails, form, t=t, algo=algo, counts=counts, offs=offs):
                exp = np.concatenate([values(t, p, counts[p], dt, k) for p in range(n)])
                mine = values(t, r, counts[r], dt, k)
                if form == "provided":
                    o = sentinel(offs[-1], dt)
                    wo = W(o)
                    _same(fails, f"{t} {form}", cc.allgatherv(W(mine), wo, counts, algorithm=algo), wo)
                elif form == "recvbuf=None (as allgather)":
                    o = cc.allgatherv(W(mine), None, counts, algorithm=algo)
                    if type(o) is not np.ndarray:
                        fails.append(f"{t} {form}: returned {type(o).__name__}, want a new numpy array")
                        return
                else:
                    o = sentinel(offs[-1], dt)
                    o[offs[r]:offs[r + 1]] = mine
                    wo = W(o)
                    _same(fails, f"{t} {form}",
                          cc.allgatherv(W(o[offs[r]:offs[r + 1]]), wo, counts, algorithm=algo), wo)
                _cmp(fails, f"{t} {form}", o, exp)
            for form in ("provided", "recvbuf=None (as allgather)", "in place"):
                add(f"{t} {form}", lambda cc, k, f, agv=agv, form=form: agv(cc, k, f, form))

        for algo in _algos(comm, "gather"):
            for root in range(n):
                t = f"gather {dn} c={c} algo={algo} root={root}"

                def ga(cc, k, fails, form, t=t, algo=algo, root=root):
                    exp = np.concatenate([values(t, p, c, dt, k) for p in range(n)])
                    mine = values(t, r, c, dt, k)
                    send = mine.copy()
                    o = None
                    if form == "provided at the root, None elsewhere":
                        o = sentinel(c * n, dt) if r == root else None
                    elif form == "provided everywhere (ignored off the root)":
                        o = sentinel(c * n, dt)
                    elif form == "in place at the root":
                        if r == root:
                            o = sentinel(c * n, dt)
                            o[r * c:(r + 1) * c] = mine
                            send = o[r * c:(r + 1) * c]
                    wo = W(o)
                    got = cc.gather(W(send), wo, root, algorithm=algo)
                    if r != root:
                        if got is not None:
                            fails.append(f"{t} {form}: a non-root got {type(got).__name__} back, want None")
                        if o is not None:
                            _cmp(fails, f"{t} {form}: non-root recvbuf untouched", o, sentinel(c * n, dt))
                        return
                    if form == "recvbuf=None at the root (allocates)":
                        if type(got) is not np.ndarray:
                            fails.append(f"{t} {form}: the root got {type(got).__name__}, want a new numpy array")
                            return
                        o = got
                    else:
                        _same(fails, f"{t} {form}", got, wo)
                    _cmp(fails, f"{t} {form}", o, exp)
                for form in ("provided at the root, None elsewhere", "provided everywhere (ignored off the root)",
                             "recvbuf=None at the root (allocates)", "in place at the root"):
                    add(f"{t} {form}", lambda cc, k, f, ga=ga, form=form: ga(cc, k, f, form))

        for root in range(n):
            t = f"gatherv {dn} counts={counts} root={root}"

            def gv(cc, k, fails, form, t=t, root=root, counts=counts, offs=offs):
                exp = np.concatenate([values(t, p, counts[p], dt, k) for p in range(n)])
                mine = values(t, r, counts[r], dt, k)
                send, o = mine, None
                cnt = counts if (r == root or form == "counts everywhere") else None
                if r == root and form != "recvbuf=None at the root (allocates)":
                    o = sentinel(offs[-1], dt)
                    if form == "in place at the root":
                        o[offs[r]:offs[r + 1]] = mine
                        send = o[offs[r]:offs[r + 1]]
                wo = W(o)
                got = cc.gatherv(W(send), wo, cnt, root)
                if r != root:
                    if got is not None:
                        fails.append(f"{t} {form}: a non-root got {type(got).__name__} back, want None")
                    return
                if o is None:
                    if type(got) is not np.ndarray:
                        fails.append(f"{t} {form}: the root got {type(got).__name__}, want a new numpy array")
                        return
                    o = got
                else:
                    _same(fails, f"{t} {form}", got, wo)
                _cmp(fails, f"{t} {form}", o, exp)
            for form in ("counts at the root only", "counts everywhere", "recvbuf=None at the root (allocates)",
                         "in place at the root"):
                add(f"{t} {form}", lambda cc, k, f, gv=gv, form=form: gv(cc, k, f, form))

        for algo in _algos(comm, "scatter"):
            for root in range(n):
                t = f"scatter {dn} c={c} algo={algo} root={root}"

                def sc(cc, k, fails, form, t=t, algo=algo, root=root):
                    whole = np.concatenate([values(t, p, c, dt, k) for p in range(n)])
                    send = whole.copy() if (r == root or form == "sendbuf everywhere (ignored off the root)") \
                        else None
                    o = sentinel(c, dt)
                    if form == "in place at the root" and r == root:
                        o = send[r * c:(r + 1) * c]
                    wo = W(o)
                    _same(fails, f"{t} {form}", cc.scatter(W(send), wo, root, algorithm=algo), wo)
                    _cmp(fails, f"{t} {form}", o, whole[r * c:(r + 1) * c])
                    if send is not None:
                        _cmp(fails, f"{t} {form}: sendbuf untouched", send, whole)
                for form in ("sendbuf at the root, None elsewhere", "sendbuf everywhere (ignored off the root)",
                             "in place at the root"):
                    add(f"{t} {form}", lambda cc, k, f, sc=sc, form=form: sc(cc, k, f, form))

        for root in range(n):
            t = f"scatterv {dn} counts={counts} root={root}"

            def scv(cc, k, fails, form, t=t, root=root, counts=counts, offs=offs):
                whole = np.concatenate([values(t, p, counts[p], dt, k) for p in range(n)])
                send = whole.copy() if r == root else None
                cnt = counts if (r == root or form == "counts everywhere") else None
                o = sentinel(counts[r], dt)
                if form == "in place at the root" and r == root:
                    o = send[offs[r]:offs[r + 1]]
                wo = W(o)
                _same(fails, f"{t} {form}", cc.scatterv(W(send), wo, cnt, root), wo)
                _cmp(fails, f"{t} {form}", o, whole[offs[r]:offs[r + 1]])
            for form in ("counts at the root only", "counts everywhere", "in place at the root"):
                add(f"{t} {form}", lambda cc, k, f, scv=scv, form=form: scv(cc, k, f, form))

        for algo in _algos(comm, "reduce_scatter"):
            t = f"reduce_scatter {dn} c={c} algo={algo}"

            def rs(cc, k, fails, form, t=t, algo=algo):
                send = values(t, r, c * n, dt, k)
                exp = sum(values(t, p, c * n, dt, k) for p in range(n)).astype(dt)[r * c:(r + 1) * c]
                o = send[r * c:(r + 1) * c] if form == "in place" else sentinel(c, dt)
                wo = W(o)
                _same(fails, f"{t} {form}", cc.reduce_scatter(W(send), wo, algorithm=algo), wo)
                _cmp(fails, f"{t} {form}", o, exp)
                if form != "in place":
                    _cmp(fails, f"{t} {form}: input untouched", send, values(t, r, c * n, dt, k))
            for form in ("provided", "in place"):
                add(f"{t} {form}", lambda cc, k, f, rs=rs, form=form: rs(cc, k, f, form))

        for algo in (None, MESSAGE_ALGO["reduce_scatter"]):
            t = f"reduce_scatterv {dn} counts={counts} algo={algo}"

            def rsv(cc, k, fails, form, t=t, algo=algo, counts=counts, offs=offs):
                send = values(t, r, offs[-1], dt, k)
                exp = sum(values(t, p, offs[-1], dt, k) for p in range(n)).astype(dt)[offs[r]:offs[r + 1]]
                o = send[offs[r]:offs[r + 1]] if form == "in place" else sentinel(counts[r], dt)
                wo = W(o)
                _same(fails, f"{t} {form}", cc.reduce_scatterv(W(send), wo, counts, algorithm=algo), wo)
                _cmp(fails, f"{t} {form}", o, exp)
            for form in ("provided", "in place"):
                add(f"{t} {form}", lambda cc, k, f, rsv=rsv, form=form: rsv(cc, k, f, form))

        for algo in _algos(comm, "alltoall"):
            t = f"alltoall {dn} c={c} algo={algo}"

            def a2a(cc, k, fails, t=t, algo=algo):
                send = values(t, r, c * n, dt, k)
                exp = np.concatenate([values(t, p, c * n, dt, k)[r * c:(r + 1) * c] for p in range(n)])
                o = sentinel(c * n, dt)
                wo = W(o)
                _same(fails, t, cc.alltoall(W(send), wo, algorithm=algo), wo)
                _cmp(fails, t, o, exp)
            add(t, a2a)

        def pair(i, j):         # elements rank i sends rank j in alltoallv
            return (i * 3 + j * 5 + c) % 7 + (c // 100)
        for algo in (None, "direct"):
            t = f"alltoallv {dn} algo={algo}"

            def a2av(cc, k, fails, t=t, algo=algo):
                sc = [pair(r, j) for j in range(n)]
                rc = [pair(j, r) for j in range(n)]
                send = np.concatenate([values(t, r * n + j, sc[j], dt, k) for j in range(n)])
                exp = np.concatenate([values(t, j * n + r, rc[j], dt, k) for j in range(n)])
                o = sentinel(sum(rc), dt)
                wo = W(o)
                _same(fails, t, cc.alltoallv(W(send), wo, sc, rc, algorithm=algo), wo)
                _cmp(fails, t, o, exp)
            add(t, a2av)

    for algo in _algos(comm, "barrier"):
        def br(cc, k, fails, algo=algo):
            got = cc.barrier(algorithm=algo)
            if got is not None:
                fails.append(f"barrier algo={algo}: returned {got!r}")
        add(f"barrier algo={algo}", br)
    return out


def _run_forms(comm, todo, reps: int = REPS) -> list:
    """Run each form ``reps`` times in a row on a dup of ``comm``; an exception is a failure (its form's
    later repetitions are skipped) and makes every rank replace the dup (see the module's docstring)."""
    fails = []
    c = comm.dup()
    try:
        for name, fn in todo:
            bad = False
            for k in range(reps):
                try:
                    fn(c, k, fails)
                except Exception as e:  # noqa: BLE001  (any error of a call form is the finding)
                    where = traceback.extract_tb(e.__traceback__)[-1]
                    fails.append(f"{name} call #{k + 1}: {type(e).__name__}: {e} "
                                 f"(at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})")
                    c.abort()
                    bad = True
                    break
            if any(comm.allgather_object(bad)):
                c.close()
                c = comm.dup()
    finally:
        c.close()
    return fails


def every_form(comm, kind: str = "numpy", leave_out: str = "") -> list:
    """Every call form (but those whose name holds ``leave_out``, when given: for a diagnosis that gets
    past a crash), ``REPS`` times each with new data, numpy or torch buffers: the failures."""
    todo = [(name, fn) for name, fn in forms(comm, _wrap(kind)) if not (leave_out and leave_out in name)]
    return _run_forms(comm, todo)


def form_names(comm) -> list[str]:
    return [name for name, _ in forms(comm, _wrap("numpy"))]


def crash_on(comm, victim: int):
    """Rank ``victim`` dies of SIGSEGV while the others wait for it in an allreduce."""
    import os
    import signal
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGSEGV)
    comm.allreduce(np.ones(4, np.float32))
    return []
