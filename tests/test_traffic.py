"""Communicator.traffic(): what each call's schedule moved, counted on every path."""
import pytest

import rankfns as rf

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("n", (2, 3, 4))
def test_every_algorithm_counts_what_its_schedule_moved(pools, transport, n):
    count = 1000
    out = pools(n).run(rf.traffic_of_every_algorithm, count, transport=transport, timeout=200)
    G = count * n * 4               # the whole vector, bytes
    for (prim, algo), per_rank in ((k, [o[k] for o in out]) for k in out[0]):
        calls = {c for c, *_ in per_rank}
        assert calls == {2} or (prim in ("send", "recv")), (prim, algo, per_rank)
        sent, received = sum(r[2] for r in per_rank), sum(r[3] for r in per_rank)
        if prim in ("send", "recv"):
            continue
        from pyxccl.algorithms import registry
        if registry.lookup(prim, algo).segment:
            assert sent == 0 and received > 0, (prim, algo, per_rank)    # one host's segment: reads
        else:
            assert sent == received > 0, (prim, algo, per_rank)         # every byte sent is received once
        if algo == "ring" and prim == "allreduce":
            assert all(r[2] == r[3] == 2 * 2 * G * (n - 1) // n for r in per_rank), per_rank
        if algo == "ring" and prim in ("allgather", "reduce_scatter"):
            assert all(r[2] == r[3] == 2 * G * (n - 1) // n for r in per_rank), per_rank
        if prim in ("allreduce", "reduce_scatter", "alltoall", "broadcast", "allgather"):
            assert all(r[1] == 2 * G for r in per_rank), (prim, algo, per_rank)   # payload: the whole buffer
    assert out[0][("send", None)] == (1, count * 4, count * 4, 0)
    assert out[1][("recv", None)] == (1, count * 4, 0, count * 4)
