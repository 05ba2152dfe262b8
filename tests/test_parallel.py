"""pyxccl.parallel: the groups and the traffic counters."""
import pytest

import parallelfns as pf

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2), (1, 4), (4, 1)])
def test_groups_place_tp_innermost_then_dp_then_pp(torch_pools, tp, pp):
    n = 4
    dp = n // (tp * pp)
    out = torch_pools(n).run(pf.layout, tp, pp, timeout=120)
    for r, (tpr, dpr, ppr, epr, ti, di, pi, text) in enumerate(out):
        assert (ti, di, pi) == (r % tp, r // tp % dp, r // (tp * dp))
        assert tpr == [(pi * dp + di) * tp + t for t in range(tp)]
        assert dpr == [(pi * dp + d) * tp + ti for d in range(dp)]
        assert ppr == [(p * dp + di) * tp + ti for p in range(pp)]
        assert epr == [r]
        assert f"tp {tp} x dp {dp} x pp {pp}" in text and "warning" not in text   # one host: tp never spans


@pytest.mark.parametrize("tp", (1, 2))
def test_counters_read_what_the_ring_schedules_moved(torch_pools, tp):
    """bytes: the payload; sent/received: pyxccl's own counts of what the ring schedules did, which
    the brief's formula gives: 2G(N-1)/N for allreduce, G(N-1)/N for allgather and reduce-scatter
    (G the full vector)."""
    n, numel = 4, 1 << 14
    N, G = n // tp, numel * 4
    for rows in torch_pools(n).run(pf.ring_allreduce_traffic, tp, numel, timeout=120):
        got = {op: (calls, b, s, rcv) for g, op, calls, b, s, rcv in rows}
        assert {g for g, *_ in rows} == {"dp"}
        assert got["all_reduce"] == (1, G, 2 * G * (N - 1) // N, 2 * G * (N - 1) // N)
        assert got["all_gather"] == (1, G * N, G * (N - 1), G * (N - 1))
        assert got["reduce_scatter"] == (1, G * N, G * (N - 1), G * (N - 1))


def test_train_3d_example_learns_and_moves_what_the_formulas_say():
    """examples/train_3d.py on 4 ranks (tp 2 x pp 2): the loss goes down and every rank's counted calls
    and bytes per group equal the formulas (the example compares them and says which differ)."""
    import re
    import subprocess
    import sys
    from pathlib import Path
    example = Path(__file__).resolve().parent.parent / "examples" / "train_3d.py"
    p = subprocess.run([sys.executable, "-m", "pyxccl", "run", "-n", "4", str(example), "--steps", "12"],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", p.stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1, p.stdout
    assert "every rank's calls and bytes equal the formulas" in p.stdout, p.stdout[-3000:]
    assert "tp groups: [[0, 1], [2, 3]]" in p.stdout and "tp     all_reduce          32" in p.stdout
