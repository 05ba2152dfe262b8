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

Builders that also take ``hosts`` (the host index of every rank) get it:
that is how hierarchical algorithms see the topology.
"""
from __future__ import annotations

import inspect
from typing import Callable

from ..schedule import Schedule

Builder = Callable[..., Schedule]
_REGISTRY: dict[tuple[str, str], Builder] = {}
_DEFAULT: dict[str, str] = {}
_WANTS_HOSTS: set[Builder] = set()


def register(primitive: str, name: str, *, default: bool = False):
    """Decorator: make ``builder`` available as ``algorithm=name`` for ``primitive``."""
    def deco(builder: Builder) -> Builder:
        _REGISTRY[(primitive, name)] = builder
        if "hosts" in inspect.signature(builder).parameters:
            _WANTS_HOSTS.add(builder)
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


def build(builder: Builder, rank: int, nranks: int, hosts=None, **args) -> Schedule:
    """Call ``builder``, passing ``hosts`` only to builders that use it."""
    if builder in _WANTS_HOSTS:
        return builder(rank, nranks, hosts=hosts, **args)
    return builder(rank, nranks, **args)
