import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))   # rank processes import rankfns from here

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
