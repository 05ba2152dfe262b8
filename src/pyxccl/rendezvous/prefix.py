"""A view of a store with every key under a prefix (to keep jobs or communicators apart)."""
from __future__ import annotations

from .base import Store


class PrefixStore(Store):
    """``store`` seen with every key turned into ``prefix + "/" + key``.

    Communicators sharing one store each use their own prefix, so their keys
    never meet. ``close()`` leaves the wrapped store open: it is shared.
    """

    def __init__(self, prefix: str, store: Store):
        super().__init__(store.timeout)
        self.prefix, self.store = prefix.rstrip("/") + "/", store

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self.prefix + key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.store.get(self.prefix + key, timeout)

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self.prefix + key, amount)

    def check(self, key: str) -> bool:
        return self.store.check(self.prefix + key)

    def delete_key(self, key: str) -> bool:
        return self.store.delete_key(self.prefix + key)

    def release(self) -> None:
        self.store.release()

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        return self.store.multi_get([self.prefix + k for k in keys], timeout)

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self.store.wait([self.prefix + k for k in keys], timeout)
