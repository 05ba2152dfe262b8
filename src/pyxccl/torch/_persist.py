"""The torch backend's persistent requests: a call whose buffer, shape, dtype, op, peer or root, tag
and deadline repeat runs as a started ``PersistentRequest`` (``comm.allreduce_init`` and the rest)
instead of a plain call (DDP's gradient buckets, GradientReducer's buckets, a pipeline's fixed
send and receive buffers).

The rules (one :class:`RequestCache` per process group):

- A key is (call, data pointer, numel, dtype, op, root or peer, tag, timeout). The first sighting
  of a key is a plain call and only remembers a weak reference to the tensor; the second, with the
  *same tensor object* (a new tensor at the same address is a new key's first sighting), makes the
  request, and later ones start it. A call the request cannot take as it is (its last start still
  running, an init that refuses the tensor) is a plain call, so results, errors and the order of
  calls are the plain call's.
- Tensors are held weakly: a request holds the tensor's storage (its numpy view), not the user's
  tensor object, and the weak reference's callback drops the request when that object dies, so
  the storage is released with the user's last reference (DDP's bucket buffers live as long as
  the model: their requests do too). A tensor whose storage is swapped (``set_``) leaves a stale
  entry holding its old storage until it is evicted or the tensor dies; it is never started, as
  the key holds the data pointer.
- At most ``slots`` keys (LRU). An evicted request is dropped (with the last reference go the
  request and the storage it holds; a start still running keeps what it needs); ``discard(t)``
  frees those of one tensor (the DDP hook's ``PersistentState.free()``), ``close()`` (the group's
  shutdown) every one not running.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

SLOTS = 64
_NEVER = False       # an entry whose init refused: plain calls, without trying again


class _Entry:
    __slots__ = ("ref", "req", "__weakref__")

    def __init__(self, ref):
        self.ref, self.req = ref, None


class RequestCache:
    """Persistent requests of one communicator, by call key (see the module's rules). ``created``
    and ``reused`` count the requests made and the starts of a made request (tests, diagnostics)."""

    def __init__(self, slots: int = SLOTS):
        self.slots = slots
        self.created = self.reused = 0
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.RLock()       # RLock: a weak reference's callback may run inside get()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key, tensor, make):
        """The request to start for ``tensor`` under ``key``, or None for a plain call. ``make()``
        makes the request (the ``*_init`` call); an exception there means a plain call (it raises
        the same error, with the plain call's message)."""
        if self.slots <= 0:
            return None
        with self._lock:
            e = self._entries.get(key)
            if e is None or e.ref() is not tensor:
                self._put(key, tensor)
                return None
            self._entries.move_to_end(key)
            req = e.req
        if req is _NEVER:
            return None
        if req is None:
            try:
                req = make()
            except Exception:  # noqa: BLE001  (the plain call reports it)
                e.req = _NEVER
                return None
            with self._lock:
                if self._entries.get(key) is not e:      # the tensor died or was evicted meanwhile
                    return None
                e.req = req
                self.created += 1
            return req
        if req.active and not settled(req):
            return None            # its last start still runs: this one goes behind it, as a plain call
        self.reused += 1
        return req

    def _put(self, key, tensor) -> None:
        # a replaced, dead or evicted entry is only dropped, not freed: a caller that just got its
        # request may still start it; with the last reference go the request and its storage
        self._entries.pop(key, None)
        e = _Entry(None)
        wkey = weakref.ref(e)

        def dead(_ref, key=key):
            with self._lock:
                cur = wkey()
                if cur is not None and self._entries.get(key) is cur:
                    del self._entries[key]
        try:
            e.ref = weakref.ref(tensor, dead)
        except TypeError:          # not weakly referable: never kept
            return
        self._entries[key] = e
        while len(self._entries) > self.slots:
            self._entries.popitem(last=False)

    def discard(self, tensor) -> None:
        """Forget ``tensor`` under every key it was seen with, freeing its requests not running (a
        running one is only dropped; a caller that just got one finds it freed and makes the plain call)."""
        with self._lock:
            keys = [k for k, e in self._entries.items() if e.ref() is tensor]
            entries = [self._entries.pop(k) for k in keys]
        _free(entries)

    def close(self) -> None:
        """Free every request (the group is going away)."""
        with self._lock:
            entries, self._entries = list(self._entries.values()), OrderedDict()
        _free(entries)


def _free(entries) -> None:
    for e in entries:
        if e.req and not e.req.active:          # not None (no request yet), not _NEVER
            e.req.free()


def settled(req) -> bool:
    """Make a request whose last start completed inactive; False while it runs. Its error, if any,
    went to the torch Work of that start already."""
    try:
        return req.test()
    except Exception:  # noqa: BLE001
        return True
