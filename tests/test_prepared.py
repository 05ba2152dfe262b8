"""Prepared calls and the native executor: a blocking call made again with the same shape skips the
full path (core/prepared.py) and runs the compiled segment program (pyxccl._native); everything the
full path checks still holds. CI runs the one-host tests a second time with PYXCCL_NATIVE=0 (the
pure-Python executor)."""
import os

import numpy as np
import pytest

import rankfns as rf
from pyxccl.core import onehost
from pyxccl.dtypes import DTYPES
from pyxccl.ops import ReduceOp

NATIVE = os.environ.get("PYXCCL_NATIVE", "1") != "0"


def _ok(results):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not fails, "\n".join(fails[:20])


def test_the_native_executor_is_built_and_used():
    """`make test` builds pyxccl._native from source; plans of numpy dtypes use it (unless turned off)."""
    f32 = np.dtype(np.float32)
    if not NATIVE:
        assert onehost.native_codes(f32, ReduceOp.SUM) is None
        return
    import pyxccl._native  # noqa: F401  (fails if pip did not build it)
    assert onehost.native_codes(f32, ReduceOp.SUM) == (0, 0)
    assert onehost.native_codes(np.dtype(np.int64), ReduceOp.BXOR) is not None
    assert onehost.native_codes(np.dtype(np.float16), ReduceOp.SUM) is None     # reduced in Python
    assert onehost.native_codes(np.dtype(np.float16), None) == (-1, -1)         # moved natively


@pytest.mark.parametrize("n", (2, 3, 4))
def test_repeated_calls_run_prepared(pools, transport, n):
    made = pools(n).run(rf.full_path_calls, transport=transport)
    assert made == [0] * n, f"argument checks made by prepared repeats, per rank: {made}"


def test_repeated_calls_run_prepared_when_the_kept_calls_are_full(pools):
    made = pools(3).run(rf.full_path_calls_in_a_full_cache, transport="shm")
    assert made == [0] * 3, f"argument checks made by prepared repeats, per rank: {made}"


def test_torch_tensors_run_prepared_too(pools):
    pytest.importorskip("torch")
    made = pools(2).run(rf.torch_full_path_calls, transport="shm")
    assert made == [0, 0], f"argument checks made by prepared repeats of torch tensors, per rank: {made}"


@pytest.mark.parametrize("n", (2, 4))
def test_prepared_calls_give_right_results_with_new_data(pools, n):
    pairs = rf.valid_pairs(DTYPES)
    _ok(pools(n).run(rf.check_prepared, (0, 1, 7, 1000), pairs, transport="shm"))
    _ok(pools(n).run(rf.check_prepared, (40000, 70000), rf.covering(pairs), transport="shm"))


def test_prepared_calls_over_tcp_give_right_results(pools):
    _ok(pools(3).run(rf.check_prepared, (1, 1000), rf.valid_pairs((np.float32, np.int64)), transport="tcp"))


@pytest.mark.parametrize("transport", ("shm", "tcp"))
def test_prepared_shapes_still_refuse_what_the_full_path_refuses(pools, transport):
    _ok(pools(2).run(rf.check_prepared_refusals, transport=transport))


@pytest.mark.parametrize("n", (2, 3))
@pytest.mark.parametrize("algorithm", ("segment", "ring"))
def test_nan_and_overflow_match_numpy(pools, n, algorithm):
    _ok(pools(n).run(rf.check_nan_and_overflow, algorithm, transport="shm"))


def test_a_done_callback_runs_once_when_added_as_the_work_completes():
    """add_done_callback racing the completion: each callback runs exactly once (it used to run twice
    when the work finished between appending it and checking for completion)."""
    import threading

    from pyxccl.core.engine import Work
    for _ in range(2000):
        w = Work("allreduce", 1, 0, 1e18)
        calls = []
        t = threading.Thread(target=w._finish, args=("x",))
        t.start()
        for i in range(5):
            w.add_done_callback(lambda _w, i=i: calls.append(i))
        t.join()
        assert sorted(calls) == list(range(5)), calls
