"""Shrinking a failed world to the ranks still alive (MPI ULFM's ``MPIX_Comm_shrink``).

After a rank is lost, the survivors of a world communicator call
``comm.shrink()``. Each says it is alive in the job's store, under a key
space of this shrink (the n-th of this world); each waits until as many
ranks said so as it knows to be alive (every rank whose connection has not
ended), or until the deadline for one that is alive but does not come. The
first to be done writes the members, in the order of their old ranks; the
members connect a new mesh under the shrink's key space, and a later shrink
of the new world works the same way. The new mesh keeps the world's link
figures (measured at init, not again: the survivors' calls would wait on it),
so the new world is tuned as the world was: survivors on one host get the
segment and its algorithms. The store must survive: its server
runs in world rank 0 (``pyxccl run``), as torch elastic's rendezvous must.
"""
from __future__ import annotations

import json
import time

from .._errors import CommAbortedError, InvalidArgumentError
from ..rendezvous import PrefixStore


def shrink(ctx, timeout: float):
    """The mesh of the survivors of ``ctx``'s world (``ctx`` is the world's context)."""
    from ..transport.mesh import build_mesh
    mesh = ctx.mesh
    if ctx.parent is not None or mesh.store is None:
        raise InvalidArgumentError(f"rank {ctx.rank}: shrink() is for a world communicator made by pyxccl.init() "
                                   f"(shrink the world, then split the new one)", rank=ctx.rank, op="shrink")
    mesh.shrinks += 1
    store = PrefixStore(f"shrink/{mesh.shrinks}", mesh.store)
    me, deadline = mesh.rank, time.monotonic() + timeout
    store.set(f"alive/{me}", b"1")
    store.add("count", 1)
    while time.monotonic() < deadline:
        alive = mesh.size - sum(mesh.mailbox.lost(p) is not None for p in range(mesh.size))
        if store.add("count", 0) >= alive:
            break
        time.sleep(0.01)
    if store.add("decide", 1) == 1:
        store.set("members", json.dumps([p for p in range(mesh.size) if store.check(f"alive/{p}")]).encode())
    members = json.loads(store.get("members", timeout=max(0.1, deadline - time.monotonic())))
    if me not in members:
        raise CommAbortedError(f"rank {ctx.rank}: shrink() decided without this rank (it came after the deadline); "
                               f"the members are world ranks {members}", rank=ctx.rank, op="shrink")
    transport, master = mesh.how
    theirs = PrefixStore("mesh", store)
    new = build_mesh(theirs, members.index(me), len(members), transport=transport, master_addr=master,
                     timeout=max(0.1, deadline - time.monotonic()))
    new.store, new.how = theirs, mesh.how
    # The survivors run on the world's hosts: its measured figures still hold (the same Machine on
    # every rank, so every rank's tuner chooses alike). Without them the new world has no tuner and
    # every call runs the registry default, never the one-host segment its set-up attaches. The
    # segment's round was timed among all the world's ranks: a round among fewer is no slower.
    new.machine = mesh.machine
    return new
