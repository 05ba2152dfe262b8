"""Rank functions for the compressed collectives: against numpy within the stated bounds, and the counters."""
from __future__ import annotations

import zlib

import numpy as np

from pyxccl import InvalidArgumentError
from pyxccl.compression import BF16, FP16, INT8, Threshold, TopK
from pyxccl.algorithms import registry

QUANTIZERS = {"fp16": FP16(), "bf16": BF16(), "int8": INT8()}
UNIT = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def inputs(n: int, count: int, seed: int = 0):
    """Every rank's input (each rank can compute the others': the reference)."""
    return [np.random.default_rng(seed * 100 + r).standard_normal(count).astype(np.float32) * (1 + r)
            for r in range(n)]


def bound(name: str, xs, hops: int) -> np.ndarray:
    """What a quantized sum may be off by, per element: each of ``hops`` quantizations of a partial
    sum (at most sum |x_r|) errs by its unit (fp16, bf16: relative; int8: half a step of the largest
    block, bounded here by the largest element)."""
    s = np.sum(np.abs(np.stack(xs)), axis=0, dtype=np.float64)
    one = UNIT[name] * s if name in UNIT else np.full_like(s, s.max() / 254)
    return hops * one + 1e-6 * s


def check_quantized(comm, algorithms, counts=(5000, 1024)):
    """allreduce (SUM, AVG), reduce_scatter and allgather with each quantizer and algorithm; every rank
    the same allreduce result; returns the failures. 1024 per rank: chunks of whole INT8 blocks."""
    return [f for count in counts for f in _check_quantized(comm, algorithms, count)]


def _check_quantized(comm, algorithms, count):
    n, r = comm.size, comm.rank
    xs = inputs(n, count * n)
    want = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    hops = 2 * n
    fails = []
    for name, q in QUANTIZERS.items():
        for algo in algorithms:
            what = f"{name} {algo}"
            y = xs[r].copy()
            if name == "int8" and not registry.lookup("allreduce", algo).settles:     # refused: INT8's blocks need ring or hierarchical
                try:
                    comm.allreduce(y, compression=q, algorithm=algo)
                    fails.append(f"allreduce {what}: not refused")
                except InvalidArgumentError:
                    pass
                continue
            comm.allreduce(y, compression=q, algorithm=algo)
            if np.any(np.abs(y - want) > bound(name, xs, hops)):
                fails.append(f"allreduce {what}: off by {np.max(np.abs(y - want))}")
            same = comm.allgather(np.array([zlib.crc32(y.tobytes())], np.int64))     # bit-equal everywhere?
            if len(set(same.tolist())) != 1:
                fails.append(f"allreduce {what}: ranks differ")
            out = np.empty_like(y)
            comm.allreduce(xs[r], op="avg", out=out, compression=name, algorithm=algo, async_op=True).wait()
            if np.any(np.abs(out - want / n) > bound(name, xs, hops) / n):
                fails.append(f"allreduce avg async {what}: off by {np.max(np.abs(out - want / n))}")
        for algo in ("ring", "direct"):
            part = np.empty(count, np.float32)
            comm.reduce_scatter(xs[r], part, compression=q, algorithm=algo)
            mine = slice(r * count, (r + 1) * count)
            if np.any(np.abs(part - want[mine]) > bound(name, xs, hops)[mine]):
                fails.append(f"reduce_scatter {name} {algo}: off by {np.max(np.abs(part - want[mine]))}")
            got = comm.allgather(xs[r][:count], compression=q, algorithm=algo)
            ref = np.concatenate([q.round_trip(x[:count]) for x in xs])
            if not np.allclose(got, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max()):
                fails.append(f"allgather {name} {algo}: not every block as its round trip")
    return fails


def check_sparse(comm, steps: int = 3, count: int = 4000):
    """TopK and Threshold: the result is the sum of every rank's compressed contribution (computed
    here with a compressor of the same kind per rank), on every collective; error feedback conserves
    the total over steps."""
    n, r = comm.size, comm.rank
    fails = []
    for make in (lambda: TopK(0.01), lambda: TopK(0.3), lambda: Threshold(2.0), lambda: TopK(0.05, error_feedback=False)):
        mine, refs = make(), [make() for _ in range(n)]
        sent_total, in_total = np.zeros(count, np.float64), np.zeros(count, np.float64)
        for step in range(steps):
            xs = inputs(n, count, seed=step + 1)
            want = np.zeros(count, np.float32)
            for q, x in zip(refs, xs):
                q.accumulate(want, *q.compress(x, "g"))
            y = xs[r].copy()
            comm.allreduce(y, compression=mine, key="g")
            if not np.allclose(y, want, rtol=1e-5, atol=1e-6 * np.abs(want).max()):     # dense: another sum order
                fails.append(f"allreduce {mine.spec} step {step}: off by {np.max(np.abs(y - want))}")
            sent_total += y
            in_total += np.sum(xs, axis=0)
        if mine.error_feedback:
            residuals = np.sum([q.residual("g") for q in refs], axis=0)
            if not np.allclose(sent_total + residuals, in_total, rtol=1e-4, atol=1e-4):
                fails.append(f"{mine.spec}: sent + residual != inputs")
    xs = inputs(n, count * n, seed=9)
    refs = [TopK(0.02) for _ in range(n)]
    want = np.zeros(count * n, np.float32)
    for q, x in zip(refs, xs):
        q.accumulate(want, *q.compress(x, "rs"))
    part = np.empty(count, np.float32)
    comm.reduce_scatter(xs[r], part, compression=TopK(0.02), key="rs", async_op=True).wait()
    if not np.allclose(part, want[r * count:(r + 1) * count], rtol=1e-5, atol=1e-6):
        fails.append("reduce_scatter topk: wrong part")
    got = comm.allgather(xs[r][:count], compression=TopK(0.02, error_feedback=False))
    ref = np.concatenate([TopK.decompress(*TopK(0.02, error_feedback=False).compress(x[:count]), count) for x in xs])
    if not np.array_equal(got, ref):
        fails.append("allgather topk: blocks are not each rank's top-k")
    return fails


def spec_keeps_state(comm, steps: int = 3, count: int = 4000):
    """A spec string names one compressor per communicator (however it is spelt): step after step, the
    same results, bit for bit, as one compressor object passed each time (TopK's and Threshold's
    residuals per key, INT8's random stream); a dup starts afresh."""
    fails = []
    c = comm.dup()
    for spec, obj in (("topk:0.01", TopK(0.01)), ("threshold:2.0", Threshold(2.0)),
                      ("int8:stochastic=1,seed=5", INT8(stochastic=True, seed=5))):
        for step in range(steps):
            x = inputs(comm.size, count, seed=step + 1)[comm.rank]
            by_spec, by_obj = x.copy(), x.copy()
            c.allreduce(by_spec, compression=spec if step != 1 else " " + spec.upper(), key="w")
            c.allreduce(by_obj, compression=obj, key="w")
            if not np.array_equal(by_spec, by_obj):
                fails.append(f"{spec} step {step}: the spec string lost the compressor's state")
    d = c.dup()
    first = inputs(comm.size, count, seed=1)[comm.rank].copy()
    d.allreduce(first, compression="topk:0.01", key="w")
    again = inputs(comm.size, count, seed=1)[comm.rank].copy()
    c2 = comm.dup()
    c2.allreduce(again, compression="topk:0.01", key="w")
    if not np.array_equal(first, again):
        fails.append("a dup's first topk call saw another communicator's residual")
    held = [x._compressors() for x in (c2, d, c)]
    if not all(held):
        fails.append("a spec string's compressor was not kept on its communicator")
    c.close()           # closes its dup d too: the compressors of both go
    c2.close()
    if any(held):
        fails.append("a closed communicator kept the compressors its spec strings named")
    return fails


def wire_ratio(comm, count: int):
    """Bytes on the wire of one float32 ring allreduce of ``count``: uncompressed, INT8, TopK(0.01),
    read from comm.traffic() (the bytes each send handed to a transport)."""
    x = np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32)

    def wire(**kw):
        before = sum(comm.traffic().get("allreduce", {}).get("wire", {}).values())
        comm.allreduce(x.copy(), algorithm="ring", **kw)
        t = comm.traffic()["allreduce"]
        return sum(t["wire"].values()) - before
    plain = wire()
    return plain, wire(compression=INT8()) / plain, wire(compression=TopK(0.01), key="x") / plain


def disagree(comm, theirs):
    """Rank 0 compresses with INT8, the others with ``theirs``: the error every rank gets (on a dup: the
    pool's communicator stays usable)."""
    x = np.ones(1000, np.float32)
    c = comm.dup()
    try:
        c.allreduce(x, compression="int8" if comm.rank == 0 else theirs, algorithm="ring", timeout=20)
    except Exception as e:      # noqa: BLE001  (the test looks at it)
        return type(e).__name__, str(e)
    finally:
        c.close()
    return None


def auto_choice(comm, nbytes: int):
    """What compression="auto" picks for an allreduce of ``nbytes`` here, and that the call runs."""
    x = np.ones(nbytes // 4, np.float32)
    codec = comm.compression_for("allreduce", x.nbytes)
    comm.allreduce(x, compression="auto")
    return (codec.spec if codec is not None else None), bool(np.all(x == comm.size))


def check_hosts(comm, count: int = 1 << 18, quantized_counts=(5000, 1024), sparse_count: int = 4000):
    """Across hosts: the quantized and sparse checks, and hierarchical compresses only between hosts
    (its bytes to other hosts shrink by the code's ratio, those inside a host do not)."""
    fails = (check_quantized(comm, ["ring", "hierarchical", "tree"], quantized_counts)
             + check_sparse(comm, count=sparse_count))
    x = np.ones(count * comm.size, np.float32)

    def links(**kw):
        before = comm.traffic().get("allreduce", {}).get("wire", {})
        comm.allreduce(x.copy(), algorithm="hierarchical", **kw)
        after = comm.traffic()["allreduce"]["wire"]
        return {k: v - before.get(k, 0) for k, v in after.items()}
    plain, int8 = links(), links(compression=INT8())
    crossed = comm.allgather(np.array([plain.get("tcp", 0)], np.int64))
    if not crossed.any():
        fails.append(f"compressed hierarchical: no rank sent bytes between hosts ({plain})")
    if plain.get("tcp", 0) and not 0.25 <= int8.get("tcp", 0) / plain["tcp"] <= 0.27:
        fails.append(f"compressed hierarchical: between hosts {int8.get('tcp')} of {plain['tcp']} bytes")
    for k in ("shm", "tcp_local"):
        if int8.get(k, 0) != plain.get(k, 0):
            fails.append(f"compressed hierarchical: {k} {int8.get(k)} bytes, uncompressed {plain.get(k)}")
    return fails
