"""Every documented call form of every array collective, repeated with new data (the repeats may run
prepared, core/prepared.py), equals numpy on every rank; wrong buffers are refused, on the first and on a
repeated call, and leave the communicator usable; torch tensors give the same results; two threads with a
communicator each drive thousands of calls of more shapes than the prepared-call cache keeps. `make test`
runs this file again with PYXCCL_NATIVE=0 (the pure-Python executor). Issue 25: a repeated allocating
call (gather with recvbuf=None at the root) ran prepared without its output."""
import pytest

import callformfns as cf
from pyxccl.testing import RankError, RankPool


def _ok(results):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    # the causes first: a rank's error aborts the dup its form runs on, its peers then see PeerLostError
    fails.sort(key=lambda f: "PeerLostError" in f)
    assert not fails, f"{len(fails)} failures:\n" + "\n".join(fails[:40])


@pytest.mark.parametrize("n", (1, 2, 3, 4, 5))
def test_every_call_form_repeated_equals_numpy(pools, transport, n):
    _ok(pools(n).run(cf.every_form, transport=transport, timeout=120))


def test_the_forms_cover_every_collective_and_algorithm(pools):
    """The list the test above runs: every array collective and v-variant, in and out of place, allocating,
    every root, the default, a message and the segment algorithm (shm pool communicators)."""
    names = pools(3).run(cf.form_names, transport="shm")[0]
    for prim in ("allreduce", "broadcast", "reduce", "allgather", "allgatherv", "gather", "gatherv", "scatter",
                 "scatterv", "reduce_scatter", "reduce_scatterv", "alltoall", "alltoallv", "barrier"):
        assert any(name.startswith(prim + " ") for name in names), prim
    for must in ("gather float32 c=3 algo=None root=2 recvbuf=None at the root (allocates)",
                 "gatherv int64 counts=[600, 650, 0] root=1 recvbuf=None at the root (allocates)",
                 "alltoall uint8 c=0 algo=pairwise", "reduce float16 c=5 algo=segment root=2 out everywhere",
                 "allgather float32 c=3 algo=segment recvbuf=None", "reduce_scatter int64 c=700 algo=segment in place",
                 "scatter float32 c=3 algo=binomial root=1 in place at the root", "barrier algo=segment"):
        assert must in names, must


def test_every_call_form_with_torch_tensors(pools):
    pytest.importorskip("torch")
    _ok(pools(3).run(cf.every_form, "torch", transport="shm", timeout=120))


@pytest.mark.parametrize("n", (2, 3))
def test_wrong_buffers_are_refused_first_and_repeated(pools, transport, n):
    """A wrong output size, a read-only or non-contiguous buffer, an overlap off the in-place form, another
    dtype, None where a buffer is needed: InvalidArgumentError on the calling rank before the same shape
    ran, after it ran twice (prepared) and again; the buffers untouched; the communicator usable after."""
    _ok(pools(n).run(cf.refusals, transport=transport, timeout=120))


def test_two_threads_with_a_communicator_each_drive_many_shapes(pools, transport):
    """10,000 blocking calls from two threads (each on its own dup), of more shapes than the prepared-call
    cache keeps (core/prepared.py _KEPT): every result right."""
    from pyxccl.core.prepared import _KEPT
    res = pools(2).run(cf.two_threads, 5000, transport=transport, timeout=120)
    _ok([x["fails"] for x in res])
    for x in res:
        assert min(x["shapes"].values()) > _KEPT, x["shapes"]


@pytest.mark.parametrize("victim", (0, 1))
def test_a_rank_that_dies_fails_the_call(victim):
    """A crashed rank (SIGSEGV, as issue 25's root) fails the pool call with a RankError naming it, not
    a hang (the shared pools replace a pool that lost a rank)."""
    pool = RankPool(2, transports=("shm",))
    try:
        with pytest.raises(RankError, match=f"rank {victim} died"):
            pool.run(cf.crash_on, victim, transport="shm", timeout=60)
        assert not pool.alive
    finally:
        pool.close()
