"""Algorithms as schedules: every registered algorithm proven by the symbolic checker
for world sizes 1..64, its textbook step and byte counts read off the schedules,
and real runs of each algorithm, forced one by one, against numpy."""
import math

import numpy as np
import pytest

import rankfns as rf
from pyxccl import algorithms
from pyxccl.algorithms import registry
from pyxccl.checker import CheckError, check, simulate
from pyxccl.ops import ReduceOp
from pyxccl.schedule import Copy, Recv, Schedule, Send
from pyxccl.testing import RankPool

PRIMS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter", "alltoall",
         "barrier")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
ALL = [(p, a) for p in PRIMS for a in algorithms.algorithms(p)]


def _counts(n):
    """Counts smaller than n, not divisible by n, and larger."""
    return sorted({0, 1, 2, n - 1, n + 1, 3 * n + 2}) if n <= 16 else (1, n + 1)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("prim, algo", ALL)
def test_checker_proves_every_algorithm_for_1_to_64_ranks(prim, algo):
    for n in range(1, 65):
        for count in _counts(n):
            for root in (sorted({0, n - 1, n // 2}) if prim in ROOTED else (0,)):
                check(prim, algo, n, count, root)


@pytest.mark.parametrize("layout", ("two_even", "three_uneven", "interleaved"))
def test_hierarchical_for_host_layouts(layout):
    for n in range(1, 17):
        hosts = {"two_even": [r * 2 // n for r in range(n)],
                 "three_uneven": [0 if r < 1 else (1 if r < n // 2 + 1 else 2) for r in range(n)],
                 "interleaved": [r % 3 for r in range(n)]}[layout]
        for count in _counts(n):
            check("allreduce", "hierarchical", n, count, hosts=hosts)


def _transfer_steps(s: Schedule) -> int:
    return sum(1 for step in s.steps if any(type(o) is not Copy for o in step))


def _sent(s: Schedule) -> int:
    return sum(o.count for step in s.steps for o in step if type(o) is Send)


@pytest.mark.parametrize("n", (2, 3, 4, 5, 8, 13, 16))
def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_data_in_2_n_minus_1_steps(n):
    count = n * 1024                       # divisible, so the figure is exact
    _, _, scheds = simulate("allreduce", "ring", n, count)
    for s in scheds:
        assert _transfer_steps(s) == 2 * (n - 1)
        assert _sent(s) == 2 * (n - 1) * count // n


@pytest.mark.parametrize("n", (2, 4, 8, 16, 32, 64))
def test_halving_doubling_takes_2_log2_n_steps(n):
    if "halving_doubling" not in algorithms.algorithms("allreduce"):
        pytest.fail("halving_doubling is not registered")
    _, _, scheds = simulate("allreduce", "halving_doubling", n, n * 64)
    for s in scheds:
        assert _transfer_steps(s) == 2 * int(math.log2(n))
        assert _sent(s) == 2 * (n - 1) * 64      # 2(n-1)/n of the data, like ring


def test_checker_catches_wrong_schedules(monkeypatch):
    """The checker is not a rubber stamp: a missing reduction, a race and a deadlock are caught."""
    def no_reduce(rank, nranks, count):
        s = registry.lookup("allreduce", "ring")[1](rank, nranks, count)
        s.steps = [tuple(o._replace(reduce=False) if type(o) is Recv else o for o in st) for st in s.steps]
        return s

    def racy(rank, nranks, count):
        s = Schedule(rank, nranks)
        s.step(Copy("in", 0, "out", 0, count))
        s.step(Send((rank + 1) % nranks, "out", 0, count), Recv((rank - 1) % nranks, "out", 0, count, True))
        return s

    def deadlock(rank, nranks, count):
        s = Schedule(rank, nranks)
        s.step(Recv((rank - 1) % nranks, "out", 0, count))
        s.step(Send((rank + 1) % nranks, "out", 0, count))
        return s
    for name, fn, msg in (("t_no_reduce", no_reduce, "contributions"), ("t_racy", racy, "overlaps"),
                          ("t_deadlock", deadlock, "deadlock")):
        monkeypatch.setitem(registry._REGISTRY, ("allreduce", name), fn)
        with pytest.raises(CheckError, match=msg):
            check("allreduce", name, 4, 9)


REAL_SIZES = tuple(range(1, 10))
REAL_PAIRS = rf.valid_pairs((np.float32, np.float16, rf.bfloat16, np.int32), tuple(ReduceOp))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", REAL_SIZES)
def test_every_allreduce_algorithm_forced_matches_numpy(pools, transport, n):
    out = pools(n).run(rf.check_forced, "allreduce", algorithms.algorithms("allreduce"), (0, 1, 7, 1000),
                       REAL_PAIRS, transport=transport, timeout=250)
    fails = [f"rank {r}: {f}" for r, fs in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", REAL_SIZES)
def test_every_other_algorithm_forced_matches_numpy(pools, transport, n):
    fails = []
    for prim in PRIMS[1:]:
        out = pools(n).run(rf.check_forced, prim, algorithms.algorithms(prim), (0, 1, 7, 1000), REAL_PAIRS,
                           transport=transport, timeout=250)
        fails += [f"rank {r}: {f}" for r, fs in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", (["a", "a", "b", "b"], ["a", "a", "a", "b", "b"], ["a", "b", "a", "b", "c"]))
def test_emulated_hosts_topology_and_every_primitive(hosts):
    """PYXCCL_HOST_ID per rank: shared memory inside a host, TCP across, hierarchical allreduce correct."""
    with RankPool(len(hosts), transports=("auto",), hosts=hosts) as pool:
        classes = pool.run(rf.link_classes, transport="auto")
        for r, row in enumerate(classes):
            assert row == ["self" if p == r else ("shm" if hosts[p] == hosts[r] else "tcp")
                           for p in range(len(hosts))]
        out = pool.run(rf.check_forced, "allreduce", ["hierarchical", "ring"], (0, 1, 7, 1000), REAL_PAIRS,
                       transport="auto", timeout=250)
        out += pool.run(rf.check_movement, (0, 7, 1000), (np.float32, np.int8), transport="auto")
        fails = [f for fs in out for f in fs]
        assert not fails, "\n".join(fails[:20])
