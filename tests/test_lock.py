"""pyxccl._native.Lock, the engine's locks where the C executor runs calls (core/engine.py), against
threading.Lock, whose interface it has: the same answers and errors for any sequence of operations
from one thread, and the same waits across threads."""
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxccl.core import onehost

pytestmark = pytest.mark.skipif(onehost._native is None, reason="the C executor (pyxccl._native) is not built")

# (name, call): every form of the interface a thread can use on a lock alone
OPS = {
    "acquire(False)": lambda lk: lk.acquire(False),
    "acquire(blocking=False)": lambda lk: lk.acquire(blocking=False),
    "acquire(timeout=0)": lambda lk: lk.acquire(timeout=0),
    "acquire(True, 0.001)": lambda lk: lk.acquire(True, 0.001),
    "acquire(False, 1)": lambda lk: lk.acquire(False, 1),
    "acquire(timeout=-2)": lambda lk: lk.acquire(timeout=-2),
    "release()": lambda lk: lk.release(),
    "locked()": lambda lk: lk.locked(),
    "with": lambda lk: _with(lk),
}


def _with(lk):
    if lk.locked():         # (a held lock's `with` waits for ever, as threading.Lock's)
        return None
    with lk:
        return lk.locked()


def _outcome(lk, name):
    try:
        return ("returned", OPS[name](lk))
    except Exception as e:      # noqa: BLE001  (the kind of error is what is compared)
        return ("raised", type(e).__name__)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(OPS)), max_size=30))
def test_every_sequence_of_operations_answers_as_threading_lock(names):
    ours, theirs = onehost._native.Lock(), threading.Lock()
    for k, name in enumerate(names):
        got, want = _outcome(ours, name), _outcome(theirs, name)
        assert got == want, f"step {k} ({name}) of {names}: {got} against threading.Lock's {want}"


def test_a_blocking_acquire_waits_for_the_release_of_another_thread():
    lk = onehost._native.Lock()
    lk.acquire()
    took = []
    t = threading.Thread(target=lambda: took.append((lk.acquire(), time.monotonic())))
    t.start()
    time.sleep(0.1)
    assert not took, "acquired a held lock"
    released = time.monotonic()
    lk.release()            # a lock may be released by another thread than the one that took it, as threading's
    t.join(5)
    assert took and took[0][0] is True and took[0][1] >= released
    assert lk.locked()
    lk.release()


def test_a_timed_acquire_gives_up_after_its_timeout_and_lets_other_threads_run():
    lk = onehost._native.Lock()
    lk.acquire()
    ticks = []
    t = threading.Thread(target=lambda: [ticks.append(time.sleep(0.01)) for _ in range(5)])
    t0 = time.monotonic()
    t.start()
    assert lk.acquire(timeout=0.2) is False
    waited = time.monotonic() - t0
    t.join(5)
    assert 0.2 <= waited < 5, waited
    assert len(ticks) == 5, "the wait held the GIL"
    lk.release()
    assert not lk.locked()


def test_an_engine_uses_it_where_the_c_executor_is_built(monkeypatch):
    """Whatever PYXCCL_NATIVE says when the engine is made (plans read it later, and make Calls, which need
    these locks, once it is unset); threading.Lock where the module is not built."""
    from pyxccl.core.engine import Engine
    for native, kind in (("1", onehost._native.Lock), ("0", onehost._native.Lock), (None, type(threading.Lock()))):
        if native is None:
            monkeypatch.setattr(onehost, "_native", None)
        else:
            monkeypatch.setenv("PYXCCL_NATIVE", native)
        e = Engine("test-engine")
        try:
            assert type(e.lock) is kind and type(e._exec) is kind
        finally:
            e.stop()


def test_a_signal_ends_a_wait_for_ever_with_its_handler_s_exception():
    import signal

    class Rang(Exception):
        pass

    def ring(*_):
        raise Rang

    lk = onehost._native.Lock()
    lk.acquire()
    was = signal.signal(signal.SIGALRM, ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        t0 = time.monotonic()
        with pytest.raises(Rang):
            lk.acquire()        # what pytest-timeout's alarm does to a hung test
        assert time.monotonic() - t0 < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, was)
    assert lk.locked()
    lk.release()
