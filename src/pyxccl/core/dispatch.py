"""Dispatch: what a call shape runs, decided once (its ``Plan``), by the communicator's ``Planner``.

A call shape is (primitive, dtype, size bucket, op, root, algorithm asked
for). Its plan holds the algorithm that shape runs (the one asked for, else
``PYXCCL_ALGO``'s, else the tuner's choice for the bucket, else the default),
how it runs here (over messages, or as rounds on the one-host segment), the
bound reduction, and the fingerprint words its calls share; the schedules of
the exact sizes seen are kept on it, the most recent few.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from .. import _env
from .._errors import InvalidArgumentError
from ..algorithms import registry
from ..algorithms.segment import Window
from ..compression.policy import compressed_algorithm
from ..ops import ReduceOp, reducer
from ..primitives import Call, call_word, size_word
from . import messages, onehost

_SCHEDULES_PER_PLAN = 16
_SCHEDULES = 256          # per communicator, over all its plans: calls of ever new sizes turn them over


def bucket(nbytes: int) -> int:
    """The power of two a size is chosen for (at least 8 bytes)."""
    return 1 << max(3, (max(1, nbytes) - 1).bit_length())


class Plan:
    """One call shape, prepared."""

    def __init__(self, planner: "Planner", primitive: str, algo: registry.Algorithm, dtype: np.dtype, op, root,
                 codec=None):
        ctx = self.ctx = planner.ctx
        self.planner, self.primitive, self.algo, self.dtype, self.op, self.root = planner, primitive, algo, dtype, op, root
        # compression (a pyxccl.compression Quantizer): every message of the schedule travels encoded,
        # except inside a host in a hierarchical algorithm (the fast links there)
        self.codec = codec
        self.compressed = None if codec is None else frozenset(
            r for r in range(ctx.size) if r != ctx.rank and (not algo.wants_hosts
                                                            or ctx.hosts[r] != ctx.hosts[ctx.rank]))
        self.label = algo.name if codec is None else f"{algo.name}+{codec.spec}"
        self.reduce = reducer(op) if op is not None else None
        self.avg = op is ReduceOp.AVG and (root is None or root == ctx.rank)     # divide where the sum lands
        self.execute = onehost.run if algo.segment else messages.run
        self.codes = onehost.native_codes(dtype, op) if algo.segment else None    # runs natively (C)?
        seg = ctx.segment
        self.window = Window.of(seg.area, dtype.itemsize, seg.cma, seg.pipelined) if algo.segment else None
        self.algorithm_id = registry.algorithm_id(algo.name)
        self._schedules: OrderedDict = OrderedDict()
        self._w0: dict[str, int] = {}           # call name -> first fingerprint word
        self._sizes: dict = {}                  # (schedule key, agreed size?) -> the size part of the second

    def schedule(self, key, args: dict):
        """This rank's schedule for builder arguments ``args`` (``key``: a hashable form of them)."""
        s = self._schedules.get(key)
        if s is None:
            s = self.algo.schedule(self.ctx.rank, self.ctx.size, hosts=self.ctx.hosts, window=self.window, **args)
            s = self.planner.made(self, key, s)
        return s

    def words(self, name: str, key, size, thread: int) -> tuple[int, int]:
        """The fingerprint words of a call ``name`` of this plan (``size``: what it says of the counts;
        ``thread``: the issuing thread's digest, 0 when not checked)."""
        w0 = self._w0.get(name)
        if w0 is None:
            w0 = self._w0[name] = call_word(name, self.op, self.dtype, self.algorithm_id, self.root,
                                            self.codec and self.codec.spec)
        k = (key, size is None)
        w1 = self._sizes.get(k)
        if w1 is None:
            w1 = self._sizes[k] = size_word(size, 0)
            if len(self._sizes) > 4 * _SCHEDULES_PER_PLAN:
                self._sizes.clear()
        return w0, w1 | (thread & 0xFFFF) << 48

    def call(self, name: str, size, thread: str) -> Call:
        """The description of a call of this plan (for errors)."""
        return Call(name, self.dtype, size, self.root, self.op, self.label, thread)

    def run(self, s, bufs: dict, seq: int, words, op: str, deadline: float, codec=None) -> None:
        """Run schedule ``s`` on ``bufs`` (scratch included, as "tmp"); ``codec``: the call's own
        compressor (the plan's has the same spec, but a compressor may carry state: INT8's random
        stream). A prepared call (core/prepared.py) runs it, and divides for AVG; a plan with native
        ``codes`` it runs as its compiled program instead."""
        codec = self.codec if codec is None else codec
        if codec is not None:
            messages.run(self.ctx, s, bufs, self.reduce, seq, words, op, deadline, self.dtype, codec,
                         self.compressed)
            if self.primitive == "allreduce" and not self.algo.settles:
                # A rank may hold a sum it never sent as the others saw it (recursive doubling, a tree's
                # root): every rank quantizes its result once more and holds the same bits (an
                # elementwise code is idempotent: v and its round trip end equal)
                np.copyto(bufs["out"], codec.round_trip(bufs["out"]))
        elif self.reduce is None:
            self.execute(self.ctx, s, bufs, None, seq, words, op, deadline, self.dtype)
        else:
            with np.errstate(all="ignore"):     # overflow saturates or wraps, as in NCCL and MPI
                self.execute(self.ctx, s, bufs, self.reduce, seq, words, op, deadline, self.dtype)


class Planner:
    """The plans of one communicator, by call shape."""

    def __init__(self, ctx, forced: dict | None = None):
        self.ctx = ctx
        # PYXCCL_ALGO as it was when the communicator was made (a later planner keeps it)
        self.forced = _parse_algo_env(os.environ.get("PYXCCL_ALGO", "")) if forced is None else forced
        self._plans: dict[tuple, Plan] = {}
        self._auto: dict[tuple, object] = {}        # compression="auto"'s choices, per size bucket
        self._made: OrderedDict = OrderedDict()     # (plan, schedule key) of the schedules made, oldest first
        self._lock = threading.Lock()               # threads may make plans and schedules at once

    def made(self, plan: Plan, key, s):
        """A plan made schedule ``s``: kept (the one of a thread that made it first wins); past
        ``_SCHEDULES_PER_PLAN`` in a plan or ``_SCHEDULES`` in all, the oldest are dropped."""
        with self._lock:
            s = plan._schedules.setdefault(key, s)
            if len(plan._schedules) > _SCHEDULES_PER_PLAN:
                self._made.pop((plan, next(iter(plan._schedules))), None)
                plan._schedules.popitem(last=False)
            self._made[(plan, key)] = None
            while len(self._made) > _SCHEDULES:
                (old, k), _ = self._made.popitem(last=False)
                old._schedules.pop(k, None)
        return s

    def plan(self, primitive: str, dtype: np.dtype, nbytes: int, op=None, root=None, algorithm=None,
             error=InvalidArgumentError, codec=None) -> Plan:
        key = (primitive, dtype, bucket(nbytes), op, root, algorithm, codec and codec.spec)
        p = self._plans.get(key)
        if p is None:
            self.ctx.usable(primitive)      # closed or failed: say so, not that the segment is gone
            algo = self.choose(primitive, dtype, nbytes, algorithm, error, codec=codec)
            made = Plan(self, primitive, algo, dtype, op, root, codec)
            with self._lock:
                p = self._plans.setdefault(key, made)
        return p

    def choose(self, primitive: str, dtype: np.dtype, nbytes: int, algorithm=None,
               error=InvalidArgumentError, codec=None) -> registry.Algorithm:
        """The algorithm for a call: asked for, else PYXCCL_ALGO's, else the tuner's, else the default.
        A compressed call runs a message algorithm (compression is of messages): the one asked for,
        else the hierarchical one across hosts (it compresses only there), else ring."""
        if codec is not None:
            name = algorithm or compressed_algorithm(self.ctx, primitive)
        else:
            name = algorithm or self.forced.get(primitive)
            if algorithm is None and name is not None and self.ctx.segment is None \
                    and name in registry.algorithms(primitive) and registry.lookup(primitive, name).segment:
                name = None      # PYXCCL_ALGO asks for the segment where there is none (yet): choose as usual
            tuner = self.ctx.tuner
            if name is None and tuner is not None:
                name = tuner.choose(primitive, bucket(nbytes), dtype.itemsize)
            elif name is None and self.ctx.setting_up:
                name = SETUP.get(primitive)
            elif name is None and self.ctx.size == 1 and self.ctx.segment is not None:
                name = "segment"    # one rank: a copy or nothing, in one C call (no tuner to ask: nothing to tune)
        try:
            algo = registry.lookup(primitive, name)
        except KeyError:
            raise error(f"no algorithm {name!r} for {primitive}; known: "
                        + ", ".join(registry.algorithms(primitive))) from None
        if codec is not None and algo.segment:
            raise error(f"algorithm {name!r} runs on the shared segment, where data moves by reads, not "
                        f"messages: it cannot compress; ask for a message algorithm (ring, hierarchical, ...)")
        if codec is not None and not codec.elementwise and not algo.settles and primitive == "allreduce":
            settle = [a.name for a in registry.records(primitive) if a.settles]
            raise error(f"{codec.spec} quantizes blocks of each message; {name!r} cuts the vector anew from hop "
                        f"to hop and the ranks would end with different bits: use {' or '.join(settle)}, or "
                        f"fp16/bf16")
        if algo.segment and self.ctx.segment is None:
            raise error(f"algorithm {algo.name!r} runs on the shared segment of ranks that all share one host; "
                        f"this communicator has none (ranks on several hosts, PYXCCL_TRANSPORT=tcp, or one rank)")
        return algo

    def auto_compression(self, primitive: str, nbytes: int):
        """``compression="auto"``: the compressor the cost model says pays for this call, or None."""
        key = (primitive, bucket(nbytes))
        if key not in self._auto:
            from ..compression.policy import choose
            self._auto.setdefault(key, choose(self.ctx, primitive, key[1]))
        return self._auto[key]

    def usable(self, primitive: str) -> list[str]:
        recs = (registry.lookup(primitive, n) for n in registry.algorithms(primitive))
        return [a.name for a in recs if (self.ctx.segment is not None or not a.segment) and a.runs(self.ctx.size)]


# A communicator's set-up (its segment, its link figures) gathers small objects before it has a
# tuner: it takes the algorithms with the fewest rounds (ceil(log2 n), where ring's default takes
# n-1), so what every rank learns at init costs O(log n) rounds.
SETUP = {"allgather": "bruck"}


def _parse_algo_env(spec: str) -> dict[str, str]:
    """PYXCCL_ALGO="allreduce=ring,allgather=ring" -> {"allreduce": "ring", ...}; a part that is no
    primitive=algorithm pair of known names is an InvalidArgumentError (not a setting silently dropped)."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        prim, _, name = (s.strip() for s in part.partition("="))
        if prim not in registry.primitives():
            why = f"{prim!r}, no primitive (give primitive=algorithm pairs: {', '.join(registry.primitives())})"
        elif registry.canonical(name) not in registry.algorithms(prim):
            why = f"{name!r}, no algorithm of {prim} ({', '.join(registry.algorithms(prim))})"
        else:
            out[prim] = name
            continue
        raise _env.refused("PYXCCL_ALGO", spec, f"asks for {why}")
    return out
