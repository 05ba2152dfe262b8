"""Some ranks' arrays of the algorithms that fold, made in numpy (``tuning/shifted.py``), beside what they
replace: the same arrays, bit for bit, as the schedules built rank by rank and converted
(``compact.convert``), for every rank, host 0's and single ranks, over numbers of ranks, sizes (a few
elements on many ranks: empty chunks) and blocks of different sizes, some empty; and the tuner's estimates
and choices the same with them as without."""
from __future__ import annotations

import random

import pytest

from pyxccl.algorithms import hierarchical
from pyxccl.primitives import PRIMITIVES
from pyxccl.tuning import compact, shifted

from test_tuner_rooted import _algorithm, _same, _with_and_without

COVERED = [("allreduce", "ring"), ("allreduce", "direct"), ("allreduce", "bcube"), ("allreduce", "reduce_broadcast"), ("allgather", "ring"), ("reduce_scatter", "ring"), ("allgather", "direct"),
           ("reduce_scatter", "direct"), ("alltoall", "direct"), ("alltoall", "pairwise"),
           ("broadcast", "scatter_allgather/ring_phase"),
           ("reduce", "reduce_scatter_gather/reduce_scatter_phase_of"), ("reduce", "reduce_scatter_gather")]
SIZES = [0, 4, 12, 100, 4000, 3 << 18]


def _built(prim: str, name: str, ranks, n: int, args: dict, hosts=None) -> compact.Compact:
    algo = _algorithm(prim, name)
    return compact.convert([algo.schedule(r, n, hosts=hosts, **args) for r in ranks], written=True)


def _ranks_of(n: int, rng: random.Random) -> list[list[int]]:
    """Every rank, the first few (host 0's), one rank, a few others in order."""
    return [list(range(n)), list(range(min(n, 4))), [n - 1], sorted(rng.sample(range(n), min(n, 3)))]


@pytest.mark.parametrize("prim,name", COVERED)
def test_arrays_are_the_converted_builds(prim, name):
    rng = random.Random(7)
    cases = 0
    for n in (1, 2, 3, 5, 8, 13, 24):
        for nbytes in SIZES:
            for root in sorted({0, n - 1, n // 2}):
                args = PRIMITIVES[prim].sized(n, nbytes, 4, root)
                for ranks in _ranks_of(n, rng):
                    got = shifted.arrays(prim, name, ranks, n, dict(args))
                    assert _same(got, _built(prim, name, ranks, n, args)), (n, nbytes, root, ranks)
                    cases += 1
    assert cases > 300


@pytest.mark.parametrize("n", [4, 9, 16, 27, 32, 64])
def test_bcube_on_cubes_of_many_dimensions(n):
    """BCube where the ranks make a cube of two or more dimensions (above, most counts are a single group):
    regions that shrink unevenly, some empty at a few elements."""
    rng = random.Random(n)
    for nbytes in SIZES + [4 * 1001]:
        args = PRIMITIVES["allreduce"].sized(n, nbytes, 4)
        for ranks in _ranks_of(n, rng):
            assert _same(shifted.arrays("allreduce", "bcube", ranks, n, dict(args)),
                         _built("allreduce", "bcube", ranks, n, args)), (n, nbytes, ranks)


@pytest.mark.parametrize("prim,name", [c for c in COVERED if PRIMITIVES[c[0]].shape in ("blocks", "pairs")])
@pytest.mark.parametrize("seed", range(4))
def test_blocks_of_any_size_some_empty(prim, name, seed):
    """Blocks of different sizes, some empty: the ops and steps that move nothing are left out as the
    builders leave them out."""
    rng = random.Random(seed)
    for n in (1, 2, 5, 8, 13):
        block = [rng.choice((0, 0, 1, 3, 1000)) for _ in range(n)]
        args = (dict(send_counts=block, recv_counts=[rng.choice((0, 2, 5)) for _ in range(n)])
                if PRIMITIVES[prim].shape == "pairs" else dict(counts=block))
        for ranks in _ranks_of(n, rng):
            assert _same(shifted.arrays(prim, name, ranks, n, dict(args)), _built(prim, name, ranks, n, args))


@pytest.mark.parametrize("hosts,per_host", [(1, 4), (2, 1), (2, 3), (4, 4), (5, 3), (3, 8)])
def test_hierarchical_allreduce_on_even_hosts(hosts, per_host):
    """The hierarchical allreduce's pipeline of chunks (sizes of one to eight chunks), its hosts blocks of
    ranks or strided; on uneven hosts, None (built rank by rank)."""
    rng = random.Random(hosts * per_host)
    n = hosts * per_host
    for hl in ([r // per_host for r in range(n)], [r % hosts for r in range(n)]):
        for nbytes in (0, 4, 100, 4 << 20, 40 << 20):
            args = PRIMITIVES["allreduce"].sized(n, nbytes, 4)
            for ranks in _ranks_of(n, rng):
                got = shifted.arrays("allreduce", "hierarchical", ranks, n, dict(args, hosts=hl))
                assert _same(got, _built("allreduce", "hierarchical", ranks, n, args, hl)), (hl, nbytes, ranks)
    uneven = [0, 0, 0, 1, 1, 2, 2]
    assert shifted.arrays("allreduce", "hierarchical", [0], 7, dict(count=100, hosts=uneven)) is None


@pytest.mark.parametrize("hosts,per_host", [(2, 2), (2, 3), (4, 4), (5, 3), (3, 8)])
@pytest.mark.parametrize("prim", ["alltoall", "allgather", "reduce_scatter"])
def test_hierarchical_exchanges_on_even_hosts(prim, hosts, per_host):
    """The hierarchical alltoall's, allgather's and reduce-scatter's regroupings and phases, their hosts
    blocks of ranks, strided or shuffled (the allgather declines where its columns are in rank order: None); one host, one rank a host,
    uneven hosts or blocks of different sizes: None (built rank by rank)."""
    rng = random.Random(hosts * per_host)
    n = hosts * per_host
    shuffled = list(range(n))
    rng.shuffle(shuffled)
    made = 0
    for hl in ([r // per_host for r in range(n)], [r % hosts for r in range(n)], [q // per_host for q in shuffled]):
        for nbytes in (0, 4, 100 * n, 4 << 20):
            args = PRIMITIVES[prim].sized(n, nbytes, 4)
            for ranks in _ranks_of(n, rng):
                got = shifted.arrays(prim, "hierarchical", ranks, n, dict(args, hosts=hl))
                if got is None and prim == "allgather" and hierarchical.Layout(0, n, hl).grid == list(range(n)):
                    continue            # (its columns in rank order: declined)
                assert _same(got, _built(prim, "hierarchical", ranks, n, args, hl)), (hl, nbytes, ranks)
                made += 1
    assert made >= 16
    pairs = PRIMITIVES[prim].shape == "pairs"
    uneven = dict(send_counts=[1, 2, 1, 1], recv_counts=[1, 2, 1, 1]) if pairs else dict(counts=[1, 2, 1, 1])
    assert shifted.arrays(prim, "hierarchical", [0], 4, dict(uneven, hosts=[0, 0, 1, 1])) is None
    for hl in ([0] * 4, [0, 1, 2, 3], [0, 0, 0, 1]):
        equal = dict(send_counts=[1] * 4, recv_counts=[1] * 4) if pairs else dict(counts=[1] * 4)
        assert shifted.arrays(prim, "hierarchical", [0], 4, dict(equal, hosts=hl)) is None


@pytest.mark.parametrize("n,layouts", [(4, [None]), (6, [None, [0, 0, 0, 1, 1, 1]]), (9, [None]),
                                       (12, [None, [r // 4 for r in range(12)], [r % 3 for r in range(12)]]),
                                       (16, [None, [r // 2 for r in range(16)]]), (7, [None])])
def test_torus2d_allreduce(n, layouts):
    """The 2D-torus allreduce on the most square grid or on hosts (blocks or strided), empty parts
    included; where there is no grid (7 ranks), None as the builder raises."""
    rng = random.Random(n)
    for hl in layouts:
        for nbytes in (0, 4, 12, 100, 4 << 20):
            args = PRIMITIVES["allreduce"].sized(n, nbytes, 4)
            for ranks in _ranks_of(n, rng):
                got = shifted.arrays("allreduce", "torus2d", ranks, n, dict(args, hosts=hl))
                if n == 7:
                    assert got is None
                    with pytest.raises(ValueError):
                        _built("allreduce", "torus2d", ranks, n, args, hl)
                    continue
                assert _same(got, _built("allreduce", "torus2d", ranks, n, args, hl)), (hl, nbytes, ranks)


def test_what_it_does_not_cover_is_none():
    assert shifted.arrays("allreduce", "halving_doubling", [0], 4, dict(count=8)) is None
    assert not shifted.covers("broadcast", "binomial") and shifted.covers("allreduce", "ring")


@pytest.mark.parametrize("hosts,per_host", [(9, 8), (17, 4), (33, 2)])
@pytest.mark.parametrize("prim", ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce"])
def test_tuner_estimates_and_choices_are_those_of_the_builds(hosts, per_host, prim, monkeypatch):
    """Above ``FOLD_ABOVE`` ranks, every algorithm's estimate and the choice at a few sizes, with the arrays
    and with host 0's ranks built: equal, and the arrays were used."""
    _with_and_without("part", monkeypatch, hosts, per_host, prim, [8, 4096, 1 << 20, 1 << 24])


@pytest.mark.parametrize("name", ["ring", "torus2d", "hierarchical", "bcube", "direct"])
@pytest.mark.parametrize("nbytes", [8, 4000, 3 << 20])
def test_ranks_made_alone_then_joined(name, nbytes):
    """The tuner's ``_Ranks.part`` joins ranks made alone before (rank 0's for its bound, a spot) to the others'
    (``compact.joined``): the same arrays as all made at once."""
    from pyxccl.algorithms import registry
    from pyxccl.tuning.select import _Ranks

    hosts, per_host = 4, 4
    n = hosts * per_host
    hl = [r // per_host for r in range(n)]
    args = PRIMITIVES["allreduce"].sized(n, nbytes, 4)
    algo = registry.lookup("allreduce", name)
    key = (*range(per_host), per_host, n - 1, 9)
    fresh = _Ranks(algo, n, hl, None, args).part(tuple(sorted(key)))
    ranks = _Ranks(algo, n, hl, None, args)
    for r in (0, per_host, 9):
        ranks.part((r,))
    assert compact.joined([fresh]) is fresh
    assert _same(ranks.part(tuple(sorted(key))), fresh.expanded())
