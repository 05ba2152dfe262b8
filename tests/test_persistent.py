"""Persistent requests (comm.*_init, issue 28 item 1): every primitive right on repeat with new data written
into the buffers of its init (in place and out of place, every root), bit for bit the plain call's result on
the same inputs, the MPI states (start twice, free, start after free, the blocking form, test polling),
starts that skip the full path, and errors (mismatch, timeout, a lost peer) as for plain calls."""
import numpy as np
import pytest

import persistentfns as pf
import pyxccl
from pyxccl.testing import RankPool


def _ok(results):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not fails, f"{len(fails)} failures:\n" + "\n".join(fails[:20])


def test_the_request_type_is_public():
    assert pyxccl.PersistentRequest.__module__ == "pyxccl.core.persistent"
    for prim in ("allreduce", "broadcast", "reduce", "allgather", "allgatherv", "gather", "gatherv", "scatter",
                 "scatterv", "reduce_scatter", "reduce_scatterv", "alltoall", "alltoallv", "barrier", "send", "recv"):
        assert getattr(pyxccl.Communicator, f"{prim}_init").__doc__, prim


def test_the_python_request_base_is_the_c_ones():
    """core/persistent.py's ``_Request`` stands in for ``_native.Request`` where the module is not built: the
    same fields, and a request without a C call of its own (``_mine`` None) runs ``_run`` either way."""
    from pyxccl.core import onehost, persistent
    if onehost._native is None:
        pytest.skip("the C executor is not built here")
    bases = (onehost._native.Request, persistent._Request)
    assert [sorted(m for m in dir(b) if not m.startswith("__")) for b in bases] == \
        [sorted(persistent._Request.__slots__) + ["run"]] * 2
    for base in bases:
        class R(base):
            __slots__ = ()

            def _run(self):
                return "ran", self.result

        q = R()
        q._mine, q._work, q._freed, q.result = None, None, False, 7
        assert q() == q.run() == ("ran", 7), base
        q._mine = object()          # not a Call: Python's way too
        assert q() == ("ran", 7), base
        with pytest.raises(TypeError):
            q(1)


@pytest.mark.timeout(120)
def test_a_job_without_the_c_module(tmp_path):
    """Where pyxccl._native cannot be imported (built without a compiler) the classes whose bases it gives
    (Context: Books, Tally: Count, PersistentRequest: Request) stand on Python's: calls, persistent starts,
    the counters, the recorder and a mismatch error's naming of the call work as with it."""
    import subprocess
    import sys
    import textwrap
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.modules["pyxccl._native"] = None       # import pyxccl._native raises ImportError
        import numpy as np
        import pyxccl
        from pyxccl.core import onehost, persistent
        assert onehost._native is None and persistent.PersistentRequest.__bases__ == (persistent._Request,)
        comm = pyxccl.init()
        x = np.ones(4, np.float32)
        for _ in range(3):
            comm.allreduce(x)
        req = comm.allreduce_init(x)
        for _ in range(3):
            req()
        req.start(); req.wait()
        assert np.all(x == 2 ** 7), x
        assert comm.traffic()["allreduce"]["calls"] == 7, comm.traffic()
        assert [e["state"] for e in comm.flight_record()[-7:]] == ["done"] * 7
        try:
            if comm.rank == 0:
                comm.allreduce(x)
            else:
                comm.broadcast(x)
        except pyxccl.CollectiveMismatchError as e:
            assert ("allreduce" if comm.rank == 0 else "broadcast") in str(e), e
            print("ok", comm.rank, flush=True)
    """))
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "2", str(script)], capture_output=True,
                       text=True, timeout=100)
    assert p.returncode == 0 and "ok 0" in p.stdout and "ok 1" in p.stdout, p.stdout + p.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", (2, 3, 4))
def test_every_primitive_right_on_repeat_and_bit_for_bit_the_plain_call(pools, transport, n):
    _ok(pools(n).run(pf.every_primitive, transport=transport, timeout=200))


def test_torch_tensors(pools):
    pytest.importorskip("torch")
    _ok(pools(2).run(pf.torch_tensors, transport="shm"))


def test_a_start_runs_the_prepared_call_of_its_init(pools):
    """No argument check, key, plan lookup or new prepared call per start."""
    _ok(pools(2).run(pf.starts_skip_the_full_path, transport="shm"))


@pytest.mark.parametrize("transport", ("shm", "tcp"))
def test_request_states_as_mpi_has_them(pools, transport):
    _ok(pools(2).run(pf.refusals, transport=transport))


def test_a_blocking_start_the_c_call_does_not_finish(pools, transport):
    """A late peer, a busy engine, another thread, AVG: the blocking start's ways besides one C call."""
    _ok(pools(2).run(pf.blocking_start_answers, transport=transport))


def test_persistent_send_and_recv(pools):
    _ok(pools(3).run(pf.point_to_point, transport="tcp"))


@pytest.mark.parametrize("transport", ("shm", "tcp"))
def test_mismatched_persistent_calls_raise_on_every_rank(pools, transport):
    out = pools(2).run(pf.mismatched, transport=transport)
    for r, (name, msg, again) in enumerate(out):
        assert name == "CollectiveMismatchError", (r, name, msg)
        assert f"rank {r}:" in msg and f"rank {1 - r}" in msg and "allreduce" in msg, msg
        assert again == "CollectiveMismatchError", (r, again)      # the aborted communicator refuses the next start


@pytest.mark.timeout(60)
def test_a_persistent_call_that_times_out_names_the_rank_that_never_started(pools):
    out = pools(2).run(pf.timed_out, 1, 1.0, transport="shm", timeout=40)
    name, peer, msg = out[0]
    assert (name, peer) == ("CommTimeoutError", 1), msg
    assert "rank 1 never entered it" in msg and "allreduce" in msg, msg
    assert out[1][0] is not None, out[1]          # the idle rank's late start fails too (the call was aborted)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("prim, transport, shrink", [("allreduce", "shm", True), ("allreduce", "tcp", False),
                                                     ("broadcast", "shm", False), ("allgather", "tcp", False),
                                                     ("alltoall", "shm", False)])
def test_a_peer_lost_during_a_persistent_call_is_named(prim, transport, shrink):
    n, victim = 3, 1
    pool = RankPool(n, transports=(transport,))
    try:
        out = pool.run(pf.killed_during, victim, prim, shrink, transport=transport, expect_dead=(victim,), timeout=60)
    finally:
        pool.close()
    for r, res in enumerate(out):
        if r == victim:
            continue
        name, peer, seconds, msg, op, later, shrunk = res
        assert (name, peer, op) == ("PeerLostError", victim, prim), f"rank {r}: {op}: {msg}"
        assert f"rank {victim}" in msg and seconds < 10, (seconds, msg)
        assert later.startswith("PeerLostError") and "refused" in later, later   # the failed communicator's
        if shrink:
            assert shrunk == (n - 1, True), shrunk
