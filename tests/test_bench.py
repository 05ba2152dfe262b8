"""`pyxccl bench --check` over a small sweep of every primitive: no wrong element, every column."""
import json
import subprocess
import sys

import pytest

from pyxccl.bench import methodology as M

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
