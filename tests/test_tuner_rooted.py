"""The arrays of every rank of a rooted tree algorithm made at once in numpy (``tuning/rooted.py``), beside
what they replace: the same arrays, bit for bit, as the schedules built rank by rank and converted
(``compact.convert``), over layouts of hosts (blocks, strided, of different sizes, shuffled), sizes on
both sides of the hierarchical broadcast's shard threshold, roots and counts with empty blocks; and the
tuner's estimates and choices the same with them as without."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pyxccl.algorithms import hierarchical, registry
from pyxccl.primitives import PRIMITIVES
from pyxccl.tuning import compact, rooted, select

from test_tuner_bound import _tuner
from test_tuner_builders import _hosts

COVERED = [("broadcast", "binomial"), ("reduce", "binomial"), ("gather", "binomial"), ("scatter", "binomial"),
           ("broadcast", "hierarchical"), ("broadcast", "chain"), ("broadcast", "scatter_allgather"),
           ("reduce", "reduce_scatter_gather"), ("gather", "direct"), ("scatter", "direct"),
           ("gather", "hierarchical"), ("scatter", "hierarchical"), ("broadcast", "scatter_allgather/scatter_phase"),
           ("reduce", "reduce_scatter_gather/gather_phase")]
#: covered on hosts of consecutive ranks only (elsewhere the root regroups the blocks: None, built rank by rank)
CONSECUTIVE = {("gather", "hierarchical"), ("scatter", "hierarchical")}


def _consecutive(hl) -> bool:
    groups = hierarchical.host_groups(len(hl), hl)[0]
    return [r for g in groups for r in g] == list(range(len(hl)))
SHAPES = [(1, 1), (1, 5), (2, 1), (2, 3), (3, 4), (4, 2), (5, 3), (8, 4), (7, 7), (3, 16), (33, 2)]
KINDS = ["blocks", "strided", "uneven", "shuffled"]
# elements of a float32 call: 0, a few, around SHARD_MIN (where hierarchical broadcast cuts shards), large
SIZES = [0, 4, 12, 1000, 4 * (hierarchical.SHARD_MIN - 1), 4 * hierarchical.SHARD_MIN, 3 << 18, 17 << 20]


def _same(got: compact.Compact, want: compact.Compact) -> bool:
    """``got`` (its repeated steps written out: ``Compact.expanded``) is ``want``, bit for bit."""
    got = got.expanded()
    if not got.equal(want) or (got.skip is None) != (want.skip is None):
        return False
    if got.skip is not None and not np.array_equal(got.skip, want.skip):
        return False
    return all(getattr(got, f).dtype == getattr(want, f).dtype for f in ("kind", "red", "peer", "count", "touch"))


def _algorithm(prim: str, name: str) -> registry.Algorithm:
    """A registered algorithm, or a phase of one ("name/builder": ``Algorithm.parts``)."""
    whole = registry.lookup(prim, name.split("/")[0])
    return whole if "/" not in name else next(a for a in whole.parts() if a.name == name)


def _built(prim: str, name: str, n: int, hl, args: dict) -> compact.Compact:
    algo = _algorithm(prim, name)
    return compact.convert([algo.schedule(r, n, hosts=hl, **args) for r in range(n)], written=True)


@pytest.mark.parametrize("prim,name", COVERED)
def test_arrays_are_the_converted_builds(prim, name):
    """Every layout, size and a few roots (first, last, middle, another): the arrays of the schedules."""
    cases = 0
    for h, p in SHAPES:
        for kind in KINDS:
            hl = _hosts(h, p, kind)
            n = len(hl)
            for nbytes in SIZES:
                for root in sorted({0, n - 1, n // 2, 7 * n // 10}):
                    args = PRIMITIVES[prim].sized(n, nbytes, 4, root)
                    got = rooted.arrays(prim, name, n, hl, dict(args))
                    if got is None and (prim, name) in CONSECUTIVE and not _consecutive(hl):
                        continue
                    assert got is not None
                    assert _same(got, _built(prim, name, n, hl, args)), (h, p, kind, nbytes, root)
                    cases += 1
    assert cases > 700


@pytest.mark.parametrize("prim", ["gather", "scatter"])
@pytest.mark.parametrize("name", ["binomial", "direct", "hierarchical"])
@pytest.mark.parametrize("seed", range(4))
def test_blocks_of_any_size_some_empty(prim, name, seed):
    """Blocks of different sizes, some empty (the ops and steps that move nothing are left out as the
    builders leave them out): the arrays of the schedules (hierarchical: on hosts of 4 consecutive ranks,
    the last host maybe smaller)."""
    rng = random.Random(seed)
    for n in (1, 2, 5, 8, 13, 32):
        counts = [rng.choice((0, 0, 1, 3, 1000)) for _ in range(n)]
        hl = [r // 4 for r in range(n)] if name == "hierarchical" else None
        for root in {0, n - 1, rng.randrange(n)}:
            args = dict(counts=counts, root=root)
            assert _same(rooted.arrays(prim, name, n, hl, dict(args)), _built(prim, name, n, hl, args))


def test_what_it_does_not_cover_is_none():
    n, hl = 8, [r // 4 for r in range(8)]
    assert rooted.arrays("broadcast", "hierarchical", n, hl, dict(count=10, root=0, inner="chain")) is None
    assert rooted.arrays("broadcast", "binomial", n, None, dict(count=10, root=0, other=1)) is None
    assert not rooted.covers("allreduce", "ring") and rooted.covers("gather", "binomial")
    assert rooted.arrays("gather", "hierarchical", n, [r % 2 for r in range(n)], dict(counts=[1] * n, root=0)) is None
    assert rooted.cheap("gather", "binomial") and not rooted.cheap("broadcast", "scatter_allgather")
    big = 1 + int((rooted.RING_OPS / 2) ** 0.5)                # its ring phases: more than RING_OPS operations
    assert rooted.arrays("broadcast", "scatter_allgather", big, None, dict(count=10, root=0)) is None
    assert rooted.arrays("reduce", "reduce_scatter_gather", big, None, dict(count=10, root=0)) is None


@pytest.mark.parametrize("hosts,per_host", [(2, 4), (3, 5), (16, 4), (40, 3)])
@pytest.mark.parametrize("prim", ["broadcast", "reduce", "gather", "scatter"])
def test_tuner_estimates_and_choices_are_those_of_the_builds(hosts, per_host, prim, monkeypatch):
    """Every algorithm's estimate and the choice, at sizes on both sides of the shard threshold, with the
    arrays and with every rank built (below and above ``FOLD_ABOVE``): equal, and the arrays were used."""
    _with_and_without("arrays", monkeypatch, hosts, per_host, prim, [8, 4096, 4 * hierarchical.SHARD_MIN, 1 << 20])


def _with_and_without(method: str, monkeypatch, hosts: int, per_host: int, prim: str, sizes) -> None:
    """Every algorithm's estimate and the choice at ``sizes``, with ``select._Ranks``'s ``method`` (arrays made
    without building the schedules) and with it giving None (every schedule built): equal, and it was used."""
    used = []
    made = getattr(select._Ranks, method)

    def counted(self, *args):
        got = made(self, *args)
        used.append(got is not None)
        return got

    def tables():
        return [({a: repr(e) for a, e in _tuner(hosts, per_host).table(prim, nb).items()},
                 _tuner(hosts, per_host).choose(prim, nb)) for nb in sizes]

    monkeypatch.setattr(select._Ranks, method, counted)
    fast = tables()
    assert any(used)
    monkeypatch.setattr(select._Ranks, method, lambda self, *args: None)
    assert fast == tables()


def test_a_pair_of_another_class_walks_the_builds(monkeypatch):
    """Pairs between hosts whose class is not "tcp" (the C core's shape cannot say it): the arrays are
    made, refused by the class check, and every rank is built and walked in Python, as without them."""
    hosts, per_host = 40, 3
    n = hosts * per_host
    hl = [r // per_host for r in range(n)]
    odd = ({0, 3}, {0, 4})              # binomial's and hierarchical's first message between hosts

    def tuner():
        t = _tuner(hosts, per_host)
        t.klass = lambda a, b: ("self" if a == b else "shm" if hl[a] == hl[b] else
                                "tcp_local" if {a, b} in odd else "tcp")
        return t

    classes = select.Tuner._classes
    refused = []

    def check(self, scheds, shape):
        ok = classes(self, scheds, shape)
        refused.append(isinstance(scheds, compact.Compact) and not ok)
        return ok

    monkeypatch.setattr(select.Tuner, "_classes", check)
    fast = [({a: repr(e) for a, e in tuner().table(prim, 1 << 20).items()}, tuner().choose(prim, 1 << 20))
            for prim in ("broadcast", "gather")]
    assert any(refused)
    monkeypatch.setattr(select._Ranks, "arrays", lambda self: None)
    assert fast == [({a: repr(e) for a, e in tuner().table(prim, 1 << 20).items()}, tuner().choose(prim, 1 << 20))
                    for prim in ("broadcast", "gather")]


@pytest.mark.parametrize("seed", range(20))
def test_operations_repeated_are_those_written_out(seed):
    """``Ops.add``'s ``rep``: operations that stand for themselves at several step keys, cut where others
    begin or end among those keys, give the arrays of the same operations added key by key, written out
    (``Compact.expanded``); steps alike in a row are held once."""
    rng = random.Random(seed)
    n, ranks = 6, sorted(rng.sample(range(6), rng.randint(1, 6)))
    held, out = rooted.Ops(n, ranks), rooted.Ops(n, ranks)
    for _ in range(rng.randint(1, 12)):
        m = rng.randint(1, 4)
        rank = [rng.choice(ranks) for _ in range(m)]
        step, rep = [rng.randint(0, 20) for _ in range(m)], [rng.choice((1, 1, 2, 5, 9)) for _ in range(m)]
        kind, peer = rng.choice((compact.COPY, compact.SEND, compact.RECV)), [rng.randrange(n) for _ in range(m)]
        count = [rng.choice((0, 3, 7)) for _ in range(m)]
        held.add(rank, step, kind, 0 if kind == compact.COPY else peer, count, red=int(kind == compact.RECV), rep=rep)
        for i in range(m):
            for k in range(rep[i]):
                out.add([rank[i]], step[i] + k, kind, 0 if kind == compact.COPY else peer[i], count[i], red=int(kind == compact.RECV))
    got, want = held.compact(), out.compact()
    assert got.expanded().equal(want) and want.rep is None
    assert got.steps == want.steps and len(got.kind) <= len(want.kind)
