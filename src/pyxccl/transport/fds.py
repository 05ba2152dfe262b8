"""The process's descriptor limit: raised to what a job needs, or an error that says by how much."""
from __future__ import annotations

import os
import resource

from .._errors import RendezvousError


def ensure_fds(need: int, who: str, op: str = "init") -> int:
    """Make room for ``need`` more open descriptors than are open now: raise the soft limit
    (``RLIMIT_NOFILE``) up to the hard one where it is lower. Returns the soft limit in force.

    ``who`` names the caller in the error ("rank 3", "the store at host:port"), raised when even
    the hard limit is too low: it says how many descriptors are missing and what to do.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = open_fds() + need
    if want <= soft:
        return soft
    if hard != resource.RLIM_INFINITY and want > hard:
        raise RendezvousError(
            f"{who}: needs about {want} open descriptors but the hard limit is {hard} "
            f"({want - hard} short); raise it (ulimit -Hn, or nofile in /etc/security/limits.conf) "
            f"or give this process fewer peers (fewer ranks, or PYXCCL_NSOCKS=1)", op=op)
    new = hard if hard != resource.RLIM_INFINITY else max(want, soft)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


def open_fds() -> int:
    """How many descriptors this process holds now."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1     # less the one listdir opened
    except OSError:
        return 0
