"""Property: any sequence of collectives gives numpy's results.

Hypothesis draws short sequences of collectives (every primitive and v-variant, random sizes, dtypes,
every op valid for the dtype, roots, algorithms, in-place forms, a step repeated so that it runs
prepared) in this process; every rank of a 4-rank pool runs the same sequence (shipped as data), with
inputs drawn from a seed and its rank only (``rankfns.seq_input``), so this process computes every
rank's expected result with numpy. Derandomized and database-less: CI runs the same examples always.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rankfns as rf
from pyxccl.ops import ReduceOp, op_error

N = 4
EXAMPLES = 500              # sequences, each run over both transports
DTYPES = tuple(rf.DTYPE_BY_NAME)
KINDS = ("allreduce", "reduce", "broadcast", "allgather", "allgatherv", "gather", "gatherv", "scatter",
         "scatterv", "reduce_scatter", "reduce_scatterv", "alltoall", "alltoallv", "barrier")
REDUCES = ("allreduce", "reduce", "reduce_scatter", "reduce_scatterv")
ROOTED = ("reduce", "broadcast", "gather", "gatherv", "scatter", "scatterv")
UFUNC = {op.name: uf for op, uf in rf.UFUNC.items()}

sizes = st.one_of(st.integers(0, 9), st.integers(10, 300), st.sampled_from([1021, 4099, 20011]))
small = st.integers(0, 7)


@st.composite
def steps(draw):
    kind = draw(st.sampled_from(KINDS))
    dt = draw(st.sampled_from(DTYPES))
    ops = [o.name for o in ReduceOp if op_error(o, rf.DTYPE_BY_NAME[dt]) is None]
    counts = None
    if kind == "alltoallv":
        counts = draw(st.lists(st.lists(small, min_size=N, max_size=N), min_size=N, max_size=N))
    elif kind.endswith("v"):
        counts = draw(st.lists(small | st.integers(8, 200), min_size=N, max_size=N))
    return dict(kind=kind, dtype=dt, op=draw(st.sampled_from(ops)) if kind in REDUCES else None,
                root=draw(st.integers(0, N - 1)) if kind in ROOTED else None,
                count=draw(sizes), counts=counts, seed=draw(st.integers(0, 2 ** 31 - 1)),
                algorithm=draw(st.none() | st.integers(0, 15)), in_place=draw(st.booleans()),
                all_counts=draw(st.booleans()), repeat=draw(st.integers(1, 2)))


def _inputs(step, k, count_of):
    """Every rank's input of repeat ``k``: count_of(rank) elements each."""
    return [rf.seq_input(step["seed"] + k, p, count_of(p), step["dtype"], step["op"]) for p in range(N)]


def _reduced(arrays, op):
    acc = arrays[0].copy()
    for a in arrays[1:]:
        UFUNC[op](acc, a, out=acc)
    if op == "AVG":
        np.divide(acc, N, out=acc)
    return acc


def expected(step, k) -> list:
    """Every rank's result of repeat ``k`` of ``step``, by numpy (as rankfns.run_sequence returns them)."""
    kind, op, root, count, counts = (step[x] for x in ("kind", "op", "root", "count", "counts"))
    if kind in ("allreduce", "reduce"):
        xs = _inputs(step, k, lambda p: count)
        red = _reduced(xs, op)
        return [red if kind == "allreduce" or p == root else xs[p] for p in range(N)]
    if kind == "broadcast":
        return [_inputs(step, k, lambda p: count)[root]] * N
    cs = counts if kind.endswith("v") and kind != "alltoallv" else [count] * N
    if kind in ("allgather", "allgatherv", "gather", "gatherv"):
        whole = np.concatenate(_inputs(step, k, lambda p: cs[p]))
        return [whole if kind.startswith("all") or p == root else None for p in range(N)]
    off = np.concatenate([[0], np.cumsum(cs)])
    if kind in ("scatter", "scatterv"):
        send = _inputs(step, k, lambda p: sum(cs))[root]
        return [send[off[p]:off[p + 1]] for p in range(N)]
    if kind in ("reduce_scatter", "reduce_scatterv"):
        red = _reduced(_inputs(step, k, lambda p: sum(cs)), op)
        return [red[off[p]:off[p + 1]] for p in range(N)]
    if kind in ("alltoall", "alltoallv"):
        m = counts if kind == "alltoallv" else [[count] * N] * N
        sends = _inputs(step, k, lambda p: sum(m[p]))
        starts = [np.concatenate([[0], np.cumsum(m[p])]) for p in range(N)]
        return [np.concatenate([sends[p][starts[p][q]:starts[p][q + 1]] for p in range(N)]) for q in range(N)]
    return [None] * N


def _describe(step) -> str:
    return ", ".join(f"{k}={v}" for k, v in step.items() if v is not None)


@pytest.mark.timeout(240)
@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(seq=st.lists(steps(), min_size=1, max_size=4))
def test_random_sequences_match_numpy(pools, transport, seq):
    got = pools(N).run(rf.run_sequence, seq, transport=transport, timeout=60)
    for i, step in enumerate(seq):
        for k in range(step["repeat"]):
            want = expected(step, k)
            for r in range(N):
                g, w = got[r][i][k], want[r]
                where = f"step {i} ({_describe(step)}), repeat {k}, rank {r}"
                if w is None:
                    assert g is None, where
                    continue
                assert g is not None and g.dtype == w.dtype and g.shape == w.shape, \
                    f"{where}: got {None if g is None else (g.dtype, g.shape)}, want {(w.dtype, w.shape)}"
                bad = np.flatnonzero(g != w)
                assert not bad.size, f"{where}: {bad.size} wrong, first at {bad[:4]}: got {g[bad[:4]]}, " \
                                     f"want {w[bad[:4]]}"


def test_the_reference_is_numpy_written_out():
    """The oracle, checked on its own against the definitions: allreduce SUM is the sum of every rank's
    input; alltoall gives rank q the q-th block of every rank, in rank order."""
    base = dict(dtype="int32", root=None, counts=None, seed=3, algorithm=None, in_place=False, all_counts=False,
                repeat=1)
    xs = [rf.seq_input(3, p, 5, "int32", "SUM") for p in range(N)]
    assert all(np.array_equal(w, sum(xs)) for w in expected(dict(base, kind="allreduce", op="SUM", count=5), 0))
    xs = [rf.seq_input(3, p, 2 * N, "int32") for p in range(N)]
    got = expected(dict(base, kind="alltoall", op=None, count=2), 0)
    assert all(np.array_equal(got[q], np.concatenate([x[2 * q:2 * q + 2] for x in xs])) for q in range(N))
