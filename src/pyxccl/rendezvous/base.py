"""The key-value store interface ranks use to find each other."""
from __future__ import annotations

from abc import ABC, abstractmethod


class Store(ABC):
    """Keys are str, values bytes; ``get`` blocks until the key exists or the deadline passes.

    Counters made by ``add`` hold decimal ASCII, so ``get`` reads them too.
    """

    def __init__(self, timeout: float = 300.0):
        self.timeout = float(timeout)

    @abstractmethod
    def set(self, key: str, value: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes: ...

    @abstractmethod
    def add(self, key: str, amount: int) -> int: ...

    @abstractmethod
    def check(self, key: str) -> bool: ...

    @abstractmethod
    def delete_key(self, key: str) -> bool: ...

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` exists."""
        for k in keys:
            self.get(k, timeout)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
