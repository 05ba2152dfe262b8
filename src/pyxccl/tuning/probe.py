"""Transitional: ``comm.py``'s ``_ready`` imports ``measure`` from here. The probing driver is
``pyxccl.probe`` (above the Communicator, which it drives); this machine's own figures are
``tuning/figures.py``. Delete this module once ``_ready`` imports ``pyxccl.probe``."""
from __future__ import annotations

import time


def measure(comm, clock=time.perf_counter):
    """``pyxccl.probe.measure``."""
    from ..probe import measure
    return measure(comm, clock)
