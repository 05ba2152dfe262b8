"""2D-torus allreduce (algorithms/torus.py): the grid it picks, proven by the checker on every grid
it picks up to 64 ranks, its steps and bytes read off the schedules, refused where n has no grid,
right on real ranks, and priced by the tuner and ``pyxccl sim``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import rankfns as rf
from pyxccl import cli
from pyxccl.algorithms import registry, torus
from pyxccl.checker import check, simulate
from pyxccl.ops import ReduceOp
from pyxccl.schedule import Copy, Send
from pyxccl.testing import RankPool
from pyxccl.tuning import Machine, Tuner, compact, symmetric

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tuner_scale  # noqa: E402  (how a tuner of H hosts x L ranks is made)

PRIMES = (2, 3, 5, 7, 11, 13, 31, 61)


def _hosts(h: int, per: int) -> list[int]:
    return [r // per for r in range(h * per)]


def _counts(n: int):
    return (1, n - 1, n, 7 * n + 3)


def test_grid_rule():
    """Hosts alike (H > 1 hosts of L > 1 ranks, in any order) are the rows; otherwise the most square
    R x C with 2 <= R <= C, rows of consecutive ranks; no grid for n < 4 or prime."""
    assert torus.grid(12) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert torus.grid(16) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert torus.grid(8, _hosts(4, 2)) == [[0, 1], [2, 3], [4, 5], [6, 7]]      # not 2 x 4: the hosts
    assert torus.grid(6, _hosts(3, 2)) == [[0, 1], [2, 3], [4, 5]]
    assert torus.grid(8, [r % 2 for r in range(8)]) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    for hosts in ([0, 0, 0, 1, 1, 1, 1, 1], list(range(8)), [0] * 8):    # uneven, one rank per host, one host
        assert torus.grid(8, hosts) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for n in (1,) + PRIMES:
        assert torus.grid(n) is None and torus.grid(n, [0] * n) is None
        assert not registry.lookup("allreduce", "torus2d").runs(n)


@pytest.mark.timeout(300)
def test_checker_proves_every_grid_up_to_64_ranks():
    grids = 0
    for n in range(4, 65):
        if torus.grid(n) is None:
            continue
        grids += 1
        for count in _counts(n):
            check("allreduce", "torus2d", n, count)       # out of place and in place
    assert grids == 61 - 16            # 4..64 less its 16 primes


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", [_hosts(2, 4), _hosts(4, 4), _hosts(8, 8), _hosts(3, 3), _hosts(4, 2),
                                   [r % 4 for r in range(12)], [0, 0, 0, 1, 1, 1, 1, 1, 1]],
                         ids=["2x4", "4x4", "8x8", "3x3", "4x2", "interleaved", "uneven"])
def test_checker_proves_host_layouts(hosts):
    n = len(hosts)
    for count in _counts(n):
        check("allreduce", "torus2d", n, count, hosts=hosts)


def _transfer_steps(s) -> int:
    return sum(1 for step in s.steps if any(type(o) is not Copy for o in step))


@pytest.mark.parametrize("n,hosts", [(6, None), (12, None), (16, None), (64, None), (8, _hosts(4, 2)),
                                     (32, _hosts(4, 8)), (64, _hosts(8, 8))])
def test_steps_and_bytes_are_the_tori(n, hosts):
    """2 (C-1) + 2 (R-1) steps; 2 (C-1)/C of the data along the row and 2 (R-1)/n along the column,
    which alone crosses hosts when the hosts are the rows."""
    rows = torus.grid(n, hosts)
    R, C = len(rows), len(rows[0])
    row_of = {r: i for i, row in enumerate(rows) for r in row}
    count = n * 64                  # every part and sub-chunk of one size: the figures are exact
    _, _, scheds = simulate("allreduce", "torus2d", n, count, hosts=hosts)
    for s in scheds:
        assert _transfer_steps(s) == 2 * (C - 1) + 2 * (R - 1)
        sends = [o for step in s.steps for o in step if type(o) is Send]
        along_row = sum(o.count for o in sends if row_of[o.peer] == row_of[s.rank])
        assert along_row == 2 * (C - 1) * count // C
        assert sum(o.count for o in sends) - along_row == 2 * (R - 1) * count // n
        if hosts is not None:
            across = sum(o.count for o in sends if hosts[o.peer] != hosts[s.rank])
            assert across == 2 * (R - 1) * count // n


def test_empty_parts_are_left_out():
    """count < C: the columns of empty parts exchange nothing, and no step carries an empty transfer."""
    n = 64
    rows = torus.grid(n)
    _, _, scheds = simulate("allreduce", "torus2d", n, 3)
    for s in scheds:
        j = next(row.index(s.rank) for row in rows if s.rank in row)
        peers = {o.peer for step in s.steps for o in step if type(o) is not Copy}
        down = {p for p in peers if p % 8 == j}        # same column: phase 2
        assert bool(down) == (j < 3), (s.rank, sorted(down))
        assert all(o.count > 0 for step in s.steps for o in step)


@pytest.mark.parametrize("n", (1,) + PRIMES)
def test_refused_where_n_has_no_grid(n):
    for hosts in (None, [0] * n, list(range(n))):
        with pytest.raises(ValueError, match="cannot run"):
            registry.lookup("allreduce", "torus2d").schedule(0, n, hosts=hosts, count=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", (2, 3, 4, 5))
def test_communicator_lists_it_where_it_runs_and_refuses_it_elsewhere(pools, n):
    for listed, why in pools(n).run(rf.forced_allreduce_refused, "torus2d"):
        if n == 4:
            assert listed and why is None
        else:
            assert not listed and "algorithm 'torus2d' cannot run" in why and f"on {n} ranks" in why, why


PAIRS = [(np.float32, ReduceOp.SUM), (np.float32, ReduceOp.MAX), (np.int32, ReduceOp.SUM),
         (np.int32, ReduceOp.MAX)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", (4, 6, 8, 9, 16))
def test_forced_on_real_ranks_matches_numpy(pools, transport, n):
    out = pools(n).run(rf.check_forced, "allreduce", ["torus2d"], (0, 1, n - 1, 7 * n + 3, 1000), PAIRS,
                       transport=transport, timeout=250)
    fails = [f"rank {r}: {f}" for r, fs in enumerate(out) for f in fs]
    assert not fails, "\n".join(fails[:20])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", (["a", "b", "a", "b"], ["a", "a", "b", "b", "c", "c"]))
def test_forced_on_emulated_hosts_matches_numpy(hosts):
    """Hosts as rows (a grid other than the flat one): shared memory along rows, TCP down columns."""
    assert torus.grid(len(hosts), [ord(h) for h in hosts]) != torus.grid(len(hosts))
    with RankPool(len(hosts), transports=("auto",), hosts=hosts) as pool:
        out = pool.run(rf.check_forced, "allreduce", ["torus2d"], (1, 7, 1000), PAIRS, transport="auto", timeout=250)
    fails = [f for fs in out for f in fs]
    assert not fails, "\n".join(fails[:20])


def test_the_tuner_prices_it_where_it_runs():
    assert "torus2d" in tuner_scale.tuner(4, 4).table("allreduce", 1 << 20)
    n = 5
    t = Tuner(n, [0] * n, lambda a, b: "self" if a == b else "shm", Machine(cores=2), [2] * n)
    table = t.table("allreduce", 1 << 20)
    assert "ring" in table and "torus2d" not in table


def test_the_tuner_folds_it_on_128_hosts_of_8():
    """Hosts are rows, so host h runs host 0's schedules moved by 8h: the tuner walks host 0's ranks (their
    arrays, made without building them: tuning/shifted.py)."""
    t = tuner_scale.tuner(128, 8)
    algo, get = t._builder("allreduce", "torus2d", 1 << 20, 4)
    sym, reps = symmetric.find(get, 128, 8, False)
    assert sym is not None and sym.name == "shift"
    reps, _ = t._walked(algo, get)
    assert isinstance(reps, compact.Compact) and reps.ranks.tolist() == list(range(8))


def test_sim_lists_it(capsys, tmp_path):
    out = tmp_path / "rows.json"
    assert cli.main(["sim", "allreduce", "--hosts", "4", "--per-host", "8", "--hardware", "dgx-a100",
                     "--model", "pyxccl", "--size", "1048576", "--json", str(out)]) == 0
    assert "torus2d" in capsys.readouterr().out
    rows = {r["algorithm"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["torus2d"]["time"] > 0
