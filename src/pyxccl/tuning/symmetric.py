"""Symmetric mode: ranks that do the same thing at the same time are simulated once.

Many schedules look the same from every host: the ring's rank r + L does what rank r does,
with every peer moved on by L (L ranks per host); halving-doubling's rank r XOR kL does what
r does with every peer XOR kL. When a cluster is symmetric too (every host alike, and a fat
tree, or a ring of hosts for shifts of messages to the next host at most; a torus or a dragonfly
of hosts is not, and is never folded: ``sim/simulate.py``), host h runs host 0's schedules moved by h, at the same
times. So only host 0's ranks are walked: a message to another host's rank is delivered to
the host-0 rank that stands where it stands (``rep``), on the channel named by what the move
keeps unchanged (``key``), and every host's NICs and links are host 0's.

Whether an algorithm has such a symmetry is not assumed. :func:`find` proves it: the schedules of
several other hosts (the next, the last, the middle one) are built and must equal host 0's moved
(same steps, operations, peers and reduce flags; counts within one element or 1%, as uneven
chunks differ). The tuner asks :func:`fold` instead: an algorithm may declare the moves it can
have (``registry.Algorithm.symmetry``), and a declared move is then checked on three ranks of
other hosts only (:func:`spot_ranks`: the first of host 1, the last rank, one of the middle host),
not on four hosts' every rank; where nothing declared holds there, :func:`find` decides, so a
wrong declaration costs time, not a wrong fold. ``tests/test_tuner_symmetry.py`` checks over many
layouts (powers of two or not, one to eight ranks a host) and sizes that the declared answer is
``find``'s and that every rank of every host is then host 0's moved. The simulator
(``sim/simulate.py``) and ``fast.message_level`` prove with ``find``. A schedule without either
symmetry (trees, rooted collectives) runs at message level only.
"""
from __future__ import annotations

from ..schedule import Copy, Get, Post, Put, Schedule, Sync


class Shift:
    """Rank r of host h is host 0's rank r - hL, every peer moved by the same."""
    name = "shift"

    def __init__(self, nranks: int, per_host: int):
        self.n, self.p = nranks, per_host

    def rep(self, r: int) -> int:
        return r % self.p

    def key(self, a: int, b: int):
        return a % self.p, (b - a) % self.n

    def mover(self, h: int):
        d = h * self.p
        return lambda q: (q + d) % self.n


class Xor:
    """Rank r of host h is host 0's rank r XOR hL (hosts and ranks per host powers of two)."""
    name = "xor"

    def __init__(self, nranks: int, per_host: int):
        self.n, self.p = nranks, per_host

    def rep(self, r: int) -> int:
        return r % self.p

    def key(self, a: int, b: int):
        return a % self.p, a ^ b

    def mover(self, h: int):
        d = h * self.p
        return lambda q: q ^ d

    @staticmethod
    def applies(hosts: int, per_host: int) -> bool:
        return hosts & (hosts - 1) == 0 and per_host & (per_host - 1) == 0


def _close(a: int, b: int) -> bool:
    return abs(a - b) <= max(1, 0.01 * max(a, b))


def _same(s: Schedule, t: Schedule, move) -> bool:
    """``s`` is ``t`` moved by ``move`` (peers), up to the uneven chunks' element."""
    if len(s.steps) != len(t.steps) or s.segment or t.segment:
        return False
    for a, b in zip(s.steps, t.steps):
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if type(x) is not type(y) or type(x) in (Get, Put, Post, Sync) or not _close(x.count, y.count):
                return False
            if type(x) is Copy:
                if x.reduce != y.reduce:
                    return False
            elif x.peer != move(y.peer) or getattr(x, "reduce", False) != getattr(y, "reduce", False):
                return False
    return True


_NOT_SAME = "its schedules are not the same on every host, moved (no shift or XOR symmetry)"


def sample_hosts(hosts: int) -> list[int]:
    return sorted({h for h in (1, hosts - 1, hosts // 2, hosts // 3) if 0 < h < hosts})


KINDS = {"shift": Shift, "xor": Xor}


def _moves(hosts: int, per_host: int, ring_of_hosts: bool, names=tuple(KINDS)) -> list:
    """The moves of ``names`` that can hold on this layout, in ``find``'s order: a shift always; XOR
    between hosts of a fat tree, hosts and ranks per host powers of two."""
    return [k for name, k in KINDS.items()
            if name in names and (k is Shift or (not ring_of_hosts and Xor.applies(hosts, per_host)))]


def find(build, hosts: int, per_host: int, ring_of_hosts: bool, exact: bool = False):
    """(symmetry, host 0's schedules) of the algorithm ``build(rank)``, or (None, reason). ``exact``: the
    counts must be equal, not only close (what deriving every rank's schedule needs: ``compact.all_ranks``).
    The comparison is ``_same``'s, on the arrays of ``compact.py`` (``compact.same_moved``)."""
    if hosts < 2:
        return None, "one host: nothing to fold"
    n = hosts * per_host
    first, other = build(0), build(per_host)
    if [len(st) for st in first.steps] != [len(st) for st in other.steps]:
        return None, _NOT_SAME          # host 1's first rank is not host 0's moved: no need to build more
    kinds = _moves(hosts, per_host, ring_of_hosts)
    from . import compact
    if not (first.segment or other.segment):
        # the moves under which host 1's first rank is host 0's first (host 1 is the first sample: a move
        # that fails here fails there), before building host 0's every rank: a tree's do not fold
        try:
            one, moved = compact.convert([first], written=True), compact.convert([other], written=True)
        except TypeError:
            return None, _NOT_SAME
        kinds = [k for k in kinds if compact.same_moved(moved, one, k(n, per_host), 1, per_host, exact)]
        if not kinds:
            return None, _NOT_SAME
    reps = [build(r) for r in range(per_host)]
    if any(s.segment for s in reps):
        return None, "segment schedules run on one host"
    try:
        base = compact.convert(reps, written=True)
    except TypeError:       # Get, Put, Post or Sync in a message schedule: _same says no
        return None, _NOT_SAME
    # one sample host at a time, the kinds still standing checked on it: a schedule that is not the same
    # on the next host (a rooted collective's) costs one more host's schedules, not all the samples'
    for h in sample_hosts(hosts):
        try:
            a = compact.convert([build(h * per_host + j) for j in range(per_host)], written=True)
        except TypeError:
            return None, _NOT_SAME
        kinds = [k for k in kinds if compact.same_moved(a, base, k(n, per_host), h, per_host, exact)]
        if not kinds:
            break
    if kinds:
        return kinds[0](n, per_host), reps
    return None, _NOT_SAME


def spot_ranks(hosts: int, per_host: int) -> list[int]:
    """The ranks :func:`declared` checks: the first of host 1, the last of the last host, one in the
    middle host (where a remainder, a power of two's end or a rooted tree's branch shows first)."""
    n = hosts * per_host
    cand = (per_host, n - 1, (hosts // 2) * per_host + per_host // 2)
    return [r for r in dict.fromkeys(cand) if r >= per_host]


def declared(kinds, build, hosts: int, per_host: int, ring_of_hosts: bool, part=None, probe: bool = False):
    """(symmetry, host 0's schedules) from the moves an algorithm declares (``registry.Algorithm.symmetry``),
    each checked on the :func:`spot_ranks` only (one schedule each, not four hosts' of ``find``), the
    first that holds, in ``find``'s order; None when nothing is declared or nothing holds there (the
    caller then proves it with ``find``: a wrong declaration costs time, not a wrong fold). ``part(ranks)``:
    the arrays of some ranks' schedules (``compact.convert``'s, in the order written) made without
    building them, or None: where it gives them, host 0's are given as those arrays. ``probe``: the move
    is likely not to hold (a ring at fewer elements than ranks): it is checked on host 1's first rank alone
    before host 0's ranks are made."""
    if hosts < 2 or not kinds:
        return None
    kinds = _moves(hosts, per_host, ring_of_hosts, kinds)
    if not kinds:
        return None
    from . import compact
    n = hosts * per_host
    spots = spot_ranks(hosts, per_host)
    if part is not None and part((0,)) is not None:
        if probe:       # host 1's first rank against rank 0 first (``part`` joins them to the others' after)
            first = part((per_host,))
            kinds = [k for k in kinds if compact.same_moved(first, part((0,)), k(n, per_host), 1, per_host)]
            if not kinds:
                return None
        # host 0's ranks and the spots made at once (the spots are on other hosts: after host 0's)
        spots = sorted(spots)
        both = part((*range(per_host), *spots))
        host0 = both.take(0, per_host)
        for i, r in enumerate(spots):
            got, rep = both.take(per_host + i, per_host + i + 1), host0.take(r % per_host, r % per_host + 1)
            kinds = [k for k in kinds if compact.same_moved(got, rep, k(n, per_host), r // per_host, per_host)]
        return (kinds[0](n, per_host), host0) if kinds else None
    try:
        # spot by spot, the moves still standing checked on each: where none holds (a ring at a few bytes),
        # it stops having built a spot and its rank of host 0, not host 0's every rank
        for r in spots:
            got, rep = compact.convert([build(r)], written=True), compact.convert([build(r % per_host)], written=True)
            kinds = [k for k in kinds if compact.same_moved(got, rep, k(n, per_host), r // per_host, per_host)]
            if not kinds:
                return None
        reps = [build(r) for r in range(per_host)]
        if any(s.segment for s in reps):
            return None
        compact.convert(reps, written=True)     # kept on the schedules: what the walk converts again
    except TypeError:       # Get, Put, Post or Sync in a message schedule: not foldable
        return None
    return kinds[0](n, per_host), reps


def fold(kinds, build, hosts: int, per_host: int, ring_of_hosts: bool, part=None, probe: bool = False):
    """``find``'s answer, by way of :func:`declared` where the algorithm declares its moves and they
    hold on the spot ranks (``tests/test_tuner_symmetry.py``: the same answer over many layouts); host 0's
    schedules as arrays where ``part`` gives them (:func:`declared`, and its ``probe``)."""
    got = declared(kinds, build, hosts, per_host, ring_of_hosts, part, probe)
    if got is not None:
        return got
    if hosts > 1 and kinds and _moves(hosts, per_host, ring_of_hosts, kinds) == _moves(hosts, per_host, ring_of_hosts):
        # every move find would try was declared and failed on a spot rank, a rank of a host find samples: find
        # would fail too (and at a few elements a rank, build every rank of five hosts to find it)
        return None, _NOT_SAME
    return find(build, hosts, per_host, ring_of_hosts)
