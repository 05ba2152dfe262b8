"""Host identity: which ranks share a host (and so can use shared memory)."""
from __future__ import annotations

import os
import socket


def host_id() -> str:
    """This host's identity: ``PYXCCL_HOST_ID`` if set (tests use it to emulate
    several hosts on one machine), else hostname plus the kernel's boot id."""
    override = os.environ.get("PYXCCL_HOST_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def local_address(master_addr: str | None) -> str:
    """The address other ranks reach this one at: the interface that routes to the
    master (no packet is sent), loopback when the master is on loopback."""
    if not master_addr:
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(master_addr, None, socket.AF_INET, socket.SOCK_DGRAM)
        target = infos[0][4][0]
    except OSError:
        return "127.0.0.1"
    if target.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def numa_node() -> int:
    """NUMA node of this process's first allowed CPU (-1 if the kernel does not say)."""
    cpu = min(os.sched_getaffinity(0))
    base = "/sys/devices/system/node"
    try:
        for d in os.listdir(base):
            if d.startswith("node") and os.path.exists(f"{base}/{d}/cpu{cpu}"):
                return int(d[4:])
    except OSError:
        pass
    return -1
