"""The simulator: the real schedules of any algorithm, run on a modelled cluster.

The schedules come from the same builders the engine runs (``algorithms/``) and are
walked by the same walker (``walk.py``) with a semantics of time (``model.py``); nothing
here describes an algorithm a second time.

>>> from pyxccl.sim import Cluster, Link, run
>>> c = Cluster(hosts=4, per_host=8, intra=Link(1e-6, 1 / 300e9), inter=Link(5e-6, 1 / 25e9), nics=8)
>>> [(r.algorithm, round(r.busbw / 1e9)) for r in run("allreduce", 1 << 30, c, ["ring"])]
[('ring', 25)]
"""
from __future__ import annotations

from ..tuning.cost import Link
from .cluster import Cluster
from .simulate import Result, choose, run

__all__ = ["Cluster", "Link", "Result", "run", "choose"]
