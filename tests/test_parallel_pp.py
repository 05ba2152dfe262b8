"""pyxccl.parallel.pipeline: the schedules, their bubble, and a pipelined MLP equal to the unsplit one."""
import pytest

import ppfns

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

from pyxccl.parallel.pipeline import bubble, schedule  # noqa: E402


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 4), (2, 1), (2, 4), (4, 2), (4, 4), (4, 8), (8, 16)])
def test_schedule_runs_each_microbatch_once_and_bounds_activations(kind, p, m):
    for s in range(p):
        acts = schedule(kind, p, m, s)
        assert sorted(acts) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(acts.index(("F", i)) < acts.index(("B", i)) for i in range(m))
        alive, peak = 0, 0
        for k, _ in acts:
            alive += 1 if k == "F" else -1
            peak = max(peak, alive)
        # GPipe keeps every micro-batch's activations; 1F1B at most p - s (the warm-up plus one)
        assert peak == (m if kind == "gpipe" else min(m, p - s))
        if kind == "1f1b":
            lead = min(p - s, m)        # the warm-up and the first steady forward, then a backward
            assert acts[:lead] == [("F", i) for i in range(lead)] and acts[lead][0] == "B"


def test_1f1b_alternates_after_warmup():
    assert schedule("1f1b", 4, 6, 1) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4),
                                         ("B", 2), ("F", 5), ("B", 3), ("B", 4), ("B", 5)]
    assert schedule("1f1b", 4, 6, 3) == [x for i in range(6) for x in (("F", i), ("B", i))]
    assert schedule("gpipe", 2, 2, 0) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("fwd,bwd", [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0), (1.0, 3.0)])
def test_bubble_is_exactly_the_theory_for_uniform_stages(kind, fwd, bwd):
    """Uniform stages, free sends: every stage idles (p-1)(f+b) of (m+p-1)(f+b), whatever f/b, both schedules."""
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 4, 8, 32):
            assert bubble(kind, p, m, fwd, bwd) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


def test_bad_arguments_name_what_to_do():
    from pyxccl._errors import InvalidArgumentError
    from pyxccl.parallel.groups import Group
    from pyxccl.parallel.pipeline import Pipeline
    with pytest.raises(InvalidArgumentError, match="kind must be one of"):
        schedule("zb", 2, 4, 0)
    with pytest.raises(InvalidArgumentError, match="0 <= stage < stages"):
        schedule("1f1b", 2, 4, 2)
    last = Group("pp", [3, 5], 1)            # no communication happens before these errors
    ok = dict(microbatches=2, act_shape=(2, 4), loss_fn=torch.nn.functional.mse_loss)
    with pytest.raises(InvalidArgumentError, match=r"rank 5: Pipeline: .*kind must be one of"):
        Pipeline(torch.nn.Identity(), last, **dict(ok, schedule="interleaved"))
    with pytest.raises(InvalidArgumentError, match="microbatches >= 1"):
        Pipeline(torch.nn.Identity(), last, **dict(ok, microbatches=0))
    with pytest.raises(InvalidArgumentError, match=r"rank 5 \(stage 1\): .*needs loss_fn"):
        Pipeline(torch.nn.Identity(), last, **dict(ok, loss_fn=None))
    alone = Pipeline(torch.nn.Identity(), Group("pp", [0], 0), **ok)
    with pytest.raises(InvalidArgumentError, match=r"inputs must be given .* multiple of microbatches=2, got \(3, 4\)"):
        alone.step(torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(InvalidArgumentError, match="targets must be given"):
        alone.step(torch.ones(4, 4))


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_one_stage_pipeline_is_gradient_accumulation(kind):
    """p = 1 (no communication): the mean of the micro-batch losses and their summed grads are the batch's."""
    from pyxccl.parallel.groups import Group
    from pyxccl.parallel.pipeline import Pipeline
    model, ref = ppfns._model(), ppfns._model()
    x, y = ppfns._data(0)
    pipe = Pipeline(model, Group("pp", [0], 0), microbatches=4, schedule=kind, act_shape=(2, ppfns.H),
                    loss_fn=torch.nn.functional.mse_loss)
    loss = pipe.step(x, y)
    rloss = torch.nn.functional.mse_loss(ref(x), y)
    rloss.backward()
    torch.testing.assert_close(loss, rloss.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert [(k, i) for k, i, _, _ in pipe.timeline] == pipe.actions
    assert 0 <= pipe.measured_bubble() < 1


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4])
def test_pipeline_equals_the_unsplit_model(torch_pools, kind, p):
    """3 SGD steps, 4 micro-batches: the loss and every stage's grads are the single-process model's."""
    res = torch_pools(p).run(ppfns.equivalence, kind, 4, timeout=120)
    for s, steps in enumerate(res):
        assert len(steps) == 3
        for loss, ref, grads in steps:
            if s == p - 1:
                assert loss == pytest.approx(ref, rel=1e-5, abs=1e-6)
            else:
                assert loss is None
            assert len(grads) == 2 * ppfns.LAYERS // p        # weight and bias of each Linear
            for a, b in grads:
                torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
    # the steps moved the weights: the losses differ step to step
    losses = [x[0] for x in res[-1]]
    assert len(set(losses)) == 3


def _expected(p, m, s):
    """Stage s's sends (= receives) per step and the bytes of one: a micro-batch's activation, B/m * H * 4."""
    return m * (s < p - 1) + m * (s > 0), ppfns.BATCH // m * ppfns.H * 4


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 2)])
def test_traffic_is_m_activations_forward_and_m_grads_back(torch_pools, kind, p, m):
    """Stage s sends m activations to s+1 (unless last) and m grads to s-1 (unless first), and receives
    the same from the other side; pyxccl's communicator moved exactly that."""
    for s, (rows, counted, timeline, actions) in enumerate(torch_pools(p).run(ppfns.traffic, kind, m, timeout=120)):
        n, msg = _expected(p, m, s)
        got = {op: (calls, b, sent, rcv) for g, op, calls, b, sent, rcv in rows}
        assert {g for g, *_ in rows} == {"pp"}
        assert got == {"send": (n, n * msg, n * msg, 0), "recv": (n, n * msg, 0, n * msg)}
        assert counted == {"isend": (n, n * msg, 0), "irecv": (n, 0, n * msg)}
        assert [tuple(a) for a in timeline] == [tuple(a) for a in actions]
