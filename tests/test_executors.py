"""The one-host fast path's two executors give the same bits.

Every segment schedule of every primitive (algorithm "segment"), 1-8 ranks, in place and not, with
windows small enough to cut messages into several rounds (reductions on the one-round and the
two-round path, blocks through the windows, by single-copy reads and by single-copy writes into
a buffer the root posted: a gather's Puts), runs through the Python executor (``onehost._Segment``),
the C one (``pyxccl._native``) and both at once (even ranks in
C, odd ones in Python: the two speak one protocol); every buffer ends bit for bit the same, and
the outputs are numpy's. A second sweep takes every (dtype, op) the C executor reduces. The ranks
are threads of this process, each with its own ``HostSegment`` on one memfd (the C run releases
the GIL; the Python executor's waits sleep on the futex).

Also here: the C side refuses a missing, read-only or short buffer its program uses (a
ProtocolError, run in a child process so a crash fails the test instead of killing pytest), the
tables C and Python share agree (and a module built from another ``_native.c`` is refused), and
the Python executor refuses a weakly ordered CPU where it has no barriers.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from typing import NamedTuple

import numpy as np
import pytest

from pyxccl.algorithms import registry
from pyxccl.algorithms.segment import Window
from pyxccl.core import onehost
from pyxccl.ops import ReduceOp, reducer
from pyxccl.primitives import PRIMITIVES
from pyxccl.schedule import offsets
from pyxccl.transport import copies
from pyxccl.transport import segment as segment_module
from pyxccl.transport.segment import HostSegment

pytestmark = pytest.mark.skipif(onehost._native is None, reason="the C executor (pyxccl._native) is not built "
                                "(or was refused: see the warning at import)")

MODES = ("python", "c", "mixed")
PRIMS = ("allreduce", "reduce", "reduce_scatter", "allgather", "gather", "scatter", "alltoall", "broadcast",
         "barrier")
IN_PLACE = {"allreduce", "reduce", "reduce_scatter", "allgather", "gather", "scatter"}


class Case(NamedTuple):
    prim: str
    args: dict              # the builder's arguments (counts, root)
    window: Window
    dt: np.dtype
    op: ReduceOp | None
    in_place: bool


def _windows(n: int) -> tuple[Window, ...]:
    """Windows (in elements) that cut the messages below into several rounds: reductions on the
    two-round path; one round per piece; blocks by single-copy reads; tiny windows and pieces (a
    broadcast's pieces smaller than a window; with them, the reduce-scatter's two-round form and a reduce's
    root reducing it all); single-copy with pieces (an allgather's blocks put into every output a piece at a
    time)."""
    return (Window(4 * n, oneshot=2, piece=3), Window(16 * n, oneshot=1 << 30, piece=5),
            Window(8 * n, oneshot=8, single_copy=3), Window(max(5, n), oneshot=1, single_copy=1),
            Window(8 * n, oneshot=8, single_copy=2, piece=3))


def _args(prim: str, n: int, w: Window, root: int, small, unequal: bool = False) -> dict:
    """Arguments of a call of several rounds; of one element (``small``), or none (``small=0``)."""
    p = PRIMITIVES[prim]
    if small is not False:
        per = int(small)
    elif p.shape == "count":
        per = 2 * w.elements + 3
    else:
        per = 2 * (w.elements // n) + 1
    a = p.args(n, per, root)
    if unequal:         # allgather and reduce_scatter take blocks of different sizes
        a["counts"] = [per + r % 3 for r in range(n)]
    return a


def _data(dt: np.dtype, size: int, rng: np.random.Generator) -> np.ndarray:
    """Values that exercise an op: zeros (LAND, LOR), wrap-around (integers), signed zeros, NaN and
    infinities (floats)."""
    if dt.kind == "f":
        x = rng.normal(0, 100, size).astype(dt)
        special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0], dt)
        pick = rng.random(size) < 0.3
        x[pick] = rng.choice(special, int(pick.sum()))
        return x
    info = np.iinfo(dt)
    x = rng.integers(info.min, info.max, size, dtype=dt, endpoint=True)
    x[rng.random(size) < 0.25] = 0
    return x


def _inputs(case: Case, n: int, seed: int):
    """Every rank's initial "in" and "out" contents (None where the rank has none)."""
    rng = np.random.default_rng(seed)
    p = PRIMITIVES[case.prim]
    ins, outs = [], []
    for r in range(n):
        nin, nout = p.buffers(r, case.args)
        ins.append(_data(case.dt, nin, rng) if nin else None)
        outs.append(_data(case.dt, nout, rng) if nout else None)
    if case.dt.kind == "f" and case.op in (ReduceOp.SUM, ReduceOp.PROD):
        # NaN and infinities from one rank per element: which NaN a sum of two NaNs gives is open
        # (numpy's own loops pick one by position), so no element meets two
        for r, x in enumerate(ins):
            if x is not None:
                x[~np.isfinite(x) & (np.arange(x.size) % n != r)] = 1.0
    return ins, outs


def _buffers(case: Case, r: int, n: int, ins, outs) -> dict:
    """Rank ``r``'s buffers, fresh copies, as the API passes them (in place: one buffer, or the input
    at this rank's block of the output, or the output at this rank's block of the input)."""
    p = PRIMITIVES[case.prim]
    inp = None if ins[r] is None else ins[r].copy()
    out = None if outs[r] is None else outs[r].copy()
    if case.prim == "broadcast":
        return {} if out is None else {"out": out}
    if case.in_place and p.shape == "count":
        out = inp
    elif case.in_place and p.shape == "blocks" and inp is not None and out is not None:
        counts = case.args["counts"]
        at = slice(offsets(counts)[r], offsets(counts)[r] + counts[r])
        if p.gathers:
            out[at] = inp
            inp = out[at]
        else:
            out = inp[at]
    return {k: v for k, v in (("in", inp), ("out", out)) if v is not None}


def _fold(case: Case, xs):
    acc = xs[0].copy()
    f = reducer(case.op)
    for x in xs[1:]:
        f(acc, x)
    return acc


def _expected(case: Case, n: int, ins, outs, r: int):
    """numpy's result for rank ``r``'s "out" (None: the call leaves it unspecified there)."""
    a, prim = case.args, case.prim
    root = a.get("root")
    with np.errstate(all="ignore"):
        if prim == "allreduce" or (prim == "reduce" and r == root):
            return _fold(case, ins)
        if prim == "reduce_scatter":
            off = offsets(a["counts"])
            return _fold(case, ins)[off[r]:off[r] + a["counts"][r]]
    if prim == "allgather" or (prim == "gather" and r == root):
        return np.concatenate(ins)
    if prim == "scatter":
        off = offsets(a["counts"])
        return ins[root][off[r]:off[r] + a["counts"][r]]
    if prim == "alltoall":
        return np.concatenate([ins[p][offsets(a["send_counts"])[r]:][:a["recv_counts"][p]] for p in range(n)])
    if prim == "broadcast":
        return outs[root]
    return None


class World:
    """``n`` ranks as threads of this process, each with its own HostSegment on one shared memfd."""

    def __init__(self, n: int, area_bytes: int):
        first = HostSegment(0, n, area_bytes)
        self.segs = [first] + [HostSegment(r, n, area_bytes, fd=os.dup(first.fd)) for r in range(1, n)]
        self.n, self.seq, self.failed = n, 0, threading.Event()
        for s in self.segs:
            s.spin, s.yields, s.waits = 0.0, 0, (0, 0, s.waits[2])     # threads: no spinning under the GIL
            s.check_alive = self._alive

    def _alive(self, p: int, seq: int) -> None:
        if self.failed.is_set():
            raise RuntimeError(f"a rank other than {p} failed; stopping")

    def close(self) -> None:
        for s in self.segs:
            s.close()

    def run(self, calls: list[tuple[Case, str, int]]) -> list[list]:
        """Run ``calls`` = (case, mode, seed), in order, on every rank; per call and rank the final
        bytes of its buffers, and its buffers."""
        n = self.n
        results = [[None] * n for _ in calls]
        errors = []
        seq0 = self.seq
        self.seq += len(calls)

        def rank(r):
            seg = self.segs[r]
            ctx = types.SimpleNamespace(segment=seg, rank=r, error=None,
                                        mismatch=lambda p, *a, **k: AssertionError(f"rank {r}: mismatch with {p}"))
            try:
                with np.errstate(all="ignore"):
                    for i, (case, mode, seed) in enumerate(calls):
                        ins, outs = _inputs(case, n, seed)
                        bufs = _buffers(case, r, n, ins, outs)
                        s = registry.lookup(case.prim, "segment").schedule(r, n, window=case.window, **case.args)
                        native = mode == "c" or (mode == "mixed" and r % 2 == 0)
                        codes = None
                        if native:
                            codes = (-1, -1) if case.op is None else (onehost._DTYPES[case.dt],
                                                                        onehost._OPS[case.op])
                        f = None if case.op is None else reducer(case.op)
                        onehost.run(ctx, s, bufs, f, seq0 + i + 1, (7, i), case.prim, time.monotonic() + 60,
                                    case.dt, codes)
                        results[i][r] = ({k: v.tobytes() for k, v in bufs.items() if k != "win"}, bufs)
            except BaseException as e:  # noqa: BLE001  (reported by the main thread)
                errors.append((r, e))
                self.failed.set()

        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a rank thread is stuck"
        if errors:
            r, e = errors[0]
            raise AssertionError(f"rank {r} failed: {e!r}") from e
        return results


def _check(world: World, cases: list[Case], seed: int) -> None:
    """Every case through every mode: the same bits everywhere, and numpy's result."""
    calls = [(c, m, seed + i) for i, c in enumerate(cases) for m in MODES]
    got = world.run(calls)
    n = world.n
    for i, case in enumerate(cases):
        runs = got[3 * i:3 * i + 3]
        ins, outs = _inputs(case, n, seed + i)
        for r in range(n):
            want = runs[0][r][0]
            for mode, run in zip(MODES[1:], runs[1:]):
                assert run[r][0] == want, f"{case}: rank {r}: the {mode} run's buffers differ from the Python one's"
            out = runs[0][r][1].get("out")
            exp = None if out is None else _expected(case, n, ins, outs, r)        # (no out: nothing to get)
            if exp is not None:
                assert out.tobytes() == exp.tobytes(), f"{case}: rank {r}: not numpy's result"


def _structure_cases(n: int) -> list[Case]:
    """Every primitive with every window, several rounds and one element (and none), every root end,
    in place and not, unequal blocks where they are allowed; a few dtypes and ops."""
    cases = []
    kinds = [(np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.int16), ReduceOp.MAX),
             (np.dtype(np.float64), ReduceOp.PROD), (np.dtype(np.uint8), ReduceOp.BXOR)]
    for prim in PRIMS:
        p = PRIMITIVES[prim]
        for wi, w in enumerate(_windows(n)):
            if w.elements < n and p.shape in ("blocks", "pairs") and prim not in ("allgather", "gather"):
                continue
            dt, op = kinds[wi % len(kinds)]
            for root in (sorted({0, n - 1}) if p.rooted else (0,)):
                for small in ((False, 1) + ((0,) if wi == 0 else ()) if prim != "barrier" else (False,)):
                    shapes = [False] + ([True] if prim in ("allgather", "reduce_scatter") and small is False else [])
                    for unequal in shapes:
                        for in_place in ((False, True) if prim in IN_PLACE else (False,)):
                            cases.append(Case(prim, _args(prim, n, w, root, small, unequal), w, dt,
                                              op if p.reduces else None, in_place))
    return cases


def _features(cases: list[Case], n: int) -> set[str]:
    """What the cases' schedules do, on any rank: to show the sweep reaches every path."""
    seen = set()
    for c in cases:
        for r in range(n):
            s = registry.lookup(c.prim, "segment").schedule(r, n, window=c.window, **c.args)
            if len(s.steps) >= 3:
                seen.add("3+ rounds")
            for step in s.steps:
                for o in step:
                    name = type(o).__name__
                    seen.add(name)
                    if name == "Get":
                        seen.update({"Get prev"} if o.prev else set())
                        seen.update({"Get reduce"} if o.reduce else set())
                        seen.update({"Get own"} if o.peer == r else set())
                    if name == "Put":
                        seen.add("Put own" if o.peer == r else "Put other")
    return seen


@pytest.mark.parametrize("n", range(1, 9))
def test_every_schedule_runs_the_same_in_both_executors(n):
    cases = _structure_cases(n)
    want = {"3+ rounds", "Copy", "Get", "Get own", "Sync", "Post", "Put own"} | (
        {"Get reduce", "Get prev", "Put other"} if n > 1 else set())     # one rank: nothing to reduce, no shares
    assert want <= _features(cases, n)
    world = World(n, max(c.window.elements for c in cases) * 8)
    try:
        _check(world, cases, seed=1000 * n)
    finally:
        world.close()


def _reduction_cases(n: int, pairs) -> list[Case]:
    w = Window(4 * n, oneshot=2)        # pieces, each on the two-round path (every rank reduces a share)
    one = Window(8 * n, oneshot=1 << 30)       # pieces, each reduced whole by every rank
    cases = []
    for i, (dname, oname) in enumerate(pairs):
        dt, op = np.dtype(dname), ReduceOp(oname)
        cases += [Case("allreduce", _args("allreduce", n, w, 0, False), w, dt, op, i % 2 == 0),
                  Case("allreduce", _args("allreduce", n, one, 0, False), one, dt, op, i % 2 == 1),
                  Case("reduce", _args("reduce", n, w, n - 1, False), w, dt, op, i % 2 == 1),
                  Case("reduce_scatter", _args("reduce_scatter", n, w, 0, False, unequal=True), w, dt, op,
                       i % 2 == 0)]
    return cases


def test_every_dtype_and_op_the_c_executor_reduces():
    pairs = onehost._native.tables()["reduces"]
    assert len(pairs) == 8 * 9 + 2 * 4       # the integers take every op, the floats SUM PROD MIN MAX
    n = 3
    cases = _reduction_cases(n, pairs)
    world = World(n, 8 * 8 * n)
    try:
        _check(world, cases, seed=7)
    finally:
        world.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("n", range(1, 9))
def test_every_dtype_and_op_at_every_size(n):
    """The sweep above at every world size (additional)."""
    cases = _reduction_cases(n, onehost._native.tables()["reduces"])
    world = World(n, 8 * 8 * n)
    try:
        _check(world, cases, seed=11 * n)
    finally:
        world.close()


@pytest.mark.parametrize("nt, nt_windows", ((4 << 20, 2), (0, 2), (4 << 20, 1)))
def test_copies_into_large_buffers_the_same_in_both_executors(nt, nt_windows):
    """Buffers past the C side's non-temporal threshold (PYXCCL_NT_BYTES, here 4 MiB, which 2 ranks' buffers of
    4 MiB pass together; and with it off) take its non-temporal copies: pieces that start off the 16-byte line and end in a tail (odd
    windows and counts), in place and not, through the windows, by single-copy reads and by an allgather's
    puts, give numpy's bits and the Python executor's; and so do copies and reductions into the windows by
    such stores (``nt_windows`` 1: PYXCCL_NT_WINDOWS=always; 2, the default, copies plainly on this full
    path)."""
    n, dt = 2, np.dtype(np.float32)
    big = (4 << 20) // dt.itemsize + 5                      # elements: past the threshold, not a whole line
    windows = (Window(100_003, oneshot=8), Window(100_003, oneshot=8, single_copy=3))
    cases = []
    for w in windows:
        for prim in ("broadcast", "allgather", "alltoall", "allreduce", "reduce_scatter", "reduce", "gather"):
            p = PRIMITIVES[prim]
            per = big if p.shape == "count" else big // n + 1
            a = p.args(n, per, n - 1) if p.rooted else p.args(n, per, 0)
            op = ReduceOp.SUM if p.reduces else None
            for in_place in ((False, True) if prim in IN_PLACE else (False,)):
                cases.append(Case(prim, a, w, dt, op, in_place))
    # reductions into the windows by such stores (reduced a piece at a time into scratch, then streamed):
    # other item sizes and ops, and sizes that end in a part of a piece
    for other, op in ((np.dtype(np.float64), ReduceOp.PROD), (np.dtype(np.int16), ReduceOp.BXOR)):
        for prim in ("allreduce", "reduce_scatter"):
            p = PRIMITIVES[prim]
            a = p.args(n, 300_007 if p.shape == "count" else 150_011, 0)
            w = Window(100_003 * dt.itemsize // other.itemsize, oneshot=8)     # (the segment's bytes)
            cases += [Case(prim, a, w, other, op, in_place) for in_place in (False, True)]
    # an allgather's blocks put into every output a piece at a time (ranks with a core each), at any size
    tee = Window(100_003, oneshot=8, single_copy=2_999, piece=5)      # pieces of 11,996 elements
    a = PRIMITIVES["allgather"].args(n, big // n + 1, 0)
    cases += [Case("allgather", a, tee, dt, None, in_place) for in_place in (False, True)]
    world = World(n, 100_003 * dt.itemsize + 64)
    was = (onehost._native.nt_threshold(nt), onehost._native.set_nt_windows(nt_windows)) \
        if onehost._native is not None else None
    try:
        _check(world, cases, seed=3)
    finally:
        world.close()
        if was is not None:
            onehost._native.nt_threshold(was[0])
            onehost._native.set_nt_windows(was[1])


def test_copy_into_copies_as_a_calls_copy():
    """_native.copy_into (sim/calibrate.py's copies) gives the source's bytes with plain and with
    non-temporal stores, off the 16-byte line and with a tail; sizes must match."""
    for nbytes in (5000, (1 << 20) + 20):
        src = np.random.default_rng(nbytes).integers(0, 256, nbytes + 3, dtype=np.uint8)[3:]
        for nt in (False, True):
            dst = np.zeros(nbytes, np.uint8)
            assert onehost._native.copy_into(dst, src, nt) is None
            assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="differ in size"):
        onehost._native.copy_into(dst, src[1:], True)


def test_the_non_temporal_settings_are_read_from_the_environment():
    """PYXCCL_NT_BYTES sets the C side's threshold when pyxccl loads it (by default the last-level cache's
    size), a negative one refused; PYXCCL_NT_WINDOWS its way into windows, an unknown one refused."""
    if onehost._native is None:
        pytest.skip("the native executor is not built")
    code = "import pyxccl.core.onehost as o; print(o._native.nt_threshold(0))"
    for env, want in (({"PYXCCL_NT_BYTES": str(8 << 20)}, 8 << 20), ({"PYXCCL_NT_BYTES": "0"}, 0),
                      ({}, copies.last_level_cache())):
        e = {k: v for k, v in os.environ.items() if k != "PYXCCL_NT_BYTES"} | env
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True)
        assert int(out.stdout) == want, out
    with pytest.raises(ValueError, match="0 \\(never\\) or more"):
        onehost._native.nt_threshold(-1)
    # and PYXCCL_NT_WINDOWS how calls copy into their windows (never, always, or by default each prepared
    # call the way that cost less: _native.c, nt_windows)
    code = "import pyxccl.core.onehost as o; print(o._native.set_nt_windows(0))"
    for env, want in (({"PYXCCL_NT_WINDOWS": "never"}, 0), ({"PYXCCL_NT_WINDOWS": "always"}, 1), ({}, 2)):
        e = {k: v for k, v in os.environ.items() if k != "PYXCCL_NT_WINDOWS"} | env
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True)
        assert int(out.stdout) == want, out
    e = dict(os.environ, PYXCCL_NT_WINDOWS="sometimes")
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)
    assert out.returncode != 0 and ("InvalidArgumentError: PYXCCL_NT_WINDOWS='sometimes' is not one of never, always, "
                                    "auto; fix or unset it") in out.stderr
    with pytest.raises(ValueError, match="0 \\(never\\), 1 \\(always\\) or 2"):
        onehost._native.set_nt_windows(3)


def _fused(case: Case, r: int, n: int) -> set[str]:
    """Which of the C side's one-pass forms (fuse() in _native.c) rank ``r``'s program of ``case`` reaches:
    "pair" (a move and a reduce into the same bytes), "pair+tee" (then a copy of those bytes elsewhere),
    "tee" (a lone reduce, then that copy), each with shares from the fuse size on."""
    least = onehost._native.tables()["fuse"]["bytes"]
    s = registry.lookup(case.prim, "segment").schedule(r, n, window=case.window, **case.args)
    seen = set()
    for step in s.steps:
        local = [o for o in step if type(o).__name__ == "Copy" or (type(o).__name__ == "Get" and o.prev)]
        moves = [o for o in local if o.count * case.dt.itemsize >= least]
        tee = any(type(o).__name__ == "Copy" and o.src == "win" for o in moves)
        plain = sum(not o.reduce for o in moves if getattr(o, "dst", getattr(o, "buf", None)) == "win")
        reduces = sum(bool(o.reduce) for o in moves)
        if reduces:
            seen.add(("pair" if plain else "tee") + ("+tee" if tee and plain else ""))
            if tee and reduces > 1:
                seen.add("tee")
    return seen


def test_the_c_executors_one_pass_forms_give_the_bits_of_the_steps_one_by_one():
    """Large reductions' shares from the C side's fuse size on, over several of its tee's pieces and not
    a whole number of them (and a last piece's shares below it: no fuse), so that its one-pass forms run:
    a move and a reduce into a window; then my result share also into my output (the tee: 2 ranks);
    a lone last reduce with the tee (3 ranks); in place (the output is the input the pass reads) and not;
    dtypes and ops where a wrong operand order or a stale byte shows."""
    fuse = onehost._native.tables()["fuse"]
    kinds = [(np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.float64), ReduceOp.MIN),
             (np.dtype(np.int8), ReduceOp.PROD), (np.dtype(np.uint16), ReduceOp.BXOR),
             (np.dtype(np.int32), ReduceOp.MAX)]
    for n in (2, 3):
        share = 3 * fuse["tee_piece"] + 3 * 8 + 8          # bytes: pieces, then a tail of a piece
        cases, seen = [], set()
        for i, (dt, op) in enumerate(kinds):
            w = Window(n * share // dt.itemsize, oneshot=8)
            count = 2 * w.elements + n * (fuse["bytes"] // dt.itemsize) + w.elements // 2 + 5 * n + 1
            for prim in ("allreduce", "reduce"):
                for in_place in (False, True):
                    root = {} if prim == "allreduce" else {"root": (i + in_place) % n}
                    case = Case(prim, {"count": count, **root}, w, dt, op, in_place)
                    cases.append(case)
                    for r in range(n):
                        seen |= _fused(case, r, n)
        want = {"pair", "pair+tee"} | ({"tee"} if n > 2 else set())
        assert want <= seen, f"{n} ranks: the cases reach only {seen} of C's one-pass forms"
        world = World(n, n * share + 64)
        try:
            _check(world, cases, seed=21 + n)
        finally:
            world.close()


def test_the_python_executor_with_barriers_as_on_a_weakly_ordered_cpu(monkeypatch):
    """On aarch64 the Python executor takes the C helper's barriers (segment._BARRIER): the same
    paths here, with the barriers in, give the same bits."""
    monkeypatch.setattr(segment_module, "_BARRIER", onehost._native.fence)
    n = 4
    cases = [c for c in _structure_cases(n) if c.prim in ("allreduce", "allgather", "alltoall")][::3]
    assert cases
    world = World(n, max(c.window.elements for c in cases) * 8)
    try:
        _check(world, cases, seed=5)
    finally:
        world.close()


# --- what the C side refuses, and the tables it shares ----------------------------------------------------

_REFUSALS = textwrap.dedent('''
    import types
    import numpy as np
    from pyxccl import ProtocolError
    from pyxccl.algorithms import registry
    from pyxccl.algorithms.segment import Window
    from pyxccl.core import onehost
    from pyxccl.transport.segment import HostSegment

    seg = HostSegment(0, 1, 4096)
    seg.spin, seg.yields = 0.0, 0
    ctx = types.SimpleNamespace(segment=seg, rank=0)
    s = registry.lookup("allreduce", "segment").schedule(0, 1, window=Window(64, 8), count=100)
    prog = onehost.program(s, 4)
    x, settings = np.arange(100, dtype=np.float32), (0, 0, seg.waits[2], 0, 0)

    def refused(where, match, prog=prog):
        before = seg.round
        try:
            onehost.native(ctx, prog, (1, 2, 3), where, settings, 1e18, "allreduce")
        except ProtocolError as e:
            assert match in str(e) and "rank 0: allreduce" in str(e), e
            assert seg.round == before, "it ran before refusing"
        else:
            raise AssertionError(f"ran on {where}")

    refused((x, None, None), "'out' buffer and none was given")
    short = np.zeros(99, np.float32)
    refused((x, short, None), "reaches byte 400 of the 'out' buffer and it has 396")
    assert not short.any()
    ro = np.zeros(100, np.float32)
    ro.flags.writeable = False
    refused((x, ro, None), "and is read-only")
    refused((None, np.zeros(100, np.float32), None), "'in' buffer and none was given")
    refused((x[:3], np.zeros(100, np.float32), None), "of the 'in' buffer and it has 12")
    big = onehost.program(registry.lookup("allreduce", "segment").schedule(0, 1, window=Window(4096, 8), count=5000), 4)
    refused((np.zeros(5000, np.float32), np.zeros(5000, np.float32), None), "window has 4096", prog=big)
    # the prepared path calls _native.run itself: the refusal is a status, not a crash
    got = onehost._native.run(prog, 0, seg.layout, seg.round, (1, 2, 3), (x, None, None), settings)
    assert got[0] == onehost._BUFFER and got[3] == 1 and got[4] == 400, got
    for bad in (prog[:-8], b"\\x09" + prog[1:]):
        try:
            onehost._native.run(bad, 0, seg.layout, seg.round, (1, 2, 3), (x, x.copy(), None), settings)
        except ValueError as e:
            assert "not a program" in str(e), e
        else:
            raise AssertionError("ran a malformed program")
    # its arguments are read by hand (not PyArg_ParseTuple): the wrong forms are errors, nothing runs
    good = (prog, 0, seg.layout, seg.round, (1, 2, 3), (x, x.copy(), None), settings)
    for at, bad, error in ((0, "text", TypeError), (1, 0.5, TypeError), (2, seg.layout[:-1], TypeError),
                           (2, list(seg.layout), TypeError), (3, -1.0, TypeError), (4, (1, 2), TypeError),
                           (4, (1, 2, "3"), TypeError), (5, (x, x), TypeError), (6, settings[:4], TypeError),
                           (6, (0, 0, 1, 2 ** 40, 0), OverflowError), (6, (0, 0, 1, 0, None), TypeError),
                           (6, (0, 0, 1.5, 0, 0), TypeError)):
        before = seg.round
        try:
            onehost._native.run(*good[:at], bad, *good[at + 1:])
        except error:
            assert seg.round == before, "it ran before refusing"
        else:
            raise AssertionError(f"ran with argument {at} = {bad!r}")
    try:
        onehost._native.run(*good[:-1])
    except TypeError as e:
        assert "takes 7 arguments" in str(e), e
    else:
        raise AssertionError("ran with 6 arguments")
    refused((ro, ro, None), "and is read-only")     # in place: one view for both, still checked as the output
    out = np.zeros(100, np.float32)         # and with the right buffers it runs
    onehost.native(ctx, prog, (1, 2, 3), (x, out, None), settings, 1e18, "allreduce")
    assert (out == x).all()
    same = x.copy()                         # in place too (one view for both)
    onehost.native(ctx, prog, (1, 2, 3), (same, same, None), settings, 1e18, "allreduce")
    assert (same == x).all()
    print("refused all")
''')


def test_the_c_executor_refuses_buffers_its_program_would_run_past():
    """A missing, short or read-only buffer (or a window smaller than the program's) is a
    ProtocolError before anything runs, never a crash: run in a child process, so a SIGSEGV fails
    this test instead of killing pytest."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", _REFUSALS], capture_output=True, text=True, timeout=100, env=env)
    assert p.returncode == 0, f"exit {p.returncode} (a negative one is a signal)\n{p.stdout}\n{p.stderr}"
    assert "refused all" in p.stdout


def test_c_and_python_share_their_tables():
    """The C module's tables are this side's; one built from another _native.c is refused, naming
    what differs."""
    assert onehost.native_mismatch(onehost._native) is None
    theirs = onehost._native.tables()
    one = registry.lookup("barrier", "segment").schedule(0, 1, window=Window(4, 2))
    assert len(onehost.program(one, 4)) == 3 * 8 * theirs["width"]         # BEGIN, PUBLISH, SYNC
    changed = dict(theirs, opcodes=dict(theirs["opcodes"], GET=9))
    fake = types.SimpleNamespace(__file__="/x/_native.so", tables=lambda: changed)
    why = onehost.native_mismatch(fake)
    assert why and "opcodes" in why and "'GET': 9" in why and "/x/_native.so" in why
    assert "no tables()" in onehost.native_mismatch(types.SimpleNamespace(__file__="/old.so"))
    moved = dict(theirs, segment=dict(theirs["segment"], header_bytes=128))
    assert "segment" in onehost.native_mismatch(types.SimpleNamespace(__file__="/y.so", tables=lambda: moved))


def test_a_c_loop_that_parts_from_numpy_runs_in_python():
    """numpy_differs finds a reduction whose C loop gives other bits than numpy (here: MIN of +0 and
    -0 as numpy 1 had it, the first operand), and native_codes then keeps that pair in Python."""
    assert onehost._DIFFERS == frozenset(), "the C loops part from this numpy: " + repr(onehost._DIFFERS)

    def old_min(dtype, op, dst, src):
        if op != onehost._OPS[ReduceOp.MIN]:
            return onehost._native.reduce_into(dtype, op, dst, src)
        dst[:] = np.where((dst != dst) | (dst <= src), dst, src)
        return True

    differs = onehost.numpy_differs(types.SimpleNamespace(reduce_into=old_min))
    assert differs == {(onehost._DTYPES[np.dtype(t)], onehost._OPS[ReduceOp.MIN]) for t in (np.float32, np.float64)}


def test_the_python_executor_refuses_a_weakly_ordered_cpu_without_barriers(monkeypatch):
    monkeypatch.setattr(segment_module, "_ORDERED", True)
    monkeypatch.setattr(segment_module, "_BARRIER", None)
    assert segment_module.ordering_problem() is None                   # x86: its order is enough
    monkeypatch.setattr(segment_module, "_ORDERED", False)
    monkeypatch.setattr(segment_module.platform, "machine", lambda: "aarch64")
    why = segment_module.ordering_problem()
    assert why and "aarch64" in why and "pyxccl._native" in why and "C compiler" in why
    monkeypatch.setattr(segment_module, "_BARRIER", onehost._native.fence)
    assert segment_module.ordering_problem() is None                   # with the helper's barriers


@pytest.mark.parametrize("barriers", (True, False))
def test_a_communicator_on_a_weakly_ordered_cpu(pools, barriers):
    """On a CPU that reorders loads and stores, a communicator keeps the fast path when the C
    helper's barriers are there, and does without it (saying so) when not."""
    import executorfns
    fails = pools(2).run(executorfns.fast_path_on_a_weakly_ordered_cpu, barriers, transport="shm")
    assert not [f for rank in fails for f in rank], fails
