"""Rank functions of tests/test_persistent.py: persistent requests (comm.*_init) of every primitive, started
several times with new data written into the buffers given at init, checked against numpy and, bit for bit,
against the plain call on the same inputs made between the starts.

Each checking function returns a list of failure descriptions (empty when all is well)."""
from __future__ import annotations

import threading
import time
import zlib

import numpy as np

import pyxccl
from pyxccl import ReduceOp
from callformfns import MESSAGE_ALGO, _algos

STARTS = 4                    # starts per request: start+wait, run(), start+test() polling, start+wait
TIMEOUT = 30                  # s: a failing case fails on every rank within this, not at the pool's 60 s
# (dtype, op, per-rank block): a float sum of random values (the order of the sum shows in the bits), an
# integer max, a float64 average (divided after the sum)
CONFIGS = ((np.float32, ReduceOp.SUM, 5), (np.int64, ReduceOp.MAX, 3), (np.float64, ReduceOp.AVG, 1000))


def data(tag: str, who: int, count: int, dt, k: int) -> np.ndarray:
    """Rank (or block) ``who``'s input of repetition ``k`` of case ``tag``: every rank can make every other
    rank's. Floats are random (sums differ in their last bits by order), integers small."""
    rng = np.random.default_rng([zlib.crc32(tag.encode()), who, k])     # hash() differs per process
    if np.dtype(dt).kind == "f":
        return rng.standard_normal(count).astype(dt)
    return rng.integers(-50, 50, count).astype(dt)


def reduced(op, parts: list, dt) -> np.ndarray:
    """What the reduction of ``parts`` must be (floats: within rounding)."""
    if op is ReduceOp.MAX:
        return np.maximum.reduce(parts).astype(dt)
    s = np.sum(np.array(parts, np.float64), axis=0)
    return (s / len(parts) if op is ReduceOp.AVG else s).astype(dt)


def _check(fails, what, got, want, exact):
    if got.shape != want.shape or got.dtype != want.dtype:
        fails.append(f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
    elif exact and not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        fails.append(f"{what}: {len(bad)} wrong, first at {bad[:3]}: got {got[bad[:3]]} want {want[bad[:3]]}")
    elif not exact and not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        fails.append(f"{what}: not the reduction (max error {np.max(np.abs(got - want))})")


def _same_bits(fails, what, persistent, plain):
    if persistent.tobytes() != plain.tobytes():
        bad = np.flatnonzero(persistent.view(np.uint8) != plain.view(np.uint8))
        fails.append(f"{what}: persistent and plain calls differ in {len(bad)} bytes, first at byte {bad[:3]}")


def _complete(req, k: int):
    """Start ``req`` for repetition ``k`` in one of the three ways: start+wait, the blocking form, start and
    poll test()."""
    way = k % 3
    if way == 0:
        w = req.start()
        if not req.active:
            raise AssertionError("start() left the request inactive")
        w.wait()            # the started call's Work: done, and the request stays active until its own wait()
        if not w.is_completed() or not req.active:
            raise AssertionError(f"start()'s Work: completed {w.is_completed()}, request active {req.active}")
        assert req.wait() is True
        return req.result
    if way == 1:
        return req.run()
    req.start()
    while not req.test():
        time.sleep(0)
    if req.active:
        raise AssertionError("test() returned True but the request is still active")
    return req.result


def cases(comm, dt, op, c, algos=None) -> list:
    """(name, make(c) -> (request, fill(k), check(k, fails), plain(k) -> outputs, outputs)) per persistent
    call form: ``fill`` writes repetition k's inputs into the request's buffers, ``check`` compares its
    outputs with numpy, ``plain`` makes the plain call on copies of the same inputs and returns its outputs
    (compared bit for bit with the request's)."""
    n, r = comm.size, comm.rank
    dn, out = np.dtype(dt).name, []
    exact = np.dtype(dt).kind != "f"

    def add(name, make):
        out.append((name, make))

    def each(prim):
        return _algos(comm, prim) if algos is None else algos(prim)

    for algo in each("allreduce"):
        for form in ("in place", "out"):
            t = f"allreduce {dn} {op.name} c={c} algo={algo} {form}"

            def make(cc, t=t, algo=algo, form=form):
                x = np.empty(c, dt)
                o = np.full(c, 99, dt) if form == "out" else None
                req = cc.allreduce_init(x, op, out=o, algorithm=algo, timeout=TIMEOUT)
                res = x if o is None else o

                def fill(k):
                    x[:] = data(t, r, c, dt, k)

                def check(k, fails):
                    _check(fails, f"{t} #{k}", res, reduced(op, [data(t, p, c, dt, k) for p in range(n)], dt), exact)
                    if o is not None:
                        _check(fails, f"{t} #{k}: input untouched", x, data(t, r, c, dt, k), True)

                def plain(k):
                    y = data(t, r, c, dt, k)
                    return cc.allreduce(y, op, out=None if o is None else np.empty(c, dt), algorithm=algo)
                return req, fill, check, plain, res
            add(t, make)

    for algo in each("broadcast"):
        for root in range(n):
            t = f"broadcast {dn} c={c} algo={algo} root={root}"

            def make(cc, t=t, algo=algo, root=root):
                x = np.empty(c, dt)
                req = cc.broadcast_init(x, root, algorithm=algo, timeout=TIMEOUT)

                def fill(k):
                    x[:] = data(t, r, c, dt, k) if r == root else 99

                def check(k, fails):
                    _check(fails, f"{t} #{k}", x, data(t, root, c, dt, k), True)

                def plain(k):
                    y = data(t, r, c, dt, k) if r == root else np.full(c, 99, dt)
                    return cc.broadcast(y, root, algorithm=algo)
                return req, fill, check, plain, x
            add(t, make)

    for algo in each("reduce"):
        for root in range(n):
            for form in ("in place", "out at the root"):
                t = f"reduce {dn} {op.name} c={c} algo={algo} root={root} {form}"

                def make(cc, t=t, algo=algo, root=root, form=form):
                    x = np.empty(c, dt)
                    o = np.full(c, 99, dt) if form != "in place" and r == root else None
                    req = cc.reduce_init(x, root, op, out=o, algorithm=algo, timeout=TIMEOUT)
                    res = o if o is not None else x

                    def fill(k):
                        x[:] = data(t, r, c, dt, k)

                    def check(k, fails):
                        mine = data(t, r, c, dt, k)
                        if r == root:
                            _check(fails, f"{t} #{k}", res,
                                   reduced(op, [data(t, p, c, dt, k) for p in range(n)], dt), exact)
                        if res is not x or r != root:
                            _check(fails, f"{t} #{k}: input untouched", x, mine, True)

                    def plain(k):
                        y = data(t, r, c, dt, k)
                        return cc.reduce(y, root, op, out=np.empty(c, dt) if o is not None else None, algorithm=algo)
                    return req, fill, check, plain, res
                add(t, make)

    for algo in each("allgather"):
        for form in ("provided", "recvbuf=None", "in place"):
            t = f"allgather {dn} c={c} algo={algo} {form}"

            def make(cc, t=t, algo=algo, form=form):
                if form == "in place":
                    o = np.full(c * n, 99, dt)
                    x = o[r * c:(r + 1) * c]
                    req = cc.allgather_init(x, o, algorithm=algo, timeout=TIMEOUT)
                else:
                    x = np.empty(c, dt)
                    o = np.full(c * n, 99, dt) if form == "provided" else None
                    req = cc.allgather_init(x, o, algorithm=algo, timeout=TIMEOUT)
                    o = req.result          # recvbuf=None: allocated once, at init
                    if type(o) is not np.ndarray or o.size != c * n:
                        raise AssertionError(f"{t}: req.result is {o!r}")

                def fill(k):
                    x[:] = data(t, r, c, dt, k)

                def check(k, fails):
                    _check(fails, f"{t} #{k}", o, np.concatenate([data(t, p, c, dt, k) for p in range(n)]), True)

                def plain(k):
                    return cc.allgather(data(t, r, c, dt, k), None, algorithm=algo)
                return req, fill, check, plain, o
            add(t, make)

    for algo in each("gather"):
        for root in range(n):
            for form in ("provided at the root", "recvbuf=None at the root", "in place at the root"):
                t = f"gather {dn} c={c} algo={algo} root={root} {form}"

                def make(cc, t=t, algo=algo, root=root, form=form):
                    o = np.full(c * n, 99, dt) if r == root and form != "recvbuf=None at the root" else None
                    x = o[r * c:(r + 1) * c] if form == "in place at the root" and r == root else np.empty(c, dt)
                    req = cc.gather_init(x, o, root, algorithm=algo, timeout=TIMEOUT)
                    o = req.result
                    if (o is None) != (r != root):
                        raise AssertionError(f"{t}: req.result is {o!r} on rank {r}")

                    def fill(k):
                        x[:] = data(t, r, c, dt, k)

                    def check(k, fails):
                        if r == root:
                            _check(fails, f"{t} #{k}", o, np.concatenate([data(t, p, c, dt, k) for p in range(n)]),
                                   True)

                    def plain(k):
                        return cc.gather(data(t, r, c, dt, k), None, root, algorithm=algo)
                    return req, fill, check, plain, o
                add(t, make)

    for algo in each("scatter"):
        for root in range(n):
            for form in ("provided", "in place at the root"):
                t = f"scatter {dn} c={c} algo={algo} root={root} {form}"

                def make(cc, t=t, algo=algo, root=root, form=form):
                    send = np.empty(c * n, dt) if r == root else None
                    o = send[r * c:(r + 1) * c] if form != "provided" and r == root else np.full(c, 99, dt)
                    req = cc.scatter_init(send, o, root, algorithm=algo, timeout=TIMEOUT)

                    def whole(k):
                        return np.concatenate([data(t, p, c, dt, k) for p in range(n)])

                    def fill(k):
                        if send is not None:
                            send[:] = whole(k)

                    def check(k, fails):
                        _check(fails, f"{t} #{k}", o, whole(k)[r * c:(r + 1) * c], True)

                    def plain(k):
                        return cc.scatter(whole(k) if r == root else None, np.empty(c, dt), root, algorithm=algo)
                    return req, fill, check, plain, o
                add(t, make)

    for algo in each("reduce_scatter"):
        for form in ("provided", "in place"):
            t = f"reduce_scatter {dn} {op.name} c={c} algo={algo} {form}"

            def make(cc, t=t, algo=algo, form=form):
                send = np.empty(c * n, dt)
                o = send[r * c:(r + 1) * c] if form == "in place" else np.full(c, 99, dt)
                req = cc.reduce_scatter_init(send, o, op, algorithm=algo, timeout=TIMEOUT)

                def fill(k):
                    send[:] = data(t, r, c * n, dt, k)

                def check(k, fails):
                    want = reduced(op, [data(t, p, c * n, dt, k) for p in range(n)], dt)[r * c:(r + 1) * c]
                    _check(fails, f"{t} #{k}", o, want, exact)

                def plain(k):
                    return cc.reduce_scatter(data(t, r, c * n, dt, k), np.empty(c, dt), op, algorithm=algo)
                return req, fill, check, plain, o
            add(t, make)

    for algo in each("alltoall"):
        t = f"alltoall {dn} c={c} algo={algo}"

        def make(cc, t=t, algo=algo):
            send, o = np.empty(c * n, dt), np.full(c * n, 99, dt)
            req = cc.alltoall_init(send, o, algorithm=algo, timeout=TIMEOUT)

            def fill(k):
                send[:] = data(t, r, c * n, dt, k)

            def check(k, fails):
                _check(fails, f"{t} #{k}", o,
                       np.concatenate([data(t, p, c * n, dt, k)[r * c:(r + 1) * c] for p in range(n)]), True)

            def plain(k):
                return cc.alltoall(data(t, r, c * n, dt, k), np.empty(c * n, dt), algorithm=algo)
            return req, fill, check, plain, o
        add(t, make)

    counts = [2 + p for p in range(n)]
    t = f"allgatherv {dn} counts={counts}"

    def make(cc, t=t):
        x, o = np.empty(counts[r], dt), np.full(sum(counts), 99, dt)
        req = cc.allgatherv_init(x, o, counts, timeout=TIMEOUT)

        def fill(k):
            x[:] = data(t, r, counts[r], dt, k)

        def check(k, fails):
            _check(fails, f"{t} #{k}", o, np.concatenate([data(t, p, counts[p], dt, k) for p in range(n)]), True)

        def plain(k):
            return cc.allgatherv(data(t, r, counts[r], dt, k), None, counts)
        return req, fill, check, plain, o
    add(t, make)

    offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    for root in range(n):
        t = f"gatherv {dn} counts={counts} root={root}"

        def make(cc, t=t, root=root):
            x = np.empty(counts[r], dt)
            o = np.full(sum(counts), 99, dt) if r == root else None
            req = cc.gatherv_init(x, o, counts if r == root else None, root, timeout=TIMEOUT)

            def fill(k):
                x[:] = data(t, r, counts[r], dt, k)

            def check(k, fails):
                if r == root:
                    _check(fails, f"{t} #{k}", o, np.concatenate([data(t, p, counts[p], dt, k) for p in range(n)]),
                           True)

            def plain(k):
                return cc.gatherv(data(t, r, counts[r], dt, k), None, counts if r == root else None, root)
            return req, fill, check, plain, o
        add(t, make)

        t = f"scatterv {dn} counts={counts} root={root}"

        def make(cc, t=t, root=root):
            send = np.empty(sum(counts), dt) if r == root else None
            o = np.full(counts[r], 99, dt)
            req = cc.scatterv_init(send, o, counts if r == root else None, root, timeout=TIMEOUT)

            def whole(k):
                return np.concatenate([data(t, p, counts[p], dt, k) for p in range(n)])

            def fill(k):
                if send is not None:
                    send[:] = whole(k)

            def check(k, fails):
                _check(fails, f"{t} #{k}", o, whole(k)[offs[r]:offs[r + 1]], True)

            def plain(k):
                return cc.scatterv(whole(k) if r == root else None, np.empty(counts[r], dt),
                                   counts if r == root else None, root)
            return req, fill, check, plain, o
        add(t, make)

    t = f"reduce_scatterv {dn} {op.name} counts={counts}"

    def make(cc, t=t):
        send, o = np.empty(sum(counts), dt), np.full(counts[r], 99, dt)
        req = cc.reduce_scatterv_init(send, o, counts, op, timeout=TIMEOUT)

        def fill(k):
            send[:] = data(t, r, sum(counts), dt, k)

        def check(k, fails):
            want = reduced(op, [data(t, p, sum(counts), dt, k) for p in range(n)], dt)[offs[r]:offs[r + 1]]
            _check(fails, f"{t} #{k}", o, want, exact)

        def plain(k):
            return cc.reduce_scatterv(data(t, r, sum(counts), dt, k), np.empty(counts[r], dt), counts, op)
        return req, fill, check, plain, o
    add(t, make)

    def pair(i, j):             # elements rank i sends rank j in alltoallv
        return (i * 3 + j * 5) % 4 + 1
    t = f"alltoallv {dn}"

    def make(cc, t=t):
        sc, rc = [pair(r, j) for j in range(n)], [pair(j, r) for j in range(n)]
        send, o = np.empty(sum(sc), dt), np.full(sum(rc), 99, dt)
        req = cc.alltoallv_init(send, o, sc, rc, timeout=TIMEOUT)

        def fill(k):
            send[:] = np.concatenate([data(t, r * n + j, sc[j], dt, k) for j in range(n)])

        def check(k, fails):
            _check(fails, f"{t} #{k}", o, np.concatenate([data(t, j * n + r, rc[j], dt, k) for j in range(n)]), True)

        def plain(k):
            return cc.alltoallv(np.concatenate([data(t, r * n + j, sc[j], dt, k) for j in range(n)]),
                                np.empty(sum(rc), dt), sc, rc)
        return req, fill, check, plain, o
    add(t, make)
    return out


def torch_tensors(comm) -> list:
    """Persistent calls on torch CPU tensors (what DDP's buckets are): new data copied into the tensors
    between starts; the request returns the tensor."""
    import torch
    fails, n, r = [], comm.size, comm.rank
    x, o = torch.empty(6), torch.empty(6 * n)
    with comm.allreduce_init(x) as ar, comm.allgather_init(x, o) as ag:
        for k in range(STARTS):
            x.copy_(torch.arange(6) + r + k)
            if _complete(ar, k) is not x:
                fails.append(f"allreduce #{k}: the request did not return the tensor")
            want = (torch.arange(6) * n + sum(range(n)) + n * k).float()
            if not torch.equal(x, want):
                fails.append(f"allreduce #{k}: {x} want {want}")
            if _complete(ag, k) is not o or not torch.equal(o, want.repeat(n)):
                fails.append(f"allgather #{k}: {o}")
    return fails


def every_primitive(comm, configs=CONFIGS, algos=None) -> list:
    """Each persistent call form made once on a dup of ``comm`` and started ``STARTS`` times with new data
    (the three ways of ``_complete``), a plain call of the same signature on the same inputs made between
    the starts: the request's outputs right each time and bit for bit the plain call's. ``algos``: a
    function primitive -> the algorithms to run (default: the default, a message one, the segment's)."""
    fails = []
    cc = comm.dup()
    try:
        for dt, op, c in configs:
            for name, make in cases(comm, dt, op, c, algos):
                req, fill, check, plain, res = make(cc)
                with req:
                    for k in range(STARTS):
                        fill(k)
                        got = _complete(req, k)
                        if got is not req.result:
                            fails.append(f"{name} #{k}: the request returned {type(got).__name__}, not req.result")
                        check(k, fails)
                        theirs = plain(k)
                        if res is not None:
                            _same_bits(fails, f"{name} #{k}", res, theirs)
                if not req.active and req.result is not None:
                    fails.append(f"{name}: the request keeps its result after leaving `with`")
        req = cc.barrier_init(timeout=TIMEOUT)
        for k in range(STARTS):
            _complete(req, k)
        req.free()
    finally:
        cc.close()
    return fails


def starts_skip_the_full_path(comm, reps: int = 5) -> list:
    """A start makes no argument check, no key, no plan lookup and no new prepared call (the thread that
    made the request starts it): it runs the Prepared of its init."""
    import pyxccl.comm as api
    n, r = comm.size, comm.rank
    x, o = np.ones(4, np.float32), np.empty(4 * n, np.float32)
    reqs = [comm.allreduce_init(x), comm.broadcast_init(x, n - 1), comm.allgather_init(x, o),
            comm.reduce_scatter_init(o, x), comm.alltoall_init(o, np.empty(4 * n, np.float32)),
            comm.gather_init(x, o if r == 0 else None), comm.scatter_init(o if r == 0 else None, x),
            comm.reduce_init(x, 0), comm.barrier_init()]
    from pyxccl.core.context import Context
    from pyxccl.core.dispatch import Planner
    made = []
    real = api.Check, api.key, Context.prepare, Planner.plan
    api.Check = lambda *a: made.append(("Check", a[1])) or real[0](*a)
    api.key = lambda *a: made.append(("key", a[0])) or real[1](*a)
    Context.prepare = lambda self, *a, **kw: made.append(("prepare", a[0])) or real[2](self, *a, **kw)
    Planner.plan = lambda self, *a, **kw: made.append(("plan", a[0])) or real[3](self, *a, **kw)
    try:
        for _ in range(reps):
            for q in reqs:
                q.start()
                q.wait()
                q.run()
    finally:
        api.Check, api.key, Context.prepare, Planner.plan = real
    for q in reqs:
        q.free()
    return [f"a start made {what} for {op}" for what, op in made]


def four_ways(cc, x, y, call, algorithm=None) -> list:
    """The ways a blocking 2+-rank allreduce on ``x`` goes besides one C call, each checked right with its
    recorder entry done: a peer that comes late (rank 0 sleeps: the others' C waits nap and hand the call to
    Python), an engine busy with this rank's own async call on ``y`` (nothing runs in C, the call queues
    behind it), the call from another thread, AVG's division after the rounds. ``call(what, op)`` makes the
    call (a request's start, a plain call) and returns what it returns; ``algorithm``: the async call's."""
    from pyxccl.core.recorder import DONE
    fails, n, r = [], cc.size, cc.rank
    for what in ("late peer", "busy engine", "another thread", "avg"):
        x[:] = r + 1
        op = ReduceOp.AVG if what == "avg" else ReduceOp.SUM
        want = float(n + 1) / 2 if what == "avg" else float(n * (n + 1) // 2)
        if what == "late peer" and r == 0:
            time.sleep(0.05)    # the others' C waits sleep (2 ms naps) and hand the call to Python
        if what == "busy engine":
            w = cc.allreduce(y, async_op=True, algorithm=algorithm)
            got = call(what, op)
            w.wait()
            if not np.all(y == n * (n + 1) // 2):
                fails.append(f"{what}: the async call before it gave {y}")
        elif what == "another thread":
            out = []
            t = threading.Thread(target=lambda: out.append(call(what, op)), name="blocking-side")
            t.start()
            t.join(TIMEOUT)
            got = out[0] if out else None
        else:
            got = call(what, op)
        if got is not x or not np.all(x == want):
            fails.append(f"{what}: returned {type(got).__name__}, {x}, want {want}")
        e = cc.flight_record()[-1]
        if e["state"] != DONE or e["op"] != "allreduce":
            fails.append(f"{what}: the recorder's last entry is {e}")
    return fails


def blocking_start_answers(comm) -> list:
    """The blocking start (req(), req.run()) when its one C call does not finish the call (``four_ways``: a
    late peer and a busy engine go to ``_settle``, another thread to ``_run``, AVG)."""
    from pyxccl.core.persistent import CollectiveRequest
    r = comm.rank
    cc = comm.dup()
    x, y = np.empty(8, np.float32), np.full(4, r + 1, np.int64)
    req = cc.allreduce_init(x)
    in_c = req._mine is not None        # the C executor runs it (one host, the module built)

    def call(what, op):
        if op is ReduceOp.AVG:
            return cc.allreduce_init(x, op=ReduceOp.AVG)()
        return req.run() if what == "busy engine" else req()
    settled = []
    real = CollectiveRequest._settle
    CollectiveRequest._settle = lambda self, done: settled.append(type(done).__name__) or real(self, done)
    try:
        fails = four_ways(cc, x, y, call)
    finally:
        CollectiveRequest._settle = real
    # (a rank's C call finishes when it comes last: rank 0 here, so the others' naps are what is checked;
    # where nothing runs in C every start is Python's, the same checks of what it returns)
    if in_c and r != 0 and "tuple" not in settled:
        fails.append(f"no start was handed to Python after a sleep: {settled}")
    if in_c and "bool" not in settled:
        fails.append(f"no start found the engine busy: {settled}")
    cc.close()
    return fails


def refusals(comm) -> list:
    """The request's states: start while active, run while active, free while active, start and run after
    free are refused (InvalidArgumentError naming the rank, the op and what to do; nothing runs: every rank
    then completes the active start and the communicator works); wait and test of an inactive request return
    True; `with` frees; bad arguments are refused at init; a request of a closed communicator refuses to
    start; a start from another thread runs (its fingerprint names that thread); the flight recorder has an
    entry per start."""
    fails, n, r = [], comm.size, comm.rank
    cc = comm.dup()
    x = np.full(8, r + 1, np.float32)
    req = cc.allreduce_init(x)
    want = float(n * (n + 1) // 2)

    def refused(what, fn, words):
        try:
            fn()
        except pyxccl.InvalidArgumentError as e:
            msg = str(e)
            for w in (f"rank {r}", "allreduce", *words):
                if w not in msg:
                    fails.append(f"{what}: the error does not say {w!r}: {msg}")
            if (e.rank, e.op) != (r, "allreduce"):
                fails.append(f"{what}: error's rank, op = {e.rank}, {e.op}")
        else:
            fails.append(f"{what}: not refused")

    if req.wait() is not True or req.test() is not True or req.active:
        fails.append("wait()/test() of a request never started: not True at once")
    before = len(cc.flight_record())
    req.start()
    refused("start() while active", req.start, ("start()", "wait()"))
    refused("run() while active", req.run, ("run()", "wait()"))
    refused("free() while active", req.free, ("free()", "wait()"))
    req.wait()
    if not np.all(x == want):
        fails.append(f"the active start, after the refusals: {x} want {want}")
    x[:] = r + 1
    req()                          # still usable: not freed by the refused free()
    if not np.all(x == want):
        fails.append(f"the blocking form after the refusals: {x} want {want}")
    ops = [e for e in cc.flight_record()[before:]]
    if [(e["op"], e["state"]) for e in ops] != [("allreduce", "done")] * 2:
        fails.append(f"flight recorder after two starts: {[(e['op'], e['state']) for e in ops]}")
    req.free()
    req.free()                     # twice: harmless
    refused("start() after free()", req.start, ("freed", "allreduce_init"))
    refused("run() after free()", req.run, ("freed",))
    if req.wait() is not True or req.test() is not True:
        fails.append("wait()/test() of a freed request: not True")

    with cc.allreduce_init(x) as q:
        x[:] = r + 1
        q.start()
        q.wait()
    refused("start() after `with`", q.start, ("freed",))
    if "freed" not in repr(q):
        fails.append(f"repr after `with`: {q!r}")

    try:           # the block raised with a start active: `with` waits for it, then frees; the error propagates
        with cc.allreduce_init(x) as q:
            q.start()
            raise KeyError("inside")
    except KeyError:
        if q.active or "freed" not in repr(q):
            fails.append(f"`with` left by an error: {q!r}")
    else:
        fails.append("`with` swallowed the block's error")

    # arguments are checked at init, as the plain call checks them
    for what, fn in (("out of another size", lambda: cc.allreduce_init(x, out=np.empty(3, np.float32))),
                     ("a bad root", lambda: cc.broadcast_init(x, root=n)),
                     ("an op the dtype lacks", lambda: cc.allreduce_init(x, op="BXOR")),
                     ("an unknown algorithm", lambda: cc.allreduce_init(x, algorithm="nope")),
                     ("overlapping buffers", lambda: cc.allgather_init(x[2:6], x)),
                     ("a read-only output", lambda: cc.allreduce_init(x, out=_readonly(8)))):
        try:
            fn()
        except pyxccl.InvalidArgumentError:
            pass
        else:
            fails.append(f"init with {what}: not refused")

    # started from another thread: it runs, named by that thread in the fingerprints (every rank alike)
    x[:] = r + 1
    req = cc.allreduce_init(x)
    errs = []
    t = threading.Thread(target=lambda: errs.append(None) if req.run() is x else errs.append("result"),
                         name="persistent-side")
    t.start()
    t.join(TIMEOUT)
    if errs != [None] or not np.all(x == want):
        fails.append(f"a start from another thread: {errs}, {x}")
    if cc.thread_check and len(req._prepared) != 2:     # thread word -> its Prepared
        fails.append(f"a start from another thread ran the call prepared for the init's thread: "
                     f"{len(req._prepared)} prepared")
    x[:] = r + 1
    req()                      # and from this one again
    if not np.all(x == want):
        fails.append(f"a start from the first thread again: {x}")

    # wait(timeout=) caps that wait only: past it the request stays active and a later wait completes it
    # (rank 1 starts only once rank 0's capped wait has given up: it waits for rank 0's message first)
    x[:] = r + 1
    token = np.zeros(1, np.int64)
    if r == 0:
        req.start()
        try:
            req.wait(timeout=0.05)
            fails.append("a capped wait returned before the other ranks started")
        except pyxccl.CommTimeoutError:
            if not req.active:
                fails.append("a capped wait that expired left the request inactive")
        for p in range(1, n):
            comm.send(token, p, tag=77)
        req.wait()
    else:
        comm.recv(token, 0, tag=77)
        req.run()
    if not np.all(x == want):
        fails.append(f"after a capped wait: {x} want {want}")

    # a closed communicator: its requests refuse to start, and no request is made on it
    cc.close()
    for what, fn in (("start()", req.start), ("run()", req.run), ("init", lambda: cc.allreduce_init(x))):
        try:
            fn()
        except pyxccl.CommClosedError as e:
            if f"rank {r}" not in str(e) or "allreduce" not in str(e):
                fails.append(f"{what} on a closed communicator: {e}")
        else:
            fails.append(f"{what} on a closed communicator: not refused")
    return fails


def _readonly(count: int) -> np.ndarray:
    a = np.ones(count, np.float32)
    a.setflags(write=False)
    return a


def point_to_point(comm) -> list:
    """send_init / recv_init around the ring, started several times with new data (a receive from any
    source too); and a send request refuses a second start while active."""
    fails, n, r = [], comm.size, comm.rank
    cc = comm.dup()
    try:
        sbuf, rbuf, anyb = np.empty(6, np.int64), np.empty(6, np.int64), np.empty(6, np.int64)
        send = cc.send_init(sbuf, (r + 1) % n, tag=3)
        recv = cc.recv_init(rbuf, (r - 1) % n, tag=3)
        to0 = cc.send_init(sbuf, 0, tag=4) if r != 0 else None
        from_any = cc.recv_init(anyb, None, tag=4) if r == 0 else None
        heard = []
        for k in range(STARTS):
            sbuf[:] = np.arange(6) * 100 + r * 10 + k
            recv.start()
            if k % 2:
                send.run()
            else:
                send.start()
            recv.wait()
            send.wait()
            want = np.arange(6) * 100 + ((r - 1) % n) * 10 + k
            if not np.array_equal(rbuf, want):
                fails.append(f"persistent recv #{k}: {rbuf} want {want}")
            if r != 0:
                to0.run()
            else:
                heard += [int(from_any.run()[0]) for _ in range(n - 1)]
        # A sender may be a round ahead of another (its sends are buffered), and an any-source receive
        # rightly takes what came first: what holds is every message once, each sender's in order.
        if r == 0:
            order = {p: [v % 10 for v in heard if v // 10 == p] for p in range(1, n)}
            if order != {p: list(range(STARTS)) for p in range(1, n)} or len(heard) != (n - 1) * STARTS:
                fails.append(f"recv from any source: {heard}")
        send.start()
        try:
            send.start()
            fails.append("a send request started twice: not refused")
        except pyxccl.InvalidArgumentError as e:
            if "send" not in str(e) or e.op != "send":
                fails.append(f"send started twice: {e}")
        send.wait()
        recv()
        for q in (send, recv, to0, from_any):
            if q is not None:
                q.free()
    finally:
        cc.close()
    return fails


def mismatched(comm):
    """Rank 0 starts a persistent allreduce of 4 elements where the others start one of 5: every rank
    raises CollectiveMismatchError naming the other call, as for plain calls. Returns (type, message)."""
    cc = comm.dup()
    try:
        x = np.ones(4 if comm.rank == 0 else 5, np.float32)
        req = cc.allreduce_init(x, timeout=TIMEOUT)
        try:
            req.start()
            req.wait()
        except pyxccl.PyxcclError as e:
            again = None
            try:
                req.start()
            except pyxccl.PyxcclError as e2:
                again = type(e2).__name__
            return type(e).__name__, str(e), again
        return None, "no error", None
    finally:
        cc.close()


def timed_out(comm, idle: int, timeout: float):
    """Rank ``idle`` starts nothing until past the others' deadline: their persistent allreduce times out
    naming it (as a plain call's does). Returns (type, peer, message) on the others."""
    cc = comm.dup()
    try:
        x = np.ones(16, np.float32)
        req = cc.allreduce_init(x, timeout=timeout)
        if comm.rank == idle:
            time.sleep(timeout + 2.0)
            try:
                req.run()
            except pyxccl.PyxcclError as e:
                return type(e).__name__, e.peer, str(e)
            return None, None, "ran"
        try:
            req.start()
            req.wait()
        except pyxccl.PyxcclError as e:
            return type(e).__name__, e.peer, str(e)
        return None, None, "no error"
    finally:
        cc.close()


def _persistent_call(comm, prim: str, count: int):
    """A persistent request of ``prim`` on new buffers of ``count`` elements per rank."""
    n = comm.size
    x = np.ones(count, np.float32)
    if prim == "allreduce":
        return comm.allreduce_init(x)
    if prim == "allgather":
        return comm.allgather_init(x, np.empty(count * n, np.float32))
    if prim == "alltoall":
        return comm.alltoall_init(np.ones(count * n, np.float32), np.empty(count * n, np.float32))
    return comm.broadcast_init(x, root=0)


def killed_during(comm, victim: int, prim: str, shrink: bool = False):
    """``victim`` SIGKILLs itself while every rank starts and waits a large persistent ``prim`` in a loop.
    The survivors report (error type, its peer, seconds from the last start to the error, the message, its op, what
    a later start of the request raises, and with ``shrink``: the survivors' new world's size and whether a
    request made on it runs right)."""
    import os
    import signal

    me = comm.rank == victim
    small, large = _persistent_call(comm, prim, 16), _persistent_call(comm, prim, 1 << 18)
    small()
    comm.barrier()
    if me:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    t0 = time.monotonic()
    try:
        while True:
            t0 = time.monotonic()
            large.start()
            large.wait()
    except pyxccl.PyxcclError as e:
        got = type(e).__name__, e.peer, time.monotonic() - t0, str(e), e.op
    try:
        small.start()
        later = "started"
    except pyxccl.PyxcclError as e:
        later = f"{type(e).__name__}: {e}"
    if not shrink:
        return (*got, later, None)
    new = comm.shrink()
    try:
        y = np.full(4, new.rank + 1, np.float32)
        ok = True
        with new.allreduce_init(y) as req:
            for k in range(3):
                y[:] = new.rank + 1 + k
                ok = ok and bool(np.all(req() == sum(p + 1 + k for p in range(new.size))))
        return (*got, later, (new.size, ok))
    finally:
        new.close()
