"""Declared symmetry (``registry.Algorithm.symmetry``, checked by ``symmetric.declared`` on a few ranks)
beside the proof it replaces in the tuner (``symmetric.find``, four other hosts built): over many layouts
(hosts x ranks per host, powers of two or not) and sizes, the two give the same answer, and where the
declaration folds, every host's schedules are host 0's moved (``symmetric._same``, every rank). A wrong
declaration falls back to the proof; the tuner's estimates are the same either way."""
from __future__ import annotations

import pytest

from pyxccl import algorithms
from pyxccl.algorithms import registry
from pyxccl.primitives import PRIMITIVES
from pyxccl.tuning import select, symmetric

from test_tuner_bound import PRIMS, _tuner

DECLARED = [(p, a.name) for p in PRIMS for a in registry.records(p) if a.symmetry]
LAYOUTS = [(h, L) for h in (2, 3, 4, 5, 8, 12) for L in (1, 2, 3, 4)] + [(16, 8), (7, 8)]
SIZES = [8, 1000, 1 << 20]


def _builder(prim: str, name: str, hosts: int, per_host: int, nbytes: int):
    """``get(rank)`` of the tuner's call (equal blocks, root 0), built once per rank; None if it cannot run."""
    algo = registry.lookup(prim, name)
    n = hosts * per_host
    if not algo.runs(n):
        return None
    hl = [r // per_host for r in range(n)]
    args = PRIMITIVES[prim].sized(n, nbytes, 4)
    built: dict = {}

    def get(r: int):
        if r not in built:
            built[r] = algo.schedule(r, n, hosts=hl, **args)
        return built[r]
    try:
        get(0)
    except ValueError:
        return None
    return get


def test_the_declarations_are_the_foldable_message_algorithms():
    """Every primitive with an algorithm that folds at scale declares it; segment algorithms declare nothing."""
    assert {n for p, n in DECLARED if p == "allreduce"} >= {"ring", "hierarchical", "recursive_doubling"}
    assert {"pairwise", "hierarchical", "bruck"} <= {n for p, n in DECLARED if p == "alltoall"}
    assert not any(a.segment and a.symmetry for p in PRIMS for a in registry.records(p))
    assert all(set(a.symmetry) <= set(symmetric.KINDS) for p in PRIMS for a in registry.records(p))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("prim,name", DECLARED)
def test_a_declared_symmetry_is_what_the_proof_finds_and_holds_on_every_host(prim, name):
    """Over every layout and size: ``declared`` folds exactly where ``find`` does, with the same move, and
    then every rank of every host is its host-0 rank moved (``_same``, op by op); where it does not fold,
    some host is not host 0's moved under any declared move (the declaration was rightly refused)."""
    algo = registry.lookup(prim, name)
    folded = refused = 0
    for hosts, per_host in LAYOUTS:
        n = hosts * per_host
        for nbytes in SIZES:
            get = _builder(prim, name, hosts, per_host, nbytes)
            if get is None:
                continue
            got = symmetric.declared(algo.symmetry, get, hosts, per_host, False)
            sym, _ = symmetric.find(get, hosts, per_host, False)
            where = (hosts, per_host, nbytes)
            assert (got[0].name if got else None) == (sym.name if sym else None), where
            if got is None:
                kinds = [k(n, per_host) for k in (symmetric.Shift, symmetric.Xor)
                         if k.name in algo.symmetry and (k is symmetric.Shift or k.applies(hosts, per_host))]
                assert not any(all(symmetric._same(get(r), get(r % per_host), k.mover(r // per_host))
                                   for r in range(per_host, n)) for k in kinds), where
                refused += 1
                continue
            dsym, reps = got
            assert [s.rank for s in reps] == list(range(per_host))
            for r in range(per_host, n):
                assert symmetric._same(get(r), reps[r % per_host], dsym.mover(r // per_host)), (where, r)
            folded += 1
    assert folded            # the grid has layouts where it folds


@pytest.mark.parametrize("prim,name", [("broadcast", "binomial"), ("allreduce", "tree"),
                                       ("allreduce", "recursive_doubling")])
def test_a_wrong_declaration_falls_back_to_the_proof(prim, name):
    """Moves declared where they do not hold (a tree, a rooted collective; XOR claimed by recursive
    doubling on 3 hosts) are refused by the spot check, and ``fold`` answers what ``find`` answers."""
    hosts, per_host = (3, 4) if name == "recursive_doubling" else (4, 4)
    get = _builder(prim, name, hosts, per_host, 1 << 20)
    assert symmetric.declared(("shift", "xor"), get, hosts, per_host, False) is None
    sym, why = symmetric.fold(("shift", "xor"), get, hosts, per_host, False)
    assert sym is None and why == symmetric.find(get, hosts, per_host, False)[1]


def test_the_spot_ranks_are_on_other_hosts_and_few():
    for hosts, per_host in [(2, 1), (2, 8), (3, 4), (512, 8)]:
        spots = symmetric.spot_ranks(hosts, per_host)
        assert 1 <= len(spots) <= 3 and all(per_host <= r < hosts * per_host for r in spots)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("hosts,per_host", [(32, 4), (16, 8), (24, 3)])
@pytest.mark.parametrize("nbytes", [8, 1 << 20])
def test_the_tuner_prices_the_same_with_and_without_declarations(hosts, per_host, nbytes, monkeypatch):
    """Above ``FOLD_ABOVE``: the costs ``_argmin`` computes with the declarations are those of the proof
    alone (``fold`` answering ``find``'s, nothing declared), bit for bit, for every primitive."""
    fast = {p: _tuner(hosts, per_host)._argmin(p, nbytes, 4) for p in PRIMS}
    proof = symmetric.find
    monkeypatch.setattr(symmetric, "fold", lambda kinds, build, hosts, per_host, ring, *a: proof(build, hosts, per_host, ring))
    for prim in PRIMS:
        costs, skipped = _tuner(hosts, per_host)._argmin(prim, nbytes, 4)
        assert fast[prim] == (costs, skipped), prim
    assert hosts * per_host > select.FOLD_ABOVE and algorithms.algorithms("allreduce")


@pytest.mark.parametrize("name", ["tree", "double_binary_tree", "reduce_broadcast", "direct"])
def test_find_builds_two_ranks_of_what_does_not_fold(name):
    """Host 1's first rank compared with rank 0 moved before host 0's every rank is built (host 1 is the
    first sample): what does not fold costs two schedules, not host 0's and the samples' (the direct
    allreduce, whose steps are alike on every rank but whose peers are in rank order, cost 18 here)."""
    hosts, per_host = 16, 8
    get = _builder("allreduce", name, hosts, per_host, 64 << 20)
    built = []
    sym, why = symmetric.find(lambda r: built.append(r) or get(r), hosts, per_host, False)
    assert sym is None and why == symmetric._NOT_SAME and built == [0, per_host]
    ring = _builder("allreduce", "ring", hosts, per_host, 64 << 20)
    assert symmetric.find(ring, hosts, per_host, False)[0] is not None


@pytest.mark.parametrize("name,hosts", [("ring", 12), ("halving_doubling", 16), ("bcube", 16)])
def test_refuted_by_the_spots_needs_no_proof(name, hosts, monkeypatch):
    """A ring (a shift: on hosts not a power of two, the only move ``find`` tries), Rabenseifner's or BCube
    (shift and XOR) at a few elements on many ranks (empty chunks on some hosts) declares every move ``find``
    would try, and the spot ranks refuse them: ``fold`` answers that it does not fold without ``find``
    building five hosts' schedules, and ``find`` agrees."""
    per_host = 4
    get = _builder("allreduce", name, hosts, per_host, 8)
    kinds = registry.lookup("allreduce", name).symmetry
    assert symmetric.find(get, hosts, per_host, False)[0] is None
    monkeypatch.setattr(symmetric, "find", lambda *a: pytest.fail("find was asked"))
    assert symmetric.fold(kinds, get, hosts, per_host, False) == (None, symmetric._NOT_SAME)
