"""The planner (pyxccl.plan, pyxccl plan): the brief's worked numbers come out of it, the traffic
rules hold, the presets load with their sources, JSON round-trips, the CLI runs."""
import contextlib
import fnmatch
import io
import json
import math
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from pyxccl import cli
from pyxccl.algorithms import registry
from pyxccl.plan import Layout, Model, Plan, estimate, hardware, load_model, model_presets
from pyxccl.plan.result import QUOTE, THRESHOLD, verdict
from pyxccl.plan.traffic import stages, traffic

GB = 1e9


def nvlink600(per_host=8):
    """seeds/003's machine: GPUs on 600 GB/s links (the brief's figure for NVLink)."""
    return hardware.from_dict({"name": "seed003", "gpu": "a100-sxm", "gpus_per_host": per_host,
                               "intra": {"gbytes_per_s": 600, "latency_us": 0}, "inter": "ib-hdr", "nics": 8})


def row(plan, strategy, what, phase=None, primitive=None):
    rows = [r for r in plan.rows if r.strategy == strategy and r.what == what
            and (phase is None or r.phase == phase) and (primitive is None or r.primitive == primitive)]
    assert len(rows) == 1, [(r.strategy, r.what, r.phase, r.primitive) for r in plan.rows]
    return rows[0]


def seed003(hidden=12288, tp=8):
    m = load_model("gpt3-175b").with_(micro_batch_size=32, seq_len=2048, hidden=hidden, dtype="fp16")
    return estimate(m, Layout(tp=tp, micro_batches=1), nvlink600(), train=False)


# --- seeds/003: tensor parallelism's allreduces ----------------------------------------------------------

def test_seed003_gpt3_tp8_allreduce_is_1_6_gb_and_4_7_ms():
    p = seed003()
    r = row(p, "TP", "layer activations", "forward")
    assert r.bytes_per_call == 32 * 2048 * 12288 * 2 == 1_610_612_736          # "1.6 GB"
    assert r.primitive == "allreduce" and r.link_class == "intra"
    assert r.calls == 2 * 96                                                   # two per block forward
    ring = 2 * 7 / 8 * r.bytes_per_call / 600e9                                # the brief's formula
    assert ring == pytest.approx(4.7e-3, rel=0.01)
    assert r.time_per_call == pytest.approx(ring, rel=0.01)                   # what the tuner would choose
    assert r.time / 96 == pytest.approx(9.4e-3, rel=0.01)                     # per layer forward
    assert r.sent_per_call == pytest.approx(2 * 7 / 8 * r.bytes_per_call, rel=1e-3)


def test_seed003_ring_on_the_simulator_matches_the_formula():
    from pyxccl import sim
    c = nvlink600().cluster(1, 8)
    (res,) = sim.run("allreduce", 1_610_612_736, c, ["ring"], dtype="float16")
    assert res.time == pytest.approx(2 * 7 / 8 * 1_610_612_736 / 600e9, rel=0.01)


def test_seed003_512_mb_example_h4096_tp4():
    p = seed003(hidden=4096, tp=4)
    r = row(p, "TP", "layer activations", "forward")
    assert r.bytes_per_call == 32 * 2048 * 4096 * 2 == 512 << 20            # "512 MB"
    assert r.time_per_call == pytest.approx(2 * 3 / 4 * (512 << 20) / 600e9, rel=0.01)
    assert r.group_size == 4 and r.link_class == "intra"


def test_seed003_share_of_communication_is_about_17_percent():
    # seeds/003: 50 ms of compute per layer, ~10 ms of allreduces: 10/(50+10) ~ 17%
    m = load_model("gpt3-175b").with_(micro_batch_size=32, seq_len=2048, dtype="fp16")
    p = estimate(m, Layout(tp=8, micro_batches=1), nvlink600(), train=False, compute_time=96 * 50e-3)
    per_layer = row(p, "TP", "layer activations", "forward").time / 96
    assert per_layer / (per_layer + 50e-3) == pytest.approx(10 / (50 + 10), abs=0.01)
    assert p.share == pytest.approx(10 / 60, abs=0.01)
    assert p.verdict is None and p.share < THRESHOLD


def test_tp_over_sequence_parallelism_is_reduce_scatter_plus_allgather_of_the_full_tensor():
    m = load_model("gpt3-175b").with_(layers=4, micro_batch_size=2, seq_len=512)
    plain = traffic(m, Layout(tp=4, micro_batches=3), stages(m, 1)[0])
    sp = traffic(m, Layout(tp=4, sp=True, micro_batches=3), stages(m, 1)[0])
    act = 2 * 512 * m.hidden * 2
    ar = [t for t in plain if t.what == "layer activations"]
    assert [(t.phase, t.primitive, t.sizes) for t in ar] == [("forward", "allreduce", ((2 * 4 * 3, act),)),
                                                              ("backward", "allreduce", ((2 * 4 * 3, act),))]
    spl = [t for t in sp if t.what == "layer activations"]
    assert sorted((t.phase, t.primitive) for t in spl) == [("backward", "allgather"), ("backward", "reduce_scatter"),
                                                           ("forward", "allgather"), ("forward", "reduce_scatter")]
    assert all(t.sizes == ((2 * 4 * 3, act),) for t in spl)


# --- seeds/004 and seeds/001: data parallelism -------------------------------------------------------------

def billion_fp32(layers=19, vocab=10668):
    """A model of about 1e9 fp32 parameters (seeds/004)."""
    return Model("1b", layers=layers, hidden=2048, heads=16, ffn=8192, vocab=vocab, dtype="fp32", global_batch=8)


def test_seed004_ring_allreduce_of_1e9_fp32_parameters_over_8_sends_7_gb_per_rank():
    m = billion_fp32()
    assert m.params == pytest.approx(1e9, rel=1e-5)
    p = estimate(m, Layout(dp=8, micro_batches=1), hardware.load("dgx-a100"))
    r = row(p, "DP", "gradients", primitive="allreduce")
    assert r.total_bytes == m.params * 4 == pytest.approx(4 * GB, rel=1e-5)    # "about 4 GB"
    assert r.calls == math.ceil(r.total_bytes / (25 << 20))                      # DDP buckets of 25 MiB
    assert r.sent == pytest.approx(2 * 7 / 8 * 4 * GB, rel=1e-3)                # "about 7 GB"
    assert r.overlap == "overlappable"


def test_seed004_allgather_of_1_gb_per_rank_over_8_receives_7_gb_per_rank_56_in_all():
    m = billion_fp32(layers=39, vocab=18098).with_(tied=True)                  # about 2e9 fp32 parameters
    assert m.params == pytest.approx(2e9, rel=1e-3)
    p = estimate(m, Layout(dp=8, zero=1, micro_batches=1, bucket_mb=1e5), hardware.load("dgx-a100"))
    r = row(p, "ZeRO-1", "parameters", primitive="allgather")
    assert r.calls == 1 and r.bytes_per_call / 8 == pytest.approx(1 * GB, rel=1e-3)   # 1 GB per rank
    # an allgather sends what every other rank receives: 7 GB per rank, 8 x 7 = 56 GB in all
    assert r.sent == pytest.approx(7 * GB, rel=1e-3)
    assert 8 * r.sent == pytest.approx(56 * GB, rel=1e-3)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_seed001_dp_sends_2g_n_minus_1_over_n_ring_2n_minus_2_steps_hd_2_log2_n(n):
    m = billion_fp32(layers=2, vocab=1000)
    p = estimate(m, Layout(dp=n, micro_batches=1, bucket_mb=1e4), hardware.load("dgx-a100").with_gpu("h100-sxm"))
    r = row(p, "DP", "gradients")
    G = m.params * 4
    assert r.calls == 1 and r.sent == pytest.approx(2 * G * (n - 1) / n, rel=1e-3)

    def comm_steps(name):
        s = registry.lookup("allreduce", name).schedule(0, n, count=1 << 12)
        return sum(1 for st in s.steps if any(type(x).__name__ == "Send" for x in st))
    assert comm_steps("ring") == 2 * (n - 1)
    assert comm_steps("halving_doubling") == 2 * int(math.log2(n))


def test_zero_volumes_dp_2x_zero3_3x_parameters():
    m = billion_fp32(layers=4, vocab=1000).with_(dtype="fp16")
    st = stages(m, 1)[0]
    P = m.params
    dp = traffic(m, Layout(dp=4, micro_batches=1), st)
    assert sum(t.total_bytes for t in dp) == P * 2
    z1 = traffic(m, Layout(dp=4, zero=1, micro_batches=1), st)
    assert {t.primitive for t in z1} == {"reduce_scatter", "allgather"}
    assert sum(t.total_bytes for t in z1) == 2 * P * 2                   # 2x parameters like DP's allreduce
    assert traffic(m, Layout(dp=4, zero=2, micro_batches=1), st)[0].total_bytes == z1[0].total_bytes
    z3 = traffic(m, Layout(dp=4, zero=3, micro_batches=2), st)
    assert sorted((t.phase, t.primitive) for t in z3) == [("backward", "allgather"), ("backward", "reduce_scatter"),
                                                         ("forward", "allgather")]
    assert sum(t.total_bytes for t in z3) == 3 * P * 2 * 2             # 3x per micro-batch, 2 micro-batches
    assert all(t.calls == (4 + 2) * 2 for t in z3)                     # a unit per layer + 2 embeddings


def test_pipeline_sends_activations_per_micro_batch_and_reports_the_bubble():
    m = load_model("llama-7b").with_(micro_batch_size=2)
    lay = Layout(dp=2, tp=2, pp=4, micro_batches=6)
    mid = stages(m, 4)[1]
    pp = [t for t in traffic(m, lay, mid) if t.strategy == "PP"]
    act = 2 * 4096 * 4096 * 2
    assert [(t.phase, t.sizes) for t in pp] == [("forward", ((6, act),)), ("backward", ((6, act),))]
    p = estimate(m, lay, hardware.load("dgx-a100"))
    assert p.totals["bubble_fraction"] == pytest.approx(3 / (6 + 3))
    assert p.totals["bubble_time"] == pytest.approx(p.totals["compute_time"] * 3 / 6)
    assert p.totals["step_time"] == pytest.approx(p.totals["compute_time"] + p.totals["bubble_time"]
                                                  + p.totals["comm_time"])


def test_expert_parallel_alltoalls_and_deepseek_moe_layers():
    m = load_model("deepseek-v3")
    assert m.moe_layers == tuple(range(4, 62)) and m.layers == 61             # seeds/001: layers 4-61 MoE
    assert m.params == pytest.approx(671e9, rel=0.02)
    m = m.with_(layers=6, moe_layers=(4, 5, 6), micro_batch_size=1, seq_len=1024)
    lay = Layout(dp=16, ep=8, micro_batches=2)
    p = estimate(m, lay, hardware.load("dgx-h100"))
    fwd = row(p, "EP", "token dispatch + combine", "forward")
    assert fwd.calls == 2 * 3 * 2                                            # dispatch + combine, 3 MoE layers, m=2
    assert fwd.bytes_per_call == 1024 * 8 * m.hidden * 2                    # tokens x top-k x h x 2 bytes
    assert fwd.sent_per_call == pytest.approx(fwd.bytes_per_call * 7 / 8, rel=0.01)   # (ep-1)/ep leaves
    assert row(p, "DP", "gradients (experts)").group_size == 2              # dp/ep ranks hold the same experts


def test_placement_tp_inside_a_host_dp_and_pp_across():
    lay = Layout(dp=4, tp=8, pp=2)
    assert lay.group("tp", 8).hosts == 1
    g = lay.group("dp", 8)
    assert (g.hosts, g.per_host, g.groups_per_host) == (4, 1, 8)
    assert lay.group("pp", 8).hosts == 2
    p = estimate(load_model("llama-7b"), lay, hardware.load("dgx-a100"))
    classes = {r.strategy: r.link_class for r in p.rows}
    assert classes == {"TP": "intra", "DP": "inter", "PP": "inter"}


# --- the verdict ----------------------------------------------------------------------------------------

def test_verdict_appears_iff_share_above_30_percent():
    m, lay, hw = load_model("llama-7b"), Layout(dp=2, tp=4, micro_batches=2), hardware.load("pcie-a100-eth")
    comm = estimate(m, lay, hw).totals["comm_time"]
    for share in (0.25, 0.30, 0.29, 0.31, 0.6):
        p = estimate(m, lay, hw, compute_time=comm * (1 - share) / share)
        assert p.share == pytest.approx(share, rel=1e-9)
        assert (p.verdict is not None) == (share > 0.30), share
    assert "gradient-accumulation" in p.verdict and "InfiniBand" in p.verdict
    assert QUOTE in p.table() and "seeds/000" in p.table()


def test_seed001_deepseek_layer_ratios():
    # seeds/001: 10 ms compute + 3 ms communication per layer; unoptimized MoE 1:1
    assert verdict(3 / 13, []) is None
    assert verdict(1 / 2, []) is not None


# --- presets, JSON, CLI, packaging --------------------------------------------------------------------------

def test_presets_load_and_cite_sources():
    for name in model_presets():
        assert load_model(name).source
    assert {"gpt3-175b", "llama-7b", "llama-70b", "deepseek-v3"} <= set(model_presets())
    assert load_model("gpt3-175b").params == pytest.approx(174.6e9, rel=1e-3)
    assert load_model("llama-7b").params == pytest.approx(6.74e9, rel=1e-3)
    assert load_model("llama-70b").params == pytest.approx(68.98e9, rel=1e-3)
    for name in hardware.names():
        hw = hardware.load(name)
        assert hw.source and hw.gpu.source and hw.intra.source and hw.inter.source
    for name in hardware.link_names():
        assert hardware.load_link(name).source
    for name in hardware.gpu_names():
        assert hardware.load_gpu(name).source
    bw = {n: hardware.load_link(n).bandwidth / GB for n in hardware.link_names()}
    # the brief's figures: NDR400 = 50 GB/s, PCIe 5.0 ~64, PCIe 4.0 x16 ~32, 100 GbE ~12, A100 NVLink 600 both ways
    assert bw["ib-ndr"] == 50 and bw["pcie5-x16"] == pytest.approx(64, rel=0.02)
    assert bw["pcie4-x16"] == pytest.approx(32, rel=0.02) and bw["eth-100g"] == pytest.approx(12.5)
    assert 2 * bw["nvlink3"] == 600 and 2 * bw["nvlink4"] == 900
    assert hardware.load_gpu("a100-sxm").peak("bf16") == 312e12
    assert hardware.load("dgx-a100").nics == 8 and hardware.load("dgx-h100").inter.name == "ib-ndr"


def test_model_and_hardware_from_files(tmp_path):
    (tmp_path / "m.toml").write_text('layers = 2\nhidden = 64\nheads = 4\nffn = 256\nvocab = 1000\n'
                                     'experts = 4\ntop_k = 2\nmoe_layers = "2"\nsource = "test"\n')
    (tmp_path / "h.toml").write_text('gpu = { tflops = { bf16 = 100 } }\ngpus_per_host = 4\n'
                                     'intra = "pcie5-x16"\ninter = { gbits_per_s = 10, latency_us = 30 }\n')
    m = load_model(tmp_path / "m.toml")
    assert m.name == "m" and m.moe_layers == (2,)
    hw = hardware.load(tmp_path / "h.toml")
    assert hw.inter.bandwidth == 1.25e9 and hw.intra.shared
    with pytest.raises(ValueError, match="unknown keys"):
        hardware.from_dict({"gpu": "a100-sxm", "gpus_per_host": 8, "intra": "nvlink3", "inter": "ib-hdr", "x": 1})
    with pytest.raises(ValueError, match="no model"):
        load_model("no-such-model")


def test_json_round_trips():
    p = estimate(load_model("llama-7b"), Layout(dp=2, tp=4, pp=2, micro_batches=4, zero=1), hardware.load("dgx-h100"))
    d = p.to_json()
    assert json.loads(json.dumps(d)) == d
    back = Plan.from_json(json.loads(json.dumps(d)))
    assert back.to_json() == d and back.table() == p.table()


def run_cli(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["plan", *args])
    return code, out.getvalue()


def test_cli_table_json_and_errors(capsys):
    args = ["--model", "llama-7b", "--hardware", "dgx-a100", "--dp", "2", "--tp", "8", "--micro-batches", "2"]
    code, text = run_cli(*args)
    assert code == 0 and "allreduce" in text and "communication share" in text
    code, text = run_cli(*args, "--json")
    d = json.loads(text)
    want = estimate(load_model("llama-7b"), Layout(dp=2, tp=8, micro_batches=2), hardware.load("dgx-a100")).to_json()
    assert code == 0 and d == json.loads(json.dumps(want))
    code, text = run_cli("--list")
    assert code == 0 and "gpt3-175b" in text and "dgx-h100" in text
    code, text = run_cli("--list-hardware")
    assert code == 0 and "source: NVIDIA DGX A100" in text and "ib-ndr" in text
    code, _ = run_cli("--model", "llama-7b", "--dp", "3", "--ep", "2")
    assert code == 2 and "ep=2 must divide dp=3" in capsys.readouterr().err
    code, text = run_cli("--model", "gpt3-175b", "--micro-batch-size", "32", "--tp", "8", "--micro-batches", "1",
                         "--forward-only", "--compute-ms", "4800", "--json")
    assert json.loads(text)["settings"]["train"] is False


def test_measured_machine_links_with_preset_compute():
    hw = hardware.measured(per_host=2, gpu="h100-sxm")
    assert hw.measured and hw.gpu.name == "h100-sxm" and hw.per_host == 2
    m = Model("small", layers=2, hidden=256, heads=4, ffn=1024, vocab=1000, global_batch=4)
    p = estimate(m, Layout(dp=4, micro_batches=1), hw)
    r = row(p, "DP", "gradients")
    assert r.link_class == "inter" and r.time > 0
    code, text = run_cli("--model", "llama-7b", "--measured", "--per-host", "2", "--dp", "2", "--micro-batches", "1")
    assert code == 0 and "measured" in text


def test_package_data_lists_every_preset_file():
    root = Path(__file__).resolve().parents[1]
    with open(root / "pyproject.toml", "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["pyxccl.plan"]
    base = resources.files("pyxccl.plan")
    files = [str(p.relative_to(Path(str(base)))) for p in Path(str(base)).rglob("*.toml")]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)


@pytest.mark.parametrize("hosts,per_host", [(1, 8), (4, 4), (16, 1)])
def test_pricing_picks_what_the_simulator_would_choose(hosts, per_host):
    # the planner runs symmetric mode where it can (faster); the answer must be sim.choose's
    from pyxccl import sim
    from pyxccl.plan.price import _sim
    c = hardware.load("dgx-h100").cluster(hosts, per_host)
    for prim in ("allreduce", "reduce_scatter", "allgather", "alltoall"):
        mine, theirs = _sim(prim, 1 << 24, c, 2, None), sim.choose(prim, 1 << 24, c, dtype="float16")
        assert mine.algorithm == theirs.algorithm and mine.time == pytest.approx(theirs.time, rel=1e-6)


def test_groups_with_whole_dgx_nodes_are_priced_as_nccl_prices_them():
    """A TP group of a DGX node's 8 GPUs runs NCCL: its allreduce costs what NCCL's model picks (the
    time of ``pyxccl sim`` on that preset); a DP group of one GPU a node is priced by pyxccl's walk."""
    from dataclasses import replace

    from pyxccl.sim import calibrated, fitted, nccl
    from pyxccl.sim.calibrated import Pricing

    def tp_row(pricing=None):
        p = estimate(load_model("llama-7b"), Layout(dp=2, tp=8, micro_batches=2), hardware.load("dgx-h100"),
                     pricing=pricing)
        rows = {(r.group, r.primitive): r for r in p.rows}
        assert "/" not in rows[("dp", "allreduce")].algorithm
        return p, rows[("tp", "allreduce")]
    # by default with the fitted figures, one process per GPU, the newest release: what `pyxccl sim` prints
    p, tp = tp_row()
    comm = nccl.preset("dgx-h100", 1, 8)
    best = next(r for r in calibrated.nccl("allreduce", tp.bytes_per_call, comm, fitted.FITTED[("nccl", "dgx-h100")],
                                           "per-gpu") if r.chosen)
    assert (tp.algorithm, tp.time_per_call) == (f"{best.algorithm}/{best.protocol}", best.time)
    assert p.settings["nccl_figures"] == {"release": "2.30.7", "launch": "per-gpu", "calibration": "fitted"}
    assert any("NCCL 2.30.7, per-gpu launch, calibrated" in n for n in p.notes)
    # raw: the port as it is
    raw = nccl.choose("allreduce", tp.bytes_per_call, comm)
    _, tp = tp_row(Pricing(raw=True))
    assert (tp.algorithm, tp.time_per_call) == (f"{raw.algorithm}/{raw.protocol}", raw.time * 1e-6)
    # a single-process launch adds the fitted launch latency; another release is priced with its constants
    _, one = tp_row(Pricing(launch="single-process"))
    assert one.time_per_call == pytest.approx(best.time + fitted.FITTED[("nccl", "dgx-h100")].launch_lat, rel=1e-12)
    old = next(r for r in calibrated.nccl("allreduce", tp.bytes_per_call, replace(comm, version="2.21.5"),
                                          fitted.FITTED[("nccl", "dgx-h100")], "per-gpu") if r.chosen)
    assert tp_row(Pricing(version="2.21.5"))[1].time_per_call == old.time


def test_ep_alltoall_on_whole_dgx_nodes_is_priced_as_nccl_runs_it():
    """An EP group with whole DGX nodes to itself runs NCCL's alltoall, grouped point-to-point: its token
    dispatch + combine costs what ``pyxccl sim alltoall`` prints there (``calibrated.alltoall_row``, the
    fidelity table's), for the ``Pricing`` given; an EP group of half a node is priced by pyxccl's walk."""
    from pyxccl.sim import calibrated, fitted, nccl
    from pyxccl.sim.calibrated import Pricing
    m = load_model("deepseek-v3").with_(layers=6, moe_layers=(4, 5, 6), micro_batch_size=1, seq_len=1024)

    def ep_row(lay, pricing=None):
        return row(estimate(m, lay, hardware.load("dgx-h100"), pricing=pricing), "EP", "token dispatch + combine",
                   "forward")
    cal = fitted.FITTED[("nccl", "dgx-h100")]
    for ep, hosts in ((8, 1), (16, 2)):
        lay = Layout(dp=2 * ep, ep=ep, micro_batches=2)
        r = ep_row(lay)
        comm = nccl.preset("dgx-h100", hosts)
        want = calibrated.alltoall_row(r.bytes_per_call, comm, cal, "per-gpu")
        assert (r.algorithm, r.time_per_call) == (f"grouped p2p/{want.protocol}", want.time), ep
        assert r.time == r.calls * want.time and r.sent_per_call == int(r.bytes_per_call * (ep - 1) / ep)
        # raw, another launch mode: the same figures `pyxccl sim --raw` / `--launch single-process` print
        raw = ep_row(lay, Pricing(raw=True))
        assert raw.time_per_call == calibrated.alltoall_row(r.bytes_per_call, comm, None).time
        one = ep_row(lay, Pricing(launch="single-process"))
        assert one.time_per_call == calibrated.alltoall_row(r.bytes_per_call, comm, cal, "single-process").time
        assert one.time_per_call > r.time_per_call
    # half a node a group (two EP groups share each node): no NCCL figure, pyxccl's fastest algorithm
    from pyxccl.algorithms import registry
    half = ep_row(Layout(dp=8, ep=4, micro_batches=2))
    assert half.algorithm in registry.algorithms("alltoall")
