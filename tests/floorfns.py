"""Rank functions of tests/test_floor.py: the blocking call run by one C call (core/prepared.py's
``Prepared.fast``, pyxccl._native.Call) keeps the books as the Python path does (``Prepared.start``:
Engine.claim, Recorder.begin, Tally.count, recorder.ended): the same flight-recorder entries, sequence
numbers, traffic counters and mismatch records, call by call.

Each function returns a list of failure descriptions (empty when all is well)."""
from __future__ import annotations

import numpy as np

from pyxccl import InvalidArgumentError, ReduceOp
from pyxccl.core import prepared as prepared_mod
from pyxccl.core.recorder import DONE, FIELDS, expand, live

SEG = "segment"         # the one-host algorithm, whose calls the native executor runs
_SEQ, _CSEQ, _ISSUED, _STARTED, _ENDED = (FIELDS.index(f) for f in ("seq", "coll_seq", "issued", "started", "ended"))


class _Starts:
    """Counts Prepared.start calls (the Python path) and Prepared.again calls (a repeat found by its key)
    while installed."""

    def __init__(self):
        self.n = self.keyed = 0
        self._orig = prepared_mod.Prepared.start, prepared_mod.Prepared.again

    def __enter__(self):
        start0, again0 = self._orig

        def start(p, *a, **k):
            self.n += 1
            return start0(p, *a, **k)

        def again(p, *a, **k):
            self.keyed += 1
            return again0(p, *a, **k)
        prepared_mod.Prepared.start, prepared_mod.Prepared.again = start, again
        return self

    def __exit__(self, *exc):
        prepared_mod.Prepared.start, prepared_mod.Prepared.again = self._orig


def context(comm):
    """The framework's context of ``comm`` (the books live below the API): the live context whose flight
    recorder is the communicator's."""
    comm.barrier()
    mine = comm.flight_record()
    found = [c for c in live() if c.rank == comm.rank and c.size == comm.size and c.recorder.entries() == mine]
    assert len(found) == 1, f"{len(found)} contexts with this communicator's flight record"
    return found[0]


def _books(ctx, op: str) -> tuple:
    """The last recorder entry (in FIELDS order), the traffic counters of ``op``, the recent slot of the
    last collective, and the sequence numbers."""
    traffic, RECENT = ctx.traffic.snapshot().get(op, {}), prepared_mod.RECENT_CALLS
    return (expand(ctx.recorder.ops[-1]), {k: v for k, v in traffic.items() if k != "wire"},
            (ctx.recent[ctx.coll_seq % RECENT], ctx.recent_calls[ctx.coll_seq % RECENT]), ctx.seq, ctx.coll_seq)


def _compare(fails, what, ctx, op, ref, fast, prev):
    """``ref``: the books after a call through Prepared.start, ``fast`` after the same call through
    Prepared.fast, ``prev`` before the first of the two."""
    e_ref, t_ref, recent_ref, seq_ref, cseq_ref = ref
    e_fast, t_fast, recent_fast, seq_fast, cseq_fast = fast
    if (seq_ref, cseq_ref) != (prev[3] + 1, prev[4] + 1) or (seq_fast, cseq_fast) != (seq_ref + 1, cseq_ref + 1):
        fails.append(f"{what}: sequence numbers {prev[3:]} -> {(seq_ref, cseq_ref)} -> {(seq_fast, cseq_fast)}")
    for e, seq, cseq, path in ((e_ref, seq_ref, cseq_ref, "start"), (e_fast, seq_fast, cseq_fast, "fast")):
        if e[_SEQ] != seq or e[_CSEQ] != cseq:
            fails.append(f"{what} ({path}): entry numbered {e[_SEQ]}/{e[_CSEQ]}, the context {seq}/{cseq}")
        if not 0 < e[_ISSUED] == e[_STARTED] <= e[_ENDED]:
            fails.append(f"{what} ({path}): entry times {e[_ISSUED:_ENDED + 1]}")
        if type(e[_ISSUED]) is not float or type(e[_ENDED]) is not float:
            fails.append(f"{what} ({path}): entry times of types {type(e[_ISSUED])}, {type(e[_ENDED])}")
    untimed = [i for i in range(len(FIELDS)) if i not in (_SEQ, _CSEQ, _ISSUED, _STARTED, _ENDED)]
    if [e_ref[i] for i in untimed] != [e_fast[i] for i in untimed] or len(e_ref) != len(e_fast):
        fails.append(f"{what}: entries differ: start {e_ref}, fast {e_fast}")
    if e_fast[FIELDS.index("state")] != DONE:
        fails.append(f"{what}: fast entry {e_fast}")
    if recent_ref[0] != cseq_ref or recent_fast[0] != cseq_fast or recent_ref[1] is not recent_fast[1]:
        fails.append(f"{what}: recent slots {recent_ref} (start), {recent_fast} (fast)")
    before = prev[1]
    for k in ("calls", "bytes", "sent", "received"):
        d_ref, d_fast = t_ref.get(k, 0) - before.get(k, 0), t_fast.get(k, 0) - t_ref.get(k, 0)
        if d_ref != d_fast or (k == "calls" and d_fast != 1):
            fails.append(f"{what}: traffic {k} +{d_ref} (start), +{d_fast} (fast)")


def same_books(comm):
    """Per call form: a call through Prepared.start, then the same prepared call through its C path; the
    books (recorder entry, numbers, counters, the recent slot) the same but for times and numbers."""
    ctx = context(comm)
    fails, r, n = [], comm.rank, comm.size
    x32 = np.arange(5, dtype=np.float32) + r
    x64 = np.arange(7, dtype=np.float64) * (r + 1)
    out = np.empty(5, np.float32)
    gathered = np.empty(3 * n, np.int32)
    whole = np.empty(3 * n, np.int32)         # allgather in place: this rank's block is its input
    root_out = np.empty(3 * n, np.int32) if r == 0 else None
    spread, part = np.arange(3 * n, dtype=np.int32), np.empty(3, np.int32)
    cases = [
        ("allreduce", "allreduce in place", lambda: comm.allreduce(x32, algorithm=SEG), lambda: (x32, x32, x32)),
        ("allreduce", "allreduce avg", lambda: comm.allreduce(x64, ReduceOp.AVG, algorithm=SEG), lambda: (x64, x64, x64)),
        ("allreduce", "allreduce out=", lambda: comm.allreduce(x32, out=out, algorithm=SEG), lambda: (x32, out, out)),
        ("broadcast", "broadcast root 1", lambda: comm.broadcast(x32, root=n - 1, algorithm=SEG), lambda: (None, x32, x32)),
        ("allgather", "allgather", lambda: comm.allgather(np.full(3, r, np.int32), gathered, algorithm=SEG),
         lambda: (np.full(3, r, np.int32), gathered, gathered)),
        ("allgather", "allgather in place", lambda: comm.allgather(whole[3 * r:3 * r + 3], whole, algorithm=SEG),
         lambda: (whole[3 * r:3 * r + 3], whole, whole)),
        # rooted: a rank without output (gather) or input (scatter) repeats in C as the root does
        ("gather", "gather to root 0", lambda: comm.gather(np.full(3, r, np.int32), root_out, 0, algorithm=SEG),
         lambda: (np.full(3, r, np.int32), root_out, root_out)),
        ("scatter", "scatter from root 1", lambda: comm.scatter(spread if r == 1 else None, part, 1, algorithm=SEG),
         lambda: (spread if r == 1 else None, part, part)),
        ("reduce", "reduce to root 1", lambda: comm.reduce(x32, 1, algorithm=SEG), lambda: (x32, x32, x32)),
    ]
    for op, what, call, bufs in cases:
        call()                  # made (full path) and kept (or found by its key: a communicator used before)
        call()                  # found by its key, and remembered (PreparedCalls.last)
        inp, o, res = bufs()
        p = ctx.prepared.last.get((op, id(o)))
        if p is None or p.fast is None:
            fails.append(f"{what}: no C path for a native call ({p and p.plan.algo.name})")
            continue
        prev = _books(ctx, op)
        with _Starts() as s:
            p.start(inp, o, res, False)         # the Python path
            ref = _books(ctx, op)
            if s.n != 1:
                fails.append(f"{what}: start ran {s.n} times")
            call()
            if s.n != 1:
                fails.append(f"{what}: the repeat went through Prepared.start, not its C path")
            if s.keyed:
                fails.append(f"{what}: the repeat of the same arrays was looked up by its key")
        _compare(fails, what, ctx, op, ref, _books(ctx, op), prev)
    # a repeat on the remembered output whose input overlaps it elsewhere than in the in-place form: refused
    # as the full path refuses it, nothing run
    before = ctx.coll_seq
    wrong = whole[3 * ((r + 1) % n):3 * ((r + 1) % n) + 3]
    try:
        comm.allgather(wrong, whole, algorithm=SEG)
        fails.append("an input overlapping the output at another rank's block: not refused")
    except InvalidArgumentError as e:
        if "overlap" not in str(e):
            fails.append(f"the overlap refused with {e}")
    if ctx.coll_seq != before:
        fails.append("the refused overlap took a number")
    # persistent: req() through its C path, against its prepared call's start()
    req = comm.allreduce_init(x32, algorithm=SEG)
    req()
    p = next(iter(req._prepared.values()))
    prev = _books(ctx, "allreduce")
    with _Starts() as s:
        p.start(x32, x32, x32, False)
        ref = _books(ctx, "allreduce")
        req()
        if s.n != 1:
            fails.append("persistent: req() went through Prepared.start, not its C path")
    _compare(fails, "persistent req()", ctx, "allreduce", ref, _books(ctx, "allreduce"), prev)
    req.free()
    return fails


def taking_turns(comm):
    """Two forms of a call taking turns on one output (its algorithm named or not, two ops, two roots) each
    repeat in C once both ran (PreparedCalls.forms), with no key looked up and no Python path, and give
    their own results."""
    ctx = context(comm)
    fails, r, n = [], comm.rank, comm.size
    x = np.zeros(4, np.float32)

    def fill():
        x[:] = r + 1
    pairs = [
        ("barrier", lambda: comm.barrier(), lambda: comm.barrier(algorithm=SEG), None),
        ("sum and max", lambda: (fill(), comm.allreduce(x, algorithm=SEG)),
         lambda: (fill(), comm.allreduce(x, ReduceOp.MAX, algorithm=SEG)), (sum(range(1, n + 1)), n)),
        ("two roots", lambda: (fill(), comm.broadcast(x, root=0, algorithm=SEG)),
         lambda: (fill(), comm.broadcast(x, root=n - 1, algorithm=SEG)), (1, n)),
    ]
    for what, a, b, want in pairs:
        for _ in range(2):
            a(), b()
        with _Starts() as s:
            for _ in range(3):
                for call, value in ((a, want and want[0]), (b, want and want[1])):
                    call()
                    if want is not None and not np.all(x == value):
                        fails.append(f"{what}: {x}, want {value}")
        if s.n or s.keyed:
            fails.append(f"{what}: {s.n} calls took the Python path, {s.keyed} were looked up by their key")
    return fails


def busy_engine(comm):
    """A blocking call behind a queued one takes the Python path and runs after it: entries in number
    order, both results right."""
    ctx = context(comm)
    fails, r, n = [], comm.rank, comm.size
    a, b = np.full(4, r + 1, np.float32), np.full(4, 10 * (r + 1), np.float32)
    for _ in range(2):
        comm.allreduce(b, algorithm=SEG)       # prepared and kept
        b[:] = 10 * (r + 1)
    w = comm.allreduce(a, async_op=True, algorithm=SEG)
    comm.allreduce(b, algorithm=SEG)
    w.wait()
    want_a, want_b = sum(range(1, n + 1)), 10 * sum(range(1, n + 1))
    if not (np.all(a == want_a) and np.all(b == want_b)):
        fails.append(f"results {a}, {b}; want {want_a}, {want_b}")
    c = np.full(3, r + 1, np.int64)
    req = comm.allreduce_init(c, algorithm=SEG)
    req()
    c[:] = r + 1
    w = comm.allreduce(a, async_op=True, algorithm=SEG)
    req()                       # the persistent form behind a queued call
    w.wait()
    if not np.all(c == sum(range(1, n + 1))):
        fails.append(f"persistent behind a queued call: {c}")
    req.free()
    last = [expand(e) for e in list(ctx.recorder.ops)[-2:]]
    if [e[_CSEQ] for e in last] != [ctx.coll_seq - 1, ctx.coll_seq] or any(e[FIELDS.index("state")] != DONE
                                                                          for e in last):
        fails.append(f"entries {last}")
    return fails


def thread_words(comm):
    """The thread's word the C path's again() finds (Call.thread_word) is Context.thread_word's, for the
    main thread, a pool's worker, a renamed thread (none in C until Python found it again) and with
    fingerprints that do not name threads."""
    import threading
    ctx = context(comm)
    x = np.ones(4, np.float32)
    comm.allreduce(x, algorithm=SEG)
    comm.allreduce(x, algorithm=SEG)
    fast = ctx.prepared.last[("allreduce", id(x))].fast
    fails = []

    def same(what):
        py = ctx.thread_word()         # first: it finds a renamed thread's word (C reads what it keeps)
        c = fast.thread_word()
        if c != py:
            fails.append(f"{what}: C {c}, Python {py}")

    same("main thread")
    t = threading.current_thread()
    name = t.name
    try:
        t.name = "renamed"
        if fast.thread_word() != -1:
            fails.append(f"renamed: C found {fast.thread_word()} before Python did")
        same("renamed")
    finally:
        t.name = name
        ctx.thread_word()
    same("named back")         # (C keeps the last word it found with the name object it was found for)
    worker = threading.Thread(target=lambda: (ctx.thread_word(), same("pool worker")), name="pool_3")
    worker.start()
    worker.join()
    ctx.thread_check = False
    try:
        same("thread_check off")
    finally:
        ctx.thread_check = True
    return fails


def _off_lead(ways, before_first) -> list:
    """Runs (index, ways per rank) where a rank's way (0 plain, 1 streamed) is neither rank 0's nor rank 0's of
    the run before (``before_first``: before the first): a rank that enters a run before rank 0 has said its way
    takes that one (_native.c, lead); ``ways``: a row per rank."""
    before = np.concatenate(([before_first], ways[0, :-1]))
    return [(i, [int(w) for w in ways[:, i]]) for i in range(ways.shape[1])
            if not np.all((ways[1:, i] == ways[0, i]) | (ways[1:, i] == before[i]))]


def window_ways(comm, calls: int = 40):
    """A repeated call that copies into its window (a 1 MiB allreduce) picks its way each run (_native.c,
    nt_windows): by default rank 0 times both ways (each at least three runs: the first of each warms up)
    and stays with one but for a trial of the other now and then (window_costs: what each cost, and when the
    next trial comes), and the other ranks take its way (lead): they time none of their own once they have
    seen it, and take the way rank 0 was set to where only rank 0 forces one; set to always or never on
    every rank, nobody times a run. Every result right, whichever way.

    A rank that enters a run before rank 0 has said its way for it takes the way of rank 0's run before,
    so the ranks' ways may differ on a run where rank 0 changes way (a trial, a new pick), and only there:
    checked run by run (the last run alone differed in 2 of 148 runs of this test)."""
    from pyxccl.core import onehost
    ctx = context(comm)
    fails, n = [], comm.size
    count = (1 << 20) // 4
    want = sum(range(1, n + 1))
    x, out = np.full(count, comm.rank + 1, np.float32), np.zeros(count, np.float32)
    before = (0, 0)
    for _ in range(2):      # the full path, then the key's: from here on the call repeats in C (``last``)
        comm.allreduce(x, out=out, algorithm=SEG)
    last_led = comm.allgather(np.array([ctx.prepared.last[("allreduce", id(out))].fast.window_way()]))[0]
    # (rank 0's setting, the others'): both ways picked, then rank 0 forcing each, then everyone forcing each
    for lead, rest in ((2, 2), (1, 2), (0, 2), (1, 1), (0, 0)):
        setting = lead if comm.rank == 0 else rest
        was = onehost._native.set_nt_windows(setting)
        comm.barrier()
        mine = np.zeros(calls, np.int64)       # the way of each run
        try:
            for i in range(calls):
                out[:] = 0
                comm.allreduce(x, out=out, algorithm=SEG)
                if not np.all(out == want):
                    fails.append(f"settings {lead, rest}: {np.count_nonzero(out != want)} elements wrong")
                    break
                mine[i] = ctx.prepared.last[("allreduce", id(out))].fast.window_way()
        finally:
            onehost._native.set_nt_windows(was)
        fast = ctx.prepared.last[("allreduce", id(out))].fast
        runs, costs = fast.window_runs(), fast.window_costs()
        ways = comm.allgather(mine).reshape(n, calls)
        odd = _off_lead(ways, last_led)
        if odd or (lead != 2 and ways[0, -1] != lead):
            fails.append(f"settings {lead, rest}: runs whose ways (0 plain, 1 streamed) are neither rank 0's nor "
                         f"its way of the run before, as (run, per rank): {odd[:5]}; last run {ways[:, -1]}")
        last_led = ways[0, -1]
        if (lead, rest) == (2, 2):
            seeds = onehost._native.set_window_seeds((0,) * 4)
            onehost._native.set_window_seeds(seeds)
            seed = seeds[fast.window_class()]
            if comm.rank == 0 and costs and seed != (costs[1] < costs[0]):
                fails.append(f"rank 0: window costs {costs}, but new calls of its class would warm up way {seed} first")
            if comm.rank == 0 and not (min(runs) >= 3 and sum(runs) <= calls):
                fails.append(f"rank 0 by default: {runs} timed runs plainly and streamed of {calls} calls")
            if comm.rank == 0 and not (costs and costs[0] > 0 and costs[1] > 0 and -1 <= costs[2] <= 512):
                fails.append(f"rank 0: window costs {costs} (ns a run each way, runs to the next trial)")
            if comm.rank != 0 and sum(runs) > 1:
                fails.append(f"rank {comm.rank} timed {runs} runs of its own, following rank 0")
        elif runs != before:
            fails.append(f"settings {lead, rest}: counted {runs}, {before} before")
        before = runs
    return fails


def new_calls_warm_up_the_cheaper_way_first(comm):
    """A new call copying into its windows warms up first (three runs) the way the last call of its class of
    window traffic that knew both found the cheaper (_native.c, win_seed), on every rank (they take rank 0's):
    set to each way here, the other classes to the other way (a 1 MiB allreduce on 2 ranks moves 1 MiB a run
    through the windows: class 2, from 1 to 16 MiB); where its class has none yet, the nearest class's (the
    larger first), and where no class has one, streamed from 16 MiB a run (class 3), else plain."""
    from pyxccl.core import onehost
    ctx, fails = context(comm), []
    none = (-1,) * 4
    for k, (seeds, seed, cls) in enumerate((((0, 0, 1, 0), 1, 2), ((1, 1, 0, 1), 0, 2), ((0, -1, -1, 1), 1, 2),
                                            ((1, 0, -1, -1), 0, 2), (none, 0, 2), (none, 1, 3))):
        was = onehost._native.set_window_seeds(seeds)
        try:
            comm.barrier()
            count = (1 << 20) // 4 * (16 if cls == 3 else 1) + 16 * k + 16       # (a call of a shape not seen yet)
            x, out = np.full(count, comm.rank + 1, np.float32), np.zeros(count, np.float32)
            ways = []
            for _ in range(7):      # the full path, then the call's runs: three each way
                comm.allreduce(x, out=out, algorithm=SEG)
                fast = ctx.prepared.last.get(("allreduce", id(out)))
                ways.append(-1 if fast is None else fast.fast.window_way())
            if fast.fast.window_class() != cls:
                fails.append(f"a {count * 4 >> 20} MiB allreduce's window traffic of class {fast.fast.window_class()}, "
                             f"not {cls}")
            every = comm.allgather(np.array(ways[1:], np.int64)).reshape(comm.size, -1)
            if list(every[0]) != [seed] * 3 + [1 - seed] * 3 or _off_lead(every, every[0, 0]):
                fails.append(f"new calls with seeds {seeds}: their runs went {every.tolist()} (per rank)")
            if not np.all(out == sum(range(1, comm.size + 1))):
                fails.append(f"new calls set to warm up way {seed} first: a wrong sum")
        finally:
            onehost._native.set_window_seeds(was)
    return fails


def late_rank_counts_for_neither_way(comm, calls: int = 40, late_s: float = 0.0006):
    """Rank 0 times the runs it picks windows' ways by from when the last rank entered the call (_native.c,
    entry_word): a rank that comes 0.6 ms late to every call, busy elsewhere (less than a wait spins before
    it sleeps, PYXCCL_SPIN_US, after which a run is not timed at all), leaves the way rank 0 keeps (timed
    every 4th run, the median of its last five) costing what a 16 KiB call costs, far below those 0.6 ms."""
    import time
    ctx = context(comm)
    count = (16 << 10) // 4     # (copied into the windows in one piece, which the way takes)
    x, out = np.full(count, comm.rank + 1, np.float32), np.zeros(count, np.float32)
    for _ in range(calls):
        if comm.rank == 1:
            until = time.perf_counter() + late_s
            while time.perf_counter() < until:
                pass
        comm.allreduce(x, out=out, algorithm=SEG)
    if not np.all(out == sum(range(1, comm.size + 1))):
        return ["a wrong sum"]
    costs = ctx.prepared.last[("allreduce", id(out))].fast.window_costs()
    if comm.rank == 0 and not (costs and min(costs[:2]) < late_s * 1e9 / 2):
        return [f"rank 0's window costs {costs} (ns a run each way) count the late rank's {late_s * 1e3} ms"]
    return []


def native_turned_on_later(comm):
    """A communicator made with PYXCCL_NATIVE=0, called once it is unset: its new plans run in C (their Calls
    take its engine's locks), with the right sums."""
    import os
    was = os.environ.get("PYXCCL_NATIVE")
    os.environ["PYXCCL_NATIVE"] = "0"
    try:
        sub = comm.dup()
    finally:
        os.environ.pop("PYXCCL_NATIVE")
    fails = []
    try:
        x = np.ones(5, np.float32)
        for _ in range(3):
            x[:] = comm.rank + 1
            sub.allreduce(x)
            if not np.all(x == sum(range(1, comm.size + 1))):
                fails.append(f"a wrong sum: {x}")
        if not any(p.fast is not None for p in context(sub).prepared.values()):
            fails.append("no C path once PYXCCL_NATIVE was unset")
        sub.close()
    finally:
        if was is not None:
            os.environ["PYXCCL_NATIVE"] = was
    return fails


def one_rank(comm):
    """A one-rank communicator (``pyxccl run -n 1``: debugging, a CI smoke test) runs every primitive on its
    segment, where the call is a copy or nothing, and a repeat in one C call: not through the message
    executor (9-14 us a call before)."""
    from pyxccl.algorithms import registry
    from pyxccl.core import onehost
    fails = []
    ctx = context(comm)
    for p in registry.primitives():
        for nbytes in (8, 1 << 20):
            got = comm.algorithm_for(p, nbytes)
            if got != SEG:
                fails.append(f"{p} of {nbytes} B: {got}")
    x, o = np.arange(4, dtype=np.float32), np.empty(4, np.float32)
    for _ in range(2):
        comm.allreduce(x, out=o)
    if not np.array_equal(o, x):
        fails.append(f"allreduce out of place: {o}")
    kept = ctx.prepared.last.get(("allreduce", id(o)))        # (kept where it has a C call)
    if (kept is None) != (onehost.native_codes(np.dtype(np.float32), ReduceOp.SUM) is None):
        fails.append(f"the repeat's C call: {kept}")
    return fails


def through(comm, which: str, fn: str):
    """This module's ``fn`` with comm.py's way into every call (``_call``) the C one (``_native.repeat``, the
    default where the module is built) or its Python twin (``_repeat``, where it is not), so each test of the
    C path holds the two to the same books; "python" counts its calls, so that it is seen taken."""
    import pyxccl.comm as cm
    was, seen = cm._call, []
    if which == "c":
        if cm._call is not cm._native.repeat:
            return [f"the default way into a call is {cm._call!r}, not _native.repeat"]
    else:
        cm._call = lambda *a: seen.append(a[1]) or cm._repeat(*a)
    try:
        fails = globals()[fn](comm)
    finally:
        cm._call = was
    return fails + (["the Python _repeat was never called"] if which == "python" and not seen else [])


def plain_repeat_answers(comm):
    """A plain blocking repeat (its output's Prepared in PreparedCalls.last) when its C call does not finish
    the call (persistentfns.four_ways: a late peer and a busy engine go to Prepared.settle, another thread to
    the full path, AVG)."""
    from persistentfns import four_ways
    r = comm.rank
    x, y = np.empty(8, np.float32), np.full(4, r + 1, np.int64)
    for op in (ReduceOp.SUM, ReduceOp.AVG):
        for _ in range(2):          # made, then found by its key and remembered
            x[:] = r + 1
            comm.allreduce(x, op, algorithm=SEG)
    settled = []
    real = prepared_mod.Prepared.settle
    prepared_mod.Prepared.settle = lambda p, inp, out, res, done: settled.append(type(done).__name__) or \
        real(p, inp, out, res, done)
    try:
        fails = four_ways(comm, x, y, lambda what, op: comm.allreduce(x, op, algorithm=SEG), algorithm=SEG)
    finally:
        prepared_mod.Prepared.settle = real
    # (a rank's C call finishes when it comes last: rank 0 here, so the others' naps are what is checked)
    if r != 0 and "tuple" not in settled:
        fails.append(f"no repeat was handed to Python after a sleep: {settled}")
    if "bool" not in settled:
        fails.append(f"no repeat found the engine busy: {settled}")
    return fails
