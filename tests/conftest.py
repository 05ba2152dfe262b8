import os
import shutil
import sys
import tempfile
import weakref

import pytest

sys.path.insert(0, os.path.dirname(__file__))   # rank processes import rankfns from here

# The suite never reads or writes the user's link figures (~/.cache/pyxccl/links.json): it loads
# the cores, so figures it measured would be a busy machine's, and it must see a fresh machine.
# Set before any rank process starts: the pools' and launched jobs' processes inherit it.
LINKS_DIR = tempfile.mkdtemp(prefix="pyxccl-test-links-")
os.environ["PYXCCL_LINKS"] = os.path.join(LINKS_DIR, "links.json")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(LINKS_DIR, ignore_errors=True)

from pyxccl.testing import RankPool  # noqa: E402

SIZES = (1, 2, 3, 4, 5, 8)          # the core sweep; algorithm runs use 1..9


class Pools:
    """One RankPool per world size, shared by every test; a pool that failed is replaced."""

    def __init__(self):
        self._pools: dict[int, RankPool] = {}

    def __call__(self, n: int) -> RankPool:
        p = self._pools.get(n)
        if p is None or not p.alive:
            p = self._pools[n] = RankPool(n)
        return p

    def close(self):
        for p in self._pools.values():
            p.close()


@pytest.fixture(scope="session")
def pools():
    ps = Pools()
    yield ps
    ps.close()


@pytest.fixture(params=("tcp", "shm"))
def transport(request):
    return request.param


@pytest.fixture(scope="session")
def torch_pools(pools):
    """The pools of 1 to 4 ranks with torch.distributed initialized (backend pyxccl, plus a Gloo group).

    A pool replaced after a failure starts without torch: it is initialized when a test asks for it, so
    one lost rank fails its own test, not every torch test after it (CI once failed twelve that way)."""
    pytest.importorskip("torch")
    import torchfns
    ready = weakref.WeakSet()

    def get(n: int) -> RankPool:
        p = pools(n)
        if p not in ready:
            assert p.run(torchfns.init_torch, timeout=120) == [("pyxccl", n)] * n
            ready.add(p)
        return p
    for n in (1, 2, 3, 4):
        get(n)
    return get


# What `make test-fast` leaves out (`-m "not slow"`): whole files that start many processes, torch, emulated
# hosts or fuzzers, and the checker's proofs up to 64 ranks (the same algorithms are proven up to 9 ranks
# and run on real ranks in the fast set), and the 5- and 8-rank cases of the pool sweeps. `make test` and CI run everything.
SLOW_FILES = {"test_faults.py", "test_convergence.py", "test_fuzz.py", "test_security.py", "test_multihost.py",
              "test_host_faults.py", "test_torch_backend.py", "test_torch_hooks.py", "test_parallel.py",
              "test_parallel_dp.py", "test_parallel_ep.py", "test_parallel_pp.py", "test_parallel_tp.py",
              "test_parallel_zero.py", "test_tuner_cache.py", "test_launcher.py", "test_errors.py",
              "test_sim_fidelity.py", "test_bench.py"}
SLOW_TESTS = ("1_to_64_ranks", "forced_matches_numpy", "-8]", "[8]", "-5]", "[5]", "with_new_data[4]",
              "docstring_examples_run",        # the sweeps' 5- and 8-rank cases: 2-4 ranks stay
              "64_ranks_hold",                 # test_scale_transport's 64-rank case
              "8x8")                           # test_multihost's 8 emulated hosts x 8 ranks (issue 26)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES or any(s in item.name for s in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
