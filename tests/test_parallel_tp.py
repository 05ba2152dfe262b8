"""pyxccl.parallel.tensor: Megatron tensor parallelism and sequence parallelism against the dense model."""
import pytest

import tpfns

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

RTOL, ATOL = 1e-5, 1e-6
MODES = [(tp, sp) for tp in (2, 4) for sp in (False, True)]


def _close(got, want):
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("tp,sp", MODES)
def test_block_matches_dense_forward_and_every_gradient(torch_pools, tp, sp):
    out = torch_pools(tp).run(tpfns.block_grads, tp, sp, timeout=120)
    for r in out:
        assert r["same_names"]
        _close(r["y"], r["yd"])          # SP: this rank's sequence shard of the dense output
        _close(r["dx"], r["dxd"])
    for name, (_, dim, dense) in out[0]["grads"].items():
        shards = [torch.tensor(r["grads"][name][0]) for r in out]
        if dim is None:                  # replicated: every rank holds the whole dense grad
            for s in shards:
                _close(s.tolist(), dense)
        else:                            # the shards, gathered in TP rank order, are the dense grad
            assert shards[0].shape[dim] * tp == torch.tensor(dense).shape[dim]
            _close(torch.cat(shards, dim).tolist(), dense)


@pytest.mark.parametrize("tp,sp", MODES)
def test_two_block_training_losses_match_dense(torch_pools, tp, sp):
    out = torch_pools(tp).run(tpfns.train_losses, tp, sp, timeout=120)
    for losses in out:
        dense = [d for d, _ in losses]
        assert dense[-1] < dense[0]                  # it trains, so the steps compare something
        for d, p in losses:
            assert p == pytest.approx(d, rel=RTOL, abs=ATOL)


@pytest.mark.parametrize("tp,sp", MODES)
def test_block_traffic_is_megatrons(torch_pools, tp, sp):
    """Per block, G = b*s*h*4: TP 2 all_reduce of G each way (ring: 2G(N-1)/N each); SP 2 all_gather
    (output G) and 2 reduce_scatter (input G) each way (ring: G(N-1)/N each), then one all_reduce of
    the LayerNorm and row-bias grads (6h floats per block)."""
    nb, N = 2, tp
    G = tpfns.B * tpfns.S * tpfns.H * 4
    for fwd, bwd, sync, n_sp in torch_pools(tp).run(tpfns.block_traffic, tp, sp, nb, timeout=120):
        if not sp:
            want = [("tp", "all_reduce", 2 * nb, 2 * nb * G, 2 * nb * 2 * G * (N - 1) // N,
                     2 * nb * 2 * G * (N - 1) // N)]
            assert fwd == want and bwd == want
            assert sync == [] and n_sp == 0
        else:
            one = (2 * nb, 2 * nb * G, 2 * nb * G * (N - 1) // N, 2 * nb * G * (N - 1) // N)
            want = [("tp", "all_gather", *one), ("tp", "reduce_scatter", *one)]
            assert fwd == want and bwd == want
            assert n_sp == nb * 6 * tpfns.H
            s = 2 * n_sp * 4 * (N - 1) // N
            assert sync == [("tp", "all_reduce", 1, n_sp * 4, s, s)]


@pytest.mark.parametrize("what,word", [("heads", "heads"), ("ffn", "ffn"), ("seq", "sequence"),
                                       ("seq_rs", "sequence")])
def test_sizes_not_divisible_by_tp_are_refused(torch_pools, what, word):
    for r, res in enumerate(torch_pools(2).run(tpfns.bad_sizes, 2, what, timeout=120)):
        assert res is not None and res[0] == "InvalidArgumentError"
        assert f"rank {r}" in res[1] and word in res[1] and "divisible by tp" in res[1]


@pytest.mark.parametrize("sp", (False, True))
def test_column_gather_output_matches_dense(torch_pools, sp):
    for r in torch_pools(2).run(tpfns.column_gather_output, 2, sp, timeout=120):
        for k in ("y", "dx", "dw"):
            _close(r[k], r[k + "d"])
