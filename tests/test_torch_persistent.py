"""The torch backend's persistent requests (pyxccl/torch/_persist.py), the DDP hook with one
request per bucket (pyxccl.torch.hooks.allreduce_hook) and the pipeline's fixed buffers: the same
bits, errors and timeouts as plain calls, requests made once per buffer and started again, never
for another tensor."""
import numpy as np
import pytest

import torchpersistfns as tpf

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("n", [2, 3])
def test_repeated_calls_match_plain_calls_and_reuse_one_request(torch_pools, n):
    assert torch_pools(n).run(tpf.repeated_calls, timeout=120) == [[]] * n


def test_a_new_tensor_never_starts_a_stale_request(torch_pools):
    assert torch_pools(2).run(tpf.stale_buffers, timeout=120) == [[], []]


def test_timeout_after_repeats_raises_as_the_plain_call(torch_pools):
    plain = torch_pools(2).run(tpf.timeout_after_repeats, 0, timeout=60)[0]
    mine = torch_pools(2).run(tpf.timeout_after_repeats, None, timeout=60)[0]
    assert plain[-1] == 0 and mine[-1] == 1, (plain, mine)          # the request was made, and started
    assert mine[0] == "CommTimeoutError" and mine[1], mine
    assert mine[:-1] == plain[:-1], (mine, plain)


def _same_params(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_with_persistent_requests_is_bit_for_bit_the_plain_ddp(torch_pools, n):
    steps, free_after = 8, 3
    out = {v: torch_pools(n).run(tpf.ddp_steps, v, steps, free_after if v == "hook" else None, timeout=120)
           for v in ("plain", "cache", "hook", "torch_hook", "hook_gloo", "torch_hook_gloo")}
    # DDP's own allreduce divides after the sum, torch's hook before: compare each with its plain twin
    for v, twin in (("plain", "plain"), ("cache", "plain"), ("hook", "torch_hook"), ("torch_hook", "torch_hook"),
                    ("hook_gloo", "torch_hook_gloo")):
        for r, (params, *_) in enumerate(out[v]):
            assert _same_params(params, out[twin][0][0]), f"{v}: rank {r}'s parameters differ from {twin}'s rank 0"
    buckets = out["hook"][0][1]
    assert buckets > 1 and out["torch_hook"][0][1] == buckets and out["hook_gloo"][0][1] == buckets
    for r in range(n):
        # buckets are rebuilt after step 0: the rebuilt ones are seen at step 1, made at step 2, reused after
        assert out["cache"][r][2] == (buckets, buckets * (steps - 3)), (out["cache"][r][2], buckets)
        # the hook's come from the same cache; free() after step 3 drops them: seen again at step 4,
        # made again at 5, reused after
        assert out["hook"][r][2] == (2 * buckets, buckets * (steps - 5)), (out["hook"][r][2], buckets)
        assert out["hook"][r][3] == out["hook"][r][2], out["hook"][r][2:]   # all of them the backend's
        assert out["plain"][r][2] == (0, 0) and out["torch_hook"][r][2] == (0, 0)
        assert out["hook_gloo"][r][2] == (0, 0)       # on Gloo: torch's hook alone


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4])
def test_pipeline_sends_and_receives_reuse_requests(torch_pools, kind, p):
    steps, m = 4, 4
    fresh = torch_pools(p).run(tpf.pipeline_steps, kind, m, steps, False, timeout=120)
    fixed = torch_pools(p).run(tpf.pipeline_steps, kind, m, steps, True, timeout=120)
    for s, (a, b) in enumerate(zip(fresh, fixed)):
        assert a[0] == b[0], f"stage {s}: losses differ"
        assert _same_params(a[1], b[1]), f"stage {s}: parameters differ"
        p2p = b[2]
        assert a[3] == (0, 0), f"stage {s}: fresh tensors made requests {a[3]}"
        # every send and receive: seen at step 0, made at step 1, started again at every later step
        want = (p2p, p2p * (steps - 2))
        assert b[3] == want, f"stage {s}: (made, reused) {b[3]}, expected {want}"


@pytest.mark.parametrize("overlap", [True, False])
def test_gradient_reducer_buckets_reuse_requests(torch_pools, overlap):
    steps, n = 4, 3
    plain = torch_pools(n).run(tpf.reducer_steps, overlap, steps, 0, timeout=120)
    mine = torch_pools(n).run(tpf.reducer_steps, overlap, steps, None, timeout=120)
    for r, ((p0, k0, c0), (p1, k1, c1)) in enumerate(zip(plain, mine)):
        assert _same_params(p0, p1), f"rank {r}: parameters differ from the plain calls'"
        assert c0 == (0, 0) and k0 == k1 and (k1 > 1) == overlap, (c0, k0, k1)
        # each bucket's allreduce: seen at step 0, made at step 1, started again after; the
        # parameters' broadcast at the start is once per tensor (no request)
        assert c1 == (k1, k1 * (steps - 2)), (c1, k1)


class _Req:
    """A stand-in request: what RequestCache reads (active) and does (free)."""
    active = False

    def __init__(self):
        self.freed = False

    def free(self):
        self.freed = True


def test_request_cache_discard_frees_one_tensors_requests_and_close_skips_refused_inits():
    import torch

    from pyxccl.torch._persist import RequestCache
    c = RequestCache(8)
    a, b, bad = torch.ones(2), torch.ones(3), torch.ones(4)
    reqs = {}

    def make(k):
        def m():
            reqs[k] = _Req()
            return reqs[k]
        return m

    def refuse():
        raise ValueError("refused")
    for key, t, mk in (("a1", a, make("a1")), ("a2", a, make("a2")), ("b", b, make("b")), ("bad", bad, refuse)):
        assert c.get(key, t, mk) is None                    # first sighting: a plain call
        assert c.get(key, t, mk) is reqs.get(key)           # second: made (None where the init refused)
    assert c.created == 3 and len(c) == 4
    c.discard(a)                                            # both of a's keys, nothing else
    assert reqs["a1"].freed and reqs["a2"].freed and not reqs["b"].freed and len(c) == 2
    assert c.get("a1", a, make("a1")) is None               # seen afresh
    c.close()                                               # the refused entry holds no request to free
    assert reqs["b"].freed and len(c) == 0
