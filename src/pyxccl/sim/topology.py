"""What connects the hosts of a modelled cluster, and the route a transfer takes between two of them:
the directed links it holds, one per hop (``ClusterNet.route`` adds the hosts' NICs). The C core
(``tuning/_simcore.c``, ``route``) computes the same routes; ``tests/test_sim_core.py`` holds it to them.

- ``fattree``: full bisection, no link between hosts is shared (only the NICs are).
- ``ring`` of hosts: the shorter way round (forward on a tie), each link between neighbours one hop;
  with two hosts there is no link beyond the NICs.
- ``torus2d`` / ``torus3d``: hosts on a grid of ``dims`` with wrap-around links; host h has the
  coordinates of h in row-major order (the last dimension varies fastest, so hosts h and h + 1 are
  neighbours inside a row). Dimension-ordered routing: the first dimension is corrected first,
  each the shorter way round (forward on a tie), one hop per link: a shortest path, as many hops
  as the Manhattan distance with wrap-around.
- ``dragonfly``: ``groups`` groups of ``hosts / groups`` consecutive hosts (a); inside a group every
  pair of hosts has a link, and every pair of groups one global link. The global link between
  groups g1 and g2 is attached in g1 to host ``g2 mod a`` of the group (and in g2 to ``g1 mod a``).
  Minimal routing: a local hop to the gateway (when the source is not it), the global hop, a local
  hop to the destination (when the gateway is not it): at most 3 hops, 1 inside a group, the
  shortest path with one global hop. (With small groups, fewer hosts than a group has global links,
  a path through a third group can be a hop shorter; minimal routing, as dragonflies route without
  congestion, does not take it.)

Links are directed: each direction is a resource of its own (one transfer at a time on each).
"""
from __future__ import annotations

from math import prod

from .._errors import InvalidArgumentError

TOPOLOGIES = ("fattree", "ring", "torus2d", "torus3d", "dragonfly")
TORUS_DIMS = {"torus2d": 2, "torus3d": 3}


def square_dims(hosts: int, ndim: int) -> tuple[int, ...]:
    """The most square factorization of ``hosts`` into ``ndim`` factors, largest first (the smallest
    largest factor, then the largest smallest one).

    >>> square_dims(16, 2), square_dims(12, 2), square_dims(16, 3), square_dims(7, 2)
    ((4, 4), (4, 3), (4, 2, 2), (7, 1))
    """
    best = None

    def walk(left: int, k: int, most: int, got: tuple):
        nonlocal best
        if k == 1:
            if left <= most:
                dims = got + (left,)
                key = (max(dims), -min(dims))
                if best is None or key < best[0]:
                    best = (key, dims)
            return
        for f in range(min(most, left), 0, -1):
            if left % f == 0:
                walk(left // f, k - 1, f, got + (f,))
    walk(hosts, ndim, hosts, ())
    return best[1]


def check_dims(topology: str, hosts: int, dims) -> tuple[int, ...]:
    """The torus's ``dims`` (default: ``square_dims``), checked against ``hosts``."""
    ndim = TORUS_DIMS[topology]
    if not dims:
        return square_dims(hosts, ndim)
    dims = tuple(int(d) for d in dims)
    if len(dims) != ndim or min(dims) < 1 or prod(dims) != hosts:
        raise InvalidArgumentError(
            f"{topology} of {hosts} hosts: dims {dims} do not multiply to the hosts; give {ndim} dimensions whose "
            f"product is {hosts} (e.g. dims={square_dims(hosts, ndim)}, --dims "
            f"{'x'.join(map(str, square_dims(hosts, ndim)))}) or leave dims out for that", op="sim")
    return dims


def check_groups(hosts: int, groups: int) -> int:
    """The dragonfly's ``groups`` (default: the most square split of the hosts), checked."""
    if not groups:
        return square_dims(hosts, 2)[0]
    if groups < 1 or hosts % groups:
        raise InvalidArgumentError(f"dragonfly of {hosts} hosts: {groups} groups do not divide them; give groups "
                                   f"that divide the hosts (e.g. groups={square_dims(hosts, 2)[0]})", op="sim")
    return groups


def coords(h: int, dims: tuple[int, ...]) -> list[int]:
    """Host ``h``'s place on the torus (row-major: the last dimension varies fastest)."""
    out = []
    for d in reversed(dims):
        out.append(h % d)
        h //= d
    return out[::-1]


def _step(fwd: int, size: int) -> int:
    return 1 if fwd <= size - fwd else -1


def ring_hops(ha: int, hb: int, hosts: int) -> list[tuple]:
    """("hop", host, +1 or -1): the link leaving ``host`` that way."""
    if hosts <= 2:
        return []
    step, h, out = _step((hb - ha) % hosts, hosts), ha, []
    while h != hb:
        out.append(("hop", h, step))
        h = (h + step) % hosts
    return out


def torus_hops(ha: int, hb: int, dims: tuple[int, ...]) -> list[tuple]:
    """("torus", host, dimension, +1 or -1): the link leaving ``host`` along that dimension, that way."""
    x, want = coords(ha, dims), coords(hb, dims)
    stride = [prod(dims[k + 1:]) for k in range(len(dims))]
    h, out = ha, []
    for k, size in enumerate(dims):
        if x[k] == want[k]:
            continue
        step = _step((want[k] - x[k]) % size, size)
        while x[k] != want[k]:
            out.append(("torus", h, k, step))
            nxt = (x[k] + step) % size
            h += (nxt - x[k]) * stride[k]
            x[k] = nxt
    return out


def dragonfly_hops(ha: int, hb: int, hosts: int, groups: int) -> list[tuple]:
    """("local", from host, to host) inside a group, ("global", from group, to group) between groups."""
    a = hosts // groups
    ga, gb = ha // a, hb // a
    if ga == gb:
        return [("local", ha, hb)] if ha != hb else []
    out, gw_a, gw_b = [], ga * a + gb % a, gb * a + ga % a
    if ha != gw_a:
        out.append(("local", ha, gw_a))
    out.append(("global", ga, gb))
    if gw_b != hb:
        out.append(("local", gw_b, hb))
    return out


def hops(c, ha: int, hb: int) -> list[tuple]:
    """The links a transfer from host ``ha`` to host ``hb`` of cluster ``c`` holds, in order."""
    if ha == hb or c.topology == "fattree":
        return []
    if c.topology == "ring":
        return ring_hops(ha, hb, c.hosts)
    if c.topology == "dragonfly":
        return dragonfly_hops(ha, hb, c.hosts, c.groups)
    return torus_hops(ha, hb, c.dims)

