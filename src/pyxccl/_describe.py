"""What a communicator says about itself: its ranks, links, topology, algorithms and settings.
A base of :class:`pyxccl.Communicator` (the API layer, with ``comm.py``)."""
from __future__ import annotations

import numpy as np


class Description:
    """The introspection part of the Communicator's API (``self._ctx``: its context)."""

    @property
    def world_ranks(self) -> list[int]:
        """The world rank of each rank of this communicator."""
        return list(self._ctx.world_ranks)

    def transport(self, peer: int) -> str:
        """How data moves to ``peer``: "shm", "tcp" or "self" (asking does not connect)."""
        return self._ctx.mesh.kind_to(self._ctx.world_ranks[peer])

    def connection(self, peer: int) -> dict:
        """How this rank reaches ``peer``: ``transport`` ("shm", "tcp", "self"), the peer's ``host``
        ("name (address)"; None for itself) and the ``connections`` of the pair (PYXCCL_NSOCKS).
        Connects to ``peer`` if nothing has yet (connections are made on first use)."""
        p = self._ctx.peer(peer)
        return dict(transport=p.kind, host=getattr(p, "host", None), connections=getattr(p, "connections", 1))

    def connections(self) -> dict:
        """How many peers this process holds a connection to, per transport ("tcp", "shm"): connections
        are made on first use, so this counts the peers this rank has exchanged messages with."""
        return self._ctx.mesh.connections()

    def link_class(self, a: int, b: int) -> str:
        """Link class between ranks ``a`` and ``b``: "self", "shm", "tcp_local" (one host) or "tcp"."""
        return self._ctx.link_class(a, b)

    @property
    def host_ranks(self) -> list[int]:
        """Ranks of this communicator on the same host as this rank (by host identity)."""
        return [r for r, h in enumerate(self._ctx.hosts) if h == self._ctx.hosts[self.rank]]

    def topology(self) -> list[dict]:
        """Per rank: its host's identity, index (in order of first rank), cores and NUMA node."""
        m, c = self._ctx.mesh, self._ctx
        return [dict(host=m.hosts[w], host_index=c.hosts[r], cores=m.cores[w], numa=m.numa[w])
                for r, w in enumerate(c.world_ranks)]

    def link_figures(self):
        """The measured figures the tuner uses (a ``pyxccl.tuning.Machine``), or None."""
        return self._ctx.mesh.machine

    def shared_segment(self):
        """The shared segment of this communicator's ranks on one host (``transport.segment``: every
        rank's window, as the one-host algorithms use them), or None where it has none. For measuring
        it (``pyxccl.sim.calibrate``); writing a window while a call runs breaks the call."""
        return self._ctx.segment

    @property
    def thread_check(self) -> bool:
        """Whether a call's fingerprint names its thread (default True), so that calls which threads
        issued in different orders on different ranks raise CollectiveMismatchError instead of pairing
        wrongly. Threads are known by name (the workers of one pool as one): matching calls must come
        from threads of one name on every rank. Turn it off where the program orders calls from several
        threads itself (the torch backend does: torch issues a group's calls from hooks and callbacks).
        """
        return self._ctx.thread_check

    @thread_check.setter
    def thread_check(self, on: bool) -> None:
        self._ctx.thread_check = bool(on)

    def algorithms(self, primitive: str) -> list[str]:
        """The algorithms ``primitive`` can run with on this communicator (``algorithm=`` values)."""
        return self._ctx.plans.usable(primitive)

    def algorithm_for(self, primitive: str, nbytes: int, dtype="float32") -> str:
        """The algorithm a ``primitive`` call of ``nbytes`` (nccl-tests' size) would run here."""
        return self._ctx.plans.choose(primitive, np.dtype(dtype), nbytes).name

    def traffic(self) -> dict[str, dict[str, int]]:
        """What this rank's calls moved since the communicator was made, per operation: ``calls``,
        ``bytes`` (payload), ``sent`` and ``received`` (what the schedules that ran sent and received,
        on one host's segment what the others read of this rank's and what it read of theirs, so
        that summed over the ranks sent equals received; see ``pyxccl/core/counters.py``; a
        compressed call's encoded sizes), and ``wire``: the bytes its
        sends handed to transports, per link class ("shm", "tcp_local", "tcp"). Take two and subtract
        for a step's.

        >>> comm.allreduce(np.ones(1 << 20, np.float32), algorithm="ring")    # doctest: +SKIP
        >>> comm.traffic()["allreduce"]["sent"]          # 2 * 4 MiB * (n - 1) / n
        """
        return self._ctx.traffic.snapshot()

    def compression_for(self, primitive: str, nbytes: int):
        """The compressor ``compression="auto"`` picks for a float32 ``primitive`` of ``nbytes`` here
        (None: the cost model says compressing costs more than it saves; see compression/policy.py)."""
        return self._ctx.plans.auto_compression(primitive, nbytes)

    def _compressors(self) -> dict:
        """The compressors this communicator's ``compression=`` spec strings named, by spec (for
        compression/collectives.py; on the context, whose close() empties it)."""
        return self._ctx.compressors

    @property
    def label(self) -> str | None:
        """A name for this communicator in its timeline lane (``PYXCCL_TRACE``), e.g. "tp"."""
        return self._ctx.label

    @label.setter
    def label(self, name: str | None) -> None:
        self._ctx.label = name

    def flight_record(self) -> list[dict]:
        """This communicator's last operations, oldest first (the flight recorder: ``PYXCCL_RECORD``,
        default 2000, are kept): seq, coll_seq, op, dtype, count, bytes, algorithm, peer, issued,
        started and ended (``time.time()`` seconds), state and error. ``PYXCCL_DUMP_DIR`` writes them
        on a failure; ``pyxccl doctor`` reads those dumps.

        >>> comm.flight_record()[-1]["op"]        # doctest: +SKIP
        'allreduce'
        """
        return self._ctx.recorder.entries()
