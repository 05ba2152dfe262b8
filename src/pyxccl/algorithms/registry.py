"""(primitive, algorithm name) -> schedule builder.

A builder is ``f(rank, nranks, **args) -> Schedule``; the arguments per primitive:

=================  ======================================================
allreduce          count
reduce_scatter     counts (elements each rank ends with)
allgather          counts (elements each rank contributes)
broadcast          count, root
reduce             count, root
gather / scatter   counts, root
alltoall           send_counts, recv_counts (this rank's, per peer)
barrier            (none)
=================  ======================================================
"""
from __future__ import annotations

from typing import Callable

from ..schedule import Schedule

Builder = Callable[..., Schedule]
_REGISTRY: dict[tuple[str, str], Builder] = {}
_DEFAULT: dict[str, str] = {}


def register(primitive: str, name: str, *, default: bool = False):
    """Decorator: make ``builder`` available as ``algorithm=name`` for ``primitive``."""
    def deco(builder: Builder) -> Builder:
        _REGISTRY[(primitive, name)] = builder
        if default:
            _DEFAULT[primitive] = name
        return builder
    return deco


def algorithms(primitive: str) -> list[str]:
    return sorted(n for p, n in _REGISTRY if p == primitive)


def lookup(primitive: str, name: str | None) -> tuple[str, Builder]:
    """The builder for ``name`` (the primitive's default when None); KeyError if unknown."""
    name = name or _DEFAULT[primitive]
    return name, _REGISTRY[(primitive, name)]
