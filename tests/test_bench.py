"""`pyxccl bench --check` over a small sweep of every primitive: no wrong element, every column; and
`bench --vs` with its peers (what runs without them installed; the real runs: gloo and MPICH always, the test
extra has them; the others skip only where one is absent)."""
import argparse
import json
import os
import pathlib
import subprocess
import sys

import pytest

from pyxccl.bench import compare, installs, oneccl
from pyxccl.bench import methodology as M

REPO = pathlib.Path(__file__).resolve().parents[1]
HEAVY = ("impi", "deepspeed", "oneccl")     # the peers scripts/setup_peers.sh installs
PIP = ("gloo", "mpi")                       # the peers of the pip extras: the test extra has them too

COLUMNS = {"lib", "op", "n", "size", "count", "type", "redop", "root", "out_of_place", "in_place"}
PART = {"time_us", "min_us", "algbw", "busbw", "wrong", "algorithm"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (2, 4))
def test_bench_check_every_primitive(tmp_path, n):
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "-m", "pyxccl", "bench", "-n", str(n), "all", "-b", "8", "-e", "4M",
                        "-f", "64", "--iters", "3", "--warmup", "1", "--check", "--json", str(out)],
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {r["op"] for r in rows} == set(M.PRIMITIVES)
    assert {r["size"] for r in rows if r["op"] == "allreduce"} == {8, 512, 32768, 2097152}
    for r in rows:
        assert COLUMNS <= set(r), r
        assert r["out_of_place"]["wrong"] == 0, r
        assert PART <= set(r["out_of_place"]), r
        if r["in_place"] is not None:
            assert r["in_place"]["wrong"] == 0 and PART <= set(r["in_place"]), r
    assert "# Out of bounds values : 0 OK" in p.stdout
    assert "Avg bus bandwidth" in p.stdout


@pytest.mark.timeout(120)
def test_bench_compression_table():
    """`pyxccl bench --compression`: a row per compressor and primitive, the bytes on the wire as the
    counters have them (TopK's: exactly its packed pairs), the error within each code's reach."""
    from pyxccl.compression import TopK, nbytes
    p = subprocess.run([sys.executable, "-m", "pyxccl", "bench", "-n", "2", "allreduce,reduce_scatter,allgather",
                        "-b", "1M", "-e", "1M", "--algo", "ring", "--iters", "2", "--warmup", "1",
                        "--compression", "none,int8,topk:0.1"], capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows, op = {}, None
    for line in p.stdout.splitlines():
        f = line.split()[1:]                    # after the rank's "[0]"
        if f[:1] == ["#"] and f[1:2] in (["allreduce"], ["reduce_scatter"], ["allgather"]):
            op = f[1]
        elif len(f) >= 9 and f[0] == "1048576":     # the algorithm may be two words: from the right
            rows[op, f[1]] = dict(wire=int(f[-3]), ratio=float(f[-2]) if f[-2] != "-" else None, err=float(f[-1]))
    assert len(rows) == 9, p.stdout
    for op in ("allreduce", "reduce_scatter", "allgather"):
        count = (1 << 18) // (2 if op == "allgather" else 1)      # what each rank sparsifies
        assert rows[op, "none"]["ratio"] == 1.0 and rows[op, "none"]["err"] < 1e-6
        assert 0.25 < rows[op, "int8"]["ratio"] <= 0.27 and rows[op, "int8"]["err"] < 1e-2
        assert rows[op, "topk:0.1"]["wire"] == nbytes(TopK(0.1).k(count), count)   # 2 ranks: its pairs, once
        assert 0.2 < rows[op, "topk:0.1"]["err"] < 1        # a first call: most entries are not sent


def test_bench_check_catches_wrong_results():
    """--check is not decorative: a broken collective makes it fail."""
    from pyxccl.bench import runner
    case = runner.Case("allreduce", 64, "float32", 0, 2, inplace=False)
    case.reset()
    assert case.wrong() > 0          # nothing ran: the output is all zeros, not the sum


def test_sizes_and_counts():
    assert M.parse_size("256M") == 256 << 20 and M.parse_size("8") == 8 and M.parse_size("1K") == 1024
    assert M.sweep(8, 64, 2) == [8, 16, 32, 64]
    assert M.counts("allgather", 8, 4, 4) == (4, 1)          # at least one element per rank
    assert M.busbw_factor("allreduce", 4) == 1.5


def test_vs_names():
    assert compare.parse_vs("gloo, mpi,,impi,deepspeed,oneccl,mpi") == ["gloo", "mpi", "impi", "deepspeed", "oneccl"]
    with pytest.raises(SystemExit, match="knows gloo, mpi, impi, deepspeed, oneccl, not intelmpi"):
        compare.parse_vs("mpi,intelmpi")


@pytest.mark.parametrize("lib", HEAVY)
def test_missing_peer_names_what_and_the_command(tmp_path, monkeypatch, lib):
    monkeypatch.setenv("PYXCCL_PEERS_DIR", str(tmp_path))
    monkeypatch.setattr(installs, "_has_module", lambda name: True)    # mpi4py (the [peers] extra) is there
    why = installs.missing(lib)
    assert why is not None and str(tmp_path) in why
    assert f"PYXCCL_PEERS_DIR={tmp_path} scripts/setup_peers.sh {lib}" in why
    # the command it names exists and knows that peer
    script = (REPO / "scripts" / "setup_peers.sh").read_text()
    assert f"\n  {lib}) {lib} ;;" in script
    # once the files it named are there, nothing is missing
    for path in why.split("(no ")[1].split(")")[0].split(", "):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pathlib.Path(path).touch()
    assert installs.missing(lib) is None


def test_missing_pip_peers_name_the_extra(monkeypatch):
    monkeypatch.setattr(installs, "_has_module", lambda name: False)
    for lib in ("gloo", "mpi", "impi"):
        assert installs.missing(lib).endswith("pip install 'pyxccl[peers]'"), lib
    monkeypatch.setattr(installs, "_has_module", lambda name: True)
    monkeypatch.setattr(installs, "mpich_mpiexec", lambda: None)
    assert "no mpiexec" in installs.missing("mpi") and installs.missing("gloo") is None


def test_plan_runs_each_peer_on_what_it_has(monkeypatch):
    monkeypatch.setattr(installs, "missing", lambda lib: "not here" if lib == "impi" else None)
    prims = ["allreduce", "broadcast", "gather"]
    todo, skipped = compare.plan(["mpi", "impi", "deepspeed", "oneccl"], prims, "float32")
    assert todo == {"pyxccl": prims, "mpi": prims, "deepspeed": ["allreduce"], "oneccl": ["allreduce", "broadcast"]}
    assert skipped == {"impi": "not here"}
    todo, skipped = compare.plan(["deepspeed", "oneccl"], ["broadcast"], "float32")
    assert todo == {"pyxccl": ["broadcast"], "oneccl": ["broadcast"]} and skipped == {"deepspeed": "has only allreduce"}
    _, skipped = compare.plan(["oneccl"], ["scatter", "gather"], "float32")
    assert skipped == {"oneccl": "has only allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall"}
    _, skipped = compare.plan(["oneccl", "mpi"], ["allreduce"], "float64")
    assert skipped == {"oneccl": "timed on float32 only"}


def test_oneccl_gets_the_counts_of_methodology(monkeypatch):
    seen = []
    monkeypatch.setattr(oneccl.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, ONECCL_OUT, ""))
    args = argparse.Namespace(dtype="float32", algo=None)
    rows = compare.run_lib("oneccl", 4, ["allreduce", "allgather"], [8, 1 << 20], args, "unused.json")
    assert seen[0][1:] == ["-n", "4", "--cases", "allreduce:2:2,allreduce:262144:262144,"
                           "allgather:4:1,allgather:262144:65536"]       # 8 B of allgather at 4 ranks: 16 B
    assert [r["size"] for r in rows] == [8, 1048576]


ONECCL_OUT = """\
2026:11:23-17:28:21:31318:[1] |CCL_WARN| Endpoint name truncated from 64 to 19 bytes
{"lib": "oneccl", "op": "allreduce", "type": "float32", "n": 2, "size": 8, "count": 2, "wrong": 0, "warmup": 5, \
"times_us": [9.0, 5.0, 7.0, 30.0, 6.0]}
{"lib": "oneccl", "op": "allreduce", "type": "float32", "n": 2, "size": 1048576, "count": 262144, "wrong": 3, \
"warmup": 5, "times_us": [400.0, 200.0]}
"""


def test_oneccl_lines_become_rows():
    rows = oneccl.rows(ONECCL_OUT)
    assert [(r["lib"], r["op"], r["n"], r["size"], r["count"]) for r in rows] == [
        ("oneccl", "allreduce", 2, 8, 2), ("oneccl", "allreduce", 2, 1048576, 262144)]
    small, big = rows[0]["out_of_place"], rows[1]["out_of_place"]
    assert small["time_us"] == pytest.approx(7.0) and small["min_us"] == pytest.approx(5.0)   # the median
    assert big["time_us"] == pytest.approx(300.0) and big["wrong"] == 3
    assert big["busbw"] == pytest.approx(1048576 / 300e-6 / 1e9 * M.busbw_factor("allreduce", 2))


def _row(lib, op, size, us, wrong=0):
    return dict(lib=lib, op=op, n=2, size=size, count=size // 4, type="float32",
                out_of_place=dict(M.summarize([us * 1e-6], size, op, 2), wrong=wrong))


def test_peers_with_fewer_primitives_merge_into_the_table(capsys):
    runs = {"pyxccl": [[_row("pyxccl", "allreduce", 8, us), _row("pyxccl", "broadcast", 8, us - 10)]
                       for us in (20.0, 40.0, 30.0)],                                    # three rounds
            "deepspeed": [[_row("deepspeed", "allreduce", 8, us, w)] for us, w in ((5.0, 0), (7.0, 1), (6.0, 0))],
            "oneccl": [oneccl.rows(ONECCL_OUT)[:1]] * 3}
    table = compare.merge(runs)
    assert table[("pyxccl", "allreduce", 8)]["time_us"] == pytest.approx(30.0)     # median of the rounds
    assert table[("deepspeed", "allreduce", 8)]["wrong"] == 1
    assert ("deepspeed", "broadcast", 8) not in table
    args = argparse.Namespace(dtype="float32", rounds=3)
    wrong = compare._print(table, list(runs), ["allreduce", "broadcast"], 2, args, {"impi": "it is not here"})
    out = capsys.readouterr().out
    assert wrong == 1
    lines = out.splitlines()
    ar = lines[lines.index("# allreduce") + 2].split()
    assert ar == ["8", "30.0", "0.000", "6.0", "0.001", "7.0", "0.001", "0.20", "0.23", "1"]
    bc = lines[lines.index("# broadcast") + 2].split()
    assert bc == ["8", "20.0", "0.000", "-", "-", "-", "-", "-", "-", "0"]
    assert "deepspeed us" in out and "x oneccl" in out
    assert "# impi: skipped: it is not here" in out


def test_impi_runs_on_intel_libmpi_and_hydra(tmp_path, monkeypatch):
    monkeypatch.setenv("PYXCCL_PEERS_DIR", str(tmp_path))
    env = {"I_MPI_FABRICS": "ofi"}
    cmd = compare._impi(env)
    assert cmd == [str(tmp_path / "impi" / "bin" / "mpiexec"), "-launcher", "fork"]
    assert env["MPI4PY_LIBMPI"] == str(tmp_path / "impi" / "lib" / "libmpi.so.12")
    assert env["I_MPI_ROOT"] == str(tmp_path / "impi")
    assert env["I_MPI_FABRICS"] == "ofi" and env["I_MPI_HYDRA_IFACE"] == "lo"    # the user's setting wins


def test_deepspeed_venv_sees_only_this_pyxccl(tmp_path):
    import pyxccl
    d = compare._pyxccl_path(str(tmp_path))
    assert os.listdir(d) == ["pyxccl"]
    assert os.path.samefile(os.path.join(d, "pyxccl"), os.path.dirname(pyxccl.__file__))
    assert compare._pyxccl_path(str(tmp_path)) == d           # twice in one run (rounds) is fine


@pytest.mark.timeout(120)
def test_vs_missing_peers_say_so_and_the_table_still_comes(tmp_path):
    env = dict(os.environ, PYXCCL_PEERS_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "pyxccl", "bench", "--vs", "impi,deepspeed,oneccl", "-n", "2",
                        "allreduce", "-b", "8", "-e", "8"], capture_output=True, text=True, timeout=110, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for lib in HEAVY:
        if lib == "impi" and not installs._has_module("mpi4py"):    # a clean test venv has none: said first
            assert "# impi: skipped: mpi4py is not installed" in p.stdout and "pyxccl[peers]" in p.stderr
            continue
        assert f"# {lib}: skipped: {installs.NAMES[lib]} is not installed" in p.stdout
        assert f"scripts/setup_peers.sh {lib}" in p.stderr
    assert "# allreduce" in p.stdout and "# Out of bounds values : 0 OK" in p.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lib", PIP + HEAVY)
def test_vs_installed_peer(tmp_path, lib):
    """The real thing: gloo and MPICH always (`make test` installs them), the others where
    scripts/setup_peers.sh has been run (CI does not download those GBs)."""
    if lib in PIP:
        assert installs.missing(lib) is None, "the test extra installs it: pip install -e '.[test]'"
    elif installs.missing(lib):
        pytest.skip(installs.missing(lib))
    out = tmp_path / "vs.json"
    p = subprocess.run([sys.executable, "-m", "pyxccl", "bench", "--vs", lib, "-n", "2", "all",
                        "-b", "8", "-e", "64K", "-f", "8192", "--check", "--json", str(out)],
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {(r["lib"], r["op"], r["size"]): r for r in json.loads(out.read_text())}
    has = installs.primitives(lib, M.PRIMITIVES)
    # (a peer whose run failed is skipped with its reason on stderr: show it)
    assert {k[1] for k in rows if k[0] == lib} == set(has), p.stderr[-3000:]
    for op in has:
        for size in (8, 65536):
            assert rows[(lib, op, size)]["wrong"] == 0 and rows[(lib, op, size)]["time_us"] > 0, (op, size)
