"""pyxccl.parallel.expert: MoE with experts sharded over the EP group (all-to-all dispatch and combine)."""
import math

import pytest

import epfns

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

H, T = epfns.H, epfns.T


def _drops(E, top_k, cf):
    return math.ceil(cf * T * top_k / E) * E < T * top_k     # capacity below the assignments: some must drop


@pytest.mark.parametrize("n,E,top_k,cf,shape3", [
    (2, 8, 2, 0.5, False),      # 4 experts per rank, many dropped
    (2, 4, 2, 2.0, True),       # C >= T: none dropped; [b, s, hidden] input
    (4, 8, 2, 0.75, False),     # 2 experts per rank
    (4, 4, 1, 4.0, False),      # 1 expert per rank, top-1, none dropped
])
def test_moe_equals_dense_reference(torch_pools, n, E, top_k, cf, shape3):
    """Output and input grad on each rank = DenseMoE on that rank's tokens; expert grads = the sum over
    ranks of the dense grads; gate grad all-reduced over dp = the dense one; 3 Adam steps: same losses."""
    out = torch_pools(n).run(epfns.equivalence, E, top_k, cf, shape3, timeout=120)
    for ok, dropped in out:
        assert ok == dict.fromkeys(ok, True) and len(ok) == 7
        if _drops(E, top_k, cf):
            assert all(d > 0 for d in dropped)
        else:
            assert dropped == [0] * n


@pytest.mark.parametrize("n,E,cf", [(2, 4, 0.5), (4, 8, 1.0)])
def test_stats_match_dense_reference(torch_pools, n, E, cf):
    out = torch_pools(n).run(epfns.stats, E, 2, cf, timeout=120)
    for load, dropped, cap, rload, rdropped, rcap, gload, gdropped, sload, sdropped in out:
        assert (load, dropped, cap) == (rload, rdropped, rcap)
        assert cap == math.ceil(cf * T * 2 / E) and sum(load) == T * 2
        assert (gload, gdropped) == (sload, sdropped)      # global_stats: summed over the group
        assert dropped > 0 if cf < 1 else True


@pytest.mark.parametrize("n,E,cf", [(2, 4, 1.0), (4, 8, 1.0), (2, 4, 0.25), (4, 4, 0.5)])
def test_traffic_two_row_all_to_alls_each_way(torch_pools, n, E, cf):
    """Forward: the counts (8 * E bytes, int64 per expert) then 2 row exchanges, bytes = the INPUT
    (rows * H * 4); backward: the 2 row exchanges reversed. sent/received: the rows to/from the other
    ranks (pairwise send/recv), exactly; with every expert full (small cf) each rank sends (ep-1)/ep
    of its E * C rows away."""
    L, row = E // n, H * 4
    out = torch_pools(n).run(epfns.traffic, E, 2, cf, timeout=120)
    for me, (fwd, bwd, kept) in enumerate(out):
        mine = range(me * L, (me + 1) * L)
        rows_out = sum(kept[me])                                   # rows this rank dispatches
        rows_in = sum(kept[r][e] for r in range(n) for e in mine)  # rows its experts receive
        away = sum(kept[me][e] for e in range(E) if e not in mine)              # dispatched elsewhere
        back = sum(kept[r][e] for r in range(n) if r != me for e in mine)      # received from elsewhere
        counts = 8 * L * (n - 1)
        assert fwd == [("ep", "all_to_all", 3, 8 * E + (rows_out + rows_in) * row,
                        counts + (away + back) * row, counts + (back + away) * row)]
        assert bwd == [("ep", "all_to_all", 2, (rows_out + rows_in) * row, (away + back) * row, (back + away) * row)]
        C = math.ceil(cf * T * 2 / E)
        if all(k == C for ks in kept for k in ks):                  # uniform: every expert full
            assert away * n == (n - 1) * E * C and back * n == (n - 1) * E * C
        assert (cf < 1) <= all(k == C for ks in kept for k in ks)   # the small cf really is the uniform case


def test_bad_sizes_raise_naming_rank_and_op():
    from pyxccl._errors import InvalidArgumentError
    from pyxccl.parallel.expert import DenseMoE, MoE
    from pyxccl.parallel.groups import Group
    with pytest.raises(InvalidArgumentError, match=r"rank 1: MoE: .*divisible by the EP group size"):
        MoE(8, 16, 4, Group("ep", [0, 1, 2], 1))
    with pytest.raises(InvalidArgumentError, match="top_k <= num_experts"):
        DenseMoE(8, 16, 2, top_k=3)
    moe = MoE(8, 16, 4, Group("ep", [0], 0))
    with pytest.raises(InvalidArgumentError, match="MoE.forward: x has last dim 5"):
        moe(torch.zeros(3, 5))


def test_dense_routing_keeps_the_first_assignments_in_token_order():
    """Capacity 1 per expert: the first token to pick an expert keeps it; the probabilities are
    renormalized over the top k."""
    from pyxccl.parallel.expert import route
    logits = torch.tensor([[3.0, 2.0, 0.0], [3.0, 0.0, 2.0], [0.0, 3.0, 2.0]])
    tok, e, p, st = route(logits, 2, 0.5)          # C = ceil(0.5 * 3 * 2 / 3) = 1
    assert st["capacity"] == 1 and st["load"].tolist() == [2, 2, 2] and st["dropped"] == 3
    assert list(zip(e.tolist(), tok.tolist())) == [(0, 0), (1, 0), (2, 1)]
    top = torch.softmax(logits, -1).topk(2).values
    assert torch.allclose(p, torch.stack([top[0, 0], top[0, 1], top[1, 1]]) / torch.stack(
        [top[0].sum(), top[0].sum(), top[1].sum()]))
