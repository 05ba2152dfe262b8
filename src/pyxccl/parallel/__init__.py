"""Parallel strategies on pyxccl (torch as an extra): DP, TP/SP, PP, EP and ZeRO, their traffic counted.

>>> import torch.distributed as dist, pyxccl.torch             # doctest: +SKIP
>>> from pyxccl.parallel import ParallelGroups, GradientReducer, traffic
>>> dist.init_process_group("pyxccl")
>>> groups = ParallelGroups(tp=2, pp=2)
>>> print(groups.layout())
>>> ddp = GradientReducer(model, groups.dp)
>>> print(traffic.table(traffic.step()))

One module per strategy: :mod:`.data` (DP), :mod:`.tensor` (TP, SP), :mod:`.pipeline` (PP),
:mod:`.expert` (EP), :mod:`.zero` (ZeRO 1-3). See docs/parallel.md for what each moves and the
formulas the tests check.
"""
from . import ops, traffic
from .data import GradientReducer
from .expert import MoE
from .groups import Group, ParallelGroups
from .pipeline import Pipeline
from .tensor import ColumnParallelLinear, ParallelTransformerBlock, RowParallelLinear
from .zero import FullyShardedModule, ZeroOptimizer

__all__ = ["ColumnParallelLinear", "FullyShardedModule", "GradientReducer", "Group", "MoE", "ParallelGroups",
           "ParallelTransformerBlock", "Pipeline", "RowParallelLinear", "ZeroOptimizer", "ops", "traffic"]
