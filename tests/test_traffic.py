"""Communicator.traffic(): what each call's schedule moved, counted on every path."""
import pytest

import rankfns as rf

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("n", (2, 3, 4, 5))
def test_every_algorithm_counts_what_its_schedule_moved(pools, transport, n):
    count = 1000
    out = pools(n).run(rf.traffic_of_every_algorithm, count, transport=transport, timeout=200)
    G = count * n * 4               # the whole vector, bytes
    from pyxccl.algorithms import registry
    assert transport == "tcp" or ("allreduce", "segment") in out[0], sorted(out[0])    # the segment ran
    for (prim, algo), per_rank in ((k, [o[k] for o in out]) for k in out[0]):
        calls = {c for c, *_ in per_rank}
        assert calls == {2} or (prim in ("send", "recv")), (prim, algo, per_rank)
        sent, received = sum(r[2] for r in per_rank), sum(r[3] for r in per_rank)
        if prim in ("send", "recv"):
            continue
        assert sent == received, (prim, algo, per_rank)        # every byte sent is received once
        assert sent > 0 or prim == "barrier", (prim, algo, per_rank)
        if algo == "ring" and prim == "allreduce":
            assert all(r[2] == r[3] == 2 * 2 * G * (n - 1) // n for r in per_rank), per_rank
        if algo == "ring" and prim in ("allgather", "reduce_scatter"):
            assert all(r[2] == r[3] == 2 * G * (n - 1) // n for r in per_rank), per_rank
        if registry.lookup(prim, algo).segment and prim in ("allgather", "alltoall"):
            # every rank reads every other rank's block once: n - 1 blocks each way, twice
            assert all(r[2] == r[3] == 2 * G * (n - 1) // n for r in per_rank), (prim, per_rank)
        if prim in ("allreduce", "reduce_scatter", "alltoall", "broadcast", "allgather"):
            assert all(r[1] == 2 * G for r in per_rank), (prim, algo, per_rank)   # payload: the whole buffer
    assert out[0][("send", None)] == (1, count * 4, count * 4, 0)
    assert out[1][("recv", None)] == (1, count * 4, 0, count * 4)


@pytest.mark.parametrize("n", (2, 3, 5))
def test_sent_equals_received_where_blocks_move_in_pieces_or_by_single_copy_reads(pools, transport, n):
    """256 KiB blocks: the segment's allreduce in two rounds (past its one-shot size), its allgather
    and alltoall by single-copy reads (where the kernel allows them), the transports in slices."""
    out = pools(n).run(rf.traffic_of_every_algorithm, 1 << 16, transport=transport, timeout=200)
    assert transport == "tcp" or ("allgather", "segment") in out[0], sorted(out[0])
    for key in [k for k in out[0] if k[0] not in ("send", "recv")]:
        per_rank = [o[key] for o in out]
        assert sum(r[2] for r in per_rank) == sum(r[3] for r in per_rank), (key, per_rank)


def test_the_segment_counts_what_a_rank_publishes_for_others_as_sent(pools):
    """2 ranks, two 1 MiB allreduces on the segment: each rank reduces its half from the other's window
    (reading 512 KiB of it) and reads the other's reduced half (512 KiB): 1 MiB received per call, and
    the other reads as much of it: 1 MiB sent, as over TCP's ring."""
    out = pools(2).run(rf.segment_allreduce_traffic, 1 << 20, transport="shm")
    for algo, sent, received in out:
        assert algo == "segment"
        assert sent == received == 2 << 20, (sent, received)


def test_the_segment_counts_a_gather_by_puts_as_the_writers_sending(pools):
    """3 ranks, a gather on the segment from single-copy sizes: every rank writes its block into the root's
    output (Put), so each writer counts its block as sent and the root the others' blocks as received."""
    from pyxccl.algorithms.segment import CMA_BYTES
    count = CMA_BYTES // 4
    out = pools(3).run(rf.segment_gather_by_puts, (count,), transport="shm", timeout=200)
    block = 4 * count
    for r, (fails, algos, moved, _) in enumerate(out):
        assert not fails and algos == ["segment"], (fails, algos)
        assert moved == [(0, 2 * block) if root == r else (block, 0) for root in range(3)], (r, moved)


def test_tallies_count_puts_when_read():
    """A segment schedule with Puts: its ``sent`` (its own Puts into others, others' reads of it) and its
    ``received`` (others' Puts into it) are both found when the counters are read."""
    from pyxccl.core.counters import Traffic, schedule_io
    from pyxccl.schedule import Post, Put, Schedule

    def sched(rank, n=3, count=5):
        s = Schedule(rank, n, segment=True)
        s.step(*((Post("out", 0, n * count, writes=True),) if rank == 0 else ()), Put(0, rank * count, "in", 0, count))
        s.peers = lambda q: sched(q, n, count)
        return s
    t = Traffic()
    for r in range(3):
        assert schedule_io(sched(r), 4) == (None, None)
        t.tally(f"gather{r}", 60, None, None, sched(r), 4).count()
    got = t.snapshot()
    assert [(got[f"gather{r}"]["sent"], got[f"gather{r}"]["received"]) for r in range(3)] == [(0, 40), (20, 0), (20, 0)]


def test_tallies_are_added_when_read_and_nothing_waits_without_bound():
    """A prepared call counts its calls in a Tally; they are added to the counters when the counters
    are read, a segment schedule's ``sent`` (its peers' reads of it: n schedules to build) found then;
    past 256 tallies waiting, the oldest is added; a tally counts on after a reading."""
    from pyxccl.core.counters import Traffic
    from pyxccl.schedule import Get, Schedule

    def sched(rank, n=3, count=5):
        s = Schedule(rank, n)
        s.segment = True
        s.step(*(Get(p, 0, "out", 0, count) for p in range(n) if p != rank))
        s.peers = lambda q: sched.__wrapped__(q, n, count)
        return s
    sched.__wrapped__ = sched
    t = Traffic()
    ts = [t.tally("allreduce", 20, None, 40, sched(0), 4) for _ in range(300)]
    for x in ts:
        x.count()
        x.count()
    assert len(t._unsettled) == 256 and sum(x.calls == 0 for x in ts) == 300 - 256   # the oldest, added as they left
    assert all(x.sent == 2 * 5 * 4 for x in ts[:300 - 256]) and all(x.sent is None for x in ts[-256:])
    got = t.snapshot()["allreduce"]
    # 2 peers read 5 float32 each, per call
    assert (got["calls"], got["bytes"], got["sent"], got["received"]) == (600, 600 * 20, 600 * 2 * 5 * 4, 600 * 40)
    assert all(x.sent == 2 * 5 * 4 and x.calls == 0 for x in ts) and not t._unsettled
    ts[0].count()                   # counts on after a reading
    assert t.snapshot()["allreduce"]["calls"] == 601
