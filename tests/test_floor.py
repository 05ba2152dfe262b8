"""The small-call floor: a blocking call the native executor runs is one C call (core/prepared.py's
``Prepared.fast``, pyxccl._native.Call) that keeps the books as the Python path (``Prepared.start``)
does: the same flight-recorder entries, sequence numbers, traffic counters and mismatch records. With
PYXCCL_NATIVE=0 there is no C path, and every call goes through ``Prepared.start``."""
import os

import numpy as np
import pytest

import floorfns as ff

NATIVE = os.environ.get("PYXCCL_NATIVE", "1") != "0"


def _ok(results):
    fails = [f"rank {r}: {f}" for r, fs in enumerate(results) for f in fs]
    assert not fails, "\n".join(fails[:20])


#: comm.py's way into a call: the C one (_native.repeat) and its Python twin (_repeat), held to the same checks
WAYS = ["c", "python"]


@pytest.mark.parametrize("way", WAYS)
def test_the_c_path_keeps_the_books_of_the_python_path(pools, way):
    if not NATIVE:
        if way == "python":
            pytest.skip("PYXCCL_NATIVE=0: there is no C path (checked once, way c)")
        out = pools(2).run(_no_c_path, transport="shm")
        assert out == [[], []], out
        return
    _ok(pools(2).run(ff.through, way, "same_books", transport="shm"))


def test_the_c_path_finds_the_thread_word_of_the_python_path(pools):
    if not NATIVE:
        pytest.skip("PYXCCL_NATIVE=0: there is no C path")
    _ok(pools(2).run(ff.thread_words, transport="shm"))


@pytest.mark.parametrize("way", WAYS)
def test_two_forms_of_a_call_taking_turns_on_one_output_each_repeat_in_c(pools, way):
    if not NATIVE:
        pytest.skip("PYXCCL_NATIVE=0: there is no C path")
    _ok(pools(2).run(ff.through, way, "taking_turns", transport="shm"))


@pytest.mark.parametrize("way", WAYS)
def test_a_plain_repeat_the_c_call_does_not_finish(pools, way):
    """A late peer, a busy engine, another thread, AVG: a plain repeat's ways besides one C call."""
    if not NATIVE:
        pytest.skip("PYXCCL_NATIVE=0: there is no C path")
    _ok(pools(2).run(ff.through, way, "plain_repeat_answers", transport="shm"))


def test_a_communicator_made_with_the_c_path_off_takes_it_once_it_is_on(pools):
    if not NATIVE:
        pytest.skip("PYXCCL_NATIVE=0: there is no C path")
    _ok(pools(2).run(ff.native_turned_on_later, transport="shm"))


def test_a_one_rank_communicator_runs_on_its_segment(pools):
    _ok(pools(1).run(ff.one_rank, transport="shm"))


@pytest.mark.parametrize("way", WAYS)
def test_a_blocking_call_behind_a_queued_one_runs_after_it(pools, way):
    _ok(pools(2).run(ff.through, way if NATIVE else "python", "busy_engine", transport="shm"))


def _no_c_path(comm):
    x = np.ones(3, np.float32)
    comm.allreduce(x)
    comm.allreduce(x)
    ps = list(ff.context(comm).prepared.values())
    return [f"a C path with PYXCCL_NATIVE=0: {p.name}" for p in ps if p.fast is not None] + \
        ([] if ps else ["nothing prepared"])


def test_a_call_copies_into_its_windows_the_way_that_costs_less(pools):
    """_native.c's nt_windows: the policy alone (both ways tried first, the cheaper kept and the other tried
    again for two runs, the more rarely the dearer it was, a way that turns dear left once most of its last
    five timed runs say so, a trial that comes out cheap followed by others soon, the settings that force a
    way), then real calls, where rank 0 picks for all and the others follow, and every result is right,
    and a rank that comes late to every call counts for neither way."""
    if not NATIVE:
        pytest.skip("PYXCCL_NATIVE=0: there is no C path")
    from pyxccl.core import onehost
    picks = onehost._native.window_picks

    def trials(got, kept, start=6):
        """The first run of each trial of the other way (each is two runs, the second the one timed)."""
        other = [k for k in range(start, len(got)) if got[k] != kept]
        assert all(k + 1 in other for k in other[::2]), other
        return other[::2]

    first = [0, 0, 0, 1, 1, 1]          # each way three times (its first run warms up, not kept)
    for cheap, costs in ((0, ([1.0] * 300, [2.0] * 300)), (1, ([2.0] * 300, [1.0] * 300))):
        got = picks(*costs)
        assert got[:6] == first
        # warming up the other way first (a new call, where the last one found it the cheaper: win_seed)
        assert picks(*costs, True) == [1] * 3 + [0] * 3 + got[6:]
        # twice as dear: tried every 16 * 2 * 2 runs (counted from the run after the trial's second)
        assert trials(got, cheap) == [70, 136, 202, 268], got
    assert trials(picks([1.0] * 300, [1.1] * 300), 0)[:3] == [25, 46, 67]     # 16 * 1.1 * 1.1: every 19
    assert trials(picks([1.0] * 600, [6.0] * 600), 0) == [518]                  # at most every 512
    # plain turns dear at run 40 (the machine's slow state): once both ways have three, every 4th run is timed
    # (43, 47, 51), and three dear ones make most of its last five; then plain, 1.5x dearer, every 16 * 1.5 * 1.5
    got = picks([1.0] * 40 + [3.0] * 160, [2.0] * 200)
    assert got[40:56] == [0] * 12 + [1] * 4 and trials(got, 1, 56) == [70, 108, 146, 184]
    # the way back: plain 6x dearer, then cheaper than streaming from run 100 on; its first trial (518) came
    # out cheaper, so the next two follow 16 runs apart, and they make most of plain's last five: plain kept
    # from 556 on, streaming (2x dearer) tried 16 runs after the last trial and then every 64
    got = picks([6.0] * 100 + [0.5] * 600, [1.0] * 700)
    assert trials(got, 1, 6)[:3] == [518, 536, 554] and set(got[556:572]) == {0}
    assert trials(got, 0, 556) == [572, 638], got[500:]
    with pytest.raises(ValueError, match="as many"):
        picks([1.0], [])
    for setting in (0, 1):
        was = onehost._native.set_nt_windows(setting)
        try:
            assert picks([1.0] * 20, [2.0] * 20) == [setting] * 20 == picks([2.0] * 20, [1.0] * 20)
        finally:
            onehost._native.set_nt_windows(was)
    _ok(pools(2).run(ff.window_ways, transport="shm"))
    _ok(pools(2).run(ff.new_calls_warm_up_the_cheaper_way_first, transport="shm"))
    _ok(pools(2).run(ff.late_rank_counts_for_neither_way, transport="shm"))
