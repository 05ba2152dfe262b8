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
from pyxccl.schedule import Copy, Recv, Schedule, Send, offsets, split_counts
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
    if kind == "shuffled":
        hl = [r // per_host for r in range(n)]
        random.Random(n).shuffle(hl)
        return hl
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
    # the same move again (another rank's): the same step object, kept; another block size, another
    hierarchical._move_equal(b, c, ("tmp", 3), np.array(keys), ("out", 7), np.array(dst))
    assert (b.steps[1] is b.steps[0]) if c else not b.steps
    hierarchical._move_equal(b, c + 1, ("tmp", 3), np.array(keys), ("out", 7), np.array(dst))
    assert repr(b.steps[-1]) != repr(a.steps)
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


def _random_schedules(seed: int, n: int) -> list[Schedule]:
    """Schedules of random operations (sends, receives, copies that reduce or not, copies of the input
    onto itself), some of their steps large and shared between schedules."""
    rng = random.Random(seed)
    bufs = ("in", "out", "tmp")

    def op():
        k = rng.randrange(4)
        if k == 0:
            return Send(rng.randrange(n), rng.choice(bufs), rng.randrange(99), rng.randrange(1, 9))
        if k == 1:
            return Recv(rng.randrange(n), rng.choice(bufs), rng.randrange(99), rng.randrange(1, 9), rng.random() < .5)
        o = rng.randrange(99)
        if k == 2:
            return Copy("in", o, "out", o, rng.randrange(1, 9))
        return Copy(rng.choice(bufs), o, rng.choice(bufs), rng.randrange(99), rng.randrange(1, 9), rng.random() < .5)

    shared = [tuple(op() for _ in range(rng.choice((255, 256, 300)))) for _ in range(3)]
    out = []
    for r in range(n):
        s = Schedule(r, n)
        for _ in range(rng.randrange(8)):
            s.steps.append(rng.choice(shared) if rng.random() < 0.4 else tuple(op() for _ in range(rng.randrange(1, 6))))
        out.append(s)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_large_steps_converted_on_their_own_are_one_conversion(seed, monkeypatch):
    """Large steps (kept by identity, converted once) among the others: the arrays of converting every
    operation together, on a first conversion and on later ones that reuse what was kept."""
    scheds = _random_schedules(seed, 6)
    compact._STEPS.clear()
    first, again = compact._convert(scheds), compact._convert(scheds)
    assert compact._STEPS or not any(len(st) >= compact.BIG_STEP for s in scheds for st in s.steps)
    monkeypatch.setattr(compact, "BIG_STEP", 1 << 30)
    plain = compact._convert(scheds)
    for got in (first, again):
        assert got.equal(plain)
        assert (got.skip is None) == (plain.skip is None)
        assert got.skip is None or np.array_equal(got.skip, plain.skip)


def _ops_plain(flat: list) -> tuple:
    """``compact._ops``, op by op as its docstrings say: (kind, red, peer, count, skip, touch)."""
    kinds = {Copy: compact.COPY, Send: compact.SEND, Recv: compact.RECV}
    kind = np.array([kinds[type(o)] for o in flat], np.int8)
    red = np.array([0 if type(o) is Send else int(o[-1]) for o in flat], np.int8)
    peer = np.array([0 if type(o) is Copy else o.peer for o in flat], np.int64)
    count = np.array([o.count for o in flat], np.int64)
    calls = ("in", "out", "tmp")
    touch = np.array([(o.src in calls) + (o.dst in calls) * (2 if o.reduce else 1) if type(o) is Copy else 0
                      for o in flat], np.int8)
    skip = [type(o) is Copy and o.src == "in" and o.dst == "out" and o.src_off == o.dst_off for o in flat]
    return kind, red, peer, count, np.array(skip) if any(skip) else None, touch


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("copies", [0.0, 0.3, 0.7, 1.0])
def test_operations_arrays_are_op_by_ops(seed, copies):
    """``_ops`` (numpy field by field where most operations are copies, else op by op) gives what reading
    each operation gives, with copies of the input onto itself, reducing copies and buffers of every name."""
    rng = random.Random(seed)
    flat = []
    for _ in range(rng.randrange(1, 400)):
        if rng.random() < copies:
            o = rng.randrange(9)
            src, dst = rng.choice(("in", "out", "tmp")), rng.choice(("in", "out", "tmp"))
            flat.append(Copy("in", o, "out", o, 3) if rng.random() < 0.1 else
                        Copy(src, o, dst, rng.randrange(9), rng.randrange(1, 9), rng.random() < 0.5))
        elif rng.random() < 0.5:
            flat.append(Send(rng.randrange(64), "tmp", rng.randrange(9), rng.randrange(1, 9)))
        else:
            flat.append(Recv(rng.randrange(64), "out", rng.randrange(9), rng.randrange(1, 9), rng.random() < 0.5))
    want = _ops_plain(flat)
    forms = [compact._ops_py] + ([compact._ops] if compact._simcore is not None else [])
    for form in forms:
        got = form(flat)
        for name, a, b in zip(("kind", "red", "peer", "count", "skip", "touch"), got, want):
            assert (a is None) == (b is None), (form.__name__, name)
            assert a is None or (np.array_equal(a, b) and a.dtype == b.dtype), (form.__name__, name)


def test_operations_arrays_refuse_what_a_message_schedule_cannot_hold():
    """Both forms of ``_ops`` raise TypeError on a segment operation; the C one on an empty list gives
    empty arrays."""
    from pyxccl.schedule import Get
    for form in [compact._ops_py] + ([compact._ops] if compact._simcore is not None else []):
        with pytest.raises(TypeError, match="not a message schedule"):
            form([Send(1, "in", 0, 4), Get(1, 0, "out", 0, 4)])
        kind, red, peer, count, skip, touch = form([])
        assert len(kind) == len(peer) == len(touch) == 0 and skip is None


def _bruck_alltoall_plain(rank: int, n: int, c: int) -> Schedule:
    """Bruck's alltoall written op by op through Schedule.step (the reference): tmp = [slot j at block n-1-j,
    then a mirror of blocks 0..n-2 | pack area | incoming area]; the even slots copied from in, the odd
    ones from in into step 1's message; step d packs the runs of slots with bit d set (in the slot area's
    order), sends them in one message to rank+d and receives rank-d's into the incoming area, which the
    next step unpacks first; at the end the mirror and one copy to out. The copies of steps 2, 4, ... and of
    the end are steps of their own (the same on every rank)."""
    from pyxccl.schedule import Copy, Recv, Send
    ds = [1 << k for k in range(max(n - 1, 0).bit_length())]
    moving = [[j for j in range(n) if j & d] for d in ds]
    most = max(map(len, moving), default=0)
    pack, inc = (2 * n - 1) * c, (2 * n - 1 + most) * c
    s = Schedule(rank, n, scratch=(2 * n - 1 + 2 * most) * c if c else 0)

    def runs(js):           # (first slot, slots) of each run of consecutive slots
        out = []
        for j in js:
            if out and out[-1][0] + out[-1][1] == j:
                out[-1][1] += 1
            else:
                out.append([j, 1])
        return out

    def at(j, k):           # where the run of k slots from slot j starts in the slot area
        return (n - j - k) * c
    ops = [Copy("in", ((rank + j) % n) * c, "tmp", at(j, 1), c) for j in range(0, n, 2)]
    ops += [Copy("in", ((rank + j) % n) * c, "tmp", pack + i * c, c) for i, j in enumerate(range(1, n, 2))]
    for i, d in enumerate(ds):
        if i:
            p = 0
            for j, k in runs(moving[i - 1]):
                ops.append(Copy("tmp", inc + p * c, "tmp", at(j, k), k * c))
                p += k
        if d > 1:
            p = 0
            for j, k in runs(moving[i]):
                ops.append(Copy("tmp", at(j, k), "tmp", pack + p * c, k * c))
                p += k
        if d > 1:           # step d's copies, a step of their own (the same on every rank)
            s.step(*ops)
            ops = []
        s.step(*ops, Send((rank + d) % n, "tmp", pack, len(moving[i]) * c),
               Recv((rank - d) % n, "tmp", inc, len(moving[i]) * c))
        ops = []
    p = 0
    for j, k in runs(moving[-1] if ds else []):
        ops.append(Copy("tmp", inc + p * c, "tmp", at(j, k), k * c))
        p += k
    out = Copy("tmp", (n - 1 - rank) * c, "out", 0, n * c)
    if ds:                  # the last unpacking and the mirror, then the copy to out
        s.step(*ops, Copy("tmp", 0, "tmp", n * c, (n - 1) * c))
        s.step(out)
    else:
        s.step(*ops, out)
    return s


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 17, 33])
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


def _ring_phase_plain(s: Schedule, counts, buf: str, a: int, reduce: bool) -> None:
    """A ring phase as it was written, step by step through Schedule.step: in step k, Send chunk
    (a - k) % n right and Recv chunk (a - k - 1) % n from the left."""
    from pyxccl.schedule import Recv, Send, offsets
    r, n = s.rank, s.nranks
    off = offsets(counts)
    for k in range(n - 1):
        c, d = (a - k) % n, (a - k - 1) % n
        s.step(Send((r + 1) % n, buf, off[c], counts[c]), Recv((r - 1) % n, buf, off[d], counts[d], reduce=reduce))


def _reduce_rs_gather_plain(rank: int, n: int, count: int, root: int) -> Schedule:
    """Rabenseifner's reduce as it was written: the ring reduce-scatter's schedule embedded."""
    from pyxccl.schedule import Recv, Send, embed, offsets, split_counts
    pieces = split_counts(count, n)
    off = offsets(pieces)
    rs = registry.lookup("reduce_scatter", "ring").build(rank, n, counts=pieces)
    s = Schedule(rank, n, scratch=rs.scratch + max(pieces, default=0))
    mine = ("out", off[rank]) if rank == root else ("tmp", rs.scratch)
    embed(s, rs, list(range(n)), {"in": ("in", 0), "out": mine, "tmp": ("tmp", 0)})
    if rank == root:
        s.step(*(Recv(p, "out", off[p], pieces[p]) for p in range(n) if p != root))
    else:
        s.step(Send(root, "tmp", rs.scratch, pieces[rank]))
    return s


def _broadcast_scatter_allgather_plain(rank: int, n: int, count: int, root: int) -> Schedule:
    """van de Geijn's broadcast as it was written: a ring allgather among virtual ranks, embedded."""
    from pyxccl.algorithms.ring import allgather_phase
    from pyxccl.schedule import Recv, Send, embed, offsets, split_counts
    pieces = split_counts(count, n)
    off = offsets(pieces)
    vr = (rank - root) % n
    s = Schedule(rank, n)
    d = 1 << max(0, (n - 1).bit_length() - 1) if n > 1 else 0
    while d >= 1:
        if vr % (2 * d) == 0 and vr + d < n:
            hi = min(vr + 2 * d, n)
            s.step(Send((vr + d + root) % n, "out", off[vr + d], off[hi] - off[vr + d]))
        elif vr % (2 * d) == d:
            hi = min(vr + d, n)
            s.step(Recv((vr - d + root) % n, "out", off[vr], off[hi] - off[vr]))
        d >>= 1
    ag = Schedule(vr, n)
    allgather_phase(ag, pieces, "out", have=vr)
    embed(s, ag, [*range(root, n), *range(root)], {"out": ("out", 0)})
    return s


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("count", [0, 1, 7, 13, 100])
def test_ring_phases_and_what_builds_on_them_are_their_plain_builds(n, count, monkeypatch):
    """The ring phases' path for chunks all non-empty (``ring._full_steps``) appends what the phase
    built through Schedule.step appends, and Rabenseifner's reduce and van de Geijn's broadcast, built in
    place on them, are their builds with the ring's schedules embedded: every rank, every root, types
    included (counts below n leave chunks empty: the other path; a few chunks of one count, then
    another, check the shared offsets)."""
    from pyxccl.algorithms import ring
    from pyxccl.schedule import split_counts
    for counts in (split_counts(count, n), [count if i % 2 else count + 1 for i in range(n)]):
        for a in range(n):
            for reduce, phase in ((True, ring.reduce_scatter_phase), (False, ring.allgather_phase)):
                got, want = Schedule(a, n), Schedule(a, n)
                phase(got, counts, "tmp", a)
                _ring_phase_plain(want, counts, "tmp", a - 1 if reduce else a, reduce)
                assert repr(got.steps) == repr(want.steps), (n, counts, a, reduce)
    red, bc = registry.lookup("reduce", "reduce_scatter_gather"), registry.lookup("broadcast", "scatter_allgather")
    for root in range(n):
        for r in range(n):
            for algo, plain in ((red, _reduce_rs_gather_plain), (bc, _broadcast_scatter_allgather_plain)):
                got, want = algo.schedule(r, n, count=count, root=root), plain(r, n, count, root)
                assert (repr(got.steps), got.scratch) == (repr(want.steps), want.scratch), (algo.name, n, count, root, r)


def _direct_plain(prim: str, name: str, r: int, n: int, counts: list[int], cnt: int, root: int) -> Schedule:
    """The one-step direct exchanges (``algorithms/direct.py``, ``trees.py``'s master and direct
    allreduce) written op by op through ``Schedule.step`` (the reference for their ``many`` forms)."""
    s, off, others = Schedule(r, n), offsets(counts), [p for p in range(n) if p != r]
    dst = [(r + k) % n for k in range(1, n)]        # allgather, reduce-scatter, alltoall: to r + 1 first, from r - 1 first
    src = [(r - k) % n for k in range(1, n)]
    if (prim, name) == ("gather", "direct"):
        if r != root:
            s.step(Send(root, "in", 0, counts[r]))
        else:
            s.step(Copy("in", 0, "out", off[root], counts[root]), *(Recv(p, "out", off[p], counts[p]) for p in others))
    elif (prim, name) == ("scatter", "direct"):
        if r != root:
            s.step(Recv(root, "out", 0, counts[r]))
        else:
            s.step(Copy("in", off[root], "out", 0, counts[root]), *(Send(p, "in", off[p], counts[p]) for p in others))
    elif prim == "alltoall":
        rc = counts[::-1]
        ro = offsets(rc)
        if name == "pairwise":
            s.step(Copy("in", off[r], "out", ro[r], counts[r]))
            for k in range(1, n):
                s.step(Send((r + k) % n, "in", off[(r + k) % n], counts[(r + k) % n]),
                       Recv((r - k) % n, "out", ro[(r - k) % n], rc[(r - k) % n]))
        else:
            s.step(Copy("in", off[r], "out", ro[r], counts[r]), *(Send(p, "in", off[p], counts[p]) for p in dst),
                   *(Recv(p, "out", ro[p], rc[p]) for p in src))
    elif prim == "allgather":
        s.step(Copy("in", 0, "out", off[r], counts[r]), *(Send(p, "in", 0, counts[r]) for p in dst),
               *(Recv(p, "out", off[p], counts[p]) for p in src))
    elif prim == "reduce_scatter":
        mine = counts[r]
        s.scratch = mine * n
        s.step(Copy("in", off[r], "tmp", r * mine, mine), *(Send(p, "in", off[p], counts[p]) for p in dst),
               *(Recv(p, "tmp", p * mine, mine) for p in src))
        s.step(Copy("tmp", 0, "out", 0, mine), *(Copy("tmp", p * mine, "out", 0, mine, True) for p in range(1, n)))
    elif name == "reduce_broadcast":
        s.scratch = cnt * n if r == 0 else 0
        if r != 0:
            s.step(Send(0, "in", 0, cnt))
            s.step(Recv(0, "out", 0, cnt))
        else:
            s.step(Copy("in", 0, "tmp", 0, cnt), *(Recv(p, "tmp", p * cnt, cnt) for p in range(1, n)))
            s.step(Copy("tmp", 0, "out", 0, cnt), *(Copy("tmp", p * cnt, "out", 0, cnt, True) for p in range(1, n)))
            s.step(*(Send(p, "out", 0, cnt) for p in range(1, n)))
    else:                   # allreduce direct
        cs = split_counts(cnt, n)
        co, mine = offsets(cs), cs[r]
        s.scratch = mine * n
        s.step(Copy("in", 0, "out", 0, cnt))
        s.step(Copy("out", co[r], "tmp", r * mine, mine), *(Send(p, "out", co[p], cs[p]) for p in others),
               *(Recv(p, "tmp", p * mine, mine) for p in others))
        s.step(Copy("tmp", 0, "out", co[r], mine),
               *(Copy("tmp", p * mine, "out", co[r], mine, True) for p in range(1, n)))
        s.step(*(Send(p, "out", co[r], mine) for p in others), *(Recv(p, "out", co[p], cs[p]) for p in others))
    return s


@pytest.mark.parametrize("prim,name", [("gather", "direct"), ("scatter", "direct"), ("alltoall", "pairwise"),
                                       ("alltoall", "direct"), ("allgather", "direct"), ("reduce_scatter", "direct"),
                                       ("allreduce", "reduce_broadcast"), ("allreduce", "direct")])
def test_direct_exchanges_made_at_once_are_the_plain_ones(prim, name):
    """The direct exchanges' operations made with ``schedule.many`` (in C, zero counts left out) are
    the plain build's, operation for operation and of the same types, with empty blocks and any root."""
    algo = registry.lookup(prim, name)
    for n in [*range(1, 10), 16, 33]:
        rng = random.Random(n)
        for trial in range(4):      # (the last with no empty block: pairwise's steps made at once)
            counts = [rng.choice([0, 1, 2, 5] if trial < 3 else [1, 2, 5]) for _ in range(n)]
            cnt, root = rng.choice([0, 1, 3, n, 2 * n + 1]), rng.randrange(n)
            args = {"count": cnt} if prim == "allreduce" else {"counts": counts}
            if prim == "alltoall":
                args = {"send_counts": counts, "recv_counts": counts[::-1]}
            elif prim in ("gather", "scatter"):
                args["root"] = root
            for r in range(n):
                got, want = algo.build(r, n, **args), _direct_plain(prim, name, r, n, counts, cnt, root)
                assert got.steps == want.steps and got.scratch == want.scratch, (n, r, args)
                assert [list(map(type, st)) for st in got.steps] == [list(map(type, st)) for st in want.steps]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 13, 64, 100, 1023])
def test_double_tree_places_make_two_trees(n):
    """``trees._dtree`` gives one rank's places without making every rank's (the tuner builds a few ranks'
    schedules at thousands of ranks): over all ranks they are two trees (every child's parent is the rank that
    names it, one root), the second tree 0 moved by the mirror (even n) or the shift (odd n), and (even n) every
    rank is a leaf in one of them."""
    from pyxccl.algorithms import trees

    places = [trees._dtree(n, r) for r in range(n)]
    f = (lambda q: n - 1 - q) if n % 2 == 0 else (lambda q: (q + 1) % n)
    for t in (0, 1):
        assert sum(p[t][0] < 0 for p in places) == 1
        for r, p in enumerate(places):
            assert all(places[c][t][0] == r for c in p[t][1])
            if p[t][0] >= 0:
                assert r in places[p[t][0]][t][1]
    for r, (t0, t1) in enumerate(places):
        parent, kids = places[f(r)][1]
        assert (parent, kids) == ((f(t0[0]) if t0[0] >= 0 else -1), [f(c) for c in t0[1]])
        assert n % 2 or not t0[1] or not t1[1]
