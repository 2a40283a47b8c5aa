"""The TCP sockets a set of processes listens on, from ``/proc`` (Linux): each process's open
socket inodes (``/proc/PID/fd/*`` -> ``socket:[INODE]``) matched against the LISTEN rows (state
``0A``) of ``/proc/net/tcp`` and ``/proc/net/tcp6``. What ``ss -ltnp`` shows, without needing
``ss`` in the image."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    """One listening socket: its address, port and the process that holds it."""

    address: str
    port: int
    pid: int
    command: str

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def _hex_address(text: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``ADDR:PORT`` (hex, each 32-bit word in host order: little
    endian here) as (address, port)."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def _listening_inodes() -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == LISTEN:
                out[int(f[9])] = _hex_address(f[1])
    return out


def _socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


def listeners(pids: set[int]) -> list[Listener]:
    """Every TCP socket in LISTEN state held by one of ``pids``."""
    table = _listening_inodes()
    out = []
    for pid in sorted(pids):
        for inode in _socket_inodes(pid):
            if inode in table:
                addr, port = table[inode]
                out.append(Listener(addr, port, pid, _command(pid)))
    return sorted(set(out), key=lambda x: (x.pid, x.port))
