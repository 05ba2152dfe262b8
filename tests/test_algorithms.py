"""Algorithms as schedules: every registered algorithm proven by the symbolic checker
for world sizes 1..64, its textbook step and byte counts read off the schedules,
and real runs of each algorithm, forced one by one, against numpy."""
import math

import numpy as np
import pytest

import rankfns as rf
from pyxccl import algorithms
from pyxccl.algorithms import registry
from pyxccl.algorithms.segment import Window
from pyxccl.checker import CheckError, check, simulate
from pyxccl.ops import ReduceOp
from pyxccl.primitives import PRIMITIVES
from pyxccl.schedule import Copy, Get, Post, Put, Recv, Schedule, Send, Sync
from pyxccl.testing import RankPool

PRIMS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter", "alltoall",
         "barrier")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
ALL = [(p, a) for p in PRIMS for a in algorithms.algorithms(p) if not registry.lookup(p, a).segment]   # segment: below


def _counts(n):
    """Counts smaller than n, not divisible by n, and larger."""
    return sorted({0, 1, 2, n - 1, n + 1, 3 * n + 2}) if n <= 16 else (1, n + 1)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("prim, algo", ALL)
def test_checker_proves_every_algorithm_for_1_to_64_ranks(prim, algo):
    record = registry.lookup(prim, algo)
    for n in range(1, 65):
        if not record.runs(n):        # an algorithm that says it cannot run on n ranks refuses to build
            with pytest.raises(ValueError, match="cannot run"):
                check(prim, algo, n, n + 1)
            continue
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


def _bruck_shape(s: Schedule, n: int, c: int) -> None:
    """One Send and one Recv a step, ceil(log2 n) of them, each the step's slots with bit d set, to rank r+d
    and from rank r-d; the other operations copies."""
    msgs = [[o for o in st if type(o) is not Copy] for st in s.steps]
    msgs = [m for m in msgs if m]
    assert len(msgs) == (n - 1).bit_length(), (n, s.rank)
    for k, m in enumerate(msgs):
        d, moving = 1 << k, sum(1 for j in range(n) if j >> k & 1)
        assert sorted(map(type, m), key=lambda t: t.__name__) == [Recv, Send], (n, s.rank, k)
        send, recv = (m if type(m[0]) is Send else m[::-1])
        assert (send.peer, recv.peer, send.count, recv.count) == ((s.rank + d) % n, (s.rank - d) % n,
                                                                  moving * c, moving * c), (n, s.rank, k)


@pytest.mark.parametrize("n", (*range(1, 18), 33, 64, 100))
def test_bruck_alltoall_sends_one_message_a_step(n):
    """Proven by the checker (equal blocks of 1 and 3; 0: nothing to do), every rank one packed message a
    step, and at most 3n operations a rank (pack and unpack: a copy per run; in and out: a copy per slot)."""
    for c in (1, 3):
        scheds = check("alltoall", "bruck", n, c)
        for s in scheds:
            _bruck_shape(s, n, c)
            assert sum(map(len, s.steps)) <= 3 * n + 2 * (n - 1).bit_length(), (n, c, s.rank)
    assert not any(s.steps for s in check("alltoall", "bruck", n, 0))


def test_bruck_alltoall_at_4096_ranks_holds_about_2_5_n_operations():
    """What the tuner builds for each of a host's ranks at 4,096 ranks (issue 26): 12 messages of half the
    blocks, and about 2.5n operations (it was 1.5 n log2 n: a message per block, 82k operations)."""
    n, c = 4096, 64
    algo = registry.lookup("alltoall", "bruck")
    first = None
    for r in (0, 1, 2049, n - 1):
        s = algo.schedule(r, n, send_counts=[c] * n, recv_counts=[c] * n)
        _bruck_shape(s, n, c)
        ops = sum(map(len, s.steps))
        assert ops <= 2.5 * n + 2 * 12 + 2, ops
        assert s.scratch == (2 * n - 1 + n) * c        # slots and their mirror, pack and incoming areas
        # the steps of copies alike on every rank (all but the first and the last copy) are one tuple,
        # shared: converted once for the tuner (compact._STEPS)
        alike = [k for k, st in enumerate(s.steps) if all(type(o) is Copy for o in st) and len(st) > 1]
        assert len(s.steps) == 2 * 12 + 1 and len(alike) == 12
        first = first or s
        assert all(s.steps[k] is first.steps[k] for k in alike)


@pytest.mark.parametrize("n", (1, 2, 3, 5, 8, 13, 64, 4096))
def test_bruck_allgather_ends_with_two_copies(n):
    """Own block in, ceil(log2 n) exchanges, then the slots mirrored and one copy to out: the same for every
    rank and any n (the proofs: test_checker_proves_every_algorithm_for_1_to_64_ranks, unequal counts too)."""
    algo = registry.lookup("allgather", "bruck")
    for r in sorted({0, 1 % n, n // 2, n - 1}):
        s = algo.schedule(r, n, counts=[5] * n)
        assert len(s.steps) == (n - 1).bit_length() + 2
        assert [type(o) for o in s.steps[-1]] == [Copy, Copy]
        assert sum(map(len, s.steps)) == 2 * (n - 1).bit_length() + 3

def test_checker_catches_wrong_schedules(monkeypatch):
    """The checker is not a rubber stamp: a missing reduction, a race and a deadlock are caught."""
    def no_reduce(rank, nranks, count):
        s = registry.lookup("allreduce", "ring").build(rank, nranks, count)
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
        monkeypatch.setitem(registry._REGISTRY, ("allreduce", name), registry.Algorithm("allreduce", name, fn))
        with pytest.raises(CheckError, match=msg):
            check("allreduce", name, 4, 9)


# --- the one-host fast path: segment schedules --------------------------------------------------
#: windows that make messages go in pieces, reductions take the two-round path, blocks move by
#: single-copy reads, pieces smaller than a window (a broadcast's; with them the reduce-scatter's and the
#: 2-rank reduce's two-round forms), both (an allgather's blocks put into every output a piece at a time);
#: then the windows the runtime computes for float32 on a 2 MiB area (ranks with a core each, and not)
WINDOWS = (Window(elements=4, oneshot=2), Window(elements=64, oneshot=100, piece=5),
           Window(elements=64, oneshot=8, single_copy=3), Window(elements=5, oneshot=1, single_copy=1),
           Window(elements=64, oneshot=8, single_copy=3, piece=5),
           Window.of(2 << 20, 4, True, True), Window.of(2 << 20, 4, True))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("prim", PRIMS)
def test_checker_proves_the_one_host_path_for_1_to_64_ranks(prim):
    """What runs on one host (segment schedules: windows, rounds, single-copy reads) is proven like
    every other algorithm: results, rounds in step, nobody returning while its buffer is read. Up to
    16 ranks with every window; beyond, one round of the runtime's window and single-copy reads."""
    slots = prim in ("reduce_scatter", "alltoall", "scatter")      # a slot per rank in each window
    for n in range(1, 65):
        for window in (WINDOWS if n <= 16 else (WINDOWS[-1], Window(n * (n + 2), 8, single_copy=2))):
            if slots and window.elements < n:
                continue
            for count in (sorted({0, 1, n + 1, 2 * window.elements + 3}) if window.elements < 100 and n <= 8
                          else (1, n + 1)):
                for root in (sorted({0, n - 1}) if prim in ROOTED else (0,)):
                    check(prim, "segment", n, count, root, window=window)
    if slots:
        with pytest.raises(ValueError, match="no slot"):
            args = PRIMITIVES[prim].args(8, 1)
            registry.lookup(prim, "segment").schedule(0, 8, window=Window(4, 2), **args)


def test_a_two_rank_reduce_goes_in_shares_up_to_a_mebibyte_then_the_root_reduces_it_all():
    """segment.SHARES_BYTES: where each rank has a core, a 2-rank reduce up to 1 MiB reduces shares (two
    rounds, every rank reducing), above it the root reduces every piece while the other copies the next in
    (the non-root reduces nothing), whatever the dtype; 3 ranks never take the root's form; both forms
    proven on either side of a small window's bound, for either root."""
    from pyxccl.algorithms import segment
    for itemsize in (2, 4, 8):
        window = Window.of(4 << 20, itemsize, True, True)
        mib = (1 << 20) // itemsize
        for root in (0, 1):
            at, above = (segment.reduce(1 - root, 2, c, root, window) for c in (mib, mib + 1))
            reduces = [any(getattr(o, "reduce", False) for step in s.steps for o in step) for s in (at, above)]
            assert len(at.steps) == 2 and len(above.steps) > 2 and reduces == [True, False], (itemsize, root)
    assert len(segment.reduce(1, 3, 1 << 20, 0, Window.of(4 << 20, 4, True, True)).steps) == 2
    with_shares = Window(elements=64, oneshot=2, piece=5, shares=12)
    for count in (3, 12, 13, 131):
        for root in (0, 1):
            assert (len(segment.reduce(0, 2, count, root, with_shares).steps) == 2) == (count <= 12)
            check("reduce", "segment", 2, count, root, window=with_shares)


def _broken(monkeypatch, prim, edit):
    """Register "t_broken": the fast path's schedule for ``prim`` with ``edit(rank, schedule)`` applied."""
    shm = registry.lookup(prim, "segment")

    def build(rank, nranks, **args):
        s = shm.build(rank, nranks, **args)
        edit(rank, s)
        return s
    monkeypatch.setitem(registry._REGISTRY, (prim, "t_broken"), registry.Algorithm(prim, "t_broken", build,
                                                                                   segment=True))


def test_checker_catches_a_broken_fast_path_step(monkeypatch):
    def unreduced(rank, s):          # the last round's reads copy instead of reducing
        s.steps[-1] = tuple(o._replace(reduce=False) if type(o) is Get else o for o in s.steps[-1])

    def no_last_round(rank, s):      # single copy: the owner may return while others read its buffer
        s.steps.pop()

    def early_read(rank, s):         # two-round reduction reading the others' windows of this round
        s.steps[1] = tuple(o._replace(prev=False) if type(o) is Get and o.prev else o for o in s.steps[1])

    def one_round_less(rank, s):     # rank 0 runs a round fewer: the counters part the ranks
        if rank == 0:
            s.steps.pop()

    def no_tee(rank, s):             # two-round reduction: my result share never reaches my output
        s.steps[-1] = tuple(o for o in s.steps[-1] if not (type(o) is Copy and o.src == "win"))
    for prim, edit, window, msg in (
            ("allreduce", unreduced, Window(64, 100), "contributions"),
            ("alltoall", no_last_round, Window(8, 8, single_copy=1), "may return while rank"),
            ("allgather", no_last_round, Window(64, 8, single_copy=1, piece=5), "may return while rank"),
            ("allreduce", early_read, Window(64, 2), "writes its window after publishing"),
            ("reduce_scatter", one_round_less, Window(8, 2), "different numbers of rounds"),
            ("allreduce", no_tee, Window(64, 2), "contributions"),
            ("reduce", no_tee, Window(64, 2), "contributions")):
        _broken(monkeypatch, prim, edit)
        with pytest.raises(CheckError, match=msg):
            check(prim, "t_broken", 3, 9, window=window)
    # a broadcast from BROADCAST_CMA_BYTES (16 single-copy thresholds: 16 elements here) reads the root's buffer
    _broken(monkeypatch, "broadcast", no_last_round)
    assert any(type(o) is Post for o in registry.lookup("broadcast", "segment").schedule(
        0, 3, window=Window(64, 8, single_copy=1), count=16, root=0).steps[0])
    with pytest.raises(CheckError, match="may return while rank"):
        check("broadcast", "t_broken", 3, 16, 0, window=Window(64, 8, single_copy=1))


def test_checker_proves_the_gather_by_puts(monkeypatch):
    """From single-copy sizes a gather writes every block into the root's output (Put): proven for 1..8
    ranks, every root, and (through its builder, which the registered gather calls with equal blocks
    only) uneven and zero blocks."""
    from pyxccl.algorithms import segment
    window = Window(64, 8, single_copy=2)
    monkeypatch.setitem(registry._REGISTRY, ("gather", "t_uneven"), registry.Algorithm(
        "gather", "t_uneven", lambda rank, nranks, counts, root, window: segment._gathering(
            rank, nranks, counts, window, root), segment=True))
    for n in range(1, 9):
        for root in range(n):
            for count in (0, 1, 2, 7):
                scheds = check("gather", "segment", n, count, root, window=window)
                assert any(type(o) is Put for o in scheds[root].steps[0]) == (count >= 2)
            for counts in ([(p * 3 + root) % 5 for p in range(n)], [0] * (n - 1) + [9], [9] + [0] * (n - 1)):
                scheds = check("gather", "t_uneven", n, root=root, window=window, counts=counts)
                assert any(type(o) is Post and o.writes for o in scheds[root].steps[0]) == (max(counts) >= 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (2, 3))
def test_gather_by_puts_on_a_rank_pool(pools, n):
    """Real processes on the segment, from single-copy sizes (every rank writes its block into the root's
    output): every root, in place and not, a block of the threshold and a larger odd one, plain and
    prepared: the concatenation, bit for bit."""
    from pyxccl.algorithms.segment import CMA_BYTES
    out = pools(n).run(rf.segment_gather_by_puts, (CMA_BYTES // 4, CMA_BYTES + 12_345), transport="shm", timeout=250)
    fails = [f"rank {r}: {f}" for r, (fs, _, _, _) in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])
    assert all(algos == ["segment"] for _, algos, _, _ in out), out
    if not all(cma for *_, cma in out):
        pytest.skip("single-copy moves are not allowed here (ptrace rules): the gathers above took the windows")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (2, 3))
def test_broadcast_by_puts_on_a_rank_pool(pools, n):
    """Real processes on the segment, from BROADCAST_CMA_BYTES (the root writes the head of its buffer into
    every other rank's while they read the rest): every root, a count of the threshold and a larger odd
    one, plain and prepared: the root's buffer, bit for bit."""
    from pyxccl.algorithms.segment import BROADCAST_CMA_BYTES
    out = pools(n).run(rf.segment_broadcasts, (BROADCAST_CMA_BYTES // 4, BROADCAST_CMA_BYTES // 4 + 12_345),
                       transport="shm", timeout=250)
    fails = [f"rank {r}: {f}" for r, (fs, *_) in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])
    assert all(algos == ["segment"] for _, algos, *_ in out), out


def test_broadcast_by_single_copies_from_a_smaller_size_where_every_rank_has_a_core():
    """A broadcast reads the root's buffer (Post, then single copies) from BROADCAST_CMA_OWN_BYTES where every
    rank has a core of its own (Window.piece), else from BROADCAST_CMA_BYTES; below, through the windows."""
    from pyxccl.algorithms.segment import BROADCAST_CMA_BYTES, BROADCAST_CMA_OWN_BYTES

    def by_single_copies(nbytes, own_cores):
        w = Window.of(2 << 20, 4, cma=True, pipelined=own_cores)
        steps = registry.lookup("broadcast", "segment").schedule(1, 2, window=w, count=nbytes // 4, root=0).steps
        return any(type(o) is Post for o in steps[0])
    for own in (True, False):
        start = BROADCAST_CMA_OWN_BYTES if own else BROADCAST_CMA_BYTES
        assert by_single_copies(start, own) and by_single_copies(BROADCAST_CMA_BYTES, own)
        assert not by_single_copies(start - 4, own)


def test_allgather_puts_its_blocks_into_every_output_at_any_size_where_every_rank_has_a_core():
    """Where every rank has a core of its own (Window.piece), an allgather's block goes into every output a
    piece at a time (Puts of TEE_PIECE_BYTES) however large; elsewhere through the windows at every size (no
    single copies: see segment._gathering)."""
    from pyxccl.algorithms.segment import TEE_PIECE_BYTES

    def steps(nbytes, own_cores):
        w = Window.of(2 << 20, 4, cma=True, pipelined=own_cores)
        return registry.lookup("allgather", "segment").schedule(1, 2, window=w, counts=[nbytes // 4] * 2).steps
    for nbytes in (1 << 20, 64 << 20):
        puts = [o for o in steps(nbytes, True)[0] if type(o) is Put]
        assert len(puts) == 2 * (nbytes // TEE_PIECE_BYTES) and {o.count * 4 for o in puts} == {TEE_PIECE_BYTES}
        assert not any(type(o) in (Put, Post) for step in steps(nbytes, False) for o in step)


def test_alltoall_and_scatter_read_single_copies_where_the_windows_take_more_rounds_where_ranks_share_cores():
    """An alltoall's or a scatter's blocks move by single-copy reads of the senders' inputs (Post, then Gets)
    from CMA_BYTES where every rank has a core of its own (Window.piece), else only where the windows would
    take more than SHARED_ROUNDS rounds (see segment._dealing); below, through the windows."""
    from pyxccl.algorithms.segment import CMA_BYTES, SHARED_ROUNDS

    def by_single_copies(prim, block_bytes, own_cores, n):
        w, c = Window.of(2 << 20, 4, cma=True, pipelined=own_cores), block_bytes // 4
        args = dict(send_counts=[c] * n, recv_counts=[c] * n) if prim == "alltoall" else dict(counts=[c] * n, root=0)
        steps = registry.lookup(prim, "segment").schedule(0, n, window=w, **args).steps
        return any(type(o) is Post for step in steps for o in step)
    for prim in ("alltoall", "scatter"):
        for n in (3, 4, 8):
            for own in (True, False):
                start = CMA_BYTES if own else max(CMA_BYTES, SHARED_ROUNDS * ((2 << 20) // 4 // n) * 4 + 4)
                assert by_single_copies(prim, start, own, n) and by_single_copies(prim, 64 << 20, own, n)
                assert not by_single_copies(prim, start - 4, own, n)


def test_free_rounds_begin_at_once_where_nothing_read_of_the_rank_is_written(monkeypatch):
    """walk.free (rule 1): a segment round begins without waiting for the peers' round before only where
    it is not the call's first, writes nothing into its window, posts and puts nothing and reads no window
    of the round before; the native programs say so in BEGIN's word 1, round by round; and every later
    round taken as free is caught by the checker (a window of the round before read unpublished, a window
    rewritten while a peer may still read it two rounds before)."""
    from pyxccl import walk
    from pyxccl.core import onehost
    assert not walk.free(0, (Sync(1),))
    assert all(walk.free(1, step) for step in ((Sync(1),), (Get(1, 0, "out", 0, 4),), (Copy("in", 0, "out", 0, 4),)))
    for op in (Copy("in", 0, "win", 0, 4), Get(1, 0, "win", 0, 4), Get(1, 0, "out", 0, 4, prev=True),
               Post("in", 0, 4), Put(1, 0, "in", 0, 4)):
        assert not walk.free(1, (Sync(1), op)), op
    width = onehost._native.tables()["width"]
    cases = (("barrier", 4, Window(4, 2), {}), ("reduce", 2, Window(64, 8), dict(count=300, root=0)),
             ("broadcast", 3, Window(4, 2), dict(count=9, root=1)),
             ("alltoall", 3, Window(64, 8, single_copy=3), dict(send_counts=[5] * 3, recv_counts=[5] * 3)))
    seen = set()
    for prim, n, window, args in cases:
        for rank in range(n):
            s = registry.lookup(prim, "segment").schedule(rank, n, window=window, **args)
            code = np.frombuffer(onehost.program(s, 4), np.int64).reshape(-1, width)
            frees = [walk.free(k, step) for k, step in enumerate(s.steps)]
            assert list(code[code[:, 0] == 1, 1]) == frees, (prim, rank)
            seen.update(frees)
    assert seen == {True, False}
    monkeypatch.setattr(walk, "free", lambda k, step: k > 0)
    with pytest.raises(CheckError, match="before rank . published it"):
        check("reduce", "segment", 2, 300, 0, window=Window(64, 8))
    with pytest.raises(CheckError, match="writes its window while rank . may still read it from round"):
        check("broadcast", "segment", 3, 30, 0, window=Window(4, 2))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (2, 3))
def test_broadcast_in_pieces_on_a_rank_pool(pools, n):
    """Real processes on the segment, below BROADCAST_CMA_BYTES: where every rank has a core of its own (all
    ranks agree on it at init) a broadcast goes in PIECE_BYTES pieces, else in windows; every root, a count
    of several pieces and one of a piece and a bit, plain and prepared: the root's buffer, bit for bit."""
    from pyxccl.algorithms.segment import PIECE_BYTES
    out = pools(n).run(rf.segment_broadcasts, (5 * PIECE_BYTES // 4 + 3, PIECE_BYTES + 1),
                       transport="shm", timeout=250)
    fails = [f"rank {r}: {f}" for r, (fs, *_) in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])
    assert all(algos == ["segment"] for _, algos, _, _ in out), out
    cpus = min(c for *_, c in out)
    assert [p for _, _, p, _ in out] == [n <= cpus] * n, out


def test_checker_catches_a_broken_put(monkeypatch):
    """A gather from single-copy sizes writes every block into the root's posted output (Put): a Put
    into a buffer not posted, or not posted for writing, or past its end, two Puts into one region, a
    read of a region while it is written (by another rank, or by its owner before it heard from the
    writer's next round), and the root returning before the writers are done are each reported."""
    window, c = Window(64, 8, single_copy=1), 5

    def edit_rank(which, fn):
        return lambda rank, s: fn(s) if rank == which else None

    def ops(s, k, keep=lambda o: True, add=()):
        s.steps[k] = tuple(o for o in s.steps[k] if keep(o)) + tuple(add)

    def needs_tmp(s):
        s.scratch = c
    no_post = edit_rank(0, lambda s: ops(s, 0, lambda o: type(o) is not Post))
    read_only = edit_rank(0, lambda s: ops(s, 0, lambda o: type(o) is not Post, [Post("out", 0, 3 * c)]))
    past_end = edit_rank(2, lambda s: s.steps.__setitem__(0, (Put(0, 2 * c + 1, "in", 0, c),)))
    same_region = edit_rank(2, lambda s: s.steps.__setitem__(0, (Put(0, c, "in", 0, c),)))
    read_meanwhile = edit_rank(2, lambda s: needs_tmp(s) or ops(s, 0, add=[Get(0, c, "tmp", 0, c)]))
    owner_too_soon = edit_rank(0, lambda s: needs_tmp(s) or ops(s, 1, add=[Copy("out", c, "tmp", 0, c)]))
    no_last_round = edit_rank(0, lambda s: ops(s, 1, lambda o: False, [Sync(0)]))
    for edit, msg in ((no_post, "posted no buffer in round 0"), (read_only, "posted no buffer for writing"),
                      (past_end, r"puts \[11:16\] into rank 0's posted buffer of 15"),
                      (same_region, r"rank [12] round 0 writes out\[5:10\] of rank 0 while rank [12] may still put"),
                      (read_meanwhile, r"rank 2 round 0 reads out\[5:10\] of rank 0 while rank 1 may still put"),
                      (owner_too_soon, r"rank 0 round 1 reads out\[5:10\] of rank 0 while rank 1 may still put"),
                      (no_last_round, "may return while rank 1 still puts")):
        _broken(monkeypatch, "gather", edit)
        with pytest.raises(CheckError, match=msg):
            check("gather", "t_broken", 3, c, 0, window=window)

    def owner_after(rank, s):       # the same read a round later, once it heard from every writer: right
        needs_tmp(s)
        s.steps.append((Copy("out", c, "tmp", 0, c),) if rank == 0 else (Sync(rank),))
    _broken(monkeypatch, "gather", owner_after)
    assert any(type(o) is Put for o in check("gather", "t_broken", 3, c, 0, window=window)[1].steps[0])


def test_link_classes_follow_the_mesh(pools, transport):
    """Every pair's class (the rule the tuner trusts, ``tuning.cost.HostLinks``) is the mesh's transport
    between them, named as the cost model names it: on one host, shared memory or TCP."""
    assert pools(3).run(rf.link_rule_mismatches, transport=transport) == [[]] * 3


REAL_SIZES = tuple(range(1, 10))
REAL_PAIRS = rf.valid_pairs((np.float32, np.float16, rf.bfloat16, np.int32), tuple(ReduceOp))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", REAL_SIZES)
def test_every_allreduce_algorithm_forced_matches_numpy(pools, transport, n):
    out = pools(n).run(rf.check_forced, "allreduce", "usable", (0, 1, 7, 1000), REAL_PAIRS, transport=transport,
                       timeout=250)
    fails = [f"rank {r}: {f}" for r, fs in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", REAL_SIZES)
def test_every_other_algorithm_forced_matches_numpy(pools, transport, n):
    fails = []
    for prim in PRIMS[1:]:
        out = pools(n).run(rf.check_forced, prim, "usable", (0, 1, 7, 1000), REAL_PAIRS,
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
        assert pool.run(rf.link_rule_mismatches, transport="auto") == [[]] * len(hosts)
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
    algo = registry.lookup("alltoall", "hierarchical")
    with pytest.raises(ValueError, match="equal block sizes"):
        algo.schedule(0, 4, hosts=[0, 0, 1, 1], send_counts=[1, 2, 1, 1], recv_counts=[1, 2, 1, 1])
    with pytest.raises(ValueError, match="equal block sizes"):
        algo.schedule(0, 3, hosts=[0, 0, 1], send_counts=[2, 2, 2], recv_counts=[2, 2, 3])
    # one host: the flat inner algorithm, which takes any counts
    algo.schedule(0, 3, hosts=[0, 0, 0], send_counts=[1, 2, 3], recv_counts=[1, 4, 5])


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
def test_hierarchical_with_unequal_counts(prim):
    """The v-variants (allgatherv, ...) give the builders unequal counts, zeros included."""
    for hosts in LAYOUTS.values():
        n = len(hosts)
        for counts in ([(p + k) % 5 for p in range(n)] for k in range(3)):
            for root in (range(n) if prim in ROOTED else (0,)):
                check(prim, "hierarchical", n, root=root, hosts=hosts, counts=counts)


def test_checker_takes_unequal_counts():
    for prim, algo in (("allgather", "ring"), ("allgather", "segment"), ("reduce_scatter", "direct"),
                       ("reduce_scatter", "segment"), ("allgather", "bruck")):
        for counts in ([3, 0, 5, 1], [0, 0, 0, 2], [7, 1, 1, 1]):
            check(prim, algo, 4, counts=counts, window=Window(elements=4, oneshot=2))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (2, 3))
def test_large_reductions_on_the_segment_give_the_rank_order_sum(pools, n):
    """Real processes, the runtime's windows (2 MiB): one piece on the two-round path, and several
    pieces with a short last one, float32 and float64, in place and not: the rank-order sum's bits.
    Reduce-scatters too; at 2 ranks on this machine (a core each) the reduce-scatter's and the reduce's
    two-round forms.
    (The large paths had no multi-process test; kept as a guard for whoever changes them next.)"""
    out = pools(n).run(rf.segment_large_reductions, (n * 70_001 + 1, 1_300_001), transport="shm", timeout=250)
    fails = [f"rank {r}: {f}" for r, fs in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])
