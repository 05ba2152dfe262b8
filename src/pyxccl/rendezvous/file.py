"""A store in a directory: one file per key, written atomically; works on one host
or on a file system every host shares."""
from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import tempfile
import time

from .._errors import InvalidArgumentError, RendezvousError
from .base import Store


class FileStore(Store):
    """A store kept in the directory ``path`` (created if missing).

    Each key is one file, named by the key's URL-safe base64 (long keys by
    their SHA-256), written to a temporary file and renamed into place, so a
    reader never sees half a value. ``get`` polls with a short backoff (1 ms
    growing to 50 ms); ``add`` holds ``fcntl.flock`` on ``path/.lock``.
    Use a fresh directory per job: old files would answer new gets.

    >>> s = FileStore("/tmp/job42")   # doctest: +SKIP
    """

    def __init__(self, path: str, *, timeout: float = 300.0):
        super().__init__(timeout)
        self.path = os.fspath(path)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise RendezvousError(f"cannot create the store directory {self.path!r} ({e}); give a writable "
                                  f"directory in file:///path", op="init") from None

    def _file(self, key: str) -> str:
        name = base64.urlsafe_b64encode(key.encode()).decode()
        if not name or len(name) > 200:
            # File names are limited (255 bytes); "~" is not base64, so hashed names cannot clash with others.
            name = "~" + hashlib.sha256(key.encode()).hexdigest()
        return os.path.join(self.path, name)

    def _write(self, key: str, value: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            os.replace(tmp, self._file(key))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def set(self, key: str, value: bytes) -> None:
        self._write(key, bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        timeout = self.timeout if timeout is None else float(timeout)
        deadline, delay = time.monotonic() + timeout, 0.001
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousError(f"key {key!r} did not appear in the file store {self.path} within "
                                          f"{timeout:g} s; a rank did not start, failed, or uses another "
                                          f"directory", op="store") from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.05)

    def add(self, key: str, amount: int) -> int:
        with open(os.path.join(self.path, ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)     # released when the file closes
            try:
                with open(self._file(key), "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                raw = b"0"
            try:
                new = int(raw) + int(amount)
            except ValueError:
                raise InvalidArgumentError(f"file store {self.path}: key {key!r} holds {raw[:32]!r}, not a "
                                           f"counter; add() needs a key only add() writes", op="store") from None
            self._write(key, str(new).encode())
            return new

    def check(self, key: str) -> bool:
        return os.path.exists(self._file(key))

    def delete_key(self, key: str) -> bool:
        try:
            os.unlink(self._file(key))
            return True
        except FileNotFoundError:
            return False
