"""Test helpers that ship with pyxccl: a pool of rank processes that runs
functions on every rank (so test suites start Python once, not per test)."""
from .pool import RankError, RankPool

__all__ = ["RankPool", "RankError"]
