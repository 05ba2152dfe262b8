"""Rank functions of tests/test_call_forms.py: every documented call form of every array collective,
made several times in a row with new data (from the second call on a form may run prepared, core/prepared.py),
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
from rankfns import _cmp

REPS = 4                      # calls per form in a row: the 2nd to 4th may run prepared
# A message algorithm forced per primitive (v-variants: their primitive's); gatherv/scatterv run "direct" only.
MESSAGE_ALGO = {"allreduce": "ring", "broadcast": "chain", "reduce": "binomial", "allgather": "bruck",
                "gather": "binomial", "scatter": "binomial", "reduce_scatter": "recursive_halving",
                "alltoall": "pairwise", "barrier": "dissemination"}
# (dtype, per-rank block of the equal-block calls, per-rank counts of the v-calls as a function of (n, rank))
CONFIGS = ((np.float32, 3, lambda n, p: 2 + p),
           (np.int64, 700, lambda n, p: 0 if p == n - 1 else 600 + 50 * p),
           (np.float16, 5, lambda n, p: 1 + p),            # reduced in Python, not by the native executor
           (np.uint8, 0, lambda n, p: p % 2))              # empty buffers


def values(tag: str, who: int, count: int, dt, k: int) -> np.ndarray:
    """Exact small integers (1..5, sums exact in float32 for 5 ranks) that differ per form ``tag``, per rank
    (or block) ``who`` and per repetition ``k``: every rank can compute every other rank's input."""
    salt = zlib.crc32(tag.encode()) % 997
    i = np.arange(count, dtype=np.int64)
    return ((i * 7 + who * 3 + salt + k * 11) % 5 + 1).astype(dt)


def sentinel(count: int, dt) -> np.ndarray:
    return np.full(count, 99, dt)      # no result: every value is in 1..5, a sum of up to 5 ranks <= 25


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


def _gathered(fails, what, is_root, got, o, wo, exp) -> None:
    """What a gather or gatherv returned: None off the root; at the root the recvbuf passed (``wo``,
    its array ``o``) or, with none passed, a new numpy array; the root's holds ``exp``."""
    if not is_root:
        if got is not None:
            fails.append(f"{what}: a non-root got {type(got).__name__} back, want None")
        return
    if o is None:
        if type(got) is not np.ndarray:
            fails.append(f"{what}: the root got {type(got).__name__}, want a new numpy array")
            return
        o = got
    else:
        _same(fails, what, got, wo)
    _cmp(fails, what, o, exp)


def _desc(x):
    return "" if x is None else f"{getattr(x, 'dtype', '')}{tuple(getattr(x, 'shape', ()))}"


def _algos(comm, prim: str) -> list:
    """None (the default), a forced message algorithm, and the segment algorithm where all ranks share one."""
    out = [None, MESSAGE_ALGO[prim]]
    if "segment" in comm.algorithms(prim):
        out.append("segment")
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

    def config(dt, c, vc):      # a function: the forms' closures bind this config's dt, c and counts
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
                    if r != root and o is not None:
                        _cmp(fails, f"{t} {form}: non-root recvbuf untouched", o, sentinel(c * n, dt))
                    _gathered(fails, f"{t} {form}", r == root, got, o, wo, exp)
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
                _gathered(fails, f"{t} {form}", r == root, got, o, wo, exp)
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

    for dt, c, vc in CONFIGS:
        config(dt, c, vc)

    for algo in _algos(comm, "barrier"):
        def br(cc, k, fails, algo=algo):
            got = cc.barrier(algorithm=algo)
            if got is not None:
                fails.append(f"barrier algo={algo}: returned {got!r}")
        add(f"barrier algo={algo}", br)
    return out


def _run_forms(comm, todo, reps: int = REPS, fresh: bool = False) -> list:
    """Run each form ``reps`` times in a row on a dup of ``comm``; an exception is a failure (its form's
    later repetitions are skipped) and makes every rank replace the dup (see the module's docstring), as
    does every form with ``fresh`` (its first call is then the first of its shape on its communicator)."""
    fails, c = [], None
    try:
        for name, fn in todo:
            bad = False
            try:
                if c is None:
                    c = comm.dup()
                for k in range(reps):
                    where = f"call #{k + 1}"
                    fn(c, k, fails)
            except Exception as e:  # noqa: BLE001  (any error of a call form is the finding)
                at = traceback.extract_tb(e.__traceback__)[-1]
                fails.append(f"{name} {where if c is not None else 'comm.dup()'}: {type(e).__name__}: {e} "
                             f"(at {at.filename.rsplit('/', 1)[-1]}:{at.lineno})")
                if c is not None:
                    c.abort()       # peers waiting in this dup fail now instead of at their timeout
                bad = True
            if any(comm.allgather_object(bad)) or fresh:
                if c is not None:
                    c.close()
                c = None
    finally:
        if c is not None:
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


# --- wrong buffers ------------------------------------------------------------------------------------------

T = 10.0            # every call of the refusal cases: a bad call that ran where its peers did not fails soon


class CaseFailed(AssertionError):
    """A step of a refusal case went wrong: a bad call ran or raised something else than
    InvalidArgumentError, or a good call raised."""


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _strided(count: int, dt=np.float32) -> np.ndarray:
    return np.zeros(2 * count, dt)[::2]


def refusal_cases(comm) -> list:
    """(name, who, good, bad, watch): ``good(c)`` is a valid call on every rank; ``bad(c)`` the same call
    with one wrong buffer, made on rank ``who`` only (None: on every rank; a bad root-only argument is
    passed by the root alone, as its peers would go ahead); ``watch``: arrays the refused call must leave
    as they were. refusals() runs each case on a new dup: its first bad call is the first of its shape."""
    n, r = comm.size, comm.rank
    f32, f64 = np.float32, np.float64
    cases = []
    size = iter(range(2, 10 ** 6))

    def case(name, who, good, bad, *watch):
        cases.append((name, who, good, bad, watch))

    # allreduce
    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        x, o = np.ones(c, f32), np.empty(c, f32)
        g = (lambda cc, x=x, o=o: cc.allreduce(x, out=o, timeout=T))
        wrong, wide, ovl, dt64 = sentinel(c + 1, f32), sentinel(2 * c, f32), sentinel(c + 1, f32), sentinel(c, f64)
        case("allreduce out= of the wrong size", None, g, lambda cc: cc.allreduce(x, out=wrong, timeout=T), wrong)
        case("allreduce read-only out=", None, g,
             lambda cc: cc.allreduce(x, out=_readonly(np.empty(c, f32)), timeout=T))
        case("allreduce non-contiguous out=", None, g, lambda cc: cc.allreduce(x, out=wide[::2], timeout=T), wide)
        case("allreduce non-contiguous input", None, g, lambda cc: cc.allreduce(_strided(c), out=o, timeout=T))
        case("allreduce out= overlapping the input", None, g,
             lambda cc: cc.allreduce(ovl[:c], out=ovl[1:], timeout=T), ovl)
        case("allreduce out= of another dtype", None, g, lambda cc: cc.allreduce(x, out=dt64, timeout=T), dt64)
        case("allreduce tensor=None", None, g, lambda cc: cc.allreduce(None, out=o, timeout=T))
        case("allreduce out= a list", None, g, lambda cc: cc.allreduce(x, out=[0.0] * c, timeout=T))
    block()

    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        y = np.ones(c, f32)
        g = (lambda cc, y=y: cc.allreduce(y, timeout=T))
        case("allreduce in place, read-only", None, g, lambda cc: cc.allreduce(_readonly(np.ones(c, f32)), timeout=T))
        case("allreduce in place, non-contiguous", None, g, lambda cc: cc.allreduce(_strided(c), timeout=T))
        case("allreduce in place, None", None, g, lambda cc: cc.allreduce(None, timeout=T))
    block()

    # broadcast
    def block(root):
        c = next(size)
        x = np.ones(c, f32)
        g = (lambda cc, x=x, root=root: cc.broadcast(x, root, timeout=T))
        case(f"broadcast root={root} non-contiguous", None, g,
             lambda cc, c=c, root=root: cc.broadcast(_strided(c), root, timeout=T))
        case(f"broadcast root={root} None", None, g, lambda cc, root=root: cc.broadcast(None, root, timeout=T))
        case(f"broadcast root={root} read-only off the root (non-contiguous at the root)", None, g,
             lambda cc, c=c, root=root: cc.broadcast(_strided(c) if r == root else _readonly(np.ones(c, f32)),
                                                     root, timeout=T))
    for root in sorted({0, n - 1}):
        block(root)

    # reduce
    def block(root):
        c = next(size)
        x, o = np.ones(c, f32), np.empty(c, f32)
        g = (lambda cc, x=x, o=o, root=root: cc.reduce(x, root, out=o, timeout=T))
        wrong, dt64, ovl, wide = sentinel(c + 1, f32), sentinel(c, f64), sentinel(c + 1, f32), sentinel(2 * c, f32)
        case(f"reduce root={root} out= of the wrong size at the root", root, g,
             lambda cc, x=x, wrong=wrong, root=root: cc.reduce(x, root, out=wrong, timeout=T), wrong)
        case(f"reduce root={root} read-only out= at the root", root, g,
             lambda cc, x=x, c=c, root=root: cc.reduce(x, root, out=_readonly(np.empty(c, f32)), timeout=T))
        case(f"reduce root={root} out= of another dtype at the root", root, g,
             lambda cc, x=x, dt64=dt64, root=root: cc.reduce(x, root, out=dt64, timeout=T), dt64)
        case(f"reduce root={root} out= overlapping the input at the root", root, g,
             lambda cc, c=c, ovl=ovl, root=root: cc.reduce(ovl[:c], root, out=ovl[1:], timeout=T), ovl)
        case(f"reduce root={root} non-contiguous out= at the root", root, g,
             lambda cc, x=x, wide=wide, root=root: cc.reduce(x, root, out=wide[::2], timeout=T), wide)
        case(f"reduce root={root} non-contiguous input", None, g,
             lambda cc, c=c, o=o, root=root: cc.reduce(_strided(c), root, out=o, timeout=T))
        c = next(size)
        y = np.ones(c, f32)
        case(f"reduce root={root} in place, read-only at the root", root,
             lambda cc, y=y, root=root: cc.reduce(y, root, timeout=T),
             lambda cc, c=c, root=root: cc.reduce(_readonly(np.ones(c, f32)), root, timeout=T))
    for root in sorted({0, n - 1}):
        block(root)

    # allgather, allgatherv
    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        x, o = np.ones(c, f32), np.empty(c * n, f32)
        g = (lambda cc, x=x, o=o: cc.allgather(x, o, timeout=T))
        wrong, wide, dt64 = sentinel(c * n - 1, f32), sentinel(2 * c * n, f32), sentinel(c * n, f64)
        ovl = sentinel(c * n + 1, f32)
        case("allgather recvbuf of the wrong size", None, g, lambda cc: cc.allgather(x, wrong, timeout=T), wrong)
        case("allgather read-only recvbuf", None, g,
             lambda cc: cc.allgather(x, _readonly(np.empty(c * n, f32)), timeout=T))
        case("allgather non-contiguous recvbuf", None, g, lambda cc: cc.allgather(x, wide[::2], timeout=T), wide)
        case("allgather non-contiguous sendbuf", None, g, lambda cc: cc.allgather(_strided(c), o, timeout=T))
        case("allgather recvbuf of another dtype", None, g, lambda cc: cc.allgather(x, dt64, timeout=T), dt64)
        case("allgather sendbuf overlapping recvbuf off this rank's block", None, g,
             lambda cc: cc.allgather(ovl[r * c + 1:r * c + 1 + c], ovl[:c * n], timeout=T), ovl)
        case("allgather sendbuf=None", None, g, lambda cc: cc.allgather(None, o, timeout=T))
    block()

    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        x = np.ones(c, f32)
        g = (lambda cc, x=x: cc.allgather(x, None, timeout=T))
        case("allgather recvbuf=None, non-contiguous sendbuf", None, g,
             lambda cc, c=c: cc.allgather(_strided(c), None, timeout=T))
        case("allgather recvbuf=None, sendbuf=None", None, g, lambda cc: cc.allgather(None, None, timeout=T))
    block()

    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        counts = [c + p for p in range(n)]
        x, o = np.ones(counts[r], f32), np.empty(sum(counts), f32)
        g = (lambda cc, x=x, o=o, counts=counts: cc.allgatherv(x, o, counts, timeout=T))
        wrong, ovl = sentinel(sum(counts) + 1, f32), sentinel(sum(counts) + 1, f32)
        at = sum(counts[:r]) + 1
        case("allgatherv recvbuf of the wrong size", None, g,
             lambda cc, x=x, counts=counts, wrong=wrong: cc.allgatherv(x, wrong, counts, timeout=T), wrong)
        case("allgatherv counts[rank] not the sendbuf's size", None, g,
             lambda cc, x=x, o=o, counts=counts: cc.allgatherv(x, o, [k + 1 for k in counts], timeout=T))
        case("allgatherv sendbuf overlapping recvbuf off this rank's block", None, g,
             lambda cc, counts=counts, ovl=ovl, at=at: cc.allgatherv(ovl[at:at + counts[r]], ovl[:sum(counts)],
                                                                      counts, timeout=T), ovl)
    block()

    # gather, gatherv
    def block(root):
        c = next(size)
        x, o = np.ones(c, f32), np.empty(c * n, f32)
        g = (lambda cc, x=x, o=o, root=root: cc.gather(x, o if r == root else None, root, timeout=T))
        wrong, wide, dt64 = sentinel(c * n + 1, f32), sentinel(2 * c * n, f32), sentinel(c * n, f64)
        ovl = sentinel(c * n + 1, f32)
        case(f"gather root={root} recvbuf of the wrong size at the root", root, g,
             lambda cc, x=x, wrong=wrong, root=root: cc.gather(x, wrong, root, timeout=T), wrong)
        case(f"gather root={root} read-only recvbuf at the root", root, g,
             lambda cc, x=x, c=c, root=root: cc.gather(x, _readonly(np.empty(c * n, f32)), root, timeout=T))
        case(f"gather root={root} recvbuf of another dtype at the root", root, g,
             lambda cc, x=x, dt64=dt64, root=root: cc.gather(x, dt64, root, timeout=T), dt64)
        case(f"gather root={root} non-contiguous recvbuf at the root", root, g,
             lambda cc, x=x, wide=wide, root=root: cc.gather(x, wide[::2], root, timeout=T), wide)
        case(f"gather root={root} sendbuf overlapping recvbuf off the root's block", root, g,
             lambda cc, c=c, ovl=ovl, root=root: cc.gather(ovl[root * c + 1:root * c + 1 + c], ovl[:c * n], root,
                                                           timeout=T), ovl)
        case(f"gather root={root} non-contiguous sendbuf", None, g,
             lambda cc, c=c, o=o, root=root: cc.gather(_strided(c), o if r == root else None, root, timeout=T))
        case(f"gather root={root} sendbuf=None", None, g,
             lambda cc, o=o, root=root: cc.gather(None, o if r == root else None, root, timeout=T))
        c = next(size)
        x = np.ones(c, f32)
        g = (lambda cc, x=x, root=root: cc.gather(x, None, root, timeout=T))
        case(f"gather root={root} recvbuf=None, non-contiguous sendbuf", None, g,
             lambda cc, c=c, root=root: cc.gather(_strided(c), None, root, timeout=T))
        case(f"gather root={root} recvbuf=None, sendbuf=None", None, g,
             lambda cc, root=root: cc.gather(None, None, root, timeout=T))
        c = next(size)
        counts = [c + p for p in range(n)]
        x, o = np.ones(counts[r], f32), np.empty(sum(counts), f32)
        g = (lambda cc, x=x, o=o, counts=counts, root=root:
             cc.gatherv(x, o if r == root else None, counts if r == root else None, root, timeout=T))
        wrong = sentinel(sum(counts) - 1, f32)
        case(f"gatherv root={root} recvbuf of the wrong size at the root", root, g,
             lambda cc, x=x, wrong=wrong, counts=counts, root=root: cc.gatherv(x, wrong, counts, root, timeout=T),
             wrong)
        case(f"gatherv root={root} counts=None at the root", root, g,
             lambda cc, x=x, o=o, root=root: cc.gatherv(x, o, None, root, timeout=T))
    for root in sorted({0, n - 1}):
        block(root)

    # scatter, scatterv
    def block(root):
        c = next(size)
        s, o = np.ones(c * n, f32), np.empty(c, f32)
        g = (lambda cc, s=s, o=o, root=root: cc.scatter(s if r == root else None, o, root, timeout=T))
        wrong, wide, ovl = sentinel(c + 1, f32), sentinel(2 * c, f32), sentinel(c * n + 1, f32)
        sw, sdt = sentinel(c * n + 1, f32), sentinel(c * n, f64)
        # (off the root a recvbuf of another size is another call: a CollectiveMismatchError, not local)
        case(f"scatter root={root} recvbuf of the wrong size at the root", root, g,
             lambda cc, s=s, wrong=wrong, root=root: cc.scatter(s, wrong, root, timeout=T), wrong)
        case(f"scatter root={root} read-only recvbuf", None, g,
             lambda cc, s=s, c=c, root=root: cc.scatter(s if r == root else None, _readonly(np.empty(c, f32)), root,
                                                        timeout=T))
        case(f"scatter root={root} recvbuf=None", None, g,
             lambda cc, s=s, root=root: cc.scatter(s if r == root else None, None, root, timeout=T))
        case(f"scatter root={root} non-contiguous recvbuf", None, g,
             lambda cc, s=s, wide=wide, root=root: cc.scatter(s if r == root else None, wide[::2], root, timeout=T),
             wide)
        case(f"scatter root={root} sendbuf=None at the root", root, g,
             lambda cc, o=o, root=root: cc.scatter(None, o, root, timeout=T))
        case(f"scatter root={root} sendbuf of the wrong size at the root", root, g,
             lambda cc, sw=sw, o=o, root=root: cc.scatter(sw, o, root, timeout=T))
        case(f"scatter root={root} sendbuf of another dtype at the root", root, g,
             lambda cc, sdt=sdt, o=o, root=root: cc.scatter(sdt, o, root, timeout=T))
        case(f"scatter root={root} non-contiguous sendbuf at the root", root, g,
             lambda cc, c=c, o=o, root=root: cc.scatter(_strided(c * n), o, root, timeout=T))
        case(f"scatter root={root} recvbuf overlapping sendbuf off the root's block", root, g,
             lambda cc, c=c, ovl=ovl, root=root: cc.scatter(ovl[:c * n], ovl[root * c + 1:root * c + 1 + c], root,
                                                            timeout=T), ovl)
        c = next(size)
        counts = [c + p for p in range(n)]
        s, o = np.ones(sum(counts), f32), np.empty(counts[r], f32)
        g = (lambda cc, s=s, o=o, counts=counts, root=root:
             cc.scatterv(s if r == root else None, o, counts if r == root else None, root, timeout=T))
        case(f"scatterv root={root} sendbuf of the wrong size at the root", root, g,
             lambda cc, c=c, o=o, counts=counts, root=root: cc.scatterv(np.ones(sum(counts) + 1, f32), o, counts,
                                                                        root, timeout=T))
        case(f"scatterv root={root} counts=None at the root", root, g,
             lambda cc, s=s, o=o, root=root: cc.scatterv(s, o, None, root, timeout=T))
    for root in sorted({0, n - 1}):
        block(root)

    # reduce_scatter, reduce_scatterv
    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        s, o = np.ones(c * n, f32), np.empty(c, f32)
        g = (lambda cc, s=s, o=o: cc.reduce_scatter(s, o, timeout=T))
        wrong, wide, dt64, ovl = sentinel(c + 1, f32), sentinel(2 * c, f32), sentinel(c, f64), sentinel(c * n + 1, f32)
        case("reduce_scatter recvbuf of the wrong size", None, g,
             lambda cc: cc.reduce_scatter(s, wrong, timeout=T), wrong)
        case("reduce_scatter read-only recvbuf", None, g,
             lambda cc: cc.reduce_scatter(s, _readonly(np.empty(c, f32)), timeout=T))
        case("reduce_scatter recvbuf=None", None, g, lambda cc: cc.reduce_scatter(s, None, timeout=T))
        case("reduce_scatter non-contiguous recvbuf", None, g,
             lambda cc: cc.reduce_scatter(s, wide[::2], timeout=T), wide)
        case("reduce_scatter non-contiguous sendbuf", None, g,
             lambda cc: cc.reduce_scatter(_strided(c * n), o, timeout=T))
        case("reduce_scatter recvbuf of another dtype", None, g, lambda cc: cc.reduce_scatter(s, dt64, timeout=T), dt64)
        case("reduce_scatter recvbuf overlapping sendbuf off this rank's block", None, g,
             lambda cc: cc.reduce_scatter(ovl[:c * n], ovl[r * c + 1:r * c + 1 + c], timeout=T), ovl)
    block()

    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        counts = [c + p for p in range(n)]
        s, o = np.ones(sum(counts), f32), np.empty(counts[r], f32)
        case("reduce_scatterv counts not adding up to the sendbuf", None,
             lambda cc, s=s, o=o, counts=counts: cc.reduce_scatterv(s, o, counts, timeout=T),
             lambda cc, s=s, o=o, counts=counts: cc.reduce_scatterv(s, o, [k + (p == r) for p, k in enumerate(counts)],
                                                                    timeout=T))
    block()

    # alltoall, alltoallv
    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        s, o = np.ones(c * n, f32), np.empty(c * n, f32)
        g = (lambda cc, s=s, o=o: cc.alltoall(s, o, timeout=T))
        wrong, dt64, ovl = sentinel(c * n + 1, f32), sentinel(c * n, f64), sentinel(c * n + 2, f32)
        case("alltoall recvbuf of the wrong size", None, g, lambda cc: cc.alltoall(s, wrong, timeout=T), wrong)
        case("alltoall read-only recvbuf", None, g,
             lambda cc: cc.alltoall(s, _readonly(np.empty(c * n, f32)), timeout=T))
        case("alltoall recvbuf=None", None, g, lambda cc: cc.alltoall(s, None, timeout=T))
        case("alltoall recvbuf of another dtype", None, g, lambda cc: cc.alltoall(s, dt64, timeout=T), dt64)
        case("alltoall recvbuf overlapping sendbuf", None, g,
             lambda cc: cc.alltoall(ovl[:c * n], ovl[2:], timeout=T), ovl)
        case("alltoall sendbuf not a multiple of the ranks", None, g,
             lambda cc: cc.alltoall(np.ones(c * n + 1, f32), o, timeout=T))
        case("alltoall non-contiguous sendbuf", None, g, lambda cc: cc.alltoall(_strided(c * n), o, timeout=T))
    block()

    def block():      # a function per block: its lambdas bind its own buffers
        c = next(size)
        sc = [c + j for j in range(n)]
        rc = [c + r for j in range(n)]
        s, o = np.ones(sum(sc), f32), np.empty(sum(rc), f32)
        case("alltoallv recv_counts not adding up to the recvbuf", None,
             lambda cc, s=s, o=o, sc=sc, rc=rc: cc.alltoallv(s, o, sc, rc, timeout=T),
             lambda cc, s=s, o=o, sc=sc, rc=rc: cc.alltoallv(s, o, sc, [k + 1 for k in rc], timeout=T))
    block()

    return cases


def _refusal(comm, name, who, good, bad, watch):
    """A form for _run_forms: the bad call refused before and after the good call ran (twice: prepared
    from the second), the watched arrays untouched, then the good call and an allreduce right."""
    n, r = comm.size, comm.rank

    def fn(cc, k, fails):
        def refused(when):
            if who is not None and r != who:
                return
            before = [w.copy() for w in watch]
            try:
                bad(cc)
            except pyxccl.InvalidArgumentError:
                pass
            except Exception as e:  # noqa: BLE001
                raise CaseFailed(f"the bad call, {when}: {type(e).__name__}: {e}, want InvalidArgumentError") from e
            else:
                raise CaseFailed(f"the bad call, {when}: ran, want InvalidArgumentError")
            for w, b in zip(watch, before):
                _cmp(fails, f"{name} ({when}): a buffer the refused call was given", w, b)
        def fine(when):
            try:
                good(cc)
            except Exception as e:  # noqa: BLE001
                raise CaseFailed(f"the good call, {when}: {type(e).__name__}: {e}") from e
        refused("first call")
        fine("first")
        fine("repeated")
        refused("after the same shape ran twice")
        refused("repeated")
        fine("after the refusals")
        y = np.full(3, r + 1, np.int32)
        cc.allreduce(y)
        _cmp(fails, f"{name}: an allreduce after the refusals", y, np.full(3, n * (n + 1) // 2, np.int32))
    return name, fn


def refusals(comm, leave_out: str = "") -> list:
    """Every wrong-buffer case of ``refusal_cases`` (``leave_out``: as in every_form): the failures."""
    return _run_forms(comm, [_refusal(comm, *case) for case in refusal_cases(comm)
                             if not (leave_out and leave_out in case[0])], reps=1, fresh=True)


# --- two threads ---------------------------------------------------------------------------------------------

def two_threads(comm, calls: int = 5000, widths: int = 600) -> dict:
    """Two threads (named alike on every rank), each on its own dup of ``comm``, each make ``calls``
    blocking calls of mixed primitives and sizes: half from a few hot shapes (which run prepared), half
    from ``widths`` sizes per primitive (more shapes than the prepared-call cache keeps, core/prepared.py
    _KEPT: they evict and are evicted). Every result is checked. Returns the failures and, per thread, the
    distinct call shapes it made."""
    n, r = comm.size, comm.rank
    comms = [comm.dup(), comm.dup()]
    fails, shapes = [], {}

    def one(cc, prim, size, salt):
        x = np.full(size, 0, np.int64) + ((np.arange(size) + salt + r) % 7 + 1)
        ref = [((np.arange(size) + salt + p) % 7 + 1) for p in range(n)]
        if prim == "allreduce":
            cc.allreduce(x)
            return x, sum(ref)
        if prim == "allgather":
            return cc.allgather(x, np.empty(size * n, np.int64)), np.concatenate(ref)
        if prim == "broadcast":
            return cc.broadcast(x, salt % n), ref[salt % n]
        if prim == "reduce_scatter":
            whole = np.tile(x, n)
            return cc.reduce_scatter(whole, np.empty(size, np.int64)), sum(ref)
        if prim == "gather":
            root = salt % n
            got = cc.gather(x, np.empty(size * n, np.int64) if r == root else None, root)
            if r != root:       # the others get None back
                return (np.zeros(0), np.zeros(0)) if got is None else (got, None)
            return got, np.concatenate(ref)
        raise AssertionError(prim)

    def hammer(k):
        cc, seen, mine = comms[k], set(), []
        prims = ("allreduce", "allgather", "broadcast", "reduce_scatter", "gather")
        try:
            for i in range(calls):
                prim = prims[(i // 2) % len(prims)]
                size = (1 + (i // 10) % 4) if i % 2 else 5 + ((i // 2) * 7 + k * 11) % widths
                seen.add((prim, size))
                got, want = one(cc, prim, size, i * 2 + k)
                if not np.array_equal(got, want):
                    mine.append(f"thread {k} call {i} {prim} size {size}: got {got[:4]} want {want[:4]}")
                    if len(mine) > 5:
                        break
        except Exception as e:  # noqa: BLE001
            mine.append(f"thread {k}: {type(e).__name__}: {e}")
            cc.abort()
        fails.extend(mine)
        shapes[k] = len(seen)
    threads = [threading.Thread(target=hammer, args=(k,), name=f"callforms-{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in comms:
        c.close()
    return {"fails": fails, "shapes": shapes}
