"""Tests of pyxccl.compression's codecs: quantizer error bounds, sizes, stochastic rounding,
top-k selection, error feedback conservation, wire format and spec parsing."""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pyxccl._errors import InvalidArgumentError
from pyxccl.compression import (BF16, FP16, INT8, Compressor, Quantizer, Sparsifier, Threshold, TopK,
                             accumulate, decompress, nbytes, pack, parse, sum_packed, unpack)

pytestmark = pytest.mark.timeout(60)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
F32_TINY = 2.0 ** -149


def f32(a):
    return np.asarray(a, dtype=np.float32)


def arrays(lo=-1e6, hi=1e6, max_size=700):
    return hnp.arrays(np.float32, st.integers(0, max_size),
                      elements=st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False))


def adversarial(block=256):
    rng = np.random.default_rng(1)
    r = rng.standard_normal(3 * block + 17).astype(np.float32)
    with_zero_block = r.copy()
    with_zero_block[block:2 * block] = 0
    return {
        "zeros": np.zeros(1000, np.float32),
        "zero_block": with_zero_block,
        "one": f32([-3.5]),
        "one_zero": f32([0.0]),
        "negative": -np.abs(r),
        "huge": r * np.float32(1e30),
        "tiny": r * np.float32(1e-30),
        "subnormal": r * np.float32(1e-41),
        "mixed_scales": r * np.logspace(-30, 30, r.size).astype(np.float32),
        "not_multiple": r[: block + 1],
        "constant": np.full(block + 3, 7.25, np.float32),
        "spike": np.where(np.arange(r.size) == 5, np.float32(1e6), r).astype(np.float32),
    }


# --------------------------------------------------------------------------- bounds

def fp16_bound(x):
    a = np.abs(x.astype(np.float64))
    return np.maximum(a * 2.0 ** -11, 2.0 ** -25)


def bf16_bound(x):
    a = np.abs(x.astype(np.float64))
    return np.maximum(a * 2.0 ** -8, 2.0 ** -134)


def int8_scales(x, block):
    nb = -(-x.size // block)
    pad = np.zeros(nb * block, np.float32)
    pad[: x.size] = np.abs(x)
    return pad.reshape(nb, block).max(axis=1) / np.float32(127)


def int8_bound(x, block, stochastic):
    """scale/2 (stochastic: scale) plus float32 rounding of x/scale and q*scale."""
    s = np.repeat(int8_scales(x, block).astype(np.float64), block)[: x.size]
    slack = 2.0 ** -22 * (np.abs(x.astype(np.float64)) + s) + 2.0 ** -142
    return (s if stochastic else s / 2) + slack


def check_bound(q, x):
    d = q.round_trip(x)
    assert d.dtype == np.float32 and d.shape == x.shape
    err = np.abs(d.astype(np.float64) - x.astype(np.float64))
    if isinstance(q, FP16):
        big = np.abs(x) > 65504
        assert np.array_equal(d[big], np.sign(x[big]) * np.float32(65504))   # clamped
        bound = fp16_bound(x)[~big]
        err = err[~big]
    elif isinstance(q, BF16):
        bound = bf16_bound(x)
    else:
        bound = int8_bound(x, q.block, q.stochastic)
    bad = np.flatnonzero(err > bound)
    assert bad.size == 0, (q, bad[:5], x[bad[:5]], d[bad[:5]])


QUANTIZERS = [FP16(), BF16(), INT8(), INT8(block=7), INT8(block=64, stochastic=True, seed=3)]


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.spec)
@FAST
@given(x=arrays(-60000, 60000))
def test_round_trip_bound_random(q, x):
    check_bound(q, x)


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.spec)
@pytest.mark.parametrize("case", sorted(adversarial()))
def test_round_trip_bound_adversarial(q, case):
    x = adversarial()[case]
    if isinstance(q, BF16):
        x = np.clip(x, -3e38, 3e38)
    with np.errstate(divide="raise", invalid="raise"):   # no 0/0 on zero blocks
        check_bound(q, x)
        d = q.round_trip(x)
    if case.startswith("zero") or case == "one_zero":
        assert np.all(np.isfinite(d))
        assert np.all(d[x == 0] == 0)


def test_bounds_are_tight_enough_to_fail():
    # the checks above must reject a codec that is worse than documented
    x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    bad = x.astype(np.float16).astype(np.float32) * np.float32(1 + 2 ** -9)
    assert np.any(np.abs(bad - x) > fp16_bound(x))
    coarse = np.round(x / 0.1) * 0.1   # int8-like with a scale ~0.1 > max|x|/127
    assert np.any(np.abs(coarse - x) > int8_bound(x, 256, False))


def test_fp16_matches_numpy_cast_and_clamps():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 6, 3000),
                        [65504, 65519, 65520, 7e4, -1e9, np.inf, -np.inf, 6e-8, 2.0 ** -25, 0.0, -0.0]]
                       ).astype(np.float32)
    d = FP16().round_trip(x)
    ref = np.clip(x, -65504, 65504).astype(np.float16).astype(np.float32)
    assert np.array_equal(d, ref)
    assert np.isnan(FP16().round_trip(f32([np.nan, 1.0]))[0])
    # every float16 code decodes like numpy's cast (the fast bit-level path)
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = np.empty(65536, np.float32)
    FP16().decode(codes.view(np.uint8), out)
    assert np.array_equal(out, codes.view(np.float16).astype(np.float32), equal_nan=True)


def test_bf16_matches_ml_dtypes_round_to_nearest_even():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)).astype(np.float32)
    x[:4] = f32([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1e-40, -0.0])   # ties to even, subnormal
    d = BF16().round_trip(x)
    assert np.array_equal(d, x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert d[0] == 1.0 and d[1] == 1 + 2 ** -6


def test_int8_layout_and_codes():
    q = INT8(block=4)
    x = f32([1, -2, 0.5, 4, 0, 0, 0, 0, 3, -0.3])
    buf = np.empty(q.nbytes(x.size), np.uint8)
    q.encode(x, buf)
    scales = buf[:12].view(np.float32)
    codes = buf[12:].view(np.int8)
    assert np.array_equal(scales, f32([4, 0, 3]) / np.float32(127))
    s = np.repeat(scales, 4)[:10]
    assert np.array_equal(codes, np.rint(np.divide(x, s, out=np.zeros_like(x), where=s > 0)).astype(np.int8))
    assert codes[3] == 127 and codes[8] == 127 and np.all(codes[4:8] == 0)


# --------------------------------------------------------------------------- decode modes

@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.spec)
@FAST
@given(x=arrays(-1000, 1000), seed=st.integers(0, 2 ** 32 - 1))
def test_decode_accumulate_adds_exactly(q, x, seed):
    buf = np.empty(q.nbytes(x.size), np.uint8)
    q.encode(x, buf)
    d = np.empty_like(x)
    q.decode(buf, d, accumulate=False)
    out0 = np.random.default_rng(seed).standard_normal(x.size).astype(np.float32)
    out = out0.copy()
    q.decode(buf, out, accumulate=True)
    assert np.array_equal(out, out0 + d)
    # overwrite mode ignores what was there; strided outputs work too
    junk = np.full(2 * x.size, 5.0, np.float32)
    q.decode(buf, junk[::2], accumulate=False)
    assert np.array_equal(junk[::2], d) and np.all(junk[1::2] == 5.0)
    junk2 = np.full(2 * x.size, 5.0, np.float32)
    q.decode(buf, junk2[::2], accumulate=True)
    assert np.array_equal(junk2[::2], np.float32(5.0) + d)


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.spec)
def test_large_buffer_crosses_chunks(q):
    x = np.random.default_rng(4).standard_normal(300_001).astype(np.float32)
    check_bound(q, x)
    out0 = np.ones(x.size, np.float32)
    buf = np.empty(q.nbytes(x.size), np.uint8)
    q.encode(x, buf)
    d = np.empty_like(x)
    q.decode(buf, d)
    q.decode(buf, out0, accumulate=True)
    assert np.array_equal(out0, np.float32(1) + d)


# --------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.spec)
@pytest.mark.parametrize("n", [0, 1, 6, 7, 8, 63, 64, 65, 255, 256, 257, 1000])
def test_nbytes_is_what_encode_writes(q, n):
    expected = 2 * n if q.name in ("fp16", "bf16") else n + 4 * math.ceil(n / q.block)
    assert q.nbytes(n) == expected
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    a = np.full(expected, 0xAB, np.uint8)
    b = np.full(expected, 0x54, np.uint8)
    if q.name == "int8" and q.stochastic:
        INT8(q.block, True, seed=9).encode(x, a)
        INT8(q.block, True, seed=9).encode(x, b)
    else:
        q.encode(x, a)
        q.encode(x, b)
    assert np.array_equal(a, b)          # every byte is written (none keeps its old value)
    with pytest.raises(InvalidArgumentError):
        q.encode(x, np.empty(expected + 1, np.uint8))
    with pytest.raises(InvalidArgumentError):
        q.decode(np.empty(expected + 1, np.uint8), np.empty(n, np.float32))


def test_ratio_and_names():
    assert (FP16().name, BF16().name, INT8().name) == ("fp16", "bf16", "int8")
    assert FP16().ratio == BF16().ratio == 0.5
    q = INT8(block=128)
    assert abs(q.ratio - q.nbytes(128 * 10 ** 6) / (4 * 128 * 10 ** 6)) < 1e-12
    assert TopK(0.01).ratio == 0.015 and Threshold(1e-3).ratio is None
    assert (TopK(0.1).name, Threshold(1.0).name) == ("topk", "threshold")
    assert FP16().rel_error_bound == 2 ** -11 and BF16().rel_error_bound == 2 ** -8


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.spec)
@pytest.mark.parametrize("bad", [np.zeros(4, np.float64), np.zeros(4, np.float16), np.zeros(4, np.int32),
                                 np.zeros((2, 2), np.float32), [1.0, 2.0]])
def test_encode_refuses_other_dtypes(q, bad):
    with pytest.raises(InvalidArgumentError) as ei:
        q.encode(bad, np.empty(64, np.uint8))
    assert ei.value.op == "compress"


def test_bad_constructor_arguments():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InvalidArgumentError):
            INT8(block=bad)
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(InvalidArgumentError):
            TopK(bad)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidArgumentError):
            Threshold(bad)
    with pytest.raises(InvalidArgumentError):
        TopK(0.1, error_feedback=False, momentum=0.9)
    with pytest.raises(InvalidArgumentError):
        TopK(0.1, momentum=1.0)


# --------------------------------------------------------------------------- stochastic rounding

def test_int8_stochastic_is_unbiased_and_error_below_scale():
    block, reps = 64, 4000
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(4 * block) * 3).astype(np.float32)
    q = INT8(block=block, stochastic=True, seed=11)
    tiled = np.tile(x, reps)                   # same blocks (and scales) in every copy
    d = q.round_trip(tiled).reshape(reps, x.size).astype(np.float64)
    scale = np.repeat(int8_scales(x, block), block).astype(np.float64)
    err = np.abs(d - x)
    assert np.all(err < scale + 2.0 ** -22 * (np.abs(x) + scale))
    mean = d.mean(axis=0)
    se = scale / (2 * math.sqrt(reps))          # sd of one rounding <= scale / 2
    assert np.all(np.abs(mean - x) <= 6 * se + 1e-7)
    # total bias over all elements: far tighter
    assert abs((mean - x).sum()) <= 6 * math.sqrt((se ** 2).sum())
    # the deterministic quantizer would fail this (it is biased per element)
    det = INT8(block=block).round_trip(x).astype(np.float64)
    assert np.any(np.abs(det - x) > 6 * se + 1e-7)


def test_int8_stochastic_seed_reproducible():
    x = np.random.default_rng(6).standard_normal(1000).astype(np.float32)
    a = INT8(stochastic=True, seed=1).round_trip(x)
    b = INT8(stochastic=True, seed=1).round_trip(x)
    c = INT8(stochastic=True, seed=2).round_trip(x)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# --------------------------------------------------------------------------- sparsifiers

def reference_topk(a, k):
    order = np.lexsort((np.arange(a.size), -np.abs(a.astype(np.float64))))  # by |a| desc, then index
    return np.sort(order[:k])


@pytest.mark.parametrize("ratio,count,k", [(0.01, 100, 1), (0.07, 100, 7), (0.01, 1, 1), (0.01, 50, 1),
                                           (0.3, 10, 3), (0.001, 4_000_000, 4000), (1.0, 5, 5),
                                           (0.01, 101, 2), (0.5, 0, 0)])
def test_topk_k_formula(ratio, count, k):
    assert TopK(ratio).k(count) == k
    if count:
        assert k == max(1, math.ceil(Fraction(str(ratio)) * count))
    assert Threshold(0.1).k(count) is None


@FAST
@given(x=hnp.arrays(np.float32, st.integers(1, 300),
                    elements=st.integers(-5, 5).map(float)),   # many ties
       ratio=st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0]))
def test_topk_keeps_exactly_k_largest_with_ties_to_lower_index(x, ratio):
    s = TopK(ratio, error_feedback=False)
    idx, val = s.compress(x)
    k = s.k(x.size)
    assert idx.dtype == np.int32 and val.dtype == np.float32
    assert idx.size == k and np.all(np.diff(idx) > 0)
    assert np.array_equal(idx, reference_topk(x, k))
    assert np.array_equal(val, x[idx])


@FAST
@given(x=arrays(-1e3, 1e3, max_size=2000).filter(lambda a: a.size > 0),
       ratio=st.floats(1e-3, 1.0))
def test_topk_against_sort(x, ratio):
    s = TopK(ratio, error_feedback=False)
    idx, _ = s.compress(x)
    k = s.k(x.size)
    mags = np.sort(np.abs(x))[::-1]
    assert idx.size == k
    assert np.array_equal(np.sort(np.abs(x[idx]))[::-1], mags[:k])
    assert np.array_equal(idx, reference_topk(x, k))


def test_threshold_selects_at_or_above_tau():
    x = f32([0.5, -1.0, 0.999, 1.0, -2.0, 0.0])
    idx, val = Threshold(1.0, error_feedback=False).compress(x)
    assert idx.tolist() == [1, 3, 4] and val.tolist() == [-1.0, 1.0, -2.0]
    assert Threshold(5.0, error_feedback=False).compress(x)[0].size == 0


@pytest.mark.parametrize("native", (True, False))
@pytest.mark.parametrize("tau", (0.0, 1.0, 2.5))
def test_threshold_on_large_tensors_against_numpy(monkeypatch, native, tau):
    """The native pass (32 at a time, then a tail: an odd size) against numpy: the residual added,
    every |acc| >= tau (equal ones, -0.0 and tau 0 included), values as acc holds them."""
    from pyxccl.compression.codecs import _sparse
    if not native:
        monkeypatch.setattr(_sparse, "_candidates_native", None)
    elif _sparse._candidates_native is None:
        pytest.skip("the native helpers are off (PYXCCL_NATIVE=0) or were not built")
    rng = np.random.default_rng(11)
    q = Threshold(tau)
    residual = np.zeros(100_003, np.float32)
    for _ in range(3):
        x = rng.standard_normal(residual.size).astype(np.float32)
        x[::97], x[5::101], x[-3:] = tau, -tau, [-0.0, tau, -tau]
        acc = residual + x
        idx, val = q.compress(x, "t")
        want = np.flatnonzero(np.abs(acc) >= tau)
        assert np.array_equal(idx, want) and np.array_equal(val, acc[want])
        residual = acc.copy()
        residual[want] = 0
        assert np.array_equal(q.residual("t"), residual)


SPARSIFIERS = [lambda m: TopK(0.05, momentum=m), lambda m: TopK(0.3, momentum=m),
               lambda m: Threshold(1.5, momentum=m)]


@pytest.mark.parametrize("make", SPARSIFIERS, ids=["topk0.05", "topk0.3", "threshold1.5"])
@pytest.mark.parametrize("momentum", [None, 0.9])
def test_error_feedback_conserves_the_total(make, momentum):
    s = make(momentum)
    n, steps = 1000, 8
    rng = np.random.default_rng(7)
    sent_total = np.zeros(n, np.float64)
    in_total = np.zeros(n, np.float64)      # sum of x (no momentum) or of the u added to v (momentum)
    v_prev = np.zeros(n, np.float32)
    u_prev = np.zeros(n, np.float32)
    for _ in range(steps):
        x = rng.standard_normal(n).astype(np.float32)
        idx, val = s.compress(x, key="w")
        dense = s.decompress(idx, val, n)
        v = s.residual("w")
        if momentum is None:
            added = x
            assert s.momentum_buffer("w") is None
        else:
            added = np.float32(momentum) * u_prev + x     # u before masking
            u = s.momentum_buffer("w")
            assert np.all(u[idx] == 0)                    # momentum factor masking
            assert np.array_equal(np.delete(u, idx), np.delete(added, idx))
            u_prev = u
        # per step, exactly: what was accumulated = what was sent + what is kept
        assert np.array_equal(dense + v, v_prev + added)
        assert np.all(v[idx] == 0)
        sent_total += dense
        in_total += added
        v_prev = v
    np.testing.assert_allclose(sent_total + v_prev, in_total, rtol=1e-5, atol=1e-5)
    assert 0 < np.count_nonzero(sent_total) and np.count_nonzero(v_prev)   # something sent, something kept
    np.testing.assert_allclose(np.float32(sent_total.sum() + v_prev.sum()), np.float32(in_total.sum()),
                               rtol=1e-5)


def test_error_feedback_sends_what_a_plain_call_would_miss():
    s = TopK(0.1)
    x = np.zeros(10, np.float32)
    x[3] = 1.0
    x[7] = 0.6
    assert s.compress(x, "k")[0].tolist() == [3]
    idx, val = s.compress(x, "k")               # acc[7] = 1.2 now beats x[3] = 1.0
    assert idx.tolist() == [7] and np.isclose(val[0], 1.2)


@pytest.mark.parametrize("s", [TopK(0.1, error_feedback=False), Threshold(0.5, error_feedback=False)],
                         ids=["topk", "threshold"])
def test_without_error_feedback_nothing_is_kept(s):
    x = np.random.default_rng(8).standard_normal(200).astype(np.float32)
    a = s.compress(x, "k")
    b = s.compress(x, "k")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(a[1], x[a[0]])
    assert s.residual("k") is None and s.momentum_buffer("k") is None
    s.compress(np.ones(7, np.float32), "k")     # no state: any size


@pytest.mark.parametrize("s", [TopK(0.1), Threshold(0.5), TopK(0.1, momentum=0.5)],
                         ids=["topk", "threshold", "momentum"])
def test_key_reused_with_another_size_raises(s):
    s.compress(np.ones(10, np.float32), key="layer.3")
    with pytest.raises(InvalidArgumentError, match="layer.3"):
        s.compress(np.ones(11, np.float32), key="layer.3")
    s.compress(np.ones(11, np.float32), key="other")
    s.reset("layer.3")
    assert s.residual("layer.3") is None and s.residual("other") is not None
    s.compress(np.ones(11, np.float32), key="layer.3")
    s.reset()
    assert s.residual("other") is None


def test_sparsifier_refuses_other_dtypes():
    with pytest.raises(InvalidArgumentError):
        TopK(0.1).compress(np.ones(10), "k")


# --------------------------------------------------------------------------- wire format

@FAST
@given(x=arrays(max_size=300), data=st.data())
def test_pack_unpack_round_trip(x, data):
    count = data.draw(st.integers(max(1, x.size), 2 ** 31 - 1))
    idx = np.sort(np.array(data.draw(st.lists(st.integers(0, count - 1), min_size=x.size, max_size=x.size,
                                              unique=True)), np.int64)).astype(np.int32)
    wire = pack(idx, x, count)
    blocks = -(-count // 65536)
    n = x.size                 # the layout: values, pairs per 65,536-block, low 16 bits, padding to 4
    assert wire.dtype == np.uint8 and wire.size == nbytes(n, count) == 6 * n + 2 * (n % 2) + 4 * blocks
    assert wire[: 4 * n].tobytes() == x.astype("<f4").tobytes()
    per = np.zeros(blocks, np.int64)
    np.add.at(per, idx // 65536, 1)
    assert wire[4 * n: 4 * (n + blocks)].tobytes() == per.astype("<u4").tobytes()
    assert wire[4 * (n + blocks):].tobytes() == (idx % 65536).astype("<u2").tobytes() + b"\0\0" * (n % 2)
    i2, v2 = unpack(wire, count)
    assert i2.dtype == np.int32 and v2.dtype == np.float32
    assert np.array_equal(i2, idx) and np.array_equal(v2, x)
    i3, v3 = Sparsifier.unpack(Sparsifier.pack(idx, x, count), count)
    assert np.array_equal(i3, idx) and np.array_equal(v3, x)


def test_pack_refuses_unsorted_or_out_of_range_indices():
    for idx in ([3, 1], [0, 10], [-1, 2]):
        with pytest.raises(InvalidArgumentError, match="ascending"):
            pack(np.array(idx, np.int32), f32([1, 2]), 10)


def test_unpack_rejects_partial_pairs_and_wrong_counts():
    with pytest.raises(InvalidArgumentError, match="6-byte"):
        unpack(np.zeros(4 + 7, np.uint8), 100)
    with pytest.raises(InvalidArgumentError, match="block counts"):
        unpack(np.zeros(4 + 12, np.uint8), 100)         # two pairs, counted as none
    wire = pack(np.array([1, 70000], np.int32), f32([1, 2]), 100000)
    with pytest.raises(InvalidArgumentError, match="6-byte"):
        unpack(wire, 200000)                    # read as another tensor's size: a block more


@pytest.mark.parametrize("native", (True, False))
def test_accumulate_sums_repeated_indices(monkeypatch, native):
    from pyxccl.compression.codecs import _sparse
    if native and _sparse._scatter_add_native is None:
        pytest.skip("the native helpers are off (PYXCCL_NATIVE=0) or were not built")
    if not native:
        monkeypatch.setattr(_sparse, "_scatter_add_native", None)
    out = np.arange(6, dtype=np.float32)
    idx = np.array([5, 1, 1, 0, 5, 1], np.int32)
    val = f32([1, 2, 3, 4, 5, 6])
    accumulate(out, idx, val)
    assert out.tolist() == [4, 12, 2, 3, 4, 11]
    assert decompress(idx, val, 6).tolist() == [4, 11, 0, 0, 0, 6]
    assert decompress(idx.astype(np.int64), val.astype(np.float64), 6).tolist() == [4, 11, 0, 0, 0, 6]
    for bad in ([-1], [6]):
        with pytest.raises(InvalidArgumentError):
            accumulate(out, np.array(bad), f32([1]))
    rng = np.random.default_rng(3)             # many repeats, in the order given: as np.add.at, bit for bit
    idx, val = rng.integers(0, 50, 5000).astype(np.int32), rng.standard_normal(5000).astype(np.float32)
    expect = np.zeros(50, np.float32)
    for i, v in zip(idx.tolist(), val.tolist()):
        expect[i] += np.float32(v)
    assert np.array_equal(decompress(idx, val, 50), expect)


@pytest.mark.parametrize("native", (True, False))
@pytest.mark.parametrize("count", (1, 1000, 65536, 3 * 65536 + 17))
def test_sum_packed_is_zeroing_then_adding_each_wire_in_order(monkeypatch, native, count):
    from pyxccl.compression.codecs import _sparse
    if native and _sparse._sum_pairs_native is None:
        pytest.skip("the native helpers are off (PYXCCL_NATIVE=0) or were not built")
    if not native:
        monkeypatch.setattr(_sparse, "_sum_pairs_native", None)
    rng = np.random.default_rng(count)
    wires, expect = [], np.zeros(count, np.float32)
    for m in (0, 1, 7, count // 3, count):       # odd sizes (padding), empty, dense; many shared indices
        idx = np.sort(rng.choice(count, min(m, count), replace=False)).astype(np.int32)
        val = (rng.standard_normal(idx.size) * 10.0 ** rng.integers(-3, 4, idx.size)).astype(np.float32)
        wires.append(pack(idx, val, count))
        accumulate(expect, idx, val)             # the order sum_packed must keep, bit for bit
    out = np.full(count, np.nan, np.float32)     # every element written
    sum_packed(out, wires)
    assert np.array_equal(out, expect)


@pytest.mark.parametrize("native", (True, False))
def test_sum_packed_refuses_bad_wires(monkeypatch, native):
    from pyxccl.compression.codecs import _sparse
    if not native:
        monkeypatch.setattr(_sparse, "_sum_pairs_native", None)
    past = pack(np.array([3], np.int32), f32([1]), 10)
    past[8:10] = [12, 0]                         # low bits of index 12: past a 10-element tensor's end
    for bad, match in ((past, "range|past the end"), (np.zeros(5, np.uint8), "6-byte"),
                       (np.array([0, 0, 0, 0, 1, 0, 0, 0], np.uint8), "block counts")):
        with pytest.raises(InvalidArgumentError, match=match):
            sum_packed(np.zeros(10, np.float32), [pack(np.array([1], np.int32), f32([1]), 10), bad])


def test_sparse_round_trip_through_the_wire():
    x = np.random.default_rng(9).standard_normal(4096).astype(np.float32)
    s = TopK(0.01, error_feedback=False)
    out = np.zeros(x.size, np.float32)
    for _ in range(3):                           # three ranks' contributions summed
        s.accumulate(out, *s.unpack(s.pack(*s.compress(x), x.size), x.size))
    idx = reference_topk(x, s.k(x.size))
    expect = np.zeros_like(x)
    expect[idx] = 3 * x[idx]
    assert np.array_equal(out, expect)


# --------------------------------------------------------------------------- parse

@pytest.mark.parametrize("spec,cls,attrs", [
    ("fp16", FP16, {}), ("BF16", BF16, {}), (" int8 ", INT8, {"block": 256, "stochastic": False}),
    ("int8:block=128", INT8, {"block": 128}), ("int8:64", INT8, {"block": 64}),
    ("int8:block=32,stochastic=1,seed=4", INT8, {"block": 32, "stochastic": True, "seed": 4}),
    ("topk:0.01", TopK, {"fraction": 0.01, "error_feedback": True, "momentum": None}),
    ("topk:ratio=0.2,momentum=0.9", TopK, {"fraction": 0.2, "momentum": 0.9}),
    ("threshold:1e-3", Threshold, {"tau": 1e-3}),
    ("threshold:0.5,error_feedback=0", Threshold, {"tau": 0.5, "error_feedback": False}),
])
def test_parse(spec, cls, attrs):
    c = parse(spec)
    assert type(c) is cls and isinstance(c, Compressor)
    for k, v in attrs.items():
        assert getattr(c, k) == v, k
    assert parse(c.spec) == c
    assert parse(c) is c
    assert isinstance(c, Quantizer) != isinstance(c, Sparsifier)


def test_parse_special_and_bad():
    assert parse(None) is None and parse("none") is None and parse("") is None
    assert parse("auto") == "auto"
    for bad in ["zip", "topk", "topk:abc", "int8:block=0", "fp16:3", "int8:size=4", "topk:0.1,ratio=0.2",
                "threshold:-1", "int8:block=8,stochastic=maybe"]:
        with pytest.raises(InvalidArgumentError):
            parse(bad)
    with pytest.raises(InvalidArgumentError):
        parse(3)


@pytest.mark.parametrize("native", (True, False))
@pytest.mark.parametrize("ef", (True, False))
def test_topk_on_large_tensors_keeps_exactly_the_largest(monkeypatch, native, ef):
    """Past 64 Ki elements TopK selects among candidates above a sampled threshold (one native pass,
    or numpy's): still exactly the k largest magnitudes (ties to the lower index), and error feedback
    still keeps the rest."""
    from pyxccl.compression.codecs import _sparse
    if not native:
        monkeypatch.setattr(_sparse, "_candidates_native", None)
    elif _sparse._candidates_native is None:
        pytest.skip("the native helpers are off (PYXCCL_NATIVE=0) or were not built")
    rng = np.random.default_rng(5)
    q = TopK(0.01, error_feedback=ef)
    total, sent = np.zeros(1 << 18), np.zeros(1 << 18)
    for step in range(3):
        x = (rng.standard_normal(1 << 18) * rng.choice([1e-3, 1.0, 50.0], 1 << 18)).astype(np.float32)
        x[::1000] = 7.0                                       # ties at many places
        acc = x + (q.residual("t") if ef and q.residual("t") is not None else 0)
        idx, val = q.compress(x, "t")
        k = q.k(x.size)
        want = np.sort(np.argsort(-np.abs(acc), kind="stable")[:k])
        assert np.array_equal(idx, want) and np.array_equal(val, acc[want].astype(np.float32))
        total += x
        sent[idx] += val
    if ef:
        np.testing.assert_allclose(sent + q.residual("t"), total, rtol=1e-5, atol=1e-5)
