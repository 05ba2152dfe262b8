"""The environment variables: every one pyxccl reads is read through ``pyxccl._env`` (or by the reader
that checks it, ``_env.ELSEWHERE``), README's table names each, and a value a variable does not take is an
InvalidArgumentError naming the variable, the value, what it takes and the rank, never a bare ValueError
or a silent default."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyxccl import _env
from pyxccl._errors import InvalidArgumentError
from pyxccl.core.dispatch import _parse_algo_env

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "pyxccl"


def _read_raw() -> dict[str, list[str]]:
    """PYXCCL_ variables read from os.environ in the package, outside _env.py: name -> files."""
    out: dict = {}
    for f in SRC.rglob("*.py"):
        if f.name == "_env.py":
            continue
        for name in re.findall(r"(?:environ\.get\(|environ\[|getenv\(|(?<!_)env\.get\()\s*[\"'](PYXCCL_\w+)", f.read_text()):
            out.setdefault(name, []).append(str(f.relative_to(SRC)))
    return out


def test_every_variable_is_read_in_one_place_and_documented():
    raw = _read_raw()
    assert set(raw) <= _env.ELSEWHERE, {k: v for k, v in raw.items() if k not in _env.ELSEWHERE}
    named = set()       # every variable of the table is named where it is read (_env.get's argument)
    for f in SRC.rglob("*.py"):
        if f.name != "_env.py":
            named |= set(re.findall(r"[\"'](PYXCCL_\w+)[\"']", f.read_text()))
    assert set(_env.VARIABLES) <= named, set(_env.VARIABLES) - named
    assert not set(_env.VARIABLES) & _env.ELSEWHERE
    table = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1]
    documented = set(re.findall(r"`(PYXCCL_\w+)`", table))
    # the tuner's C walker off (for tests and docs/sim.md), and pyxccl run's mark on its ranks: not for users
    internal = {"PYXCCL_SIMCORE", "PYXCCL_LAUNCHER"}
    assert (set(_env.VARIABLES) | _env.ELSEWHERE) - internal <= documented | {"PYXCCL_STRIPE_BYTES"}
    assert "PYXCCL_STRIPE_BYTES" in table       # (in PYXCCL_NSOCKS's row)


def _bad_values(spec) -> list[str]:
    out = ["x", "1.5e", " "] if not isinstance(spec, _env.Choice) else ["x", "sometimes"]
    if isinstance(spec, _env.Integer):
        out += [str(spec.low - 1), "2.5"] + ([str(spec.high + 1)] if spec.high is not None else [])
    if isinstance(spec, _env.Number):
        out += [str(spec.low - 1), "nan", "inf"]
    if isinstance(spec, _env.Flag):
        out += ["2", "maybe"]
    return [v for v in out if v.strip()]


@pytest.mark.parametrize("name", sorted(_env.VARIABLES))
def test_a_value_a_variable_does_not_take_is_refused_naming_it(name, monkeypatch):
    spec = _env.VARIABLES[name]
    monkeypatch.delenv("RANK", raising=False)
    for bad in _bad_values(spec):
        monkeypatch.setenv(name, bad)
        with pytest.raises(InvalidArgumentError, match=re.escape(f"{name}={bad!r} is not ") + ".*; fix or unset it"):
            _env.get(name)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv(name, "x")
    with pytest.raises(InvalidArgumentError, match=re.escape(f"rank 3: {name}='x'")) as e:
        _env.get(name)
    assert e.value.rank == 3 and e.value.op == "init"


@pytest.mark.parametrize("name", sorted(_env.VARIABLES))
def test_unset_or_empty_is_the_default_and_good_values_parse(name, monkeypatch):
    spec = _env.VARIABLES[name]
    for v in (None, "", "  "):
        if v is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, v)
        assert _env.get(name) == spec.default
        assert _env.get(name, default=7) == 7         # the reader's default, where the table has none
    if isinstance(spec, _env.Integer):
        good = [(str(spec.low), spec.low), (f" {spec.low + 3} ", spec.low + 3)]
        good += [(str(spec.high), spec.high)] if spec.high is not None else []
    elif isinstance(spec, _env.Number):
        good = [("0.25", 0.25 if spec.low <= 0.25 else None), (str(spec.low), spec.low)]
    elif isinstance(spec, _env.Flag):
        good = [("0", False), ("1", True), ("OFF", False), ("yes", True), ("True", True)]
    else:
        good = [(c.lower() if spec.upper else c, c) for c in spec.choices if c]
    for text, want in good:
        if want is not None:
            monkeypatch.setenv(name, text)
            assert _env.get(name) == want


def test_algorithm_pairs_are_checked():
    assert _parse_algo_env(" allreduce=ring , broadcast = binomial,") == {"allreduce": "ring", "broadcast": "binomial"}
    assert _parse_algo_env("allreduce=shm") == {"allreduce": "shm"}     # an old name (registry.ALIASES)
    for spec, why in (("ring", "'ring', no primitive"), ("alreduce=ring", "'alreduce', no primitive"),
                      ("allreduce=rng", "'rng', no algorithm of allreduce"),
                      ("allreduce=", "'', no algorithm of allreduce")):
        with pytest.raises(InvalidArgumentError, match=re.escape(f"PYXCCL_ALGO={spec!r} asks for {why}")):
            _parse_algo_env(spec)


def test_a_bad_value_stops_the_import_that_reads_it():
    """Read at import (the shared-memory rings' geometry): the process stops with the variable named."""
    out = subprocess.run([sys.executable, "-c", "import pyxccl.transport.shm"], capture_output=True, text=True,
                         env={"PYXCCL_SHM_SLOTS": "four", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode != 0
    assert ("InvalidArgumentError: PYXCCL_SHM_SLOTS='four' is not an integer from 2 (slots of each shared-memory "
            "ring); fix or unset it") in out.stderr


def test_pyxccl_run_refuses_a_bad_variable_before_it_starts_a_rank(tmp_path):
    started = tmp_path / "started"
    out = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "2", sys.executable, "-c",
                          f"open({str(started)!r}, 'w')"], capture_output=True, text=True, timeout=120,
                         env={"PYXCCL_SHM_SLOTS": "four", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out
    assert "pyxccl run: error: PYXCCL_SHM_SLOTS='four' is not an integer from 2" in out.stderr
    assert "Traceback" not in out.stderr and not started.exists()
