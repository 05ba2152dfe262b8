"""Algorithms, one module per family; importing this package registers them all."""
from . import direct, ring, tree  # noqa: F401  (registration side effects)
from .registry import algorithms, lookup, register

__all__ = ["algorithms", "lookup", "register"]
