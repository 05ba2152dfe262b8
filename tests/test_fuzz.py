"""Coverage-guided fuzzing of every parser of bytes from outside (targets: tests/fuzz_targets.py).

atheris (libFuzzer for Python) drives each target for a few seconds in a
subprocess of its own (atheris.Fuzz() exits the process when done): a
transport's frames and receive loop, the HMAC handshake between ranks, the TCP
store's server and client. A failure is an input that makes the code raise
anything but its documented error, allocate beyond what it received, leave the
store's bookkeeping off, or hang (libFuzzer's -timeout); the input is saved and
printed. atheris (3.0.0) installs from a manylinux wheel with plain pip on
CPython 3.11, checked in a fresh venv, so it is in the `test` extra instead of
hypothesis, which is not coverage-guided; without it these tests are skipped.
About 25 s for the three targets (PYXCCL_FUZZ_SECONDS each, default 6).

The last tests plant a defect of each kind and check that the harness reports
it, so that a quiet fuzzer means something.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

atheris = pytest.importorskip("atheris", reason="atheris is in the test extra: pip install -e '.[test]'")

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = int(os.environ.get("PYXCCL_FUZZ_SECONDS", "6"))      # per target; more when hunting
sys.path.insert(0, HERE)
import fuzz_targets as ft  # noqa: E402


def _rss_limit(mb: int = 1024) -> int:
    """libFuzzer's limit on its peak RSS: ``mb`` over this process's own peak. Linux copies a parent's
    peak RSS into a forked child and keeps it across exec, so the fuzzer's "rss" starts at what this
    (pytest) process once held: 1.6-1.8 GB late in a whole-suite run, over a flat 1,024 MB before any
    input. (What a target allocates per input is checked by its tracemalloc budget.)"""
    import resource
    return mb + resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


@pytest.mark.timeout(SECONDS + 60)
@pytest.mark.parametrize("target", sorted(ft.TARGETS))
def test_fuzz(target, tmp_path):
    corpus = str(tmp_path / "corpus")
    ft.write_seeds(target, corpus)
    p = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_targets.py"), target, corpus,
                        f"-max_total_time={SECONDS}", "-timeout=10", f"-rss_limit_mb={_rss_limit()}",
                        f"-artifact_prefix={tmp_path}/"],
                       capture_output=True, text=True, timeout=SECONDS + 50)
    out = "\n".join(line for line in (p.stdout + p.stderr).splitlines() if not line.startswith("INFO: Instrument"))
    found = glob.glob(f"{tmp_path}/crash-*") + glob.glob(f"{tmp_path}/timeout-*") + glob.glob(f"{tmp_path}/oom-*")
    assert p.returncode == 0 and not found, f"{target}: {found}\n{out[-4000:]}"
    assert "DONE" in out and "runs in" in out, out[-2000:]


# --- the harness catches what it is there for ------------------------------------------------------------

_LYING_FRAME = b"\0" + ft._frame(ft.DATA, (0, 9, 0), total=1 << 40, n=1 << 40) + bytes(100)


def test_harness_reports_an_allocation_of_a_claimed_size(monkeypatch):
    import numpy as np
    real = ft.TcpPeer._on_frame

    def greedy(self, kind, dcode, key, total, off, n, aux, call):
        np.ones(min(n, 64 << 20), np.uint8)   # as if it trusted the header (capped, for the test's sake)
        return real(self, kind, dcode, key, total, off, n, aux, call)
    ft.tracemalloc.start()
    try:
        ft.frames(_LYING_FRAME)                               # the real code passes
        monkeypatch.setattr(ft.TcpPeer, "_on_frame", greedy)
        with pytest.raises(AssertionError, match=r"\d+ bytes allocated for 164 bytes received"):
            ft.frames(_LYING_FRAME)
    finally:
        ft.tracemalloc.stop()


def test_harness_reports_an_undocumented_error(monkeypatch):
    def broken(self, *args):
        raise KeyError("a bug")
    ft.tracemalloc.start()
    try:
        monkeypatch.setattr(ft.TcpPeer, "_on_frame", broken)
        with pytest.raises(AssertionError, match="not a documented error.*KeyError"):
            ft.frames(_LYING_FRAME)
        monkeypatch.setattr(ft.StoreServer, "_request", broken)
        with pytest.raises(KeyError):
            ft.store(ft._store_seeds()[0])
    finally:
        ft.tracemalloc.stop()


def test_harness_reports_store_bookkeeping_that_is_off(monkeypatch):
    real = ft.StoreServer._set

    def leaky(self, *args):
        self.used += 1
        return real(self, *args)
    ft.tracemalloc.start()
    try:
        ft.store(ft._store_seeds()[0])
        monkeypatch.setattr(ft.StoreServer, "_set", leaky)
        with pytest.raises(AssertionError, match="counts .* bytes held but holds"):
            ft.store(ft._store_seeds()[0])
    finally:
        ft.tracemalloc.stop()


def test_harness_reports_a_forged_handshake(monkeypatch):
    monkeypatch.setattr(ft.auth.hmac, "compare_digest", lambda a, b: True)
    ft.tracemalloc.start()
    try:
        with pytest.raises(AssertionError, match="passed the handshake"):
            ft.handshake(ft._handshake_seeds()[0])
    finally:
        ft.tracemalloc.stop()


# --- what the fuzzer found ---------------------------------------------------------------------------------

def test_a_misaligned_chunk_for_a_reducing_receive_is_a_protocol_error():
    """A 3-byte chunk for a reducing float32 receive made numpy raise in the receiver thread (the mailbox
    views each chunk as the receive's dtype), reported as a lost peer; frames now keep chunks aligned."""
    frames = (b"\0" + ft._frame(ft.DATA, (0, 0, 1), total=64, n=3, payload=b"abc")
              + ft._frame(ft.DATA, (0, 0, 1), total=64, off=3, n=61, payload=bytes(61)))
    ft.tracemalloc.start()
    try:
        ft.frames(frames)
    finally:
        ft.tracemalloc.stop()
