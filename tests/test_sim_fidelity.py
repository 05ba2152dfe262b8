"""benchmarks/sim_fidelity.py's prediction path, on a tiny saved measurement (nothing is measured)."""
import importlib.util
import io
import json
import re
import statistics
from pathlib import Path

import pytest

import pyxccl.sim

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fid():
    spec = importlib.util.spec_from_file_location("sim_fidelity", ROOT / "benchmarks" / "sim_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MACHINE = {"links": {"shm": [20e-6, 1 / 4e9], "seg": [5e-6, 0.0]}, "gamma": 1e-10, "copy": 1e-10, "cores": 2}
HOSTS_MACHINE = {"links": {"shm": [20e-6, 1 / 4e9], "tcp": [100e-6, 8e-9]}, "gamma": 1e-10, "copy": 1e-10, "cores": 2}
DOC = {
    "local": {"rows": [
        {"prim": "allreduce", "hosts": 1, "per_host": 2, "size": 1 << 20, "algorithm": "segment", "time": 300e-6},
        {"prim": "allgather", "hosts": 1, "per_host": 2, "size": 64 << 10, "algorithm": "segment", "time": 10e-6},
    ], "machines": {"2": {"machine": MACHINE, "source": "test", "calibration": {"seg": 30e-6, "cma": [5e-6, 1e-10]},
                          "now": {"seg": [50e-6, 40e-6], "rates": {str(1 << 20): [1e-9, 1e-9]}}}}},
    "hosts": {"rows": [
        {"prim": "alltoall", "hosts": 2, "per_host": 2, "size": 1 << 20, "algorithm": "pairwise", "time": 8e-3},
    ], "machines": {"hosts": {"machine": HOSTS_MACHINE, "source": "test"}}, "rate": "1gbit"},
}


def test_prediction_table(fid, tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(DOC))
    assert fid.main(["--load", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("collective"))
    assert header.split() == ["collective", "ranks", "size", "algorithm", "measured", "ms", "predicted", "ms",
                              "error", "%", "now", "ms", "error", "%"]
    rows = {tuple(ln.split()[:3]): ln.split() for ln in lines if re.match(r"(allreduce|allgather|alltoall) ", ln)}
    assert set(rows) == {("allreduce", "2", "1M"), ("allgather", "2", "64K"), ("alltoall", "2x2", "1M")}

    # the simulator's own answers, with the figures the fixture recorded
    errs = []
    for part in ("local", "hosts"):
        m = HOSTS_MACHINE if part == "hosts" else MACHINE
        for r in DOC[part]["rows"]:
            c = pyxccl.sim.Cluster.measured(r["hosts"], r["per_host"])
            c = c.__class__(**{**c.__dict__, "intra": pyxccl.sim.Link(*m["links"]["shm"]), "gamma": m["gamma"],
                               "copy": m["copy"], "cores": 2,
                               # the job's calibration (pyxccl.sim.calibrate) replaces the probe's round
                               **({"seg": pyxccl.sim.Link(30e-6, 0.0), "cma": pyxccl.sim.Link(5e-6, 1e-10)}
                                  if part == "local" else {"inter": pyxccl.sim.Link(*m["links"]["tcp"])})})
            pred = pyxccl.sim.run(r["prim"], r["size"], c, [r["algorithm"]], inplace=False)[0].time
            err = (pred - r["time"]) / r["time"]
            errs.append(err)
            ranks = "2" if r["hosts"] == 1 else "2x2"
            cols = rows[(r["prim"], ranks, fid._size(r["size"]))]
            assert cols[3] == r["algorithm"]
            assert float(cols[4]) == pytest.approx(r["time"] * 1e3, rel=1e-3)
            assert float(cols[5]) == pytest.approx(pred * 1e3, rel=2e-3, abs=1e-3)
            assert float(cols[6]) == pytest.approx(err * 100, abs=0.051)
    # "now": only the row whose size has rates measured after the sweep; slower copies, slower round
    assert rows[("allgather", "2", "64K")][7] == "-" and rows[("alltoall", "2x2", "1M")][7] == "-"
    assert float(rows[("allreduce", "2", "1M")][7]) > float(rows[("allreduce", "2", "1M")][5])

    med = statistics.median(abs(e) for e in errs)
    m = re.search(r"median \|error\| \(overall\): ([\d.]+)%", out)
    assert m and float(m.group(1)) == pytest.approx(med * 100, abs=0.051)
    assert re.search(r"median \|error\| \(local\): [\d.]+%", out)
    assert re.search(r"median \|error\| \(hosts\): [\d.]+%", out)
    worst = max(errs, key=abs)
    assert re.search(r"# worst: \S+ \S+ \S+ \S+ ([+-]\d+)%", out).group(1) == f"{worst * 100:+.0f}"


def test_error_sign_and_medians(fid):
    rows = [dict(part="local", prim="allreduce", hosts=1, per_host=2, size=1 << 20, algorithm="segment",
                 time=t, predicted=p, error=(p - t) / t, now=None, now_error=None)
            for t, p in ((1.0, 1.8), (2.0, 1.0), (4.0, 4.4))]
    buf = io.StringIO()
    med = fid.report(rows, file=buf)
    assert med["local"] == pytest.approx(0.5) and med["overall"] == pytest.approx(0.5)
    text = buf.getvalue()
    assert "+80.0" in text and "-50.0" in text and "+10.0" in text
    assert "now ms" not in text


def test_terms(fid):
    buf = io.StringIO()
    fid.terms(DOC, file=buf)
    lines = buf.getvalue().splitlines()
    assert lines[2].split()[-3:] == ["local", "hosts", "all"]
    rows = [ln for ln in lines[3:] if ln.strip()]
    assert len(rows) == 1 + len(fid._terms())
    # the first row is the plain prediction: its medians are those of the table
    med = fid.report(fid.predict(DOC), file=io.StringIO())
    got = [float(x.rstrip("%")) for x in rows[0].split()[-3:]]
    assert got == pytest.approx([med["local"] * 100, med["hosts"] * 100, med["overall"] * 100], abs=0.051)
    # the segment round measured after the sweep (50 us, not 5) changes the local rows' prediction
    seg = next(r for r in rows if r.startswith("segment round:"))
    assert float(seg.split()[-3].rstrip("%")) != got[0]


def test_a_row_with_its_own_calibrations_is_predicted_with_each(fid):
    """A row whose timings each had calibrate's figures taken right before (``calibrations``): the median
    of the predictions with each, not the job's one calibration before the sweep; ``--terms`` the same."""
    doc = json.loads(json.dumps(DOC))
    row = doc["local"]["rows"][0]
    cals = [{"seg": s, "cma": [5e-6, 1e-10]} for s in (10e-6, 60e-6, 200e-6)]
    row["calibrations"] = cals
    job = doc["local"]["machines"]["2"]
    each = [fid._sim(fid.cluster_for(row, job["machine"], cal), row) for cal in cals]
    assert len(set(each)) == 3         # the round is in the prediction: each calibration gives its own
    got = {(r["prim"], r["size"]): r["predicted"] for r in fid.predict(doc)}
    assert got[("allreduce", 1 << 20)] == statistics.median(each)
    once = fid._sim(fid.cluster_for(row, job["machine"], job["calibration"]), row)
    assert got[("allreduce", 1 << 20)] != once
    assert got[("allgather", 64 << 10)] == fid._sim(fid.cluster_for(doc["local"]["rows"][1], job["machine"],
                                                                     job["calibration"]), doc["local"]["rows"][1])
    buf = io.StringIO()
    fid.terms(doc, file=buf)
    first = [ln for ln in buf.getvalue().splitlines()[3:] if ln.strip()][0]
    med = fid.report(fid.predict(doc), file=io.StringIO())
    assert float(first.split()[-3].rstrip("%")) == pytest.approx(med["local"] * 100, abs=0.051)
