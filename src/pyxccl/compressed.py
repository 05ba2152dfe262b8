"""Transitional: ``comm.py`` imports this module by its old name. The compressed collectives are
``pyxccl.compression.collectives``; delete this module once ``comm.py`` imports them from there
(``from .compression import collectives as compressed``) and its ``close()`` no longer calls
``forget`` (the context's close() drops the compressors now)."""
from __future__ import annotations

from .compression.collectives import allgather, allreduce, reduce_scatter

__all__ = ["allreduce", "reduce_scatter", "allgather", "forget"]


def forget(comm) -> None:
    """Nothing left to do: ``Context.close()`` drops the compressors its spec strings named."""
