"""Python objects between ranks: pickled, then moved by the array collectives (no state of their own)."""
from __future__ import annotations

import pickle

import numpy as np

from ._checks import Check


class ObjectCollectives:
    """``broadcast_object`` and ``allgather_object`` of a :class:`~pyxccl.Communicator`."""

    def broadcast_object(self, obj=None, root: int = 0, *, timeout=None):
        """Return rank ``root``'s ``obj`` (pickled) on every rank.

        Unpickling runs code chosen by the sender: use it within one trusted job only.
        """
        c = Check(self, "broadcast_object")
        root, _ = c.rank(root, "root"), c.timeout(timeout)
        data = c.pickled(obj) if self.rank == root else b""
        n = np.array([len(data)], np.int64)
        self.broadcast(n, root, timeout=timeout)
        buf = np.frombuffer(bytearray(data), np.uint8) if self.rank == root else np.empty(int(n[0]), np.uint8)
        self.broadcast(buf, root, timeout=timeout)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def allgather_object(self, obj, *, timeout=None) -> list:
        """Return the list of every rank's ``obj`` (pickled), in rank order."""
        c = Check(self, "allgather_object")
        c.timeout(timeout)
        data = np.frombuffer(c.pickled(obj), np.uint8)
        sizes = self.allgather(np.array([data.size], np.int64), timeout=timeout)
        out = self.allgatherv(data, None, [int(s) for s in sizes], timeout=timeout)
        off = np.concatenate([[0], np.cumsum(sizes)])
        return [pickle.loads(out[off[i]:off[i + 1]].tobytes()) for i in range(self.size)]
