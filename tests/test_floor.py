"""The small-call floor: a blocking call the native executor runs is one C call (core/prepared.py's
``Prepared.fast``, pyxccl._native.Call) that keeps the books as the Python path (``Prepared.start``)
does: the same flight-recorder entries, sequence numbers, traffic counters and mismatch records. With
PYXCCL_NATIVE=0 there is no C path, and every call goes through ``Prepared.start``."""
import os

import numpy as np

import floorfns as ff

NATIVE = os.environ.get("PYXCCL_NATIVE", "1") != "0"


def _ok(results):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not fails, "\n".join(fails[:20])


def test_the_c_path_keeps_the_books_of_the_python_path(pools):
    if not NATIVE:
        out = pools(2).run(_no_c_path, transport="shm")
        assert out == [[], []], out
        return
    _ok(pools(2).run(ff.same_books, transport="shm"))


def test_the_c_path_finds_the_thread_word_of_the_python_path(pools):
    if not NATIVE:
        return
    _ok(pools(2).run(ff.thread_words, transport="shm"))


def test_two_forms_of_a_call_taking_turns_on_one_output_each_repeat_in_c(pools):
    if not NATIVE:
        return
    _ok(pools(2).run(ff.taking_turns, transport="shm"))


def test_a_blocking_call_behind_a_queued_one_runs_after_it(pools):
    _ok(pools(2).run(ff.busy_engine, transport="shm"))


def _no_c_path(comm):
    x = np.ones(3, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)
    ps = list(ff.context(comm).prepared.values())
    return [f"a C path with PYXCCL_NATIVE=0: {p.name}" for p in ps if p.fast is not None] + \
        ([] if ps else ["nothing prepared"])
