"""DDP compression hooks (pyxccl.torch.hooks) on 2 ranks, on the pyxccl group and on a Gloo group.

For each compressor, a few DDP steps of a small MLP whose buckets DDP rebuilds after the first step;
every hook call is recorded on every rank (the bucket before and after the hook), and checked here:
the result is the same on every rank, DDP put it into the gradients, it is within the compressor's
bound of the exact average (TopK: exactly the rank-order sum of each rank's top-k of its gradient
plus its residual, over n), the replicas' parameters are equal, and at the first step (same
gradients on both groups) the pyxccl and Gloo results agree within the bounds.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)

N = 2
STEPS = 3
# a quantizer's bound, relative to sum_r |x_r| / n, for one round trip per rank (Gloo: each rank's
# bucket is encoded once) and for the pyxccl algorithm on 2 ranks (a rank's part once, the sum once)
REL = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
F32 = 2.0 ** -22
THRESHOLD = "threshold:0.02"     # a few percent of this model's gradient entries, a different count per rank     # float32 summation and division slack, relative to sum_r |x_r| / n


@pytest.fixture(scope="module")
def runs(torch_pools):
    import hookfns
    pool = torch_pools(N)
    out = {}
    for spec in ("fp16", "bf16", "int8", "topk:0.1", THRESHOLD):
        for backend in ("pyxccl", "gloo"):
            out[spec, backend] = pool.run(hookfns.hook_steps, spec, backend, STEPS, timeout=120)
    return out


def _sizes():
    import hookfns
    return [p.numel() for p in hookfns._model().parameters()]


def _calls(res):
    """(step, bucket index, params, [raw per rank], [out per rank]) per hook call, checking that every
    rank made the same calls and got the same bits."""
    recs = [r[0] for r in res]
    assert all(len(r) == len(recs[0]) for r in recs), [len(r) for r in recs]
    calls = []
    for k, first in enumerate(recs[0]):
        s, i, params = first[:3]
        assert all(r[k][:3] == (s, i, params) for r in recs), "ranks made different hook calls"
        raws, outs = [r[k][3] for r in recs], [r[k][4] for r in recs]
        for rank, o in enumerate(outs[1:], 1):
            assert np.array_equal(o, outs[0]), f"step {s} bucket {i}: rank {rank}'s average differs from rank 0's"
        calls.append((s, i, params, raws, outs[0]))
    assert {c[0] for c in calls} == set(range(STEPS))
    return calls


def _check_common(res):
    """The replicas' parameters are equal, and DDP's gradients are the hooks' results."""
    calls = _calls(res)
    sizes = _sizes()
    offs = np.concatenate(([0], np.cumsum(sizes)))
    for s in range(STEPS):
        want = np.full(offs[-1], np.nan, np.float32)
        for cs, _, params, _, out in calls:
            if cs != s:
                continue
            o = 0
            for p in params:
                want[offs[p]:offs[p + 1]] = out[o:o + sizes[p]]
                o += sizes[p]
        assert not np.isnan(want).any(), f"step {s}: some parameters were in no bucket"
        for rank in range(N):
            assert np.array_equal(res[rank][1][s], want), f"step {s}: rank {rank}'s gradients are not the hook's"
    for rank in range(1, N):
        for a, b in zip(res[0][2], res[rank][2]):
            assert np.array_equal(a, b), f"rank {rank}'s parameters differ from rank 0's"
    return calls


def _bound(spec, backend, raws):
    absum = np.sum([np.abs(x.astype(np.float64)) for x in raws], axis=0) / N
    if spec in REL:
        hops = 2 if backend == "pyxccl" else 1
        return absum * (hops * REL[spec] * 1.001 + F32) + hops * 2.0 ** -25     # + fp16 subnormals
    # int8: at most scale/2 = block max / 254 per round trip
    from pyxccl.compression import INT8
    if backend == "gloo":           # each rank's bucket once, in blocks from the bucket's start
        return sum(INT8().error_bound(x).astype(np.float64) for x in raws) / N * 1.001 + absum * F32
    # pyxccl's algorithm cuts the bucket into parts (blocks start at each part): bound with the bucket's
    # max; a rank's part, then the partial sum (at most the sum of the maxima) are encoded
    m = sum(float(np.abs(x).max()) for x in raws)
    return np.full(raws[0].size, 2 * m / 254 / N * 1.001) + absum * F32


@pytest.mark.parametrize("spec", ["fp16", "bf16", "int8"])
def test_quantizer_hook(runs, spec):
    first = {}
    for backend in ("pyxccl", "gloo"):
        calls = _check_common(runs[spec, backend])
        worst, moved = 0.0, False
        for s, i, _, raws, out in calls:
            exact = np.sum([x.astype(np.float64) for x in raws], axis=0) / N
            err = np.abs(out - exact)
            bound = _bound(spec, backend, raws)
            bad = np.flatnonzero(err > bound)
            assert bad.size == 0, (f"{spec} on {backend}, step {s} bucket {i}: |avg - exact| above the bound at "
                                   f"{bad[:5]}: err {err[bad[:5]]} bound {bound[bad[:5]]}")
            worst = max(worst, float((err / np.maximum(bound, 1e-30)).max()))
            moved |= bool((err > 0).any())
            if s == 0:
                first[backend, i] = (raws, out, bound)
        assert moved, f"{spec} on {backend}: every average is exact: was anything compressed?"
        assert worst > 0.01, f"{spec} on {backend}: errors far below the bound ({worst:.3g} of it): a loose test"
    for (b, i), (raws, out, bound) in first.items():
        if b != "pyxccl":
            continue
        graws, gout, gbound = first["gloo", i]
        for x, y in zip(raws, graws):
            assert np.array_equal(x, y), "step 0: the two groups' gradients differ before the hook"
        d = np.abs(out.astype(np.float64) - gout)
        assert (d <= bound + gbound).all(), f"{spec}: pyxccl and Gloo disagree by {d.max():.3g} at step 0"


def _sparse_expected(calls, select):
    """Each rank's sparsifier with error feedback simulated here (``select(acc)``: the indices sent),
    the residual kept per parameter (it moves with its parameter when DDP rebuilds the buckets): the
    rank-order sum of the pairs, over n."""
    sizes = _sizes()
    res = [[np.zeros(n, np.float32) for n in sizes] for _ in range(N)]
    want = []
    for s, i, params, raws, _ in calls:
        out = np.zeros(raws[0].size, np.float32)
        for r in range(N):
            acc = raws[r] + np.concatenate([res[r][p] for p in params])
            idx = select(acc)
            np.add.at(out, idx, acc[idx])
            acc[idx] = 0
            o = 0
            for p in params:
                res[r][p] = acc[o:o + sizes[p]].copy()
                o += sizes[p]
        np.divide(out, np.float32(N), out=out)
        want.append(out)
    return want


@pytest.mark.parametrize("spec", ["topk:0.1", THRESHOLD])
def test_sparsifier_hook(runs, spec):
    from pyxccl.compression import parse
    codec = parse(spec)
    final = {}
    for backend in ("pyxccl", "gloo"):
        res = runs[spec, backend]
        calls = _check_common(res)
        sent = 0
        for (s, i, _, raws, out), want in zip(calls, _sparse_expected(calls, lambda acc: codec._select(acc.copy())[0])):
            nz = np.count_nonzero(out)
            assert nz <= N * codec.k(out.size) if spec.startswith("topk") else nz < out.size / 2, (s, i, nz)
            sent += nz
            assert np.array_equal(out, want), (f"{spec} on {backend}, step {s} bucket {i}: not the rank-order sum "
                                               f"of the pairs / n (max diff {np.abs(out - want).max():.3g})")
        assert sent > 0, f"{spec} on {backend}: nothing was sent"
        final[backend] = res[0][2]
    # the same bits on both groups at every step, so the same parameters at the end
    for a, b in zip(final["pyxccl"], final["gloo"]):
        assert np.array_equal(a, b), f"{spec}: the pyxccl and Gloo runs ended with different parameters"


def test_migration_keeps_residuals():
    """A bucket rebuild moves each parameter's residual to its new bucket (single process)."""
    import torch

    from pyxccl.compression import TopK
    from pyxccl.torch.hooks import CompressionState
    ps = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 4)]

    class B:
        def __init__(self, i, params):
            self.i, self.params = i, params

        def index(self):
            return self.i

        def parameters(self):
            return self.params

    st = CompressionState(TopK(0.2))
    key = st.key(B(0, ps))
    x = np.arange(1, 10, dtype=np.float32)
    st.compressor.compress(x, key)                   # sends the 9 (k = 2: 9 and 8), keeps 1..7
    k1, k0 = st.key(B(1, [ps[2]])), st.key(B(0, [ps[1], ps[0]]))
    assert np.array_equal(st.compressor.residual(k1), [6, 7, 0, 0])
    assert np.array_equal(st.compressor.residual(k0), [4, 5, 1, 2, 3])
    assert st.key(B(0, [ps[1], ps[0]])) == k0 and np.array_equal(st.compressor.residual(k0), [4, 5, 1, 2, 3])


def test_state_refuses_no_compressor():
    from pyxccl.torch.hooks import CompressionState
    for bad in (None, "none", "auto"):
        with pytest.raises(ValueError):
            CompressionState(bad)
