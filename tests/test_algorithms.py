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


# --- hierarchical algorithms over host layouts -------------------------------------------------
from pyxccl.algorithms import hierarchical  # noqa: E402
from pyxccl.tuning import Link, Machine, Tuner  # noqa: E402

HIER_PRIMS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "gather", "scatter")
EVEN = {"2x2": [0, 0, 1, 1], "2x3": [0, 0, 0, 1, 1, 1], "3x2": [0, 0, 1, 1, 2, 2], "4x1": [0, 1, 2, 3],
        "1x4": [0, 0, 0, 0], "2x2_interleaved": [0, 1, 0, 1], "3x2_interleaved": [0, 1, 2, 0, 1, 2],
        "2x2_labels_reversed": [1, 1, 0, 0]}
UNEVEN = {"2+1": [0, 0, 1], "1+2+1": [0, 1, 1, 2], "3+1+2": [0, 0, 0, 1, 2, 2],
          "3+2+1_interleaved": [0, 1, 0, 2, 1, 0]}
LAYOUTS = {**EVEN, **UNEVEN}


@pytest.mark.parametrize("prim", HIER_PRIMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_hierarchical_primitives_for_host_layouts(prim, layout, monkeypatch):
    """Every hierarchical primitive on even, uneven and interleaved hosts, counts from 0 to above n,
    every root; broadcast both ways (leaders, and shards per local rank)."""
    hosts = LAYOUTS[layout]
    n = len(hosts)
    for shard_min in ((hierarchical.SHARD_MIN, 1) if prim == "broadcast" else (hierarchical.SHARD_MIN,)):
        monkeypatch.setattr(hierarchical, "SHARD_MIN", shard_min)
        for count in sorted({0, 1, 2, n - 1, n + 1, 7, 3 * n + 2}):
            for root in (range(n) if prim in ROOTED else (0,)):
                check(prim, "hierarchical", n, count, root, hosts=hosts)


def _cross(s: Schedule, hosts) -> tuple[int, int]:
    """(elements, messages) rank s.rank sends to other hosts."""
    sends = [o for step in s.steps for o in step if type(o) is Send and hosts[o.peer] != hosts[s.rank]]
    return sum(o.count for o in sends), len(sends)


@pytest.mark.parametrize("layout", EVEN)
def test_hierarchical_bytes_across_hosts_on_even_hosts(layout, monkeypatch):
    """The figures of the module docstring: H hosts of L ranks, c elements per rank (per block for
    alltoall), N = n c."""
    hosts = EVEN[layout]
    n, H = len(hosts), len(set(hosts))
    L, c = n // H, 6
    N = n * c
    monkeypatch.setattr(hierarchical, "SHARD_MIN", 1)

    def cross(prim, count, root=0):
        _, _, scheds = simulate(prim, "hierarchical", n, count, root, hosts=hosts)
        return [_cross(s, hosts) for s in scheds]
    # allgather, reduce_scatter: (H-1) c out of every rank, so N (H-1)/H out of every host
    for prim in ("allgather", "reduce_scatter"):
        assert [e for e, _ in cross(prim, c)] == [(H - 1) * c] * n, prim
    # alltoall: (H-1) L c out of every rank, in H-1 messages
    assert cross("alltoall", c) == [((H - 1) * L * c, H - 1)] * n
    # allreduce: 2 (H-1)/H of the vector out of every host, split over its L ranks
    assert [e for e, _ in cross("allreduce", N)] == [2 * (H - 1) * N // H // L] * n
    # broadcast: N reaches every other host once, 1/L of it through each of its ranks
    for root in range(n):
        _, _, scheds = simulate("broadcast", "hierarchical", n, N, root, hosts=hosts)
        assert sum(_cross(s, hosts)[0] for s in scheds) == (H - 1) * N
        got = [sum(o.count for step in s.steps for o in step if type(o) is Recv and hosts[o.peer] != hosts[s.rank])
               for s in scheds]
        assert got == [0 if hosts[r] == hosts[root] else N // L for r in range(n)]
    # gather, scatter: every other host's data once, in H-1 messages
    for prim in ("gather", "scatter"):
        for root in range(n):
            moved = cross(prim, c, root)
            assert sum(e for e, _ in moved) == N - L * c and sum(m for _, m in moved) == H - 1, (prim, root)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_hierarchical_allgather_moves_each_hosts_data_to_each_other_host_once(layout):
    """allgather: into each host, the other hosts' blocks once; reduce_scatter (the mirror): out of
    each host, its sums of the other hosts' blocks once. Even or not."""
    hosts = LAYOUTS[layout]
    n, c = len(hosts), 5
    for prim, end in (("allgather", "into"), ("reduce_scatter", "out of")):
        _, _, scheds = simulate(prim, "hierarchical", n, c, hosts=hosts)
        moved = {h: 0 for h in hosts}
        for s in scheds:
            for step in s.steps:
                for o in step:
                    if type(o) is Send and hosts[o.peer] != hosts[s.rank]:
                        moved[hosts[o.peer] if end == "into" else hosts[s.rank]] += o.count
        assert moved == {h: (n - hosts.count(h)) * c for h in hosts}, prim


def test_hierarchical_is_flat_on_one_host_and_on_one_rank_hosts():
    for prim, inner, outer in (("allgather", "ring", "ring"), ("reduce_scatter", "ring", "ring"),
                               ("broadcast", "binomial", "binomial"), ("alltoall", "pairwise", "pairwise"),
                               ("gather", "direct", "direct"), ("scatter", "direct", "direct")):
        for hosts, flat in ((None, inner), ([7] * 5, inner), ([4, 3, 2, 1, 0], outer)):
            _, _, h = simulate(prim, "hierarchical", 5, 3, 2, hosts=hosts)
            _, _, f = simulate(prim, flat, 5, 3, 2)
            assert [s.steps for s in h] == [s.steps for s in f], (prim, hosts)


def test_hierarchical_alltoall_refuses_unequal_blocks():
    build = registry.lookup("alltoall", "hierarchical")[1]
    with pytest.raises(ValueError, match="equal block sizes"):
        registry.build(build, 0, 4, hosts=[0, 0, 1, 1], send_counts=[1, 2, 1, 1], recv_counts=[1, 2, 1, 1])
    with pytest.raises(ValueError, match="equal block sizes"):
        registry.build(build, 0, 3, hosts=[0, 0, 1], send_counts=[2, 2, 2], recv_counts=[2, 2, 3])
    # one host: the flat inner algorithm, which takes any counts
    registry.build(build, 0, 3, hosts=[0, 0, 0], send_counts=[1, 2, 3], recv_counts=[1, 4, 5])


def test_tuner_prices_hierarchical_and_picks_it_over_a_slow_inter_host_link():
    hosts = [0, 0, 1, 1]

    def tuner(tcp):
        links = {"tcp": tcp} if tcp else {}
        klass = lambda a, b: "self" if a == b else ("shm" if hosts[a] == hosts[b] else "tcp")  # noqa: E731
        return Tuner(4, hosts, klass, Machine(links=links, cores=8), [8] * 4)
    for prim in HIER_PRIMS:
        for nbytes in (8, 1 << 16, 1 << 24):
            assert "hierarchical" in tuner(None).table(prim, nbytes), (prim, nbytes)
    slow = tuner(Link(100e-6, 1 / 1e8))
    for prim in ("allgather", "reduce_scatter", "allreduce"):
        assert slow.choose(prim, 16 << 20) == "hierarchical", (prim, slow.table(prim, 16 << 20))
    # broadcast: a chain along contiguous hosts also crosses between them once, pipelined
    assert slow.choose("broadcast", 16 << 20) in ("hierarchical", "chain"), slow.table("broadcast", 16 << 20)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", (["a", "a", "b", "b"], ["a", "a", "a", "b", "b"], ["a", "b", "a", "b", "c"],
                                   ["a", "b", "a", "b"]))
def test_hierarchical_forced_on_emulated_hosts_matches_numpy(hosts):
    """PYXCCL_HOST_ID per rank: every hierarchical primitive forced, against numpy; broadcast also
    above SHARD_MIN (cut into shards on even hosts)."""
    with RankPool(len(hosts), transports=("auto",), hosts=hosts) as pool:
        out = []
        for prim in HIER_PRIMS[1:]:
            out += pool.run(rf.check_forced, prim, ["hierarchical"], (0, 1, 7, 1000), REAL_PAIRS,
                            transport="auto", timeout=250)
        out += pool.run(rf.check_forced, "broadcast", ["hierarchical"], (hierarchical.SHARD_MIN + 3,),
                        REAL_PAIRS, transport="auto", timeout=250)
        fails = [f for fs in out for f in fs]
        assert not fails, "\n".join(fails[:20])


@pytest.mark.parametrize("prim", ("allgather", "reduce_scatter", "gather", "scatter"))
def test_hierarchical_with_unequal_counts(prim, monkeypatch):
    """The checker's calls give every rank the same count; the v-variants (allgatherv, ...) don't.
    Here the builders get unequal counts (zeros included) and the result is checked element by element."""
    from pyxccl import checker
    for hosts in LAYOUTS.values():
        n = len(hosts)
        for counts in ([(p + k) % 5 for p in range(n)] for k in range(3)):
            off = [sum(counts[:p]) for p in range(n + 1)]
            total = off[-1]
            for root in (range(n) if prim in ROOTED else (0,)):
                def args(primitive, nranks, rank, count, root, counts=counts):
                    sizes = {"allgather": (counts[rank], total), "reduce_scatter": (total, counts[rank]),
                             "gather": (counts[rank], total if rank == root else 0),
                             "scatter": (total if rank == root else 0, counts[rank])}[primitive]
                    kw = dict(counts=counts, root=root) if primitive in ROOTED else dict(counts=counts)
                    return (kw, *sizes)
                monkeypatch.setattr(checker, "_args", args)
                bufs, _, _ = simulate(prim, "hierarchical", n, 0, root, hosts=hosts)
                for r in range(n):
                    out = bufs[r]["out"]
                    if prim == "allgather" or (prim == "gather" and r == root):
                        want_c = np.repeat(np.eye(n, dtype=np.int32), counts, axis=0)
                        want_i = np.concatenate([np.arange(c) for c in counts])
                    elif prim == "reduce_scatter":
                        want_c = np.ones((counts[r], n), np.int32)
                        want_i = np.arange(off[r], off[r + 1])
                    elif prim == "scatter":
                        want_c = np.tile(np.eye(n, dtype=np.int32)[root], (counts[r], 1))
                        want_i = np.arange(off[r], off[r + 1])
                    else:
                        continue
                    assert (out.c == want_c).all() and (out.i == want_i).all(), (hosts, counts, root, r)
