"""(primitive, algorithm name) -> the algorithm's record: its schedule builder and where it runs.

A builder is ``f(rank, nranks, **args) -> Schedule``; the arguments per
primitive are described in ``pyxccl.primitives``. Builders that also take
``hosts`` (the host index of every rank) get it: that is how hierarchical
algorithms see the topology. Segment algorithms (``segment=True``) build
segment schedules, which run on the shared segment of one host's ranks; their
builders take ``window`` (an ``algorithms.segment.Window``: what the segment holds
for this call).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Callable

from ..schedule import Schedule

Builder = Callable[..., Schedule]


@dataclass(frozen=True)
class Algorithm:
    """An algorithm and the facts about it that other layers act on (the argument checks, the
    planner, compression): said here, where the algorithm is registered, not in name lists there."""
    primitive: str
    name: str
    build: Builder
    segment: bool = False         # runs on the host's shared segment (its schedules are segment schedules)
    wants_hosts: bool = False     # host-aware: its builder takes every rank's host (hierarchical)
    equal_blocks: bool = False    # needs every rank's block equal (refused for alltoallv)
    root_counts: bool = False     # runs when each rank knows only its own count (gatherv, scatterv)
    settles: bool = False         # compressed, every rank ends with the same quantized bits by construction
    runs_on: Callable[[int], bool] | None = None    # the numbers of ranks it can run on (None: any)
    # the moves under which its schedules may be the same on every host of a layout of hosts alike
    # ("shift", "xor": tuning/symmetric.py), for the tuner's fold: a claim checked there on a few
    # ranks (and proven by tests/test_tuner_symmetry.py over many layouts), not an assumption
    symmetry: tuple[str, ...] = ()
    # every rank r sends to r + d (mod n) what rank 0 sends to d, within one element a message of rank 0's
    # (the calls the tuner prices: blocks of one size, chunks of split_counts, empty ones left out): a
    # host's traffic to the others follows from rank 0's schedule alone (tuning/bound.py's host_link;
    # checked on a rank there, proven by tests/test_tuner_bound.py)
    rotates: bool = False
    # a segment schedule whose ranks are alike but for a rooted call's root: every rank's rounds are another's
    # with the windows moved by its rank, within one element a block: the tuner walks a few ranks and the
    # root for all (tuning/cost.py's SpotTiming; its estimate against every rank's walk: tests/test_tuner_spots.py)
    alike: bool = False
    # a chain: the rank at position i from the root (root + i) receives first from position i - 1 a block it
    # sends on to i + 1 in a later step, so the first block crosses the n - 1 hops one after another
    # (tuning/bound.py's relay; checked there on the last position, proven by tests/test_tuner_bound.py)
    relay: bool = False
    # ((builder, symmetry), ...): phases whose builders, run one after the other on a rank, make its schedule:
    # the tuner prices them apart, one after the other (a ring phase folded; tuning/select.py's _phase_estimate;
    # against every rank's walk of the whole: tests/test_tuner_fold.py)
    phases: tuple = ()

    def parts(self) -> list["Algorithm"]:
        """Its ``phases`` as algorithms of their own, named "name/builder"."""
        return [replace(self, name=f"{self.name}/{build.__name__}", build=build, symmetry=tuple(sym), phases=())
                for build, sym in self.phases]

    def runs(self, nranks: int) -> bool:
        """Whether it can run on ``nranks`` ranks at all (its builder raises ValueError where not)."""
        return self.runs_on is None or self.runs_on(nranks)

    def schedule(self, rank: int, nranks: int, *, hosts=None, window=None, **args) -> Schedule:
        """This rank's schedule, passing ``hosts`` and ``window`` only to builders that use them."""
        if self.wants_hosts:
            args["hosts"] = hosts
        if self.segment:
            args["window"] = window
        s = self.build(rank, nranks, **args)
        if self.segment:        # every rank of a segment call has the same arguments (blocks of one size)
            s.peers = lambda peer: self.build(peer, nranks, **args)
        return s


#: ``Algorithm.symmetry`` of the algorithms whose schedules are the same on every host moved by a shift of
#: ranks per host (rings, pairwise exchanges, hierarchical layouts), and of those whose partners are found
#: by XOR (recursive doubling and halving: XOR on hosts and ranks per host that are powers of two; shift
#: where the two moves coincide, two hosts or one rank a host, which ``symmetric.find`` tries first)
SHIFT, SHIFT_XOR = ("shift",), ("shift", "xor")

_REGISTRY: dict[tuple[str, str], Algorithm] = {}
_DEFAULT: dict[str, str] = {}
_IDS: dict[str, int] = {}      # algorithm name -> small number carried in call fingerprints
# Old names still accepted for algorithm= and PYXCCL_ALGO: "shm" was the segment algorithm's name, which
# is also the memfd transport's and a link class's
ALIASES = {"shm": "segment"}


def register(primitive: str, name: str, *, default: bool = False, segment: bool = False, equal_blocks: bool = False,
             root_counts: bool = False, settles: bool = False, runs_on: Callable[[int], bool] | None = None,
             symmetry: tuple[str, ...] = (), rotates: bool = False, alike: bool = False, relay: bool = False,
             phases: tuple = ()):
    """Decorator: make ``builder`` available as ``algorithm=name`` for ``primitive``, with the facts
    of :class:`Algorithm` (a builder that takes ``hosts`` is host-aware)."""
    def deco(builder: Builder) -> Builder:
        _REGISTRY[(primitive, name)] = Algorithm(primitive, name, builder, segment,
                                                 "hosts" in inspect.signature(builder).parameters,
                                                 equal_blocks, root_counts, settles, runs_on, tuple(symmetry),
                                                 rotates, alike, relay, tuple(phases))
        _IDS.clear()
        if default:
            _DEFAULT[primitive] = name
        return builder
    return deco


def algorithms(primitive: str) -> list[str]:
    """The names ``primitive`` can run (canonical names only, no aliases)."""
    return sorted(n for p, n in _REGISTRY if p == primitive)


def primitives() -> list[str]:
    """The primitives with algorithms (the names ``algorithm=`` and PYXCCL_ALGO choose for)."""
    return sorted({p for p, _ in _REGISTRY})


def records(primitive: str) -> list[Algorithm]:
    """The records of ``primitive``'s algorithms, by name."""
    return [_REGISTRY[(primitive, n)] for n in algorithms(primitive)]


def canonical(name: str | None) -> str | None:
    """``name``, or the algorithm it is an old name of (``ALIASES``)."""
    return ALIASES.get(name, name) if isinstance(name, str) else name


def lookup(primitive: str, name: str | None) -> Algorithm:
    """The record of ``name`` or of the algorithm it is an alias of (the primitive's default when None);
    KeyError if unknown. The record carries the canonical name."""
    return _REGISTRY[(primitive, canonical(name) or _DEFAULT[primitive])]


def default(primitive: str) -> str:
    return _DEFAULT[primitive]


def algorithm_id(name: str) -> int:
    """A number for ``name``, the same in every process that registered the same algorithms."""
    if not _IDS:
        _IDS.update({n: i + 1 for i, n in enumerate(sorted({n for _, n in _REGISTRY}))})
    return _IDS.get(canonical(name), 0)


def algorithm_name(ident: int) -> str:
    algorithm_id("")
    return next((n for n, i in _IDS.items() if i == ident), f"#{ident}")
