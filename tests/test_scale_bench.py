"""benchmarks/scale.py: its model's fit, one real 2-rank row, and a hung job failing its row (its
processes killed) instead of freezing the run. No timing is asserted."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def _load(name):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scale():
    return _load("scale")


@pytest.fixture(scope="module")
def model():
    return _load("scale_model")


def test_fit_recovers_a_line_and_uses_only_complete_rows_from_fit_from(model):
    assert model.fit([1, 3, 7], [5, 11, 23]) == pytest.approx((2.0, 3.0))
    assert model.fit([4], [9]) == (9.0, 0.0)
    figs = dict(threads=0, threads_med=0, fds=0, fds_med=0, rss_mib=0.0, rss_mib_med=0.0, init_s=0.0)
    rows = [dict(figs, label="x", n=n, ok=True, threads=1 + 2 * (n - 1)) for n in (4, 8, 16)]
    rows += [dict(figs, label="x", n=2, ok=True, threads=100),                 # below fit_from
             dict(figs, label="x", n=32, ok=False, threads=1000)]             # a failed row
    a, b, used = model.models(rows, fit_from=4)["x"]["threads"]
    assert (a, b, used) == (pytest.approx(1.0), pytest.approx(2.0), [4, 8, 16])
    assert "| x | threads, max rank | 1 + 2*(n-1) | 4,8,16 | 8,191 | 199,999 |" in model.table(rows, 4)


def test_two_rank_row_is_complete_and_right(scale, tmp_path):
    out = tmp_path / "rows.json"
    code = scale.main(["--ranks", "2", "--libs", "pyxccl", "--transport", "tcp", "--calls", "3", "--no-compile",
                       "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert code == 0 and len(rows) == 1, rows
    r = rows[0]
    assert r["ok"] and r["wrong"] == 0 and r["n"] == 2 and r["label"] == "pyxccl tcp", r
    for key in ("start_init_s", "init_s", "first8_s", "first1m_s", "steady8_s", "job_s", "wall_s"):
        assert r[key] > 0, (key, r)
    assert r["start_init_s"] >= r["init_s"] - 0.011     # (process start has 10 ms resolution)
    assert r["job_s"] >= r["start_init_s"] - 0.011
    assert r["threads"] >= 1 and r["fds"] >= 3 and r["sockets"] >= 1 and r["rss_mib"] > 1, r


def test_hung_job_fails_its_row_and_its_ranks_are_killed(scale, tmp_path):
    # A "launcher" that starts a "rank" in a session of its own (out of reach of the launcher's group,
    # as pyxccl run's children are), which records its pid as scale_rank.py does, then both hang.
    script = ("import os, subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
              f"open(os.path.join({str(tmp_path)!r}, f'pid.{{p.pid}}'), 'w').close()\n"
              "time.sleep(600)\n")
    code, wall, _ = scale.run_job([sys.executable, "-c", script], dict(os.environ), str(tmp_path), timeout=3)
    assert code is None
    row = scale.summarize("hang", 2, str(tmp_path), code, wall, "")
    assert not row["ok"] and row["why"].startswith("timed out, 0 of 2 ranks reported"), row
    pid = int(next(tmp_path.glob("pid.*")).name.split(".")[1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), f"the hung job's rank {pid} is still running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"      # a zombie has exited
    except FileNotFoundError:
        return False
