"""Algorithms, one module per family; importing this package registers every module in it."""
import importlib
import pkgutil

from .registry import algorithms, lookup, register

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["algorithms", "lookup", "register"]
