"""One progress thread per mesh: a ``selectors`` loop that serves every socket of the process's
connections (TCP, and the Unix sockets of shared-memory peers, which carry their frames) and the
listening sockets.

A socket is registered with a handler; when the socket is readable the loop calls the handler,
which reads one frame (or one step of a handshake) and returns. Handlers may block on the rest of
a frame (a sender writes its frames whole from its own thread), but never on anything an
application thread of this process must do. A handler returns False to be dropped.

Registration may come from any thread: it is queued and the loop is woken through a socket pair.
``every(seconds, fn)`` runs ``fn`` on the loop now and then (handshake deadlines).
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections import deque

import numpy as np

log = logging.getLogger("pyxccl")


class Progress:
    """The event loop of one mesh (see the module docstring)."""

    def __init__(self, name: str):
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._todo: deque = deque()
        self._ticks: list = []
        self._stopping = False
        self.thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self.thread.start()

    def add(self, sock: socket.socket, handler) -> None:
        """Call ``handler()`` on the loop whenever ``sock`` is readable, until it returns False."""
        self._call(lambda: self._register(sock, handler))

    def remove(self, sock: socket.socket) -> None:
        """Stop serving ``sock``; from another thread, wait until the loop has dropped it (so no handler
        of it runs after this returns, and its descriptor may be closed and reused)."""
        if threading.current_thread() is self.thread:
            self._unregister(sock)
            return
        if self._stopping or not self.thread.is_alive():
            return
        done = threading.Event()

        def drop():
            self._unregister(sock)
            done.set()
        self._call(drop)
        done.wait(5)

    def every(self, fn) -> None:
        """Run ``fn()`` on the loop about every 50 ms, until it returns False."""
        self._call(lambda: self._ticks.append(fn))

    def call(self, fn) -> None:
        """Run ``fn()`` on the loop, soon."""
        self._call(fn)

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def _call(self, fn) -> None:
        self._todo.append(fn)
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass          # a wake-up is already pending (or the loop is gone)

    def _register(self, sock, handler) -> None:
        try:
            self._sel.register(sock, selectors.EVENT_READ, handler)
        except (KeyError, ValueError, OSError):
            pass          # already closed, or registered: nothing to serve

    def _unregister(self, sock) -> None:
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError, OSError, RuntimeError):
            pass

    def _loop(self) -> None:
        np.seterr(all="ignore")       # this thread reduces incoming data: overflow is no warning (ops.reducer)
        while not self._stopping:
            while self._todo:
                self._todo.popleft()()
            if self._stopping:
                break
            events = self._sel.select(0.05 if self._ticks else None)
            live = self._sel.get_map()
            for key, _ in events:
                if live.get(key.fd) is not key:
                    continue      # dropped by a handler earlier in this round
                handler = key.data
                if handler is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                    continue
                try:
                    keep = handler()
                except BaseException:  # noqa: BLE001  (handlers report their own failures; this is a bug)
                    log.exception("pyxccl: a progress handler failed")
                    keep = False
                if keep is False:
                    self._unregister(key.fileobj)
            if self._ticks:
                self._ticks = [fn for fn in self._ticks if fn() is not False]
        self._sel.close()
        while self._todo:             # removals queued while it stopped: their callers wait for them
            try:
                self._todo.popleft()()
            except Exception:  # noqa: BLE001  (the selector is closed: there is nothing left to drop)
                pass

    def close(self) -> None:
        """Stop the loop and wait for it (from any thread but the loop's own, where it only stops)."""
        def stop():
            self._stopping = True
        self._call(stop)
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
            self._wake_r.close()
            self._wake_w.close()
