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

    def multi_get(self, keys, timeout=None):
        """torch's own ``multi_get`` (one request on its TCPStore) once every key exists; where torch has
        none, the loop of gets."""
        keys = list(keys)
        if not hasattr(self.store, "multi_get"):
            return super().multi_get(keys, timeout)
        if not keys:
            return []
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout if timeout is None else timeout))
            return [bytes(v) for v in self.store.multi_get(keys)]
        except RuntimeError as e:
            missing = [k for k in keys[:64] if not self.store.check([k])]
            raise RendezvousError(f"keys {missing[:8]!r}{' and more' if len(missing) > 8 else ''} did not appear "
                                  f"in torch's store: {e}", op="store") from None

    def add(self, key, amount):
        return int(self.store.add(key, int(amount)))

    def check(self, key):
        return bool(self.store.check([key]))

    def delete_key(self, key):
        return bool(self.store.delete_key(key))
