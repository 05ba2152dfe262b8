"""Rendezvous stores: how ranks find each other before they connect.

``create_store(url, ...)`` understands ``env://`` (MASTER_ADDR, MASTER_PORT),
``tcp://host:port`` (rank 0 serves a :class:`TCPStore` there) and ``file:///dir``.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

from .._errors import InvalidArgumentError
from .base import Store
from .file import FileStore
from .prefix import PrefixStore
from .tcp import TCPStore

__all__ = ["Store", "TCPStore", "FileStore", "PrefixStore", "create_store"]


def create_store(url: str | None, *, rank: int, world_size: int, timeout: float) -> Store:
    url = url or "env://"
    u = urlparse(url)
    if u.scheme == "env":
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            raise InvalidArgumentError(
                f"rank {rank}: init_method env:// needs MASTER_ADDR and MASTER_PORT (the address and a free "
                f"port of rank 0's host); set them, or start the job with pyxccl run / torchrun",
                rank=rank, op="init")
        return TCPStore(host, int(port), is_server=rank == 0, timeout=timeout, world_size=world_size)
    if u.scheme == "tcp":
        if not u.hostname or u.port is None:
            raise InvalidArgumentError(f"rank {rank}: {url!r} needs a host and a port: tcp://host:port",
                                       rank=rank, op="init")
        return TCPStore(u.hostname, u.port, is_server=rank == 0, timeout=timeout, world_size=world_size)
    if u.scheme == "file":
        return FileStore(u.path, timeout=timeout)
    raise InvalidArgumentError(f"rank {rank}: unknown init_method {url!r}; use env://, tcp://host:port or "
                               f"file:///path", rank=rank, op="init")
