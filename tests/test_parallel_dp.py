"""pyxccl.parallel.data: the bucketed gradient allreduce against one process, and what it moves."""
import pytest

import dpfns

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("n", (2, 4))
@pytest.mark.parametrize("overlap,accumulate", [(True, 1), (False, 1), (True, 2)])
def test_data_parallel_trains_as_one_process(torch_pools, n, overlap, accumulate):
    per_rank = torch_pools(n).run(dpfns.train_matches_one_process, overlap, accumulate, timeout=120)
    mean = [sum(ls[i] for ls, _ in per_rank) / n for i in range(3)]
    assert mean == pytest.approx(per_rank[0][1], rel=1e-5)     # the ranks' mean loss is the full batch's
    assert mean[-1] < mean[0]


def test_data_parallel_on_gloo(torch_pools):
    per_rank = torch_pools(2).run(dpfns.train_matches_one_process, True, 1, backend="gloo", timeout=120)
    assert [sum(ls[i] for ls, _ in per_rank) / 2 for i in range(3)] == pytest.approx(per_rank[0][1], rel=1e-5)


@pytest.mark.parametrize("n", (2, 4))
@pytest.mark.parametrize("overlap,accumulate", [(True, 1), (False, 1), (True, 3)])
def test_one_allreduce_per_bucket_moving_the_ring_formula(torch_pools, n, overlap, accumulate):
    """Per step and rank: one allreduce per bucket (one in all without overlap), G bytes in all
    (G = every gradient), 2G(N-1)/N sent and received (ring); buckets start during backward, on the
    last micro-batch only."""
    G = dpfns.LAYERS * (dpfns.H * dpfns.H + dpfns.H) * 4
    for rows, started, numels in torch_pools(n).run(dpfns.step_traffic, overlap, accumulate, timeout=120):
        buckets = dpfns.LAYERS if overlap else 1
        assert len(numels) == buckets and sum(numels) * 4 == G
        assert rows == [("dp", "all_reduce", buckets, G, 2 * G * (n - 1) // n, 2 * G * (n - 1) // n)]
        assert started[:-1] == [[False] * buckets] * (accumulate - 1)
        assert started[-1] == [overlap] * buckets
