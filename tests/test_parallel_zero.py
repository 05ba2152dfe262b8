"""pyxccl.parallel.zero: ZeRO stages 1, 2, 3 equal one dense process, move exactly 2Ψ / 3Ψ, keep 1/N."""
import pytest

import zerofns as zf

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

COUNTS = [b * (a + 1) for a, b in zip(zf.DIMS, zf.DIMS[1:])]     # each Linear's parameters


def padded(numel, n):
    return -(-numel // n) * n


@pytest.mark.parametrize("n", (2, 4))
@pytest.mark.parametrize("stage", (1, 2, 3))
def test_zero_matches_dense_adam_and_moves_exactly(torch_pools, n, stage):
    # the buckets: stage 1 one flat buffer, stage 2 and 3 one per Linear (a unit); each padded to N
    flats = [padded(sum(COUNTS), n)] if stage == 1 else [padded(c, n) for c in COUNTS]
    assert sum(flats) > sum(COUNTS)                 # the sizes exercise the padding
    psi = 4 * sum(flats)                            # padded flat parameter bytes (float32)
    out = torch_pools(n).run(zf.train, stage, timeout=120)
    for r in out:
        assert r["n"] == n
        assert r["err"] <= 0, f"final parameters differ from the dense reference by {r['err']} beyond rtol 1e-5"
        assert r["grad_err"] <= 0, f"shard gradients differ from the reference's mean by {r['grad_err']}"
        for step_rows in r["rows"]:
            got = {op: (calls, b, s, rcv) for g, op, calls, b, s, rcv in step_rows}
            assert {g for g, *_ in step_rows} == {"dp"} and set(got) == {"all_gather", "reduce_scatter"}
            k = len(flats)
            gather_calls, gather_bytes = (2 * k, 2 * psi) if stage == 3 else (k, psi)
            assert got["reduce_scatter"] == (k, psi, psi * (n - 1) // n, psi * (n - 1) // n)
            assert got["all_gather"] == (gather_calls, gather_bytes,
                                         gather_bytes * (n - 1) // n, gather_bytes * (n - 1) // n)
        # memory: Adam's state covers this rank's shards only, 1/N of the padded parameters
        assert r["state"] == sum(flats) // n
        if stage == 1:
            assert all(all(gs) for gs in r["grads_between"])         # full gradients kept until step
        elif stage == 2:
            assert all(not any(gs) for gs in r["grads_between"])     # freed after their reduce-scatter
        else:
            assert r["grads_between"] == [[]] * zf.STEPS                # no dense parameter left
            assert r["kinds"] == ["Parameter"]
            assert r["held"] == [(f"shards.{i}", f // n) for i, f in zip(range(len(flats)), flats)]
    for s in range(zf.STEPS):
        mean = sum(r["losses"][s] for r in out) / n
        assert mean == pytest.approx(out[0]["ref_losses"][s], rel=1e-5, abs=1e-6)


def test_zero_arguments_are_checked(torch_pools):
    (out, _) = torch_pools(2).run(zf.bad_args, timeout=120)
    assert [o[0] if o else None for o in out] == ["InvalidArgumentError"] * 5
    assert "rank 0" in out[0][1] and "stage must be 1, 2 or 3" in out[0][1]
    assert "FullyShardedModule" in out[1][1]
    assert all("Group" in o[1] for o in (out[2], out[4]))
    assert "non-empty" in out[3][1]
