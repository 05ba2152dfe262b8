"""The key-value store interface ranks use to find each other."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod


class Store(ABC):
    """A key-value store shared by the ranks of a job (the rendezvous).

    Keys are ``str``, values ``bytes``. ``get`` blocks until the key exists or
    the deadline passes (then :class:`~pyxccl.RendezvousError`, naming the key
    and the store). Counters made by ``add`` hold decimal ASCII, so ``get``
    reads them too. ``timeout`` (seconds) is the default deadline of every
    blocking call.
    """

    def __init__(self, timeout: float = 300.0):
        self.timeout = float(timeout)

    @abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing any earlier value."""

    @abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` s (default: the store's) for it to be set."""

    @abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key`` (missing counts as 0); return the new value."""

    @abstractmethod
    def check(self, key: str) -> bool:
        """Whether ``key`` exists now (never blocks)."""

    @abstractmethod
    def delete_key(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        """The values of ``keys``, waiting up to ``timeout`` s in all for each to be set (as torch's
        ``Store.multi_get``). A store that can answers in one request (the TCP store does), so a rank
        learns what it needs at init in one round trip, not one per key."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return [self.get(k, max(0.0, deadline - time.monotonic())) for k in keys]

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` exists; one deadline covers them all."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        for k in keys:
            self.get(k, max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        """Close the connections this client holds idle; the next call opens one again. A job calls it
        once it has started, so the store's server holds no connection per rank while nobody asks."""

    def close(self) -> None:
        """Release the store's connections (and stop its server, if this object runs one)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
