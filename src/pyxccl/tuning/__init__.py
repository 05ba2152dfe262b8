"""Choosing an algorithm: a cost model evaluated on the schedules themselves
(cost.py), link figures measured on this machine (``pyxccl/probe.py``, figures.py) and kept in a
checked file (linkcache.py), and the argmin with its explanation (select.py)."""
from .cost import Estimate, Link, Machine, estimate
from .select import Tuner

__all__ = ["Estimate", "Link", "Machine", "estimate", "Tuner"]
