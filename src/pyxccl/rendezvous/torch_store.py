"""torch.distributed's Store seen as a pyxccl Store (for the torch backend: one rendezvous)."""
from __future__ import annotations

from datetime import timedelta

from .._errors import RendezvousError
from .base import Store


class TorchStore(Store):
    def __init__(self, store, timeout: float = 300.0):
        super().__init__(timeout)
        self.store = store

    def set(self, key, value):
        self.store.set(key, bytes(value))

    def get(self, key, timeout=None):
        try:
            self.store.wait([key], timedelta(seconds=self.timeout if timeout is None else timeout))
            return bytes(self.store.get(key))
        except RuntimeError as e:      # torch raises RuntimeError / DistStoreError on timeouts
            raise RendezvousError(f"key {key!r} did not appear in torch's store: {e}", op="store") from None

    def add(self, key, amount):
        return int(self.store.add(key, int(amount)))

    def check(self, key):
        return bool(self.store.check([key]))

    def delete_key(self, key):
        return bool(self.store.delete_key(key))
