"""The timeline (pyxccl.trace): PYXCCL_TRACE=DIR writes a Chrome trace per rank; merge and summary read them."""
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pyxccl
from pyxccl import cli, trace
from pyxccl.testing import RankPool

pytestmark = pytest.mark.timeout(60)
STEPS, COUNT = 3, 1024          # steps of the traced job; float32 elements per allreduce


def _traced_steps(comm):
    """Per step an async allreduce overlapped with a compute region, then a blocking one; returns the
    algorithms the calls ran."""
    x = np.ones(COUNT, np.float32)
    algos = []
    for _ in range(STEPS):
        w = comm.allreduce(x, async_op=True)
        with pyxccl.compute("backward"):
            time.sleep(0.005)
        w.wait()
        algos.append(w.algorithm)
        comm.allreduce(x)
        algos.append(comm.algorithm_for("allreduce", x.nbytes))
    from pyxccl.core import recorder
    return algos, [c.recorder.trace is not None for c in recorder._contexts]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A 2-rank job with PYXCCL_TRACE set, both transports (a world each): its directory and algorithms."""
    where = tmp_path_factory.mktemp("trace")
    with RankPool(2, env={"PYXCCL_TRACE": str(where), "PYXCCL_TUNE": "0"}) as pool:
        out = {t: pool.run(_traced_steps, transport=t) for t in ("tcp", "shm")}
    for t, ranks in out.items():
        assert all(all(on) for _, on in ranks), f"{t}: a communicator kept no trace"
    return where, {t: [algos for algos, _ in ranks] for t, ranks in out.items()}


def _load(path):
    with open(path) as f:
        return json.load(f)


def _lanes(doc):
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def test_every_rank_writes_a_valid_chrome_trace(traced):
    where, _ = traced
    assert sorted(os.listdir(where)) == ["trace-rank0.json", "trace-rank1.json"]
    for r in range(2):
        doc = _load(where / f"trace-rank{r}.json")
        events = doc["traceEvents"]
        for e in events:
            assert {"ph", "ts", "pid", "tid"} <= e.keys(), e
            assert e["pid"] == r
            if e["ph"] == "X":
                assert e["dur"] >= 0 and e["ts"] >= 0, e
        names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
        assert len(names) == 1 and names[0].startswith(f"rank {r} (")
        assert sorted(_lanes(doc).values()) == ["MainThread", "comm 00000000 (world #2, 2 ranks)",
                                                "comm 00000000 (world, 2 ranks)"]


def test_each_allreduce_appears_once_per_rank_with_bytes_and_algorithm(traced):
    where, algos = traced
    for r in range(2):
        doc = _load(where / f"trace-rank{r}.json")
        lanes = {name: tid for tid, name in _lanes(doc).items()}
        for transport, lane in (("tcp", "comm 00000000 (world, 2 ranks)"),
                                ("shm", "comm 00000000 (world #2, 2 ranks)")):
            calls = [e for e in doc["traceEvents"] if e["tid"] == lanes[lane] and e["name"] == "allreduce"
                     and e["args"]["bytes"] == COUNT * 4]
            # the job's calls are the last 2 * STEPS (set-up made none of this size)
            assert len(calls) == 2 * STEPS, (transport, calls)
            assert len({e["args"]["seq"] for e in calls}) == 2 * STEPS
            calls.sort(key=lambda e: e["args"]["seq"])
            assert [e["args"]["algorithm"] for e in calls] == algos[transport][r]
            for e in calls:
                assert e["args"]["dtype"] == "float32" and e["args"]["count"] == COUNT and e["args"]["peers"] == [1 - r]
                assert e["args"]["queued_us"] >= 0


def test_every_blocking_call_has_an_end(traced):
    where, _ = traced
    doc = _load(where / "trace-rank0.json")
    tcp = {name: tid for tid, name in _lanes(doc).items()}["comm 00000000 (world, 2 ranks)"]
    assert [e for e in doc["traceEvents"] if e["tid"] == tcp and e["ph"] == "i"] == []


def test_compute_regions_are_on_the_threads_lane(traced):
    where, _ = traced
    for r in range(2):
        doc = _load(where / f"trace-rank{r}.json")
        main = {name: tid for tid, name in _lanes(doc).items()}["MainThread"]
        regions = [e for e in doc["traceEvents"] if e.get("cat") == "compute"]
        assert len(regions) == 2 * STEPS and {e["tid"] for e in regions} == {main}     # a job per transport
        assert all(e["name"] == "backward" and e["dur"] >= 4000 for e in regions)     # slept 5 ms


def test_merge_puts_both_ranks_in_one_file(traced, tmp_path):
    where, _ = traced
    out = trace.merge(str(where), str(tmp_path / "merged.json"))
    events = _load(out)["traceEvents"]
    per_rank = [_load(where / f"trace-rank{r}.json")["traceEvents"] for r in range(2)]
    assert len(events) == sum(map(len, per_rank))
    assert {e["pid"] for e in events} == {0, 1}
    assert sorted(e["args"]["name"].split(" (")[0] for e in events if e["name"] == "process_name") == \
        ["rank 0", "rank 1"]


def test_summary_of_the_job_has_a_row_per_rank(traced):
    where, _ = traced
    rows = trace.summary(str(where))
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert r["basis"] == "span" and 0 < r["exposed_us"] <= r["comm_us"] <= r["step_us"]
        # every allreduce is counted, but those with no recorded end (test_every_blocking_call_has_an_end)
        assert sum(o["calls"] for o in r["ops"] if o["op"] == "allreduce") + r["unfinished"] >= 4 * STEPS
        assert r["compute_us"] >= 2 * STEPS * 4000


# --- the summary's arithmetic on a trace made by hand ------------------------------------------

def _x(pid, tid, cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _write(path, rank, events, origin_us=1e15):
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "ts": 0, "args": {"name": f"rank {rank} (h)"}},
        *events], "otherData": {"origin_us": origin_us, "rank": rank}}))


@pytest.fixture
def synthetic(tmp_path):
    """Known intervals (us), three ranks:

    0: compute [0,100], comm [50,150]: span 150, comm 100, exposed 50: 33.3% (flagged);
    1: compute [0,60] and [40,100] on two threads, comm [20,60] and [50,70] on two communicators and
       [90,110]: span 110, comm union 70, exposed 10: 9.1%;
    2: steps [0,200] and [300,500], compute [0,150] and [300,450], comm [150,250], [480,520] and [600,700]
       (outside the steps), one call with no end: step 400, comm in steps 50 + 20, exposed 70: 17.5%.
    """
    _write(tmp_path / "trace-rank0.json", 0, [
        _x(0, 1, "compute", "compute", 0, 100), _x(0, 1000, "comm", "allreduce", 50, 100, bytes=4096)])
    _write(tmp_path / "trace-rank1.json", 1, [
        _x(1, 1, "compute", "fwd", 0, 60), _x(1, 2, "compute", "bwd", 40, 60),
        _x(1, 1000, "comm", "allreduce", 20, 40, bytes=8), _x(1, 1001, "comm", "broadcast", 50, 20, bytes=8),
        _x(1, 1000, "comm", "allreduce", 90, 20, bytes=8)], origin_us=1e15 + 1000)
    _write(tmp_path / "trace-rank2.json", 2, [
        _x(2, 1, "compute", "step", 0, 200), _x(2, 1, "compute", "step", 300, 200),
        _x(2, 1, "compute", "compute", 0, 150), _x(2, 1, "compute", "compute", 300, 150),
        _x(2, 1000, "comm", "allgather", 150, 100, bytes=1 << 20), _x(2, 1000, "comm", "allgather", 480, 40),
        _x(2, 1000, "comm", "allgather", 600, 100),
        {"ph": "i", "s": "t", "cat": "comm", "name": "recv", "pid": 2, "tid": 1000, "ts": 700,
         "args": {"unfinished": True}}])
    (tmp_path / "trace.json").write_text("not a per-rank file: ignored")
    return tmp_path


def test_summary_of_known_intervals(synthetic):
    rows = {r["rank"]: r for r in trace.summary(str(synthetic))}
    got = {r: (x["basis"], x["steps"], x["step_us"], x["comm_us"], x["exposed_us"], round(x["share"], 4),
               x["flagged"], x["unfinished"]) for r, x in rows.items()}
    assert got == {0: ("span", 0, 150, 100, 50, 0.3333, True, 0),
                   1: ("span", 0, 110, 70, 10, 0.0909, False, 0),
                   2: ("steps", 2, 400, 70, 70, 0.175, False, 1)}
    assert rows[1]["ops"] == [{"op": "allreduce", "bytes": 8, "calls": 2, "exposed_us": 10},
                              {"op": "broadcast", "bytes": 8, "calls": 1, "exposed_us": 0}]
    assert [(o["op"], o["bytes"], o["exposed_us"]) for o in rows[2]["ops"]] == [
        ("allgather", 1 << 20, 50), ("allgather", 0, 20)]
    assert rows[2]["compute_us"] == 300


def test_summary_flags_a_share_above_30_percent_with_what_to_try(synthetic, capsys):
    assert cli.main(["trace", "summary", str(synthetic)]) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line for line in out.splitlines() if line[:4].strip().isdigit()}
    assert table["0"].endswith("33.3%  > 30%") and "> 30%" not in table["1"] + table["2"]
    assert "rank 0: 33.3% of the step" in out and "rank 1: " not in out
    assert "async_op=True" in out and "allreduce of 4.0 KiB: 1 calls, 0.1 ms exposed" in out
    assert "rank 2: 1 calls have no recorded end" in out
    assert "balance the work: rank 2 computes 0.2 ms more" in out        # 300 us of compute against 100


def test_merge_aligns_the_ranks_on_the_wall_clock(synthetic):
    doc = _load(trace.merge(str(synthetic)))
    assert doc["otherData"]["origin_us"] == 1e15
    ts = {(e["pid"], e["name"], e["ts"]) for e in doc["traceEvents"] if e["ph"] == "X"}
    assert (0, "allreduce", 50) in ts and (1, "allreduce", 1020) in ts        # rank 1 started 1 ms later


def test_missing_directory_is_a_usage_error(tmp_path, capsys):
    for action in ("merge", "summary"):
        with pytest.raises(SystemExit) as e:
            cli.main(["trace", action, str(tmp_path / "nowhere")])
        assert e.value.code == 2 and "nowhere: no such directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["trace", "summary", str(tmp_path)])
    assert e.value.code == 2 and "no trace-rank*.json files" in capsys.readouterr().err


# --- compute() ----------------------------------------------------------------------------------

def test_compute_marks_regions_as_context_manager_and_decorator(monkeypatch):
    monkeypatch.setattr(trace, "_on", True)
    monkeypatch.setattr(trace, "_regions", [])

    @pyxccl.compute("update")
    def update(x):
        return x + 1
    with pyxccl.compute():
        assert update(1) == 2
    assert [r[0] for r in trace._regions] == ["update", "compute"]
    assert all(t0 <= t1 for _, _, t0, t1 in trace._regions)


def test_compute_does_nothing_when_off(monkeypatch):
    monkeypatch.setattr(trace, "_on", False)
    monkeypatch.setattr(trace, "_regions", [])

    def f():
        return 1
    assert pyxccl.compute("update")(f) is f
    with pyxccl.compute():
        pass
    assert trace._regions == []


def test_without_pyxccl_trace_nothing_is_kept_or_written(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, pyxccl
        from pyxccl import trace
        from pyxccl.core import recorder
        comm = pyxccl.init()
        with pyxccl.compute():
            comm.allreduce(np.ones(4, np.float32))
        print(comm.rank, [c.recorder.trace is None for c in recorder._contexts], trace._on, trace._regions)
        comm.close()
        print(trace.write({str(tmp_path / "out")!r}))
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYXCCL_TRACE"}
    env["PYXCCL_TUNE"] = "0"
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "2", str(script)], capture_output=True,
                       text=True, timeout=50, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["[0] 0 [True] False []", "[0] None", "[1] 1 [True] False []",
                                             "[1] None"]
    assert sorted(os.listdir(tmp_path)) == ["job.py"]


def test_written_at_exit_when_the_job_never_closes(tmp_path):
    """No close(): atexit writes the file, with a split child closed early, and a region marked last."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, pyxccl
        comm = pyxccl.init()
        sub = comm.split(color=0)
        sub.allgather(np.ones(3, np.int32))
        sub.close()
        comm.allreduce(np.ones(5, np.float64), async_op=True).wait()
        with pyxccl.compute("last"):
            pass
    """))
    env = dict(os.environ, PYXCCL_TRACE=str(tmp_path / "tl"), PYXCCL_TUNE="0")
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "2", str(script)], capture_output=True,
                       text=True, timeout=50, env=env)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        doc = _load(tmp_path / "tl" / f"trace-rank{r}.json")
        lanes = _lanes(doc)
        names = list(lanes.values())
        assert names[:2] == ["MainThread", "comm 00000000 (world, 2 ranks)"] and len(names) == 3
        assert names[2].endswith("(split of 00000000, 2 ranks)")
        got = {(lanes[e["tid"]], e["name"], e.get("args", {}).get("bytes"))
               for e in doc["traceEvents"] if e["ph"] == "X"}
        assert {("MainThread", "last", None), (names[1], "allreduce", 40), (names[2], "allgather", 24)} <= got


def _labelled(comm):
    """A sub-communicator named as pyxccl.parallel names its groups, one allreduce on it."""
    sub = comm.split(0, comm.rank)
    sub.label = "dp"
    sub.allreduce(np.ones(8, np.float32))
    sub.close()
    return sub.label


def test_a_labelled_communicator_has_its_name_on_its_lane(tmp_path):
    with RankPool(2, env={"PYXCCL_TRACE": str(tmp_path), "PYXCCL_TUNE": "0"}) as pool:
        assert pool.run(_labelled) == ["dp", "dp"]
    for r in range(2):
        lanes = sorted(_lanes(_load(tmp_path / f"trace-rank{r}.json")).values())
        assert any(" dp (split of " in name for name in lanes), lanes
