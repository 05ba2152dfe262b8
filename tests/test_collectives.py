"""Every primitive against a numpy reference: world sizes 1, 2, 3, 4, 5, 8, both
transports, every dtype and every reduce op that applies to it."""
import numpy as np
import pytest

import rankfns as rf
from conftest import SIZES
from pyxccl.dtypes import DTYPES
from pyxccl.ops import ReduceOp

COUNTS = (0, 1, 7, 1000)
pytestmark = pytest.mark.timeout(300)


def _ok(results):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.parametrize("n", SIZES)
def test_allreduce_every_op_and_dtype(pools, transport, n):
    _ok(pools(n).run(rf.check_allreduce, COUNTS, rf.valid_pairs(), transport=transport, timeout=200))


@pytest.mark.parametrize("n", SIZES)
def test_allreduce_large(pools, transport, n):
    pairs = rf.valid_pairs((np.float32, np.int64), (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BXOR, ReduceOp.AVG))
    _ok(pools(n).run(rf.check_allreduce, (rf.BIG,), pairs, transport=transport))


@pytest.mark.parametrize("n", SIZES)
def test_reduce(pools, transport, n):
    _ok(pools(n).run(rf.check_reduce, COUNTS, rf.valid_pairs(), transport=transport, timeout=200))
    _ok(pools(n).run(rf.check_reduce, (rf.BIG,), rf.valid_pairs((np.float32,), (ReduceOp.SUM,)),
                     transport=transport))


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter(pools, transport, n):
    _ok(pools(n).run(rf.check_reduce_scatter, COUNTS, rf.valid_pairs(), transport=transport, timeout=200))
    _ok(pools(n).run(rf.check_reduce_scatter, (rf.BIG // n,), rf.valid_pairs((np.float32,), (ReduceOp.SUM,)),
                     transport=transport))


@pytest.mark.parametrize("n", SIZES)
def test_data_movement(pools, transport, n):
    _ok(pools(n).run(rf.check_movement, COUNTS, DTYPES, transport=transport, timeout=200))
    _ok(pools(n).run(rf.check_movement, (rf.BIG // n,), (np.float32,), transport=transport))


@pytest.mark.parametrize("n", SIZES)
def test_point_to_point(pools, transport, n):
    _ok(pools(n).run(rf.check_p2p, COUNTS + (rf.BIG,), transport=transport))


@pytest.mark.parametrize("n", SIZES)
def test_objects_and_split(pools, transport, n):
    _ok(pools(n).run(rf.check_objects_and_split, transport=transport))


@pytest.mark.parametrize("n", (2, 3))
def test_several_connections_per_peer(pools, n):
    """PYXCCL_NSOCKS=3: large messages striped over three connections per peer pair, received in
    any order of stripes, reduced or copied, matched in the order they were sent."""
    env = {"PYXCCL_NSOCKS": "3", "PYXCCL_STRIPE_BYTES": "4096", "PYXCCL_TRANSPORT": "tcp"}
    pairs = rf.valid_pairs((np.float32, np.int64), (ReduceOp.SUM, ReduceOp.MAX))
    checks = [("check_p2p", (COUNTS + (rf.BIG,),)), ("check_allreduce", ((1000, rf.BIG), pairs)),
              ("check_movement", ((5000, rf.BIG // n), (np.float32, np.int8)))]
    _ok(pools(n).run(rf.on_new_comm, env, checks, timeout=120))


@pytest.mark.parametrize("n", (3, 4))
def test_free_rounds_on_a_rank_pool(pools, n):
    """Real processes: barriers (rank 0's release where ranks share cores: its second round free) and small
    calls of every root in turn, then broadcasts of several windows, both executors' rounds right and no
    call taken for another's (rankfns.free_rounds_in_a_mix)."""
    out = pools(n).run(rf.free_rounds_in_a_mix, transport="shm", timeout=250)
    _ok([fs for fs, _, _ in out])
    cpus = min(c for *_, c in out)
    assert [p for _, p, _ in out] == [n <= cpus] * n, out
