"""Parallel strategies on pyxccl (torch as an extra): DP, TP/SP, PP, EP and ZeRO, their traffic counted.

>>> import torch.distributed as dist, pyxccl.torch             # doctest: +SKIP
>>> from pyxccl.parallel import ParallelGroups, traffic
>>> dist.init_process_group("pyxccl")
>>> groups = ParallelGroups(tp=2, pp=2)
>>> print(groups.layout())
>>> print(traffic.table(traffic.step()))

See docs/parallel.md for each strategy, what it moves and the formulas the tests check.
"""
from . import ops, traffic
from .groups import Group, ParallelGroups

__all__ = ["Group", "ParallelGroups", "ops", "traffic"]
