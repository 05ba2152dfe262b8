"""A store in a directory: one file per key, written atomically; works on one host
or on a file system every host shares."""
from __future__ import annotations

import base64
import fcntl
import os
import tempfile
import time

from .._errors import RendezvousError
from .base import Store


class FileStore(Store):
    """>>> s = FileStore("/tmp/job42")   # doctest: +SKIP"""

    def __init__(self, path: str, *, timeout: float = 300.0):
        super().__init__(timeout)
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, base64.urlsafe_b64encode(key.encode()).decode() or "_")

    def set(self, key: str, value: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.replace(tmp, self._file(key))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        timeout = self.timeout if timeout is None else timeout
        deadline, delay = time.monotonic() + timeout, 0.001
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"key {key!r} did not appear in {self.path} within {timeout:.1f} s; "
                                          f"a rank did not start or uses another directory", op="store") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def add(self, key: str, amount: int) -> int:
        with open(os.path.join(self.path, ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(self._file(key), "rb") as f:
                    cur = int(f.read())
            except FileNotFoundError:
                cur = 0
            self.set(key, str(cur + int(amount)).encode())
            return cur + int(amount)

    def check(self, key: str) -> bool:
        return os.path.exists(self._file(key))

    def delete_key(self, key: str) -> bool:
        try:
            os.unlink(self._file(key))
            return True
        except FileNotFoundError:
            return False
