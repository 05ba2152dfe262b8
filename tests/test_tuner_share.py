"""The tuner's choices shared by a host's processes (tuning/shared.py): one prices, the others read."""
from __future__ import annotations

import os
import threading

from pyxccl.tuning import Machine, Tuner
from pyxccl.tuning.shared import SharedTable


def test_one_prices_the_others_read(tmp_path):
    """Eight openers of one table at once (flock excludes separate opens in one process as across
    processes): the choice is computed once and every opener gets it."""
    calls, got = [], []

    def compute():
        calls.append(1)
        return "ring"

    def opener():
        t = SharedTable.open(str(tmp_path), ("inputs", 1), 3600)
        got.append(t.choice("allreduce/8/4", compute))
    threads = [threading.Thread(target=opener) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == ["ring"] * 8 and len(calls) == 1


def test_other_inputs_other_table_and_torn_files_priced_again(tmp_path):
    a = SharedTable.open(str(tmp_path), ("inputs", 1), 3600)
    b = SharedTable.open(str(tmp_path), ("inputs", 2), 3600)
    assert a.path != b.path
    assert a.choice("k", lambda: "ring") == "ring"
    assert b.choice("k", lambda: "tree") == "tree"
    with open(a.path, "w") as f:
        f.write('{"k": "ri')                     # a torn write
    assert a.choice("k", lambda: "bruck") == "bruck"
    assert SharedTable(a.path).choice("k", lambda: "never") == "bruck"


def test_old_tables_pruned_and_sharing_off(tmp_path, monkeypatch):
    t = SharedTable.open(str(tmp_path), ("x",), 3600)
    t.choice("k", lambda: "ring")
    os.utime(t.path, (1, 1))
    SharedTable.open(str(tmp_path), ("y",), 3600)
    assert not os.path.exists(t.path)
    monkeypatch.setenv("PYXCCL_TUNER_SHARE", "0")
    assert SharedTable.open(str(tmp_path), ("x",), 3600) is None


def test_tuner_with_a_shared_table_chooses_what_it_prices(tmp_path, monkeypatch):
    """Two tuners of the same inputs: the second reads the first's choices, which are the unshared
    tuner's (same argmin), for every primitive and several sizes."""
    monkeypatch.setenv("PYXCCL_LINKS", str(tmp_path / "links.json"))
    def make(links):
        return Tuner(4, [0, 0, 1, 1], lambda a, b: "self" if a == b else "shm" if a // 2 == b // 2 else "tcp",
                     Machine(cores=2), [2] * 4, links=links)
    first, plain = make("auto"), make(None)
    for prim in ("allreduce", "allgather", "broadcast", "alltoall"):
        for size in (8, 1 << 16, 1 << 22):
            assert first.choose(prim, size) == plain.choose(prim, size)
    second = make("auto")
    second._priced = None        # noqa: SLF001  (it must not price: every choice is in the table)
    for prim in ("allreduce", "allgather", "broadcast", "alltoall"):
        for size in (8, 1 << 16, 1 << 22):
            assert second.choose(prim, size) == plain.choose(prim, size)


def test_waiting_on_another_key_prices_its_own_once(tmp_path):
    """While one opener holds the table pricing key "a", openers of key "b" wait sharing the lock;
    finding no "b" when it is released, exactly one of them prices "b" and the others read it."""
    first = SharedTable.open(str(tmp_path), ("inputs", 1), 3600)
    holding, release = threading.Event(), threading.Event()
    calls, got = [], []

    def slow_a():
        holding.set()
        release.wait(10)
        return "ring"

    def compute_b():
        calls.append(1)
        return "tree"

    a = threading.Thread(target=lambda: got.append(first.choice("a", slow_a)))
    a.start()
    holding.wait(10)
    others = [threading.Thread(target=lambda: got.append(SharedTable(first.path).choice("b", compute_b)))
              for _ in range(4)]
    for t in others:
        t.start()
    release.set()
    for t in [a, *others]:
        t.join(10)
    assert sorted(got) == ["ring"] + ["tree"] * 4 and len(calls) == 1
    assert SharedTable(first.path).choice("a", lambda: "never") == "ring"
