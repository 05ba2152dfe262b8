"""The environment variables pyxccl reads, each parsed here (README.md, *Environment variables*).

A value a variable does not take is an InvalidArgumentError naming the variable, the value, what it
takes and the rank (``RANK``, where a launcher set it), raised where the variable is read: never a bare
ValueError from ``int()``, never a silent fall back to the default. An empty value is an unset one
(``PYXCCL_NT_BYTES= python ...``).

>>> import os; os.environ["PYXCCL_SHM_SLOTS"] = "two"          # doctest: +SKIP
>>> get("PYXCCL_SHM_SLOTS")                                     # doctest: +SKIP
InvalidArgumentError: PYXCCL_SHM_SLOTS='two' is not an integer from 2 (slots of each shared-memory ring)...
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ._errors import InvalidArgumentError

_FLAGS = {"0": False, "1": True, "false": False, "true": True, "no": False, "yes": True, "off": False, "on": True}


@dataclass(frozen=True)
class Integer:
    default: int | None
    low: int = 0
    high: int | None = None
    what: str = ""

    def parse(self, text: str):
        t = text.strip()
        v = int(t) if t.lstrip("-").isdecimal() else None
        if v is None or v < self.low or (self.high is not None and v > self.high):
            return None, (f"is not an integer from {self.low}" + (f" to {self.high}" if self.high is not None else "")
                          + (f" ({self.what})" if self.what else ""))
        return v, None


@dataclass(frozen=True)
class Number:
    default: float | None
    low: float = 0.0
    what: str = ""

    def parse(self, text: str):
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (v >= self.low and math.isfinite(v)):
            return None, f"is not a number from {self.low:g}" + (f" ({self.what})" if self.what else "")
        return v, None


@dataclass(frozen=True)
class Flag:
    default: bool
    what: str = ""

    def parse(self, text: str):
        v = _FLAGS.get(text.strip().lower())
        if v is None:
            return None, "is not 0 or 1 (also false/true, no/yes, off/on)" + (f" ({self.what})" if self.what else "")
        return v, None


@dataclass(frozen=True)
class Choice:
    default: str
    choices: tuple
    upper: bool = False      # compared in capitals (PYXCCL_DEBUG=info)

    def parse(self, text: str):
        v = text.strip().upper() if self.upper else text.strip()
        if v not in self.choices:
            return None, f"is not one of {', '.join(c for c in self.choices if c)}"
        return v, None


#: the variables their readers take and check themselves: paths, names and the secret as they are set,
#: PYXCCL_ALGO's pairs against the algorithms (core/dispatch.py), PYXCCL_TIMEOUT as every timeout
#: (_checks.env_timeout), PYXCCL_SOCKET_IFNAME's patterns against the interfaces (transport/topology.py);
#: PYXCCL_LAUNCHER is ``pyxccl run``'s mark on its ranks (launch_env.py)
ELSEWHERE = frozenset({"PYXCCL_ALGO", "PYXCCL_TIMEOUT", "PYXCCL_SOCKET_IFNAME", "PYXCCL_HOST_ID", "PYXCCL_SECRET",
                       "PYXCCL_LINKS", "PYXCCL_DUMP_DIR", "PYXCCL_TRACE", "PYXCCL_PEERS_DIR", "PYXCCL_LAUNCHER"})

#: every other variable, and what it takes; a default of None: the reader gives it (it depends on the
#: machine or the job)
VARIABLES = {
    "PYXCCL_TRANSPORT": Choice("auto", ("auto", "tcp", "shm")),
    "PYXCCL_SHM_SLOT_BYTES": Integer(1 << 20, 4096, what="bytes of a shared-memory ring's slot"),
    "PYXCCL_SHM_SLOTS": Integer(4, 2, what="slots of each shared-memory ring"),
    "PYXCCL_SHM_AREA_BYTES": Integer(2 << 20, 64 << 10, what="bytes of a rank's data area on the one-host fast path"),
    "PYXCCL_CMA": Flag(True, "single-copy reads and writes on the fast path"),
    "PYXCCL_NT_BYTES": Integer(None, 0, what="bytes past which copies into a call's buffers stream; 0: never"),
    "PYXCCL_NT_WINDOWS": Choice("auto", ("never", "always", "auto")),
    "PYXCCL_NATIVE": Flag(True, "the C executor and kernels"),
    "PYXCCL_SIMCORE": Flag(True, "the tuner's C walker"),
    "PYXCCL_SPIN_US": Number(1000.0, what="microseconds a wait spins"),
    "PYXCCL_YIELDS": Integer(None, 0, what="sched_yield()s a wait makes before sleeping"),
    "PYXCCL_BIND": Choice("core", ("core", "none")),
    "PYXCCL_JOB_CPUS": Integer(None, 1, what="CPUs of the host for the job"),
    "PYXCCL_RECORD": Integer(2000, 0, what="operations the flight recorder keeps"),
    "PYXCCL_DEBUG": Choice("", ("", "TRACE", "DEBUG", "INFO", "WARN", "WARNING", "ERROR"), upper=True),
    "PYXCCL_LINKS_MAX_AGE": Number(None, what="seconds cached link figures stay valid"),
    "PYXCCL_TUNE": Flag(True, "the link probe at init"),
    "PYXCCL_TUNER_SHARE": Flag(True, "one tuner table a host"),
    "PYXCCL_STORE_MAX_CONNECTIONS": Integer(None, 1, what="the store's connections at once"),
    "PYXCCL_STORE_MAX_VALUE": Integer(None, 1, what="bytes of one store value"),
    "PYXCCL_STORE_MAX_BYTES": Integer(None, 1, what="bytes the store holds"),
    "PYXCCL_NSOCKS": Integer(1, 1, 16, "TCP connections per peer pair"),
    "PYXCCL_STRIPE_BYTES": Integer(None, 1, what="bytes from which messages are striped over the connections"),
    "PYXCCL_LINK_TIMEOUT": Number(5.0, what="seconds; 0: off"),
}


def rank() -> int | None:
    """This process's rank as a launcher set it (``RANK``), for naming it in an error; None without one."""
    r = os.environ.get("RANK", "")
    return int(r) if r.isdecimal() else None


def get(name: str, default=None):
    """The value of variable ``name`` as ``VARIABLES`` says it is read; ``default`` (else the table's) when
    it is unset or empty. A value it does not take raises InvalidArgumentError."""
    spec = VARIABLES[name]
    text = os.environ.get(name, "")
    if not text.strip():
        return spec.default if default is None else default
    v, why = spec.parse(text)
    if why is not None:
        raise refused(name, text, why)
    return v


def check() -> None:
    """Every variable of ``VARIABLES`` set in the environment read once: the first value one does not take
    raises its InvalidArgumentError (``pyxccl run`` asks before it starts a rank)."""
    for name in VARIABLES:
        get(name)


def refused(name: str, text: str, why: str) -> InvalidArgumentError:
    """The error for variable ``name`` set to ``text``, which it does not take (``why``)."""
    r = rank()
    return InvalidArgumentError(f"{'' if r is None else f'rank {r}: '}{name}={text!r} {why}; fix or unset it",
                                rank=r, op="init")
