"""Rendezvous stores: how ranks find each other before they connect.

``create_store(url, ...)`` understands ``env://`` (MASTER_ADDR, MASTER_PORT),
``tcp://host:port`` (rank 0 serves a :class:`TCPStore` there) and
``file:///dir`` (a :class:`FileStore`). Who a store trusts: "Trust" in
docs/design.md.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

from .._errors import InvalidArgumentError
from .base import Store
from .file import FileStore
from .prefix import PrefixStore
from .tcp import TCPStore
from .wire import Limits

__all__ = ["Store", "TCPStore", "FileStore", "PrefixStore", "Limits", "create_store"]


def _port(raw: str, what: str, rank: int) -> int:
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"rank {rank}: {what} {raw!r} is not a port number (0-65535); set it to a "
                                   f"free port of rank 0's host", rank=rank, op="init")
    return port


def create_store(url: str | None, *, rank: int, world_size: int, timeout: float) -> Store:
    """The store named by ``url`` (default ``env://``) for ``rank`` of ``world_size``.

    ``env://`` and ``tcp://host:port``: rank 0 serves a :class:`TCPStore` on
    host:port and every rank (rank 0 too) is its client. ``file:///abs/dir``:
    a :class:`FileStore` in that directory. Raises InvalidArgumentError for a
    malformed URL and RendezvousError when the store cannot be reached.
    """
    if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
        raise InvalidArgumentError(f"create_store: rank={rank!r} and world_size={world_size!r} must be integers "
                                   f"with 0 <= rank < world_size", rank=rank, op="init")
    url = url or "env://"
    u = urlparse(url)
    if u.scheme == "env":
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            missing = " and ".join(n for n, v in (("MASTER_ADDR", host), ("MASTER_PORT", port)) if not v)
            raise InvalidArgumentError(
                f"rank {rank}: init_method env:// needs {missing} (the address and a free port of rank 0's "
                f"host); set it, or start the job with pyxccl run / torchrun", rank=rank, op="init")
        return _tcp(host, _port(port, "MASTER_PORT", rank), rank, world_size, timeout)
    if u.scheme == "tcp":
        try:
            host, port = u.hostname, u.port
        except ValueError:
            host = port = None
        if not host or port is None:
            raise InvalidArgumentError(f"rank {rank}: init_method {url!r} needs a host and a port: "
                                       f"tcp://host:port", rank=rank, op="init")
        return _tcp(host, port, rank, world_size, timeout)
    if u.scheme == "file":
        if u.netloc not in ("", "localhost") or not u.path:
            raise InvalidArgumentError(f"rank {rank}: init_method {url!r} must be file:///absolute/path (three "
                                       f"slashes)", rank=rank, op="init")
        return FileStore(u.path, timeout=timeout)
    raise InvalidArgumentError(f"rank {rank}: unknown init_method {url!r}; use env://, tcp://host:port or "
                               f"file:///path", rank=rank, op="init")


def _tcp(host: str, port: int, rank: int, world_size: int, timeout: float) -> TCPStore:
    if port == 0 and world_size > 1:
        raise InvalidArgumentError(f"rank {rank}: store port 0 would be a random port the other ranks cannot "
                                   f"know; give a fixed free port", rank=rank, op="init")
    return TCPStore(host, port, is_server=rank == 0, timeout=timeout, world_size=world_size, rank=rank)
