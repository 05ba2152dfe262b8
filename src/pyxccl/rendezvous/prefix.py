"""A view of a store with every key under a prefix (to keep jobs or communicators apart)."""
from __future__ import annotations

from .base import Store


class PrefixStore(Store):
    def __init__(self, prefix: str, store: Store):
        super().__init__(store.timeout)
        self.prefix, self.store = prefix.rstrip("/") + "/", store

    def set(self, key, value):
        self.store.set(self.prefix + key, value)

    def get(self, key, timeout=None):
        return self.store.get(self.prefix + key, timeout)

    def add(self, key, amount):
        return self.store.add(self.prefix + key, amount)

    def check(self, key):
        return self.store.check(self.prefix + key)

    def delete_key(self, key):
        return self.store.delete_key(self.prefix + key)
