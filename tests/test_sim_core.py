"""The cost model's C core (tuning/_simcore.c through tuning/fast.py) gives exactly what the Python
reference (tuning.cost.run) gives: every algorithm of the message primitives, several modelled
clusters (CPU and DMA machines, fat tree and ring of hosts, NICs, a shared bus), sizes, message
level and symmetric mode; the arrays derived from host 0's (compact.all_ranks) are the arrays of
the built schedules; a deadlock reports the same stuck ranks."""
from __future__ import annotations

import numpy as np
import pytest

from pyxccl.algorithms import registry
from pyxccl.primitives import PRIMITIVES
from pyxccl.schedule import Copy, Recv, Schedule, Send
from pyxccl.sim import Cluster, Link
from pyxccl.sim import run as sim_run
from pyxccl.sim.net import FOLDABLE
from pyxccl.sim.simulate import ClusterNet, candidates
from pyxccl.tuning import compact, cost, fast, symmetric

pytestmark = pytest.mark.skipif(fast._simcore is None, reason="the C core (pyxccl.tuning._simcore) is not built")

PRIMS = ["allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce", "gather", "scatter"]
SIZES = [8, 64 << 10, 4 << 20]
_DMA = dict(intra=Link(1e-6, 1 / 300e9), inter=Link(5e-6, 1 / 25e9), gamma=1e-11, copy=5e-12)
_CPU = dict(intra=Link(20e-6, 1 / 4e9), inter=Link(60e-6, 1 / 1.1e9), gamma=2e-10, copy=1.5e-10, cpu=True,
            reduce_overlap=False)
CLUSTERS = {
    "1x4-dma": Cluster(1, 4, **_DMA),
    "1x4-cpu": Cluster(1, 4, cores=2, **_CPU),
    "2x2-dma": Cluster(2, 2, nics=1, **_DMA),
    "2x2-cpu": Cluster(2, 2, cores=1, **_CPU),
    "4x2-dma-ring-nics2-nooverlap": Cluster(4, 2, nics=2, topology="ring", **dict(_DMA, reduce_overlap=False)),
    "4x2-dma-shared-nics2": Cluster(4, 2, nics=2, intra_shared=True, **_DMA),
    "8x2-dma-ring": Cluster(8, 2, nics=1, topology="ring", **_DMA),
    "8x2-dma-nics2": Cluster(8, 2, nics=2, **_DMA),
    "8x2-cpu-ring": Cluster(8, 2, cores=1, topology="ring", **_CPU),
    # the memory term: a call larger than the cache moves at the memory's rate
    "1x4-cpu-mem": Cluster(1, 4, cores=4, mem=1e-10, cache=1 << 20, **_CPU),
    "4x2-cpu-mem": Cluster(4, 2, cores=1, mem=3e-10, cache=1 << 20, **_CPU),
    "4x2-cpu-mem-measured": Cluster(4, 2, cores=1, mem_at=((1 << 20, 1e-4), (64 << 20, 2.6e-2)), **_CPU),
    # tori and dragonflies of hosts (sim/topology.py's routes, in the C core's route()); never folded
    "8x2-dma-torus2d": Cluster(8, 2, nics=1, topology="torus2d", dims=(2, 4), **_DMA),
    "12x1-dma-torus3d": Cluster(12, 1, nics=1, topology="torus3d", dims=(3, 2, 2), **_DMA),
    "9x2-cpu-torus2d": Cluster(9, 2, cores=1, topology="torus2d", **_CPU),
    "12x2-dma-dragonfly3-nics2": Cluster(12, 2, nics=2, topology="dragonfly", groups=3, **_DMA),
    "8x2-cpu-dragonfly4": Cluster(8, 2, cores=1, topology="dragonfly", groups=4, **_CPU),
}


def _builder(prim: str, name: str, c: Cluster, nbytes: int):
    algo, p = registry.lookup(prim, name), PRIMITIVES[prim]
    args, hosts = p.sized(c.nranks, nbytes, 4), c.host_list()
    return lambda r: algo.schedule(r, c.nranks, hosts=hosts, **args)


def _message_algos(prim: str, c: Cluster):
    return [a for a in candidates(prim, c) if not registry.lookup(prim, a).segment]


def _same(a, b):
    (ea, sa), (eb, sb) = a, b
    assert eb.time == pytest.approx(ea.time, rel=1e-12, abs=0)
    assert eb.time == ea.time, "not bit for bit"
    assert (eb.steps, eb.bytes_sent, eb.messages) == (ea.steps, ea.bytes_sent, ea.messages)
    assert _ends(eb) == _ends(ea)           # each rank's clock at its end (a phase after goes on from there)
    assert sb == sa


def _ends(e) -> dict:
    return dict(zip(map(int, e.ends[0]), map(float, e.ends[1])))


def _held_once(c: compact.Compact, n: int) -> compact.Compact:
    """``c`` held once where it can be: alike copies in a row of a step as one made that many times
    (``Compact.times``), and each run of steps in a row of a schedule that are alike but for peers moving by a
    stride each step (the same peers: a stride of 0) as one step repeated (``Compact.rep``, ``Compact.stride``)."""
    cols = ("kind", "red", "peer", "count", "touch") + (("skip",) if c.skip is not None else ())
    ops = list(zip(*(getattr(c, f).tolist() for f in cols)))
    steps, reps, strides, rank_start = [], [], [], [0]

    def merged(step):               # [(op, times)]: alike copies in a row as one
        out = []
        for o in step:
            if out and o[0] == compact.COPY and out[-1][0] == o:
                out[-1] = (o, out[-1][1] + 1)
            else:
                out.append((o, 1))
        return out

    def same_but_peers(a, b):
        return len(a) == len(b) and all(x[0][:2] == y[0][:2] and x[0][3:] == y[0][3:] and x[1] == y[1]
                                        for x, y in zip(a, b))

    for i in range(len(c.ranks)):
        base = None
        for s in range(int(c.rank_start[i]), int(c.rank_start[i + 1])):
            step = merged(ops[c.step_start[s]:c.step_start[s + 1]])
            if base is not None and same_but_peers(step, base):
                k = reps[-1]
                d = strides[-1] if k > 1 else [(y[0][2] - x[0][2]) % n for x, y in zip(base, step)]
                if all((x[0][2] + k * e) % n == y[0][2] for x, y, e in zip(base, step, d)):
                    reps[-1] += 1
                    strides[-1] = d
                    continue
            steps.append(step)
            reps.append(1)
            strides.append([0] * len(step))
            base = step
        rank_start.append(len(steps))
    flat = [o for st in steps for o in st]
    step_start = np.zeros(len(steps) + 1, np.int64)
    np.cumsum([len(st) for st in steps], out=step_start[1:])
    dtypes = [np.int8, np.int8, np.int64, np.int64, np.int8, bool]
    got = [np.array([o[0][k] for o in flat], dtypes[k]) for k in range(len(cols))]
    return compact.Compact(got[0], got[1], got[2], got[3], step_start, np.array(rank_start, np.int64), c.ranks,
                           got[5] if c.skip is not None else None, got[4], np.array(reps, np.int64),
                           np.array([e for d in strides for e in d], np.int64), n,
                           np.array([o[1] for o in flat], np.int64))


def _check(scheds, net, inplace, working_set=0):
    want = cost.run(scheds, 4, net, inplace, working_set)
    _same(want, fast.run(scheds, 4, net, inplace, working_set))
    _same(want, fast.run_compact(compact.convert(scheds, inplace), 4, net, working_set))   # the C core, surely
    # alike steps in a row held once and repeated: the same walk, to the bit
    once = _held_once(compact.convert(scheds, inplace), net.shape().nranks if hasattr(net, "shape") and net.shape() else 0)
    assert once.expanded().equal(compact.convert(scheds, inplace))
    _same(want, fast.run_compact(once, 4, net, working_set))
    # every rank starting at its own clock (a phase after another: select._phase_estimate)
    start = np.random.default_rng(len(scheds)).uniform(0, want[0].time or 1e-6, size=max(s.rank for s in scheds) + 1)
    want = cost.run(scheds, 4, net, inplace, working_set, start)
    _same(want, fast.run_compact(compact.convert(scheds, inplace), 4, net, working_set, start))
    _limited(compact.convert(scheds, inplace), net, working_set, start, want)
    _same(want, fast.run_compact(once, 4, net, working_set, start))
    return bool((once.rep > 1).any()), bool(once.stride.any()) or bool((once.times > 1).any())


def _limited(comp, net, working_set, start, want):
    """With a limit (the tuner's best so far), the walk stops once past it: a time above the limit and not
    above the whole walk's, no rank stuck; at or above the whole walk's time, the whole walk, bit for bit."""
    whole = want[0].time
    _same(want, fast.run_compact(comp, 4, net, working_set, start, whole))
    _same(want, fast.run_compact(comp, 4, net, working_set, start, whole * 1.5))
    for part in (0.0, 0.3, 0.7, 0.999):
        limit = whole * part
        if limit < whole:
            est, stuck = fast.run_compact(comp, 4, net, working_set, start, limit)
            assert limit < est.time <= whole and stuck == [], (part, est.time, whole)


def _working_set(prim, c, nbytes, inplace):
    """What simulate.run gives the walk: the bytes of rank 0's buffers in the call."""
    p = PRIMITIVES[prim]
    nin, nout = p.buffers(0, p.sized(c.nranks, nbytes, 4))
    return (nout if inplace else nin + nout) * 4


@pytest.mark.parametrize("cname", list(CLUSTERS))
@pytest.mark.parametrize("prim", PRIMS)
def test_c_core_equals_the_python_walk(prim, cname):
    c = CLUSTERS[cname]
    inplace = prim == "allreduce"
    walked = folded = held = strided = 0
    for name in _message_algos(prim, c):
        for nbytes in SIZES:
            build = _builder(prim, name, c, nbytes)
            try:
                scheds = [build(r) for r in range(c.nranks)]
            except ValueError:          # the algorithm cannot run here (e.g. not a power of two)
                continue
            ws = _working_set(prim, c, nbytes, inplace)
            rep, stride = _check(scheds, ClusterNet(c), inplace, ws)
            held, strided = held + rep, strided + stride
            walked += 1
            sym, reps = symmetric.find(build, c.hosts, c.per_host, c.topology == "ring")
            if sym is not None and c.topology in FOLDABLE:
                _check(reps, ClusterNet(c, sym), inplace, ws)
                folded += 1
    assert walked and (held or prim in ("gather", "scatter"))     # (a ring's steps repeated)
    assert strided or prim != "alltoall"        # (a pairwise exchange's peers moving)
    print(prim, cname, "walked", walked, "folded", folded, "with steps repeated", held, "peers moving", strided)


def test_c_core_on_large_messages_of_a_cpu_machine():
    """Messages above the socket buffer (the sender waits until the rest fits), stretched CPUs."""
    for cname in ("2x2-cpu", "8x2-cpu-ring", "4x2-cpu-mem"):
        c = CLUSTERS[cname]
        for prim, name in (("broadcast", "binomial"), ("allreduce", "ring"), ("alltoall", "direct")):
            build = _builder(prim, name, c, 48 << 20)
            ip = prim == "allreduce"
            _check([build(r) for r in range(c.nranks)], ClusterNet(c), ip, _working_set(prim, c, 48 << 20, ip))


def test_the_c_core_is_used():
    c = CLUSTERS["8x2-dma-nics2"]
    scheds = [_builder("allreduce", "ring", c, 1 << 20)(r) for r in range(c.nranks)]
    assert fast._core(ClusterNet(c))[1] == 0 and compact.message_schedules(scheds)
    for cname in ("8x2-dma-torus2d", "12x1-dma-torus3d", "12x2-dma-dragonfly3-nics2"):
        assert fast._core(ClusterNet(CLUSTERS[cname]))[0].topology == (3 if "dragonfly" in cname else 2)


@pytest.mark.parametrize("cname", ["2x2-dma", "2x2-cpu"])
def test_a_deadlock_reports_the_same_stuck_ranks(cname):
    c = CLUSTERS[cname]
    # ranks 0 and 2 (two hosts) each wait for the other before sending; 1 and 3 exchange fine
    s = [Schedule(0, 4, [(Recv(2, "out", 0, 8),), (Send(2, "in", 0, 8),)]),
         Schedule(1, 4, [(Send(3, "in", 0, 8), Recv(3, "out", 0, 8, True))]),
         Schedule(2, 4, [(Copy("in", 0, "out", 0, 8),), (Recv(0, "out", 0, 8),), (Send(0, "in", 0, 8),)]),
         Schedule(3, 4, [(Recv(1, "out", 0, 8, True), Send(1, "in", 0, 8))])]
    a, b = cost.run(s, 4, ClusterNet(c), True), fast.run(s, 4, ClusterNet(c), True)
    assert a[1] == [0, 2]
    _same(a, b)
    # a subset of the ranks (rank 3's sender missing): 3 waits for ever
    sub = [s[3]]
    _same(cost.run(sub, 4, ClusterNet(c)), fast.run(sub, 4, ClusterNet(c)))
    assert fast.run(sub, 4, ClusterNet(c))[1] == [3]


def test_the_walkers_order_inside_a_step():
    """Ops written receive-first are walked copies, sends, receives (written order kept in each kind),
    and an in-place call's copy of a buffer onto itself is left out."""
    s = Schedule(0, 2, [(Recv(1, "out", 0, 4, True), Recv(1, "tmp", 0, 2), Send(1, "in", 0, 4),
                         Copy("in", 0, "out", 0, 4), Copy("tmp", 0, "out", 0, 2, True))])
    a = compact.convert([s])
    assert a.kind.tolist() == [0, 0, 1, 2, 2] and a.count.tolist() == [4, 2, 4, 4, 2]
    assert a.red.tolist() == [0, 1, 0, 1, 0] and a.peer.tolist() == [0, 0, 1, 1, 1]
    b = compact.convert([s], inplace=True)
    assert b.kind.tolist() == [0, 1, 2, 2] and b.step_start.tolist() == [0, 4]
    assert a.inplace().equal(b)
    t = Schedule(1, 2, [(Recv(0, "out", 0, 4), Recv(0, "out", 0, 2, True), Send(0, "in", 0, 4))])
    c = CLUSTERS["2x2-dma"].resized(1, 2)
    _same(cost.run([s, t], 4, ClusterNet(c), True), fast.run([s, t], 4, ClusterNet(c), True))


@pytest.mark.parametrize("shape", [(8, 2), (16, 4)])
@pytest.mark.parametrize("name", ["ring", "hierarchical", "halving_doubling", "torus2d"])
def test_derived_arrays_are_the_built_ones(name, shape):
    hosts, per_host = shape
    c = Cluster(hosts, per_host, nics=2, **_DMA)
    build = _builder("allreduce", name, c, 1 << 20)
    sym, reps = symmetric.find(build, hosts, per_host, False, exact=True)
    assert sym is not None
    built = [build(r) for r in range(c.nranks)]
    derived = compact.Derived(compact.convert(reps), sym, hosts, per_host)
    assert derived.full().equal(compact.convert(built))
    assert derived.inplace().full().equal(compact.convert(built, inplace=True))
    # and the C core's walk of the derived ranks (peers moved as it goes) is the Python walk of the built
    for net in (c, Cluster(hosts, per_host, nics=1, topology="ring", cores=2, **_CPU)):
        _same(cost.run(built, 4, ClusterNet(net), True), fast.run(derived, 4, ClusterNet(net), True))


def test_uneven_chunks_are_not_derived():
    """Counts only close (uneven chunks) are enough for symmetric mode, not for deriving exact arrays."""
    c = Cluster(8, 2, **_DMA)
    build = _builder("allreduce", "ring", c, 4 * 1001)
    assert symmetric.find(build, 8, 2, False)[0] is not None
    assert symmetric.find(build, 8, 2, False, exact=True)[0] is None


def test_symmetric_find_keeps_its_rules():
    """The vectorized comparison says what _same says."""
    c = Cluster(8, 2, **_DMA)
    for name in ("ring", "hierarchical", "halving_doubling", "torus2d", "tree", "double_binary_tree"):
        build = _builder("allreduce", name, c, 1 << 16)
        reps = [build(r) for r in range(2)]
        for kind in (symmetric.Shift, symmetric.Xor):
            sym = kind(16, 2)
            base = compact.convert(reps, written=True)
            for h in symmetric.sample_hosts(8):
                got = [build(h * 2 + j) for j in range(2)]
                old = all(symmetric._same(s, reps[j], sym.mover(h)) for j, s in enumerate(got))
                assert compact.same_moved(compact.convert(got, written=True), base, sym, h, 2) == old


@pytest.mark.parametrize("cpu", [False, True])
@pytest.mark.parametrize("name", ["ring", "hierarchical", "halving_doubling", "torus2d", "tree"])
def test_simulate_message_level_derived_equals_python(name, cpu, monkeypatch):
    c = Cluster(8, 4, cores=2, mem=2e-10, cache=1 << 20, **_CPU) if cpu else Cluster(8, 4, nics=2, **_DMA)
    monkeypatch.setattr(fast, "DERIVE_OPS", 0)
    got = sim_run("allreduce", 1 << 20, c, [name], mode="message")[0]
    monkeypatch.setenv("PYXCCL_SIMCORE", "0")
    want = sim_run("allreduce", 1 << 20, c, [name], mode="message")[0]
    assert (got.time, got.bytes_sent, got.messages, got.steps) == (want.time, want.bytes_sent, want.messages,
                                                                    want.steps)
    got = sim_run("allreduce", 1 << 20, c, [name], mode="symmetric")[0] if name != "tree" else None
    if got is not None:
        monkeypatch.setenv("PYXCCL_SIMCORE", "1")
        want2 = sim_run("allreduce", 1 << 20, c, [name], mode="symmetric")[0]
        assert got.time == want2.time


def test_segment_schedules_go_to_the_python_reference():
    c = CLUSTERS["1x4-cpu"]
    for name in candidates("allreduce", c):
        if registry.lookup("allreduce", name).segment:
            from pyxccl.algorithms.segment import Window
            algo = registry.lookup("allreduce", name)
            s = [algo.schedule(r, 4, window=Window.of(c.segment_bytes, 4, True), count=1 << 16) for r in range(4)]
            assert fast.run(s, 4, ClusterNet(c), True) == cost.run(s, 4, ClusterNet(c), True)


def test_the_python_reference_runs_without_the_core(monkeypatch):
    monkeypatch.setattr(fast, "_simcore", None)
    c = CLUSTERS["2x2-dma"]
    scheds = [_builder("allreduce", "ring", c, 1 << 10)(r) for r in range(4)]
    assert fast.run(scheds, 4, ClusterNet(c), True) == cost.run(scheds, 4, ClusterNet(c), True)
    assert np.isfinite(fast.run(scheds, 4, ClusterNet(c), True)[0].time)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cname", ["4x2-cpu-mem", "8x2-dma-nics2", "8x2-cpu-ring"])
def test_bookings_out_of_order_are_the_python_walks(cname, seed):
    """Steps of many messages of random sizes to random shifts: the shared links' bookings land before,
    between and after earlier ones (the C core keeps them in a gap buffer that moves back and forth, and
    grows past its first 64 intervals), every rank walked and, on a fat tree, folded."""
    c = CLUSTERS[cname]
    n, rng = c.nranks, np.random.default_rng(seed)
    plan = [[(int(d), rng.integers(1, 1 << 16, n).tolist()) for d in rng.choice(np.arange(1, n), min(8, n - 1), replace=False)]
            for _ in range(16)]

    def build(r):
        s = Schedule(r, n)
        for moves in plan:
            s.step(*(Send((r + d) % n, "in", 0, size[r]) for d, size in moves),
                   *(Recv((r - d) % n, "out", 0, size[(r - d) % n]) for d, size in moves))
        return s
    scheds = [build(r) for r in range(n)]
    _check(scheds, ClusterNet(c), False)


@pytest.mark.parametrize("cname", ["4x2-cpu-mem", "8x2-dma-nics2", "8x2-cpu-ring", "8x2-dma-torus2d"])
def test_intervals_dropped_at_every_turn_change_nothing(cname):
    """The C core drops the busy intervals that end before every rank's clock (no booking can take them):
    forced at every rank's turn, the walks above are still the Python reference's, bit for bit."""
    was = fast._simcore.pruning(1)
    try:
        for seed in range(3):
            test_bookings_out_of_order_are_the_python_walks(cname, seed)
        for prim in ("allreduce", "alltoall", "broadcast"):
            test_c_core_equals_the_python_walk(prim, cname)
    finally:
        assert fast._simcore.pruning(was) == 1
