"""A pool of rank processes that stay up across tests.

>>> with RankPool(4) as pool:                               # doctest: +SKIP
...     sums = pool.run(allreduce_ones, transport="shm")    # allreduce_ones(comm) on every rank

Each rank holds one world communicator per transport ("tcp", "shm"), made
once. ``run(fn, *args)`` calls ``fn(comm, *args)`` on every rank (``fn`` must be
importable: a module-level function) and returns the list of results, or
raises :class:`RankError` with every failing rank's traceback. A call that
does not finish within its deadline kills the pool (a hung collective can't
be trusted to recover) and raises ``TimeoutError``.
"""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback

TRANSPORTS = ("tcp", "shm")


class RankError(AssertionError):
    """Some ranks raised; ``errors`` maps rank -> (exception or None, traceback text)."""

    def __init__(self, errors: dict):
        self.errors = errors
        text = "\n".join(f"--- rank {r} ---\n{tb}" for r, (_, tb) in sorted(errors.items()))
        # the first line says what the first rank raised: pytest's one-line summary (all a CI log's tail
        # may show) then names the cause, not only how many ranks failed
        r, (_, tb) = min(errors.items())
        last = next((line.strip() for line in reversed(str(tb).splitlines()) if line.strip()), "")
        super().__init__(f"{len(errors)} rank(s) failed; rank {r}: {last[:200]}\n{text}")


def _worker(rank: int, size: int, port: int, transports, conn, env) -> None:
    os.environ.update(env, PYXCCL_POOL_STORE_PORT=str(port))
    # where every thread is, on the pool's word (a call past its deadline): on this process's stderr
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import pyxccl
    from pyxccl.rendezvous import PrefixStore, TCPStore

    comms = {}
    try:
        for t in transports:
            store = PrefixStore(f"pool/{t}", TCPStore("127.0.0.1", port, is_server=False, timeout=60))
            comms[t] = pyxccl.init(rank, size, store=store, transport=t, timeout=60)
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001
        conn.send(("err", (_picklable(e), traceback.format_exc())))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        fn, transport, args, kwargs = msg
        try:
            conn.send(("ok", fn(comms[transport], *args, **kwargs)))
        except BaseException as e:  # noqa: BLE001
            conn.send(("err", (_picklable(e), traceback.format_exc())))
    for c in comms.values():
        c.close()


def _picklable(e: BaseException):
    import pickle
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return None


class RankPool:
    def __init__(self, size: int, *, transports=TRANSPORTS, env: dict | None = None, timeout: float = 60,
                 hosts: list[str] | None = None):
        """``hosts``: a host identity per rank (PYXCCL_HOST_ID), to emulate several hosts on one machine."""
        from pyxccl.rendezvous import TCPStore
        self.size, self.transports = size, tuple(transports)
        self._store = TCPStore("127.0.0.1", 0, is_server=True, timeout=timeout)
        ctx = mp.get_context("spawn")
        self._conns, self.procs = [], []
        for r in range(size):
            parent, child = ctx.Pipe()
            rank_env = dict(env or {}, **({"PYXCCL_HOST_ID": str(hosts[r])} if hosts else {}))
            p = ctx.Process(target=_worker, args=(r, size, self._store.port, self.transports, child, rank_env),
                            daemon=True, name=f"pyxccl-rank{r}")
            p.start()
            child.close()
            self._conns.append(parent)
            self.procs.append(p)
        self.alive, self._last = True, "the start"
        self._collect("ready", timeout)

    def run(self, fn, *args, transport: str = "tcp", timeout: float = 60, expect_dead=(), **kwargs) -> list:
        """``fn(comm, *args, **kwargs)`` on every rank; the list of their results.

        Ranks in ``expect_dead`` may die during the call (their result is None);
        the pool is closed afterwards, since it lost ranks.
        """
        if not self.alive:
            raise RuntimeError("this RankPool was closed after a failure; make a new one")
        dead = {r: (None, f"rank {r} {self._exit(r)} after {self._last}, before {fn.__name__}")
                for r, p in enumerate(self.procs) if not p.is_alive()}
        if dead:        # the call before passed, then a rank died (a thread's crash, the OOM killer...)
            self.close(kill=True)
            raise RankError(dead)
        self._last = fn.__name__
        for c in self._conns:
            c.send((fn, transport, args, kwargs))
        try:
            return self._collect(fn.__name__, timeout, expect_dead)
        finally:
            if expect_dead:
                self.close()

    def _collect(self, what: str, timeout: float, expect_dead=()) -> list:
        deadline = time.monotonic() + timeout
        results, errors = [None] * self.size, {}
        for r, c in enumerate(self._conns):
            if not c.poll(max(0.0, deadline - time.monotonic())):
                self._dump_stacks()
                self.close(kill=True)
                raise TimeoutError(f"rank {r} did not finish {what} within {timeout} s; pool killed (every "
                                   f"rank's threads' stacks are on stderr, above)")
            try:
                kind, val = c.recv()
            except EOFError:
                if r in expect_dead:
                    continue
                self.procs[r].join(timeout=5)
                died = f"rank {r} {self._exit(r)} during {what}"
                self.close(kill=True)
                raise RankError({r: (None, died)}) from None
            if kind == "ok" or kind == "ready":
                results[r] = val
            else:
                errors[r] = val
        if errors:
            if what == "ready":
                self.close(kill=True)
            raise RankError(errors)
        return results

    def _exit(self, r: int) -> str:
        """How rank ``r``'s process ended, for the message naming it."""
        code = self.procs[r].exitcode
        if code is None:
            return "died (its pipe closed)"
        if code < 0:
            try:
                return f"died ({signal.Signals(-code).name})"
            except ValueError:
                return f"died (signal {-code})"
        return f"died (exit status {code})"

    def _dump_stacks(self) -> None:
        """Every live rank writes its threads' stacks to its stderr (faulthandler), one rank after the
        other, before the kill."""
        for r, p in enumerate(self.procs):
            if p.is_alive():
                print(f"--- rank {r}'s threads, past the pool's deadline ---", file=sys.stderr, flush=True)
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except OSError:
                    pass
                time.sleep(0.3)

    def close(self, kill: bool = False) -> None:
        if not self.alive:
            return
        self.alive = False
        for c in self._conns:
            try:
                if not kill:
                    c.send(None)
            except OSError:
                pass
        for p in self.procs:
            if kill:
                p.kill()
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self._conns:
            c.close()
        self._store.close()

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
