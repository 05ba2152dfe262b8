"""torch Works over pyxccl's: what ``dist.*`` calls return and what ``wait()`` raises."""
from __future__ import annotations

import threading

import torch

from pyxccl._errors import CommTimeoutError

_TorchWork = torch._C._distributed_c10d.Work


def torch_error(exc):
    """``exc`` as torch.distributed users read it: a timeout says "Timed out" first, as Gloo's does
    (PyTorch's tests and users' code match that), then pyxccl's own message (who, where, what to do)."""
    if isinstance(exc, CommTimeoutError) and not str(exc).startswith("Timed out"):
        return CommTimeoutError(f"Timed out waiting for {exc.op or 'the operation'} to complete: {exc}",
                                rank=exc.rank, peer=exc.peer, op=exc.op, seq=exc.seq)
    return exc


class PyxcclWork(_TorchWork):
    """torch's Work over pyxccl Works: ``wait()`` raises their error (a Work made from a Future
    would only set it on the Future), ``get_future()`` for DDP hooks and ``then`` chains."""

    def __init__(self, works, value, fut):
        super().__init__()
        self._works, self._value, self._fut = works, value, fut
        self.unpacked = threading.Event()    # set once the pyxccl Works' own callbacks (unpacking outputs) ran
        self._lock, self._settled = threading.Lock(), False

    def settle(self) -> None:
        """Complete the future once: from wait() or from the completer pool, whichever comes first
        (a waiter need not wait for a pool thread to wake up)."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
        exc = self.exception()
        if exc is not None:
            self._fut.set_exception(exc)
        else:
            self._fut.set_result(self._value)

    def wait(self, timeout=None) -> bool:
        secs = timeout.total_seconds() if timeout else None
        for w in self._works:
            try:
                w.wait(secs)      # raises pyxccl's error, naming the peer
            except CommTimeoutError as e:
                raise torch_error(e) from None
        self.unpacked.wait()
        self.settle()
        self._fut.wait()          # then() callbacks of another thread that settled it first are done
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return self.is_completed() and all(w.exception() is None for w in self._works)

    def exception(self):
        return torch_error(next((w.exception() for w in self._works if w.exception() is not None), None))

    def get_future(self):
        return self._fut

    def result(self):
        self.wait()
        return self._value

    def _source_rank(self) -> int:
        """The sender of a ``recv_anysource`` (torch's dist.recv(src=None) asks this)."""
        return self._works[0].source_rank()


class FailedWork(_TorchWork):
    """The Work of a call that already failed here (an inline call that timed out, lost a peer...):
    ``wait()`` raises its error, as Gloo's Work does. A Work made from a failed torch Future
    would not: its ``wait()`` returns, and ``dist.all_reduce`` would report success."""

    def __init__(self, exc: BaseException):
        super().__init__()
        self._exc = exc = torch_error(exc)
        self._fut = torch.futures.Future()
        self._fut.set_exception(exc)

    def wait(self, timeout=None) -> bool:
        raise self._exc

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return False

    def exception(self):
        return self._exc

    def get_future(self):
        return self._fut

    def result(self):
        raise self._exc
