"""The tuner prices with the simulator's walk: its choice is ``pyxccl sim``'s on the same cluster, its
folded walk (host 0's ranks, in the C core) gives the full walk's estimate, and where it cannot fold
or use the C core (odd layouts, TCP inside a host) it gives the Python reference's."""
from __future__ import annotations

import pytest

from pyxccl import algorithms
from pyxccl.algorithms import registry
from pyxccl.primitives import PRIMITIVES
from pyxccl.sim import Cluster, Link
from pyxccl.sim import run as sim_run
from pyxccl.sim.simulate import candidates as sim_candidates
from pyxccl.tuning import Machine, Tuner, estimate, fast, select, symmetric

SHM, TCP, SEG = Link(20e-6, 1 / 4e9), Link(60e-6, 1 / 1.1e9), Link(13e-6, 0.0)
GAMMA, COPY = 2e-10, 1.5e-10


def _pair(hosts: int, per_host: int, cores: int):
    """(the tuner, the simulator's cluster) of one machine: hosts x per_host ranks, ``cores`` per host."""
    n = hosts * per_host
    hl = [r // per_host for r in range(n)]
    tuner = Tuner(n, hl, lambda a, b: "self" if a == b else "shm" if hl[a] == hl[b] else "tcp",
                  Machine({"shm": SHM, "tcp": TCP, "seg": SEG}, GAMMA, COPY, cores), [cores] * n,
                  segment=(2 << 20, True) if hosts == 1 else None)
    cluster = Cluster(hosts, per_host, intra=SHM, inter=TCP, nics=1, gamma=GAMMA, copy=COPY, reduce_overlap=False,
                      cpu=True, cores=cores, seg=SEG if hosts == 1 else None, segment_bytes=2 << 20)
    return tuner, cluster


CASES = [("allreduce", 8, 2, 4, 4), ("allreduce", 1 << 20, 4, 4, 4), ("allreduce", 64 << 20, 4, 2, 2),
         ("allgather", 1 << 16, 8, 2, 2), ("alltoall", 4 << 20, 2, 4, 2), ("reduce_scatter", 1 << 20, 4, 2, 1),
         ("broadcast", 1 << 22, 4, 4, 4), ("allreduce", 1 << 12, 1, 8, 4), ("allgather", 1 << 24, 1, 4, 2),
         ("alltoall", 1 << 18, 16, 2, 2), ("allreduce", 1 << 20, 16, 8, 8), ("alltoall", 1 << 16, 32, 4, 4),
         ("allgather", 1 << 22, 128, 1, 1)]


def _simulated(primitive: str, nbytes: int, cluster: Cluster) -> dict[str, float]:
    """Every algorithm's time in the simulator, walked as the tuner walks it: above FOLD_ABOVE ranks
    folded (symmetric mode) where its schedules fold, else at message level."""
    out = {}
    for name in sim_candidates(primitive, cluster):
        try:
            if cluster.nranks <= select.FOLD_ABOVE:
                raise ValueError("every rank")
            res = sim_run(primitive, nbytes, cluster, [name], inplace=False, mode="symmetric")
        except ValueError:
            try:
                res = sim_run(primitive, nbytes, cluster, [name], inplace=False, mode="message")
            except ValueError:
                continue            # cannot run this call here
        out[name] = res[0].time
    return out


@pytest.mark.parametrize("primitive,nbytes,hosts,per_host,cores", CASES)
def test_the_tuner_chooses_what_the_simulator_predicts(primitive, nbytes, hosts, per_host, cores):
    """One model: every algorithm's estimate is the simulator's to float rounding, and the choice is
    the simulator's fastest."""
    tuner, cluster = _pair(hosts, per_host, cores)
    sim = _simulated(primitive, nbytes, cluster)
    table = tuner.table(primitive, nbytes)
    assert sorted(table) == sorted(sim)
    for name, est in table.items():
        assert est.time == pytest.approx(sim[name], rel=1e-12), name
    assert tuner.choose(primitive, nbytes) == min(sim, key=lambda a: (sim[a], a))


def _full(tuner: Tuner, primitive: str, name: str, nbytes: int) -> float:
    """The estimate of every rank's schedule walked in Python (cost.estimate: no shape, no fold)."""
    args = PRIMITIVES[primitive].sized(tuner.n, nbytes, 4)
    algo = registry.lookup(primitive, name)
    scheds = [algo.schedule(r, tuner.n, hosts=tuner.hosts, **args) for r in range(tuner.n)]
    return estimate(scheds, 4, tuner.machine, tuner.klass, tuner.stretch, tuner.hosts).time


FOLDS = [(p, h, L) for p in ("allreduce", "allgather", "reduce_scatter") for h, L in ((2, 2), (4, 2), (8, 1), (4, 4))]
FOLDS += [("alltoall", h, L) for h, L in ((2, 2), (4, 2), (8, 1))]


@pytest.mark.parametrize("primitive,hosts,per_host", FOLDS)
def test_the_folded_walk_gives_the_full_walks_estimate(primitive, hosts, per_host, monkeypatch):
    """Where an algorithm folds (its schedules the same on every host, moved), host 0's ranks walked in
    the C core give what every rank walked in Python gives, bit for bit, at 1 MiB (a size that splits
    evenly: the hosts' counts are host 0's). Not everywhere: pairwise alltoall on 4 x 4 differs
    (select.FOLD_ABOVE says where and why the tuner walks every rank below 64)."""
    monkeypatch.setattr(select, "FOLD_ABOVE", 0)
    tuner, _ = _pair(hosts, per_host, per_host)
    n = hosts * per_host
    folded = 0
    for name in algorithms.algorithms(primitive):
        algo = registry.lookup(primitive, name)
        if algo.segment:
            continue
        args = PRIMITIVES[primitive].sized(n, 1 << 20, 4)
        sym, _ = symmetric.find(lambda r: algo.schedule(r, n, hosts=tuner.hosts, **args), hosts, per_host, False)
        est = tuner.model(primitive, name, 1 << 20)
        assert est.time == _full(tuner, primitive, name, 1 << 20), name
        folded += sym is not None
    assert folded >= 2          # the ring and at least one other algorithm did fold here


@pytest.mark.parametrize("layout", [[0, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1, 1, 1]])
def test_odd_layouts_fall_back_to_the_full_walk(layout):
    """Hosts of different sizes, or ranks not consecutive on their hosts: no shape, every rank walked
    in Python, the estimate cost.estimate's."""
    n = len(layout)
    tuner = Tuner(n, layout, lambda a, b: "self" if a == b else "shm" if layout[a] == layout[b] else "tcp",
                  Machine({"shm": SHM, "tcp": TCP}, GAMMA, COPY, 2), [2] * n)
    assert tuner.net().shape() is None
    for name in ("ring", "hierarchical", "recursive_doubling"):
        assert tuner.model("allreduce", name, 1 << 20).time == _full(tuner, "allreduce", name, 1 << 20)


@pytest.mark.skipif(fast._simcore is None, reason="the C core (pyxccl.tuning._simcore) is not built")
@pytest.mark.parametrize("hosts,per_host", [(1, 4), (2, 4)])
def test_tcp_inside_a_host_in_the_c_core_is_the_python_reference(hosts, per_host):
    """A host without shared memory ("tcp_local" inside it): the C core prices it as cost.py does."""
    n = hosts * per_host
    hl = [r // per_host for r in range(n)]
    tuner = Tuner(n, hl, lambda a, b: "self" if a == b else "tcp_local" if hl[a] == hl[b] else "tcp",
                  Machine({"tcp_local": Link(40e-6, 1 / 2e9), "tcp": TCP}, GAMMA, COPY, 2), [2] * n)
    assert tuner.net().shape() is not None and not tuner.net().shape().shm_inside
    for name in ("ring", "direct", "recursive_doubling", "tree"):
        assert tuner.model("allreduce", name, 1 << 20).time == _full(tuner, "allreduce", name, 1 << 20), name


def test_a_host_unlike_the_others_is_not_folded():
    """One pair of a host without shared memory: the hosts are not alike, nothing is folded (Python walk)."""
    n, p = 8, 4
    hl = [r // p for r in range(n)]

    def klass(a, b):
        if a == b:
            return "self"
        if hl[a] != hl[b]:
            return "tcp"
        return "tcp_local" if {a, b} == {5, 6} else "shm"
    tuner = Tuner(n, hl, klass, Machine({"shm": SHM, "tcp": TCP}, GAMMA, COPY, 4), [4] * n)
    assert tuner.net().shape() is None
    assert tuner.model("allreduce", "ring", 1 << 20).time == _full(tuner, "allreduce", "ring", 1 << 20)


PRUNED = [("allreduce", 16, 8, 1 << 20), ("allgather", 16, 8, 1 << 12), ("alltoall", 16, 4, 1 << 16),
          ("broadcast", 4, 4, 1 << 16)]


@pytest.mark.parametrize("primitive,hosts,per_host,nbytes", PRUNED)
def test_choose_leaves_out_only_what_cannot_be_the_argmin(primitive, hosts, per_host, nbytes):
    """choose() walks algorithms in the order of their bounds and leaves out those bounded above the
    best so far: its choice is the full table's argmin, every bound is below its algorithm's estimate,
    and something was left out (the bound does work)."""
    tuner, _ = _pair(hosts, per_host, per_host)
    table = tuner.table(primitive, nbytes)
    costs, skipped = tuner._argmin(primitive, nbytes, 4)
    assert tuner.choose(primitive, nbytes) == min(table, key=lambda a: (table[a].time, a))
    assert skipped and all(table[a].time > b for a, b in skipped.items())
    assert all(costs[a] == table[a] for a in costs) and set(costs) | set(skipped) == set(table)


@pytest.mark.skipif(fast._simcore is None, reason="the C core (pyxccl.tuning._simcore) is not built")
@pytest.mark.parametrize("primitive", ["allreduce", "alltoall"])
def test_the_folded_walk_in_python_is_the_c_cores(primitive, monkeypatch):
    """Without the C core (PYXCCL_SIMCORE=0) the tuner's folded net (cost.Net with a symmetry: channels,
    wakes and host links folded) gives what the C core gives on the same folded schedules, bit for bit."""
    monkeypatch.setattr(select, "FOLD_ABOVE", 0)
    tuner, _ = _pair(4, 4, 2)
    names = [a for a in algorithms.algorithms(primitive) if not registry.lookup(primitive, a).segment]
    with_core = {a: tuner.model(primitive, a, 1 << 20) for a in names}
    monkeypatch.setenv("PYXCCL_SIMCORE", "0")
    assert {a: tuner.model(primitive, a, 1 << 20) for a in names} == with_core


@pytest.mark.skipif(fast._simcore is None, reason="the C core (pyxccl.tuning._simcore) is not built")
@pytest.mark.parametrize("primitive", ["allgather", "reduce_scatter", "alltoall"])
@pytest.mark.parametrize("hosts,per_host", [(4, 4), (9, 8), (16, 8)])
def test_the_direct_exchanges_fold_to_the_full_walk(primitive, hosts, per_host):
    """A direct exchange (every message of a rank in one step, to r + 1 first) folds, and its fold is
    every rank's walk to the last bit at every size: the hosts' links are booked at the earliest
    interval free (``cost.Booked``). Booked behind the last booking instead, a step's n - 1 sends
    pushed every rank walked after it behind them: the 8 B alltoall on 16 x 8 walked at 410 ms, its
    fold at 29 ms, pairwise at 7.4."""
    tuner, _ = _pair(hosts, per_host, per_host)
    n, algo = hosts * per_host, registry.lookup(primitive, "direct")
    for nbytes in (8, 64 << 10, 1 << 20, 16 << 20):
        args = PRIMITIVES[primitive].sized(n, nbytes, 4)
        build = lambda r: algo.schedule(r, n, **args)
        sym, reps = symmetric.fold(algo.symmetry, build, hosts, per_host, False)
        assert sym is not None, reps
        net = tuner.net()
        full = fast.run([build(r) for r in range(n)], 4, net)[0]
        assert fast.run(reps, 4, net.folded(sym))[0] == full, nbytes
        # a rank's n - 1 sends cost it (n - 1) alpha / 2 of its processor at least, and no more than
        # twice that where the links are not what holds it up (8 B)
        if nbytes == 8:
            assert full.time < 2 * (n - 1) * TCP.alpha / 2, full.time


def test_a_link_is_booked_at_its_earliest_free_interval():
    """``cost.Booked``: a transfer takes the earliest interval at or after its time that is free on
    every resource it crosses; touching intervals join; one of no length holds nothing."""
    from pyxccl.tuning.cost import Booked
    b = Booked()
    assert b.take(("a",), 0.0, 1.0) == 0.0
    assert b.take(("a",), 2.0, 1.0) == 2.0
    assert b.take(("a",), 0.5, 1.0) == 1.0            # the gap [1, 2) fits exactly, and joins both
    assert (b.starts["a"], b.ends["a"]) == ([0.0], [3.0])
    assert b.take(("a",), 0.5, 0.5) == 3.0
    assert b.take(("a",), 1.0, 0.0) == 1.0 and b.ends["a"] == [3.5]     # no length: it holds nothing
    assert b.take(("b",), 5.0, 1.0) == 5.0
    assert b.take(("a", "b"), 3.0, 1.0) == 3.5        # free on a from 3.5, on b until 5
    assert b.take(("a", "b"), 3.0, 1.0) == 6.0        # a is free from 4.5, b from 6
    assert (b.starts["a"], b.ends["a"], b.starts["b"], b.ends["b"]) == ([0.0, 6.0], [4.5, 7.0], [3.5, 5.0],
                                                                        [4.5, 7.0])


def _phased():
    return [a for p in PRIMITIVES for a in registry.records(p) if a.phases]


def test_the_phases_run_one_after_the_other_are_the_schedule():
    """``Algorithm.phases``: a rank's phases' steps, one after the other, are its schedule's."""
    assert {(a.primitive, a.name) for a in _phased()} >= {("broadcast", "scatter_allgather"),
                                                          ("reduce", "reduce_scatter_gather")}
    for algo in _phased():
        for n in [*range(1, 10), 16, 33]:
            for nbytes in (0, 4, 4 * n + 8, 1 << 20):
                for root in sorted({0, n - 1, n // 2}):
                    args = PRIMITIVES[algo.primitive].sized(n, nbytes, 4, root)
                    for r in range(n):
                        steps = [st for part in algo.parts() for st in part.schedule(r, n, **args).steps]
                        assert steps == algo.schedule(r, n, **args).steps, (algo.name, n, nbytes, root, r)


#: how far the phases priced apart may be from every rank's walk of the whole: the broadcast's ring waits for
#: every rank's first step (measured: 2.4e-4 or better); the reduce's gather is walked from where each rank's
#: ring ended, without the ring's link bookings it meets (measured: 2.8% or better)
PHASED_WITHIN = {"scatter_allgather": 5e-4, "reduce_scatter_gather": 3e-2}


@pytest.mark.skipif(fast._simcore is None, reason="the C core (pyxccl.tuning._simcore) is not built")
@pytest.mark.parametrize("hosts,per_host,cores", [(9, 8, 8), (16, 8, 8), (9, 8, 2), (33, 2, 2), (32, 4, 4)])
def test_the_phases_priced_apart_are_the_full_walk(hosts, per_host, cores):
    """Above FOLD_ABOVE the tuner prices a phased algorithm by its phases (``select._phase_estimate``): every
    rank's walk of the whole gives the same within ``PHASED_WITHIN``."""
    tuner, _ = _pair(hosts, per_host, cores)
    n = hosts * per_host
    assert n > select.FOLD_ABOVE
    assert set(PHASED_WITHIN) == {a.name for a in _phased()}
    for algo in _phased():
        assert tuner._phased(algo)
        for nbytes in (64 << 10, 1 << 20, 16 << 20, 256 << 20):
            args = PRIMITIVES[algo.primitive].sized(n, nbytes, 4)
            full = fast.run([algo.schedule(r, n, **args) for r in range(n)], 4, tuner.net())[0].time
            got = tuner.model(algo.primitive, algo.name, nbytes).time
            assert got == pytest.approx(full, rel=PHASED_WITHIN[algo.name]), (algo.name, nbytes)
