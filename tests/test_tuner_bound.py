"""The tuner's lower bounds (``tuning/bound.py``): never above the model's estimate, and what they leave
out of ``choose`` can never be its choice; the builders they made cheap build what they built before."""
from __future__ import annotations

import pytest

from pyxccl import algorithms
from pyxccl.algorithms import registry, ring
from pyxccl.primitives import PRIMITIVES
from pyxccl.schedule import Recv, Send
from pyxccl.tuning import Machine, Tuner, bound, select

from test_tuner_fold import COPY, GAMMA, SHM, TCP

PRIMS = ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce", "gather", "scatter"]


def _tuner(hosts: int, per_host: int, cores: int | None = None) -> Tuner:
    n = hosts * per_host
    hl = [r // per_host for r in range(n)]
    return Tuner(n, hl, lambda a, b: "self" if a == b else "shm" if hl[a] == hl[b] else "tcp",
                 Machine({"shm": SHM, "tcp": TCP}, GAMMA, COPY, cores or per_host), [cores or per_host] * n)


@pytest.mark.parametrize("hosts,per_host,cores", [(2, 4, 4), (4, 4, 2), (8, 2, 2), (16, 4, 4), (3, 5, 5)])
@pytest.mark.parametrize("nbytes", [8, 4096, 1 << 20, 16 << 20])
def test_bounds_are_never_above_the_estimate(hosts, per_host, cores, nbytes):
    """For every algorithm of every primitive, walked at message level (every rank): ``local`` and
    ``path`` are at most the estimate, and on a communicator of many hosts ``path`` is above
    ``local`` somewhere (the chains it follows are there)."""
    t = _tuner(hosts, per_host, cores)
    above = 0
    for prim in PRIMS:
        for name in algorithms.algorithms(prim):
            got = t._builder(prim, name, nbytes, 4)
            if got is None or got[0].segment:
                continue
            algo, get = got
            try:
                est = t._estimate(algo, get, 4)
            except ValueError:
                continue
            if est is None:
                continue
            local, path = t.bound(get(0), 4), t.path_bound(get, 4)
            assert local <= est.time, (prim, name)
            assert path <= est.time, (prim, name, path, est.time)
            if algo.relay:
                chain = t.relay_bound(get, 4)
                assert chain <= est.time, (prim, name, chain, est.time)
                assert chain > 0 or nbytes < 8 or hosts * per_host < 3, (prim, name)
            if algo.rotates:
                host = t.host_bound(get, 4)
                assert host <= est.time, (prim, name, host, est.time)
                assert host > 0 or hosts == 1 or nbytes < 4096, (prim, name)
            above += path > local * 1.5
    if hosts >= 8:
        assert above


@pytest.mark.parametrize("prim,nbytes,by_path", [("allreduce", 8, True), ("allreduce", 1 << 20, True),
                                                 ("broadcast", 1 << 16, True), ("broadcast", 8, True),
                                                 ("gather", 4096, False), ("reduce", 1 << 20, False)])
def test_choose_above_the_fold_is_the_full_tables_argmin(prim, nbytes, by_path, monkeypatch):
    """On 32 hosts x 4 (128 ranks: above ``FOLD_ABOVE``, where algorithms that do not fold are put last
    and left out by their path bound), the choice is the argmin of the table of every algorithm walked
    in full, everything left out has an estimate above its bound, and (``by_path``) the path bound left
    out at least one algorithm whose local bound did not."""
    t = _tuner(32, 4)
    costs, skipped = t._argmin(prim, nbytes, 4)
    monkeypatch.setattr(select, "FOLD_ABOVE", 1 << 30)        # the table: every rank walked
    full = _tuner(32, 4).table(prim, nbytes)
    best = min(full, key=lambda a: (full[a].time, a))
    assert min(costs, key=lambda a: (costs[a].time, a)) == best
    assert set(costs) | set(skipped) == set(full)
    assert all(full[a].time > b for a, b in skipped.items())
    local = {a: t.bound(t._builder(prim, a, nbytes, 4)[1](0), 4) for a in skipped}
    assert any(local[a] <= full[best].time for a in skipped) == by_path, (skipped, local)


@pytest.mark.parametrize("n", [3, 8, 13])
@pytest.mark.parametrize("count", [1, 2, 5, 16, 100])
def test_ring_skips_only_steps_that_move_nothing(n, count, monkeypatch):
    """The ring's phases loop only over the steps whose chunks hold something: the schedules are those of
    the loop over every step (``_steps`` as ``range(n - 1)``), for every rank, allreduce and the uneven
    counts of reduce_scatter and allgather (zeros among them)."""
    def every(prims):
        out = []
        for prim, args in prims:
            algo = registry.lookup(prim, "ring")
            out += [algo.schedule(r, n, **args).steps for r in range(n)]
        return out
    uneven = [count if i % 3 else 0 for i in range(n)]
    prims = [("allreduce", PRIMITIVES["allreduce"].sized(n, count * 4, 4)),
             ("reduce_scatter", {"counts": uneven}), ("allgather", {"counts": uneven})]
    fast = every(prims)
    monkeypatch.setattr(ring, "_steps", lambda counts, n, a: range(n - 1))
    assert fast == every(prims)


@pytest.mark.skipif(bound._simcore is None, reason="the C core is not built (setup.py build_ext)")
@pytest.mark.parametrize("hosts,per_host", [(4, 8), (16, 8), (5, 3), (64, 4)])
@pytest.mark.parametrize("nbytes", [8, 4096, 1 << 20])
def test_path_bounds_chains_in_c_are_the_python_relaxation(hosts, per_host, nbytes):
    """``path``'s relaxation over the chains in the C core (``_simcore.longest`` over ``_chains``' arrays)
    equals the Python reference (``_longest`` over ``_ranks``) to the bit: every algorithm of every
    primitive, searches of 8, 32 and 128 ranks."""
    t = _tuner(hosts, per_host)
    shape, n, cases = t.net().shape(), hosts * per_host, 0
    for prim in PRIMS:
        for name in algorithms.algorithms(prim):
            got = t._builder(prim, name, nbytes, 4)
            if got is None or got[0].segment:
                continue
            for most in (8, 32, 128):
                try:
                    found = bound._search(got[1], n, most)
                except ValueError:
                    break                       # cannot run this call here
                order, scheds, _ = found
                want = bound._longest(order, bound._ranks(scheds, shape, 4))
                assert bound._simcore.longest(*bound._chains(scheds, shape, 4), bound.PASSES) == want, \
                    (prim, name, most)
                cases += want > 0
    assert cases > 50


def _rotating():
    return [a for p in PRIMS for a in registry.records(p) if a.rotates]


@pytest.mark.parametrize("n", [*range(1, 18), 24, 33, 64, 100])
@pytest.mark.parametrize("nbytes", [8, 4096, 1 << 20, (16 << 20) + 12])
def test_what_rotates_sends_what_rank_0_sends_moved(n, nbytes):
    """The claim ``Algorithm.rotates`` makes (what ``bound.host_link`` reads rank 0's schedule for), proven
    on every rank: rank r sends to r + d what rank 0 sends to d, within one element a message of rank 0's,
    what the spot check asks of one rank."""
    assert {(a.primitive, a.name) for a in _rotating()} >= {("alltoall", "bruck"), ("allreduce", "direct")}
    for algo in _rotating():
        args = PRIMITIVES[algo.primitive].sized(n, nbytes, 4)
        want, msgs = [0] * n, [0] * n
        for o in (o for st in algo.build(0, n, **dict(args)).steps for o in st if type(o) is Send):
            want[o.peer] += o.count
            msgs[o.peer] += 1
        for r in range(1, n):
            got = [0] * n
            for o in (o for st in algo.build(r, n, **dict(args)).steps for o in st if type(o) is Send):
                got[(o.peer - r) % n] += o.count
            assert all(abs(g - w) <= k for g, w, k in zip(got, want, msgs)), (algo.name, n, r, got, want)


def test_the_host_link_bound_refuses_what_does_not_rotate():
    """On an algorithm whose ranks send differently (the hierarchical alltoall: leaders' columns; the
    binomial broadcast), the check on the spot rank gives 0 rather than a bound."""
    t = _tuner(8, 4)
    for prim, name in (("alltoall", "hierarchical"), ("broadcast", "binomial")):
        algo, get = t._builder(prim, name, 1 << 20, 4)
        assert t.host_bound(get, 4) == 0.0, (prim, name)


@pytest.mark.parametrize("prim", ["allreduce", "allgather", "reduce_scatter"])
def test_choose_leaves_out_the_direct_exchanges_by_their_hosts_link(prim):
    """At 16 hosts x 4 and 64 MiB the direct exchanges (every pair at once: each host's link carries
    n - 1 of n blocks of the whole vector, where the ring's carries one) are left out by the host link
    bound, not walked; the choice is the full table's argmin. (The direct alltoall moves what every
    alltoall moves across hosts: its bound is the others' too, and it is folded instead.)"""
    t = _tuner(16, 4)
    costs, skipped = t._argmin(prim, 64 << 20, 4)
    assert "direct" in skipped and "direct" not in costs
    full = t.table(prim, 64 << 20)
    assert min(full, key=lambda a: (full[a].time, a)) == min(costs, key=lambda a: (costs[a].time, a))
    assert full["direct"].time >= skipped["direct"]


def test_choose_leaves_out_bruck_by_its_hosts_link():
    """At 128 hosts x 8, 1 MiB, Bruck's alltoall (each block crosses about log2(n)/2 links) is left out by
    the host link bound: its estimate is above the winner's, which is the full table's argmin."""
    t = _tuner(128, 8)
    costs, skipped = t._argmin("alltoall", 1 << 20, 4)
    assert "bruck" in skipped and "bruck" not in costs
    full = t.table("alltoall", 1 << 20)
    assert min(full, key=lambda a: (full[a].time, a)) == min(costs, key=lambda a: (costs[a].time, a))
    assert full["bruck"].time >= skipped["bruck"]


@pytest.mark.parametrize("prim,name", [(a.primitive, a.name) for p in PRIMS for a in registry.records(p) if a.relay])
def test_what_relays_receives_first_from_the_position_before(prim, name):
    """``Algorithm.relay``, over many sizes and roots: position i's first receive is from position i - 1,
    of as many elements as position 1's, and position i - 1 sends it in a later step than its own first
    receive ends (so the first block crosses the hops one after another: ``bound.relay``)."""
    algo = registry.lookup(prim, name)
    for n in [3, 4, 5, 8, 13, 33]:
        for nbytes in (8, 4096, 1 << 20, 17 << 20):
            for root in sorted({0, 1, n - 1, n // 2}):
                args = PRIMITIVES[prim].sized(n, nbytes, 4, root)
                s = [algo.schedule((root + i) % n, n, **args) for i in range(n)]     # by position

                def first(sched):
                    return next((k, o) for k, st in enumerate(sched.steps) for o in st if type(o) is Recv)
                size = first(s[1])[1].count
                for i in range(1, n):
                    k, o = first(s[i])
                    assert o.peer == (root + i - 1) % n and o.count >= size and not o.reduce, (n, root, i)
                    if i + 1 < n:
                        sent = [j for j, st in enumerate(s[i].steps) for x in st
                                if type(x) is Send and x.peer == (root + i + 1) % n]
                        assert sent and sent[0] > k, (n, root, i)


def test_the_relay_bound_refuses_what_does_not_relay():
    """On a binomial broadcast (position n - 1 receives first from another than n - 2) it is 0."""
    t = _tuner(4, 4)
    algo, get = t._builder("broadcast", "binomial", 1 << 20, 4)
    assert t.relay_bound(get, 4) == 0.0
    algo, get = t._builder("broadcast", "chain", 1 << 20, 4)
    assert t.relay_bound(get, 4) > t.bound(get(0), 4)
