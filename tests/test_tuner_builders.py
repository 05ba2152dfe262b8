"""What makes building every rank's schedule cheap for the tuner, beside what it replaces: the shared
phases of the hierarchical algorithms (``hierarchical._sub``) and their numpy block moves
(``_move_equal``) build what the plain builds build, and the arrays of schedules converted one by one
(``compact._written`` over kept parts) are those of one conversion of them all."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pyxccl.algorithms import hierarchical, registry
from pyxccl.primitives import PRIMITIVES
from pyxccl.schedule import Schedule
from pyxccl.tuning import compact

PRIMS = ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "gather", "scatter"]
LAYOUTS = [(2, 3, "blocks"), (3, 4, "blocks"), (4, 2, "strided"), (5, 3, "blocks"), (8, 4, "blocks"),
           (3, 4, "uneven")]


def _hosts(hosts: int, per_host: int, kind: str) -> list[int]:
    n = hosts * per_host
    if kind == "strided":
        return [r % hosts for r in range(n)]
    if kind == "uneven":
        return [min(r // 3, hosts - 1) for r in range(n)]
    return [r // per_host for r in range(n)]


def _all(prim: str, n: int, hl: list[int], nbytes: int, root: int) -> list:
    rooted = PRIMITIVES[prim].rooted
    args = PRIMITIVES[prim].sized(n, nbytes, 4, root) if rooted else PRIMITIVES[prim].sized(n, nbytes, 4)
    algo = registry.lookup(prim, "hierarchical")
    return [repr((s.steps, s.scratch)) for s in (algo.schedule(r, n, hosts=hl, **args) for r in range(n))]


@pytest.mark.parametrize("prim", PRIMS)
def test_hierarchical_schedules_with_shared_phases_are_the_plain_builds(prim, monkeypatch):
    """Every rank's schedule, every layout (blocks, strided, hosts of different sizes), sizes and roots:
    the same operations (types included) with the phases shared as with each phase built afresh."""
    cases = [(h, L, kind, nb, root) for h, L, kind in LAYOUTS for nb in (8, 1000, 1 << 20)
             for root in ((0, h * L - 1) if PRIMITIVES[prim].rooted else (0,))]
    hierarchical._SUBS.clear()
    shared = {c: _all(prim, c[0] * c[1], _hosts(*c[:3]), c[3], c[4]) for c in cases}
    assert hierarchical._SUBS           # phases were shared
    monkeypatch.setattr(hierarchical, "_sub", hierarchical._build)
    for c in cases:
        assert _all(prim, c[0] * c[1], _hosts(*c[:3]), c[3], c[4]) == shared[c], c


def test_rooted_layouts_follow_the_counts_and_the_root():
    """gather/scatter keep what every rank computes alike for the last counts and root: a counts list
    changed in place, or another root, is computed again."""
    n, hl = 8, [r // 4 for r in range(8)]
    algo = registry.lookup("gather", "hierarchical")
    counts = [3] * n
    first = algo.schedule(0, n, hosts=hl, counts=counts, root=0)
    counts[5] = 7
    changed = algo.schedule(0, n, hosts=hl, counts=counts, root=0)
    fresh = algo.schedule(0, n, hosts=list(hl), counts=list(counts), root=0)
    assert changed.steps == fresh.steps and changed.steps != first.steps
    other = algo.schedule(0, n, hosts=hl, counts=counts, root=5)
    assert other.steps == algo.schedule(0, n, hosts=list(hl), counts=list(counts), root=5).steps


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("c", [0, 1, 5])
def test_move_equal_is_move(seed, c):
    """Random orders of equal blocks, with runs adjacent on both sides: the same copies as ``_move``."""
    rng = random.Random(seed)
    keys = rng.sample(range(10_000), 40)
    dst = list(keys)
    for _ in range(6):            # move whole runs, so that some blocks stay adjacent
        i, j = sorted(rng.sample(range(len(dst) + 1), 2))
        dst = dst[:i][::-1] + dst[i:j] + dst[j:][::-1] if rng.random() < 0.5 else dst[i:j] + dst[:i] + dst[j:]
    a, b = Schedule(0, 1), Schedule(0, 1)
    hierarchical._move(a, lambda k: c, ("tmp", 3), keys, ("out", 7), dst)
    hierarchical._move_equal(b, c, ("tmp", 3), np.array(keys), ("out", 7), np.array(dst))
    assert repr(a.steps) == repr(b.steps)
    with pytest.raises(KeyError):
        hierarchical._move_equal(b, 1, ("tmp", 0), np.array(keys), ("out", 0), np.array([10_001]))


@pytest.mark.parametrize("prim,name", [("broadcast", "hierarchical"), ("allreduce", "ring"), ("gather", "binomial"),
                                       ("alltoall", "hierarchical")])
def test_arrays_of_kept_parts_are_one_conversions(prim, name):
    """Converted all at once, some first one by one, all one by one (with empty schedules among them), a
    batch again, part of it or in another order: the same arrays."""
    n, hl = 24, [r // 4 for r in range(24)]
    args = PRIMITIVES[prim].sized(n, 40, 4)

    def built():
        out = [registry.lookup(prim, name).schedule(r, n, hosts=hl, **args) for r in range(n)]
        return out[:5] + [Schedule(n, n + 1), Schedule(n + 1, n + 2)] + out[5:]
    whole = compact.convert(built(), written=True)
    some, most, every = built(), built(), built()
    for s in random.Random(0).sample(some, 10):         # fewer than half kept: converted again together
        compact.convert([s], written=True)
    for s in random.Random(1).sample(most, 20):         # most kept: the kept parts joined
        compact.convert([s], written=True)
    assert compact.convert(most, written=True).equal(whole)
    for s in every:
        compact.convert([s], written=True)
    assert compact.convert(some, written=True).equal(whole)
    assert compact.convert(every, written=True).equal(whole)
    again = built()
    assert compact.convert(again, written=True).equal(whole)          # one batch, then the same again,
    assert compact.convert(again, written=True).equal(whole)
    assert compact.convert(again[3:9], written=True).equal(compact.convert(built()[3:9], written=True))  # a part
    assert compact.convert(again[::-1], written=True).equal(compact.convert(built()[::-1], written=True))


def _bruck_alltoall_plain(rank: int, n: int, c: int) -> Schedule:
    """Bruck's alltoall as it was written op by op through Schedule.step (the reference)."""
    from pyxccl.schedule import Copy, Recv, Send
    s = Schedule(rank, n, scratch=2 * n * c)
    s.step(*(Copy("in", ((rank + j) % n) * c, "tmp", j * c, c) for j in range(n)))
    d = 1
    while d < n:
        moving = [j for j in range(n) if j & d]
        s.step(*(Send((rank + d) % n, "tmp", j * c, c) for j in moving),
               *(Recv((rank - d) % n, "tmp", (n + j) * c, c) for j in moving))
        s.step(*(Copy("tmp", (n + j) * c, "tmp", j * c, c) for j in moving))
        d <<= 1
    s.step(*(Copy("tmp", j * c, "out", ((rank - j) % n) * c, c) for j in range(n)))
    return s


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("c", [0, 1, 7])
def test_bruck_alltoall_is_its_plain_build(n, c):
    algo = registry.lookup("alltoall", "bruck")
    for r in range(n):
        got = algo.schedule(r, n, send_counts=[c] * n, recv_counts=[c] * n)
        want = _bruck_alltoall_plain(r, n, c)
        assert repr(got.steps) == repr(want.steps) and got.scratch == want.scratch, (n, c, r)


def test_ring_phases_follow_their_counts():
    """The ring keeps the offsets and non-empty chunks of the last counts: a counts list changed in
    place, or another one, gives what a fresh list gives."""
    algo = registry.lookup("allgather", "ring")
    counts = [0, 2, 0, 1, 0, 0]
    first = [algo.schedule(r, 6, counts=counts).steps for r in range(6)]
    counts[2] = 5
    changed = [algo.schedule(r, 6, counts=counts).steps for r in range(6)]
    assert changed == [algo.schedule(r, 6, counts=list(counts)).steps for r in range(6)] != first
    ar = registry.lookup("allreduce", "ring")
    assert [ar.schedule(r, 5, count=3).steps for r in range(5)] != [ar.schedule(r, 5, count=4).steps for r in range(5)]
