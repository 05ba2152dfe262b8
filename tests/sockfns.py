"""Helpers of the store's tests: watching a server drop a client, waiting for a condition."""
from __future__ import annotations

import socket
import time


def dropped(s: socket.socket, within: float | None = 10.0) -> bool:
    """Whether the server closes ``s`` within ``within`` s (None: the socket's own timeout); what it
    sends before is read and ignored."""
    if within is not None:
        s.settimeout(within)
    try:
        while s.recv(1 << 16):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def eventually(check, seconds: float = 10.0) -> bool:
    """Whether ``check()`` becomes true within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
