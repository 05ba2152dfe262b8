"""Reliability: lost ranks, ranks that stop calling, abort(), the flight recorder and the doctor,
close/init cycles. Each test that kills or stalls a rank uses a pool of its own."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import rankfns as rf
from pyxccl import doctor
from pyxccl.testing import RankPool


def _diagnosis(where) -> str:
    docs = doctor.load(str(where))
    assert docs, f"no dumps in {where}"
    return " ".join(doctor.diagnose(docs))


# SIGKILL before, during and after a collective: every survivor raises PeerLostError naming the rank
# and the call within 10 s; the survivors' dumps exist and the doctor names it. Every primitive, at 2,
# 4 and 8 ranks (8 oversubscribed on this machine's 2 cores), on both transports.
FAULTS = [(n, prim, when) for n in (2, 4, 8) for prim in rf.FAULT_PRIMS for when in ("before", "during", "after")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport_", ("shm", "tcp"))
@pytest.mark.parametrize("n, prim, when", FAULTS)
def test_a_killed_rank_is_named_by_every_survivor_and_the_doctor(tmp_path, transport_, n, prim, when):
    victim = n // 2
    pool = RankPool(n, transports=(transport_,), env={"PYXCCL_DUMP_DIR": str(tmp_path)})
    try:
        out = pool.run(rf.killed_in, victim, prim, when, transport=transport_, expect_dead=(victim,), timeout=60)
    finally:
        pool.close()
    for r, res in enumerate(out):
        if r == victim:
            continue
        name, peer, seconds, msg = res
        assert (name, peer) == ("PeerLostError", victim), f"rank {r}: {msg}"
        assert f"rank {victim}" in msg and seconds < 10, (seconds, msg)
        # (a survivor may still be in the barrier before the calls when the victim dies)
        assert prim in msg or "barrier (#" in msg, f"rank {r}: the message does not name the call: {msg}"
    dumped = sorted(os.listdir(tmp_path))
    assert dumped == sorted(f"pyxccl-rank{r}.json" for r in range(n) if r != victim), dumped
    said = _diagnosis(tmp_path)
    assert f"rank {victim} lost" in said, said


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", (2, 4, 8))
def test_a_rank_that_stops_calling_is_blamed_not_the_neighbour(tmp_path, transport, n):
    """The last rank stops calling; every other rank's timeout names it (also the ranks whose neighbour
    in the algorithm is another waiting rank), and so does the doctor."""
    idle = n - 1
    pool = RankPool(n, transports=(transport,), env={"PYXCCL_DUMP_DIR": str(tmp_path)})
    try:
        out = pool.run(rf.stops_calling, idle, 1.0 + n / 4, transport=transport, timeout=40)
    finally:
        pool.close()
    for r in range(idle):
        name, peer, msg = out[r]
        assert (name, peer) == ("CommTimeoutError", idle), f"rank {r}: {msg}"
        assert f"rank {idle} never entered it" in msg, msg
    said = _diagnosis(tmp_path)
    assert f"rank {idle} never entered allreduce #" in said, said
    assert f"{doctor.ranges(range(idle))} wait in allreduce #" in said and f"for rank {idle}" in said, said


@pytest.mark.timeout(60)
def test_abort_from_another_thread_unblocks_and_peers_fail_fast(transport):
    with RankPool(3, transports=(transport,)) as pool:
        out = pool.run(rf.aborted_from_a_thread, 0.3, transport=transport)
    (name0, _, late0), later0 = out[0]
    assert name0 == "CommAbortedError" and late0 < 2 and later0 == "CommAbortedError", out[0]
    for r in (1, 2):
        (name, peer, seconds), later = out[r]
        assert (name, peer) == ("PeerLostError", 0) and seconds < 5, out[r]
        assert later == "PeerLostError", out[r]


CYCLES = textwrap.dedent("""
    import gc, os, sys, threading, numpy as np, pyxccl
    def state():
        maps = sum(1 for l in open("/proc/self/maps") if "memfd" in l or "/dev/shm" in l)
        return len(os.listdir("/proc/self/fd")), maps, threading.active_count()
    x = np.ones(4096, np.float32)
    seen = []
    for i in range(int(sys.argv[1])):
        c = pyxccl.init()
        c.allreduce(x); c.broadcast(x, 0); c.allgather(x, np.empty(4096 * c.size, np.float32))
        c.close()
        if i == 2:
            seen.append(state())
    import time
    end = time.monotonic() + 5      # a thread of the last set-up may still be finishing: a leak never does
    while time.monotonic() < end and not all(a <= b for a, b in zip(state(), seen[0])):
        time.sleep(0.05)
    print("STATE", os.environ["RANK"], seen[0], state(), flush=True)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport_", ("shm", "tcp"))
def test_close_then_init_many_times_leaks_nothing(tmp_path, transport_):
    script = tmp_path / "cycles.py"
    script.write_text(CYCLES)
    env = dict(os.environ, PYXCCL_TRANSPORT=transport_, PYXCCL_TUNE="0")
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "2", str(script), "40"], env=env,
                       capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stdout + p.stderr
    states = re.findall(r"STATE \d+ (\(.*?\)) (\(.*?\))", p.stdout)
    assert len(states) == 2, p.stdout + p.stderr
    for first, last in states:
        assert all(int(a) >= int(b) for a, b in zip(first[1:-1].split(","), last[1:-1].split(","))), \
            f"(fds, shared maps, threads) after 3 and 40 cycles: {first} {last}"


def test_doctor_on_hand_made_dumps(tmp_path):
    fields = ["seq", "coll_seq", "op", "dtype", "count", "bytes", "algorithm", "peer", "issued", "started",
              "ended", "state", "error"]

    def op(cseq, state, name="allreduce"):
        return [cseq, cseq, name, "float32", 4, 16, "ring", None, 1.0, 1.0, 2.0, state, None]
    timeout = {"type": "CommTimeoutError", "peer": 5, "message": "timed out"}
    for r in range(8):
        if r == 6:
            continue       # killed: no dump
        ops = [op(k, "done") for k in range(110, 118)]
        if r != 3:
            ops.append(op(118, "failed"))
        comm = {"id": "00000000", "rank": r, "size": 8, "world_ranks": list(range(8)), "world": True,
                "coll_seq": 118, "closed": False, "error": None if r == 3 else timeout, "ops": ops}
        (tmp_path / f"pyxccl-rank{r}.json").write_text(json.dumps(
            {"world_rank": r, "fields": fields, "communicators": [comm]}))
    said = _diagnosis(tmp_path)
    assert "rank 3 never entered allreduce #118 (last completed #117)" in said, said
    assert "ranks 0-2, 4-5 and 7 wait in allreduce #118 for ranks 3 and 6" in said, said
    assert "rank 6 left no dump" in said, said
    assert doctor.ranges([0, 1, 2, 4, 5, 6, 7]) == "ranks 0-2 and 4-7"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport_", ("shm", "tcp"))
def test_the_elastic_example_loses_a_rank_and_finishes_with_the_rest(transport_):
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "elastic.py")
    env = dict(os.environ, PYXCCL_TRANSPORT=transport_, PYXCCL_TUNE="0")
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "--keep-going", "-n", "4", example], env=env,
                       capture_output=True, text=True, timeout=100)
    assert p.returncode == 137, p.stdout + p.stderr          # the victim's SIGKILL, reported at the end
    ok = re.findall(r"OK: .* 3 ranks at the end", p.stdout)
    assert len(ok) == 3 and "WRONG" not in p.stdout, p.stdout + p.stderr
    assert p.stdout.count("lost rank 2; shrinking") == 3, p.stdout


@pytest.mark.timeout(90)
def test_a_shrunk_world_keeps_the_link_figures_and_runs_small_calls_on_the_segment():
    """After a shrink the survivors (one host) choose as the world did: the segment for a small
    allreduce, by the world's measured link figures (a new world without them ran the default)."""
    n, victim, nbytes = 3, 2, 4096
    pool = RankPool(n, transports=("shm",))
    try:
        out = pool.run(rf.small_calls_after_a_shrink, victim, nbytes, transport="shm", expect_dead=(victim,),
                       timeout=60)
    finally:
        pool.close()
    for r in range(n - 1):
        assert out[r] == ("segment", n - 1, "segment", "segment", True), (r, out[r])


@pytest.mark.timeout(60)
def test_sigusr1_dumps_the_flight_recorder(tmp_path):
    with RankPool(2, transports=("tcp",), env={"PYXCCL_DUMP_DIR": str(tmp_path)}) as pool:
        pool.run(rf.signal_self, transport="tcp")
    said = json.loads((tmp_path / "pyxccl-rank1.json").read_text())
    assert said["reason"] == "SIGUSR1", said["reason"]
    world = said["communicators"][0]
    assert any(op[2] == "allgather" and op[11] == "done" for op in world["ops"]), world["ops"][-3:]


def test_a_raising_done_callback_does_not_stop_the_worker(pools, transport):
    assert pools(2).run(rf.callback_raises, transport=transport) == [[True] * 3] * 2
