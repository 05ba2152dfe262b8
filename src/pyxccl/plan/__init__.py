"""The planner: what a training configuration costs in communication, per rank and step.

Give a model (``load_model``: a preset or a TOML file), a layout (``Layout``: DP, TP, PP, EP, SP,
ZeRO) and hardware (``hardware.load``: a preset or a TOML file; ``hardware.measured()``: this
machine); ``estimate`` lists every primitive the step calls with its count, bytes, link class and
time on the algorithm pyxccl's tuner would choose there (the simulator, ``pyxccl.sim``), and says
when communication exceeds the brief's 30% of the step. The rules are in ``traffic.py``.

>>> from pyxccl import plan
>>> p = plan.estimate(plan.load_model("gpt3-175b"), plan.Layout(dp=8, tp=8, pp=8),
...                   plan.hardware.load("dgx-a100"))                    # doctest: +SKIP
>>> print(p.table())                                                    # doctest: +SKIP
"""
from __future__ import annotations

from . import hardware
from .estimate import MFU, estimate
from .layout import Layout
from .model import Model, load_model
from .model import presets as model_presets
from .result import THRESHOLD, Plan, Row

__all__ = ["estimate", "Layout", "Model", "load_model", "model_presets", "hardware", "Plan", "Row", "MFU",
           "THRESHOLD"]
