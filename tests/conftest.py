import os
import shutil
import sys
import tempfile

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
    """The pools of 1 to 4 ranks with torch.distributed initialized (backend pyxccl, plus a Gloo group)."""
    pytest.importorskip("torch")
    import torchfns
    from pyxccl.launcher import free_port
    for n in (1, 2, 3, 4):
        assert pools(n).run(torchfns.init_torch, free_port(), timeout=120) == [("pyxccl", n)] * n
    return pools
