"""Host identity (which ranks share a host, and so can use shared memory), the NUMA node,
and the address this rank listens on for TCP (``PYXCCL_SOCKET_IFNAME``)."""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from .. import _env
from .._errors import InvalidArgumentError


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


# Linux ioctls on an AF_INET socket (linux/sockios.h, linux/if.h); the request is a struct ifreq
# (16-byte name, then a union: the flags as a short, or a sockaddr_in whose address starts at byte 4).
_SIOCGIFFLAGS, _SIOCGIFADDR = 0x8913, 0x8915
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8
_IFREQ = 40
_AUTO_EXCLUDE = ("docker",)      # as NCCL: never picked on its own (container bridges)


@dataclass(frozen=True)
class Interface:
    """A network interface; ``address`` is its IPv4 address, "" when it has none."""
    name: str
    address: str
    up: bool
    loopback: bool

    def __str__(self) -> str:
        notes = [self.address or "no IPv4 address"] + ([] if self.up else ["down"])
        return f"{self.name} ({', '.join(notes)})"


def interfaces(*, with_address: bool = True) -> list[Interface]:
    """This host's interfaces, in the kernel's index order (``socket.if_nameindex()``; address and
    flags by the SIOCGIFADDR / SIOCGIFFLAGS ioctls): those with an IPv4 address, or all."""
    import fcntl
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack(f"{_IFREQ}s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req), 16)[0]
            except OSError:          # gone since the listing
                continue
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
            except OSError:          # no IPv4 address (EADDRNOTAVAIL)
                addr = ""
            if addr or not with_address:
                found.append(Interface(name, addr, bool(flags & _IFF_UP), bool(flags & _IFF_LOOPBACK)))
    return found


def parse_ifname(spec: str) -> tuple[bool, bool, list[str]]:
    """``PYXCCL_SOCKET_IFNAME`` (NCCL_SOCKET_IFNAME's syntax) as (exclude, exact, names):
    ``"eth,ib"`` prefixes to use, ``"^docker,lo"`` prefixes to avoid, ``"=eth0"`` / ``"^=eth1"``
    exact names."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    return exclude, exact, [n.strip() for n in spec.split(",") if n.strip()]


def ifname_matches(spec: str, name: str) -> bool:
    """Does interface ``name`` pass the ``PYXCCL_SOCKET_IFNAME`` filter ``spec``?"""
    exclude, exact, names = parse_ifname(spec)
    hit = any(name == n if exact else name.startswith(n) for n in names)
    return hit != exclude


def _route_source(target: str) -> str | None:
    """The source address the kernel would use towards ``target`` (a UDP connect: no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target, 9))
            return s.getsockname()[0]
        except OSError:
            return None


def local_address(master_addr: str | None, *, rank: int | None = None, environ=None) -> str:
    """The IPv4 address other ranks reach this one at (its TCP listener binds there).

    With ``PYXCCL_SOCKET_IFNAME`` (NCCL_SOCKET_IFNAME's syntax, see
    :func:`parse_ifname`): the address of the first matching interface that is
    up, preferring the one that routes to the master; none matching raises
    InvalidArgumentError naming ``rank``, the variable and the interfaces
    there are. Without it: loopback when the master is on loopback, else the
    interface that routes to the master (no packet is sent), and never
    loopback then: if the route says loopback or nothing, the first interface
    that is up and neither loopback nor ``docker*``. No master (a file store):
    that same first interface, or loopback when there is none.
    """
    env = os.environ if environ is None else environ
    who = "this process" if rank is None else f"rank {rank}"
    spec = env.get("PYXCCL_SOCKET_IFNAME", "").strip()
    target = None
    if master_addr:
        try:
            target = socket.getaddrinfo(master_addr, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
        except (OSError, UnicodeError):
            target = None           # the store will say that it cannot reach the master
    if spec:
        if not parse_ifname(spec)[2]:
            raise InvalidArgumentError(f"{who}: PYXCCL_SOCKET_IFNAME={spec!r} names no interface; give a comma "
                                       f"list of name prefixes (eth,ib), ^ to exclude (^docker,lo) or = for "
                                       f"exact names (=eth0), or unset it", rank=rank, op="init")
        ok = [i for i in interfaces() if i.up and ifname_matches(spec, i.name)]
        if not ok:
            have = interfaces(with_address=False)
            listed = ", ".join(map(str, have)) or "none"
            raise InvalidArgumentError(f"{who}: PYXCCL_SOCKET_IFNAME={spec!r} matches no interface that is up "
                                       f"and has an IPv4 address on host {socket.gethostname()}; its "
                                       f"interfaces: {listed}; fix the variable or unset it to choose "
                                       f"automatically", rank=rank, op="init")
        src = _route_source(target) if target else None
        return next((i.address for i in ok if i.address == src), ok[0].address)
    if master_addr and target is None:
        return "127.0.0.1"          # unresolvable: the store fails first and says why
    if target is not None:
        if ipaddress.ip_address(target).is_loopback:
            return "127.0.0.1"
        src = _route_source(target)
        if src is not None and not ipaddress.ip_address(src).is_loopback:
            return src
    auto = [i for i in interfaces() if i.up and not i.loopback and not i.name.startswith(_AUTO_EXCLUDE)]
    if auto:
        return auto[0].address
    if target is not None and not _is_local(target):
        raise InvalidArgumentError(f"{who}: the master {master_addr} ({target}) is on another host, but no "
                                   f"interface other than loopback is up here to reach it from; set "
                                   f"PYXCCL_SOCKET_IFNAME to the interface to use", rank=rank, op="init")
    return "127.0.0.1"


def _is_local(address: str) -> bool:
    """Is ``address`` one of this host's own addresses?"""
    return any(i.address == address for i in interfaces())


def job_cpus() -> int:
    """CPUs this host gives the job: the launcher's count when it bound each rank to a share of them
    (PYXCCL_JOB_CPUS), else this process's own. (More ranks than this: the ranks take turns.)"""
    return _env.get("PYXCCL_JOB_CPUS") or len(os.sched_getaffinity(0))


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
