"""sim.published: the published nccl-tests table, its predictions, the fit's input and the summaries."""
import importlib.util
import json
import math
import statistics
from importlib import resources
from pathlib import Path

import pytest
from dataclasses import replace

from pyxccl._errors import InvalidArgumentError
from pyxccl.plan import hardware
from pyxccl.sim import calibrated, fitted
from pyxccl.sim import nccl as N
from pyxccl.sim import nccl_p2p
from pyxccl.sim import published as P
from pyxccl.sim import simulate

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def points():
    return P.load()


def _one(points, **kw):
    return next(p for p in points if all(getattr(p, k) == v for k, v in kw.items()))


def test_loader_reads_every_point(points):
    raw = json.loads((resources.files("pyxccl.sim") / "data" / "nccl_published.json").read_text())
    assert len(points) == len(raw) == 285
    for p, d in zip(points, raw):
        assert (p.id, p.part, p.suspect, p.source_id) == (d["id"], d["part"], d["suspect"], d["source_id"])
        assert (p.nodes, p.per_node, p.collective, p.size) == (d["nodes"], d["gpus_per_node"], d["collective"],
                                                               d["size_bytes"])
        assert p.time == d["time_us"] * 1e-6
        assert p.preset in ("dgx-a100", "dgx-h100")
        assert (p.launch, p.nccl_version, p.net_latency_us) == (d["launch"], d["nccl_version"], d["net_latency_us"])
        assert p.launch in P.LAUNCHES and d["launch_evidence"]
    assert {p.part for p in points} == {"calibrate", "validate"}
    # the launch modes and releases as the sources state them (docs/sim-data.md)
    assert {p.launch for p in points if p.source_id == "S15-unresolved-a100-thanos"} == {"single-process", "per-gpu"}
    assert {(p.source_id, p.release) for p in points if p.source_id.startswith(("S01", "S10", "S12", "S03"))} == {
        ("S01-together-h100-1n", "2.26.2"), ("S10-gcm-fixtures-a100", "2.16.2"), ("S10-gcm-fixtures-a100", "2.12.12"),
        ("S12-aws-p4de-efa", "2.17.1"), ("S03-nccl-tests-309-gj-aion", "unknown")}


def test_inputs_and_left_out_reasons(points):
    s01 = _one(points, source_id="S01-together-h100-1n", collective="allreduce")
    inp, _ = P.model_input(s01)
    assert (inp.preset, inp.nodes, inp.per_node, inp.algo, inp.proto) == ("dgx-h100", 1, 8, "Ring", None)
    efa, _ = P.model_input(_one(points, source_id="S12-aws-p4de-efa"))
    assert (efa.nics, efa.nic_GBps, efa.proto) == (4, 12.5, "Simple")
    oci, note = P.model_input(_one(points, source_id="S07-oci-tutorial-h100"))
    # 16 x 200G: the preset's per GPU; NCCL 2.21.5 as the tutorial states
    assert P.comm(oci) == replace(N.preset("dgx-h100", 2, 8), version="2.21.5") and "per GPU" in note
    one, _ = P.model_input(_one(points, source_id="S02-xxrjun-cluster01-h100", per_node=1))
    assert P.comm(one).nRanks == one.nodes
    assert (inp.version, inp.launch, inp.latency_inter) == ("2.26.2", "single-process", 0.0)
    assert (efa.version, efa.launch, efa.latency_inter) == ("2.17.1", "per-gpu", 0.0)     # not priced by default
    efa, note = P.model_input(_one(points, source_id="S12-aws-p4de-efa"), net_latency=True)
    assert efa.latency_inter == 150.0 and "NET plugin latency 150 us" in note
    c = P.comm(efa)
    assert (c.version, c.ring.latencyInter, c.tree.latencyInter) == ("2.17.1", 150.0, 150.0)
    unknown, note = P.model_input(_one(points, source_id="S03-nccl-tests-309-gj-aion"))
    assert unknown.version == N.DEFAULT_VERSION and "NCCL unknown: priced as 2.30.7" in note
    assert P.comm(unknown).version == N.DEFAULT_VERSION
    for src, why in (("S06-a3mega-ztan", "TCPXO"), ("S08-nccl-tests-232", "unstated speed"),
                     ("S09-coreweave-h100-8n-sharp", "SHARP"), ("S14-coreweave-a100-sharp-2023", "SHARP")):
        inp, reason = P.model_input(_one(points, source_id=src))
        assert inp is None and why in reason, (src, reason)


def test_nccl_prediction_is_the_port(points):
    p = _one(points, source_id="S05-nccl-tests-290", size=1 << 30)        # defaults, one node: NCCL's own choice
    inp, _ = P.model_input(p)
    best = N.choose("allreduce", p.size, N.preset("dgx-h100", 1, 8))
    assert P.predict_nccl(p, inp) == (best.time * 1e-6, f"{best.algorithm}/{best.protocol}")
    q = _one(points, source_id="S01-together-h100-1n", collective="allgather", size=1 << 30)    # Ring forced
    inp, _ = P.model_input(q)
    rows = [r for r in N.predict("allgather", q.size, N.preset("dgx-h100", 1, 8)) if r.algorithm == "Ring"]
    ring = min(rows, key=lambda r: r.time)
    assert P.predict_nccl(q, inp) == (ring.time * 1e-6, f"Ring/{ring.protocol}")
    # the fitted base latency adds to the time, the launch term as the point's launch says; an efficiency
    # divides NCCL's bandwidths
    t0, _ = P.predict_nccl(q, inp)
    assert P.predict_nccl(q, inp, fitted.Params(base_lat=7e-6))[0] == pytest.approx(t0 + 7e-6, rel=1e-12)
    assert inp.launch == "single-process"
    cal = fitted.Params(base_lat=7e-6, launch_lat=4e-6)
    assert P.predict_nccl(q, inp, cal)[0] == pytest.approx(t0 + 11e-6, rel=1e-12)
    assert P.predict_nccl(q, replace(inp, launch="per-gpu"), cal)[0] == pytest.approx(t0 + 7e-6, rel=1e-12)
    assert P.predict_nccl(q, replace(inp, launch="unknown"), cal)[0] == pytest.approx(t0 + 9e-6, rel=1e-12)
    # the point's release: S01 ran 2.26.2, whose Ring constants on one H100 node are 2.30.7's
    assert P.comm(inp).version == "2.26.2"
    model = N.tune_model(N.preset("dgx-h100", 1, 8))
    half = calibrated.scaled(model, fitted.Params(intra_eff=0.5))
    assert half.bandwidths[N.ncclFuncAllGather][N.NCCL_ALGO_RING][2] == \
        model.bandwidths[N.ncclFuncAllGather][N.NCCL_ALGO_RING][2] * 0.5


def test_pyxccl_prediction_is_the_walk(points):
    p = _one(points, source_id="S10-gcm-fixtures-a100", nodes=2, size=1 << 30)
    inp, _ = P.model_input(p)
    c = hardware.load("dgx-a100").cluster(2, 8, nic_share=8)
    best = min(simulate.run("allreduce", p.size, c, inplace=False), key=lambda r: (r.time, r.algorithm))
    assert P.predict_pyxccl(p, inp) == (best.time, best.algorithm)
    # 16 x 100 Gb/s RoCE: the same per-GPU NIC bandwidth as the preset's 8 x 200 Gb/s
    s11 = _one(points, source_id="S11-oci-oke-a100-2n", size=1 << 30)
    inp, _ = P.model_input(s11)
    assert (inp.nics, inp.nic_GBps) == (16, 12.5)
    cc = P.cluster(inp)
    assert (cc.nics, 1 / cc.inter.beta) == (8, pytest.approx(25e9))
    # alltoall under "nccl": NCCL's grouped point-to-point on the point's NCCL graphs (sim/nccl_p2p.py), raw
    # and with the fitted efficiency (the inter-node one across nodes) and latencies
    for nodes in (1, 2, 10):
        a2a = _one(points, collective="alltoall", nodes=nodes, per_node=8)
        inp, _ = P.model_input(a2a)
        assert P.predict_nccl(a2a, inp) == (nccl_p2p.alltoall(a2a.size, P.comm(inp)).time * 1e-6, "grouped p2p")
        cal = fitted.FITTED[("nccl", "dgx-h100")]
        eff = cal.inter_eff if nodes > 1 else cal.intra_eff
        t = nccl_p2p.alltoall(a2a.size, P.comm(inp), eff).time * 1e-6 + cal.base_lat   # per-GPU launch: no launch term
        assert a2a.launch == "per-gpu" and P.predict_nccl(a2a, inp, cal) == (t, "grouped p2p")


def test_a_node_of_one_gpu_takes_no_inter_node_efficiency(points, tmp_path):
    """``inter_eff`` was fitted on full nodes (every calibrate point across nodes runs 8 GPUs a node): a job of
    one GPU a node is priced with the models' own bandwidths (both models, every collective, alltoall too),
    a job of full nodes with the fitted one; the fit cannot see a one-GPU node; the CLI prices as the table."""
    assert not [p for p in P.calibration_points(points) if p.nodes > 1 and p.per_node == 1]
    for model, fn in (("nccl", P.predict_nccl), ("pyxccl", P.predict_pyxccl)):
        cal = fitted.FITTED[(model, "dgx-h100")]
        assert cal.inter_eff != 1.0
        assert calibrated.inter_efficiency(cal, 1) == 1.0 and calibrated.inter_efficiency(cal, 8) == cal.inter_eff
        for coll in ("allreduce", "allgather", "alltoall"):
            one = _one(points, source_id="S02-xxrjun-cluster01-h100", nodes=10, per_node=1, collective=coll)
            full = _one(points, source_id="S02-xxrjun-cluster01-h100", nodes=10, per_node=8, collective=coll)
            for p, moved in ((one, False), (full, True)):
                inp, _ = P.model_input(p)
                other = replace(cal, inter_eff=cal.inter_eff * 0.5)
                assert (fn(p, inp, cal) != fn(p, inp, other)) == moved, (model, p.id)
    # pyxccl's walk: the NIC as the preset has it for one GPU a node, scaled for full nodes
    one = _one(points, source_id="S02-xxrjun-cluster01-h100", nodes=10, per_node=1, collective="allgather")
    cal = fitted.FITTED[("pyxccl", "dgx-h100")]
    inp, _ = P.model_input(one)
    assert P.cluster(inp, cal).inter.beta == P.cluster(inp).inter.beta
    assert P.cluster(replace(inp, per_node=8), cal).inter.beta == \
        pytest.approx(P.cluster(replace(inp, per_node=8)).inter.beta / cal.inter_eff)
    from pyxccl import cli
    out = tmp_path / "one.json"
    assert cli.main(["sim", "allgather", "--hosts", "10", "--per-host", "1", "--hardware", "dgx-h100",
                     "--size", str(one.size), "--json", str(out)]) == 0
    best = min(json.loads(out.read_text())["rows"], key=lambda r: (r["time"], r["algorithm"]))
    assert (best["time"], best["algorithm"]) == P.predict_pyxccl(one, replace(inp, launch="per-gpu"), cal)


def test_fit_sees_calibrate_points_only(points, monkeypatch):
    calp = P.calibration_points(points)
    assert calp and all(p.part == "calibrate" and not p.suspect for p in calp)
    assert len(calp) == sum(1 for p in points if p.part == "calibrate" and not p.suspect)
    with pytest.raises(InvalidArgumentError, match="not in the calibrate part"):
        P.fit(calp[:3] + [_one(points, part="validate")])
    seen = []
    real = P.evaluate

    def spy(pts, calibration=None):
        seen.extend(pts)
        return real(pts, calibration)
    monkeypatch.setattr(P, "evaluate", spy)
    cal = P.fit(calp)
    assert seen and all(p.part == "calibrate" and not p.suspect for p in seen)
    # the table in fitted.py is what this fit gives (to its printed digits)
    assert set(cal) == set(fitted.FITTED)
    for k, v in fitted.FITTED.items():
        for f in ("intra_eff", "inter_eff", "base_lat", "launch_lat", "net_step_lat"):
            assert getattr(cal[k], f) == pytest.approx(getattr(v, f), rel=1e-3), (k, f)
    # pyxccl's walk has no network steps of NCCL's model to price
    assert all(v.net_step_lat == 0.0 for (m, _), v in fitted.FITTED.items() if m == "pyxccl")


def test_cross_validation_predicts_each_source_by_a_fit_on_the_others(points, monkeypatch):
    """Leave one source out: a calibrate point is predicted once a form, by a fit that saw none of its
    source's points and no validation point; the fit of each fold is ``fit`` itself."""
    calp = P.calibration_points(points)
    sources = sorted({p.source_id for p in calp})
    few = [p for p in calp if p.source_id in sources[:3]][::3]       # three sources, a third of their points
    fits, predicted = [], []
    real_fit, real_eval = P.fit, P.evaluate

    def fit(pts, *how):
        cal = real_fit(pts, *how)
        fits.append(({p.source_id for p in pts}, how, cal))
        return cal

    def evaluate(pts, calibration=None):
        if calibration is not None and any(calibration is c for *_, c in fits):
            trained, how, _ = next(f for f in fits if f[2] is calibration)
            predicted.extend((p, how, trained) for p in pts)
        return real_eval(pts, calibration)
    monkeypatch.setattr(P, "fit", fit)
    monkeypatch.setattr(P, "evaluate", evaluate)
    forms = {"add": ("add", False, False), "floor + net step, pooled": ("floor", True, True)}
    out = P.cross_validate(few + [_one(points, part="validate")], forms)
    assert set(out) == set(forms)
    for name, how in forms.items():
        mine = [(p, t) for p, h, t in predicted if h == how]
        assert sorted(p.id for p, _ in mine) == sorted(p.id for p in few)       # each point once
        assert all(p.source_id not in trained and trained for p, trained in mine)
        assert [r.point.id for r in out[name]] == [p.id for p, _ in mine]
        for src in sources[:3]:     # the rows are the fold's predictions
            held = [r for r in out[name] if r.point.source_id == src]
            cal = real_fit([q for q in few if q.source_id != src], *how)
            assert [r.error for r in held] == [w.error for w in real_eval([r.point for r in held], cal)]


def test_net_step_latency(points):
    """net_step_lat: added to each network step NCCL's latency model counts (tuning.cc), so NCCL's choice sees
    it; fitted as the median (measured - predicted) / steps over the several-node calibrate points <= 64 KiB."""
    ring, tree, nvlstree = N.NCCL_ALGO_RING, N.NCCL_ALGO_TREE, N.NCCL_ALGO_NVLS_TREE
    ar, ag = N.ncclFuncAllReduce, N.ncclFuncAllGather
    assert [calibrated.net_steps(n, ag, ring) for n in (1, 2, 4, 10)] == [0, 1, 3, 9]
    assert [calibrated.net_steps(n, ar, ring) for n in (1, 2, 4, 10)] == [0, 2, 6, 18]
    assert [calibrated.net_steps(n, ar, a) for n in (2, 4, 8, 10) for a in (tree, nvlstree)] == \
        [2, 2, 4, 4, 6, 6, 6, 6]
    model = N.tune_model(N.preset("dgx-h100", 4, 8))
    c = fitted.Params(net_step_lat=5e-6)
    lat = calibrated.scaled(model, c).latencies
    assert lat[ag][ring][N.NCCL_PROTO_LL] == pytest.approx(model.latencies[ag][ring][N.NCCL_PROTO_LL] + 15.0)
    assert lat[ar][nvlstree][N.NCCL_PROTO_SIMPLE] == pytest.approx(model.latencies[ar][nvlstree][N.NCCL_PROTO_SIMPLE]
                                                                   + 20.0)
    one = N.tune_model(N.preset("dgx-h100", 1, 8))
    assert calibrated.scaled(one, c).latencies == one.latencies
    # what the fit found: half of the several-node small points' residual per step lies on either side of it
    # (predicted as the fit does at that step: base and launch latencies, before the efficiencies)
    cal = fitted.FITTED[("nccl", "dgx-h100")]
    small = [p for p in P.calibration_points(points) if p.preset == "dgx-h100" and p.nodes > 1 and p.size <= 64 << 10]
    assert {p.source_id for p in small} == {"S18-vpbenchmarking-h100-4n"} and len(small) == 8
    per = []
    for p in small:
        inp, _ = P.model_input(p)
        t, choice = P.predict_nccl(p, inp, replace(cal, net_step_lat=0.0, intra_eff=1.0, inter_eff=1.0))
        per.append((p.time - t) / P.net_steps(p, choice))
    assert cal.net_step_lat == pytest.approx((sorted(per)[3] + sorted(per)[4]) / 2, rel=1e-3)


def test_launch_term_fitted_from_the_paired_sweeps(points):
    """launch_lat: the median (single-process - per-GPU) time of S15's two sweeps at 1-64 KiB, the only
    calibrate source that ran both ways on one machine."""
    s15 = [p for p in points if p.source_id == "S15-unresolved-a100-thanos" and p.size <= 64 << 10]
    one = {p.size: p.time for p in s15 if p.launch == "single-process"}
    per = {p.size: p.time for p in s15 if p.launch == "per-gpu"}
    assert sorted(one) == sorted(per) == [1 << 10, 4 << 10, 16 << 10, 64 << 10]
    want = sorted(one[s] - per[s] for s in one)
    assert fitted.launch_lat_of(P.calibration_points(points)) == pytest.approx((want[1] + want[2]) / 2)
    assert fitted.launch_lat_of([p for p in points if p.launch == "per-gpu"]) == 0.0
    c = fitted.Params(launch_lat=10e-6)
    assert [fitted.launch_term(c, m) for m in P.LAUNCHES] == [10e-6, 0.0, 5e-6]
    # base_lat and launch_lat from the latency-bound residuals of each launch mode; a mode the preset's
    # calibrate points lack takes the paired default in c
    both = fitted._base_and_launch(c, [("single-process", 30e-6), ("single-process", 34e-6), ("per-gpu", 12e-6)])
    assert (both.base_lat, both.launch_lat) == (pytest.approx(12e-6), pytest.approx(20e-6))
    one = fitted._base_and_launch(c, [("single-process", 30e-6), ("unknown", 1.0)])
    assert (one.base_lat, one.launch_lat) == (pytest.approx(20e-6), 10e-6)
    per = fitted._base_and_launch(c, [("per-gpu", 7e-6)])
    assert (per.base_lat, per.launch_lat) == (pytest.approx(7e-6), 10e-6)
    assert fitted._base_and_launch(c, [("unknown", 9e-6)]).base_lat == pytest.approx(4e-6)
    assert [calibrated.time(1e-6, c, m) for m in P.LAUNCHES] == pytest.approx([11e-6, 1e-6, 6e-6], rel=1e-12)
    # form "floor": the floor is a single-process launch's, lowered by the launch term per GPU
    f = fitted.Params(launch_lat=10e-6, floor=40e-6, form="floor")
    assert [calibrated.time(1e-6, f, m) for m in P.LAUNCHES] == pytest.approx([40e-6, 30e-6, 35e-6], rel=1e-12)
    assert calibrated.time(50e-6, f, "per-gpu") == 50e-6


def _row(part, err_py, err_nc, suspect=False, left_out=False):
    p = P.Point(0, part, suspect, "T", "H100", 1, 8, None, None, "", "", "allreduce", 1024, 1e-5)
    r = P.Row(p, "", left_out=left_out)
    if not left_out:
        r.error = {"pyxccl": err_py, "nccl": err_nc}
    return r


def test_summaries_on_a_hand_made_table():
    rows = [_row("calibrate", 0.1, -0.5), _row("calibrate", -0.3, 0.2), _row("calibrate", 0.2, 0.0),
            _row("calibrate", 9.0, 9.0, suspect=True), _row("calibrate", 0, 0, left_out=True),
            _row("validate", -0.05, 0.4), _row("validate", 0.15, -0.1)]
    s = P.summarize(rows)
    assert s[("calibrate", "pyxccl", "clean")] == dict(median=0.2, worst=0.3, count=3)
    assert s[("calibrate", "nccl", "clean")] == dict(median=0.2, worst=0.5, count=3)
    assert s[("calibrate", "nccl", "suspect")] == dict(median=9.0, worst=9.0, count=1)
    assert s[("validate", "pyxccl", "clean")] == dict(median=pytest.approx(0.1), worst=0.15, count=2)
    assert s[("validate", "nccl", "suspect")] == dict(median=None, worst=None, count=0)


def test_benchmark_published_table(monkeypatch, tmp_path, capsys, points):
    spec = importlib.util.spec_from_file_location("sim_fidelity", ROOT / "benchmarks" / "sim_fidelity.py")
    fid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fid)
    few = [p for p in points if p.source_id in ("S11-oci-oke-a100-2n", "S06-a3mega-ztan") and p.size <= 1 << 20]
    monkeypatch.setattr(P, "load", lambda path=None: few)
    doc = fid.published(json_path=str(tmp_path / "p.json"))
    out = capsys.readouterr().out
    assert "left out: GPUDirect-TCPXO" in out and "calibrate clean    nccl" in out
    saved = json.loads((tmp_path / "p.json").read_text())
    assert len(saved["rows"]) == len(few) == len(doc["rows"])
    s = next(x for x in saved["summary"] if (x["part"], x["model"], x["points"]) == ("calibrate", "nccl", "clean"))
    errs = sorted(abs(r["error"]["nccl"]) for r in saved["rows"] if not r["left_out"])
    assert s["before"]["count"] == len(errs) and math.isclose(s["before"]["worst"], errs[-1])

    # --cross-validate: the fit's forms over the sources left out one at a time, the medians of their rows
    calp = P.calibration_points(points)
    few = [p for p in calp if p.source_id in ("S11-oci-oke-a100-2n", "S15-unresolved-a100-thanos")][::2]
    monkeypatch.setattr(P, "load", lambda path=None: few)
    got = fid.main(["--published", "--cross-validate"])
    out = capsys.readouterr().out
    assert got == 0 and "leave one calibrate source out" in out and "S15-unresolved-a100-thanos" in out
    cv = P.cross_validate(few)
    for name, rows in cv.items():
        errs = [abs(r.error["nccl"]) for r in rows]
        assert f"{name:<26}nccl    {len(errs):>5}{statistics.median(errs) * 100:>8.1f}%" in out


# --- the command line prints the validated figure (differential: the CLI against the fidelity table) ------

def _as_preset(points, collective=None):
    """Clean validation points the CLI can state as they are: a DGX preset as it is (8 GPUs a node, its own
    NICs and graphs), NCCL's own choice (nothing forced)."""
    out = []
    for p in points:
        if p.part != "validate" or p.suspect or p.per_node != 8 or (collective and p.collective != collective):
            continue
        inp, _ = P.model_input(p)
        if inp is None or inp.algo or inp.proto:
            continue
        if P.comm(inp) == replace(N.preset(p.preset, p.nodes), version=inp.version):
            out.append((p, inp))
    return out


def _cli_rows(tmp_path, p, *flags):
    from pyxccl import cli
    out = tmp_path / "rows.json"
    assert cli.main(["sim", P.PRIMS[p.collective], "--hosts", str(p.nodes), "--per-host", "8", "--hardware",
                     p.preset, "--size", str(p.size), *flags, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _chosen(doc):
    (r,) = [r for r in doc["rows"] if r["chosen"]]
    return r


def _choice(r):
    """A CLI row's choice as ``predict_nccl`` names it: "Ring/LL128"; alltoall's one way, "grouped p2p" (its
    protocol a label of the size, not a choice)."""
    return r["algorithm"] if r["algorithm"] == calibrated.ALLTOALL else f"{r['algorithm']}/{r['protocol']}"


def test_cli_prints_the_nccl_figure_the_table_validates(points, tmp_path, capsys):
    """``pyxccl sim`` on a DGX preset (NCCL's model, the default there) prints, for every validation point
    it can state, exactly ``published.predict_nccl`` with FITTED on the same inputs (the point's release,
    either launch mode); ``--raw`` exactly the uncalibrated port; single-process adds ``launch_lat``.
    Alltoall too: NCCL's grouped point-to-point (``sim/nccl_p2p.py``), as the table prices it."""
    sel = _as_preset(points)
    assert len(sel) >= 29 and {p.preset for p, _ in sel} == {"dgx-a100", "dgx-h100"}
    assert len({p.nodes for p, _ in sel}) >= 3 and len({p.collective for p, _ in sel}) == 4
    a2a = [(p, inp) for p, inp in sel if p.collective == "alltoall"]
    assert len(a2a) >= 9 and {p.nodes for p, _ in a2a} == {1, 2, 10}
    for p, inp in sel:
        cal = fitted.FITTED[("nccl", p.preset)]
        got = {}
        for launch in calibrated.LAUNCH_MODES:
            doc = _cli_rows(tmp_path, p, "--nccl-version", inp.version, "--launch", launch)
            r = _chosen(doc)
            want, choice = P.predict_nccl(p, replace(inp, launch=launch), cal)
            assert (r["time"], _choice(r)) == (want, choice), (p.id, launch)
            assert (r["release"], r["launch"], r["calibration"]) == (inp.version, launch, "fitted")
            assert (doc["release"], doc["launch"], doc["calibration"]) == (inp.version, launch, "fitted")
            got[launch] = r["time"]
        assert got["single-process"] - got["per-gpu"] == pytest.approx(cal.launch_lat, rel=1e-6), p.id
        raw = _chosen(_cli_rows(tmp_path, p, "--nccl-version", inp.version, "--raw"))
        assert raw["calibration"] == "raw" and raw["time"] == P.predict_nccl(p, inp)[0], p.id
        if p.collective == "alltoall":      # every published alltoall sends MiBs a peer: Simple, as NCCL would
            plan = nccl_p2p.alltoall(p.size, P.comm(inp))
            assert (raw["time"], raw["protocol"]) == (plan.time * 1e-6, "Simple"), p.id
            assert len(doc["rows"]) == 1 and _cli_rows(tmp_path, p, "--model", "nccl")["rows"] == \
                _cli_rows(tmp_path, p)["rows"], p.id
        else:
            port = next(w for w in N.predict(P.PRIMS[p.collective], p.size, P.comm(inp)) if w.chosen)
            assert raw["time"] == port.time * 1e-6, p.id
    # no flags: the newest ported release, one process per GPU, fitted
    for p, inp in (sel[0], a2a[0]):
        newest = replace(inp, version=calibrated.newest_version(), launch="per-gpu")
        assert newest.version == N.DEFAULT_VERSION
        want = P.predict_nccl(p, newest, fitted.FITTED[("nccl", p.preset)])[0]
        assert _chosen(_cli_rows(tmp_path, p))["time"] == want, p.id
        assert "calibrated (sim/fitted.py: nccl, " in capsys.readouterr().out


def test_cli_prints_the_pyxccl_figure_the_table_validates(points, tmp_path):
    """``--model pyxccl`` on a DGX preset: the fastest algorithm's time is ``published.predict_pyxccl`` with
    FITTED (allgather and reduce-scatter: no in-place question; nccl-tests times allreduce out of place,
    the CLI in place)."""
    sel = [x for c in ("allgather", "reducescatter") for x in _as_preset(points, c)]
    sel = sel[::max(1, len(sel) // 5)]
    assert len(sel) >= 3 and len({p.nodes for p, _ in sel}) >= 2
    for p, inp in sel:
        for launch in calibrated.LAUNCH_MODES:
            doc = _cli_rows(tmp_path, p, "--model", "pyxccl", "--launch", launch)
            best = min(doc["rows"], key=lambda r: (r["time"], r["algorithm"]))
            want = P.predict_pyxccl(p, replace(inp, launch=launch), fitted.FITTED[("pyxccl", p.preset)])
            assert (best["time"], best["algorithm"]) == want, (p.id, launch)
            assert (doc["calibration"], best["launch"]) == ("fitted", launch) and "release" not in best
        doc = _cli_rows(tmp_path, p, "--model", "pyxccl", "--raw")
        best = min(doc["rows"], key=lambda r: (r["time"], r["algorithm"]))
        assert (best["time"], best["algorithm"]) == P.predict_pyxccl(p, inp) and best["calibration"] == "raw"


def test_cli_figures_are_raw_where_nothing_was_fitted(tmp_path, capsys):
    """The fitted figures are the DGX presets' as they are: another topology, or link flags, stay raw and
    say so; an unported release is refused naming the ported ones."""
    from pyxccl import cli
    out = tmp_path / "rows.json"
    for args in (["--hardware", "dgx-a100", "--topology", "torus2d"], ["--intra-bw", "100"]):
        assert cli.main(["sim", "allreduce", "--hosts", "4", "--per-host", "2", "--size", "1M", *args,
                         "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["calibration"] == "raw" and {r["calibration"] for r in doc["rows"]} == {"raw"}
        assert "raw (nothing fitted for this machine" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="2.30.7"):
        cli.main(["sim", "allreduce", "--hardware", "dgx-a100", "--nccl-version", "2.99.0"])
